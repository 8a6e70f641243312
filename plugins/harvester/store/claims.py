"""embedding_claims: a text is claimed before it is sent to the embedding provider (sql/016).

Runs of different portals meet the same texts (portals republish each other's records). Without
a claim, two runs that select "texts with no vector yet" at the same moment both pay for them.
With one, a text is sent by at most one run at a time: the run that claims it embeds it, the
others wait for its vector and link it (counted as reused). A claim ends when its vector is
written (vectors.write deletes it in the same transaction), when its run releases it (the batch
kept failing, or the breaker stopped the calls), when it expires (``ttl``), or as soon as its run is
no longer running (failed, abandoned, committed): a dead run's claims never hold anyone up for
long. Rows are taken in content-hash order, so two runs claiming overlapping batches cannot deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class Claimed:
    """What a claim of some texts gave: ``mine`` to embed now, ``stored`` (a vector of the model
    is already there: nothing to pay), ``others`` (another live run is embedding them: wait)."""
    mine: set[str] = field(default_factory=set)
    stored: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)


def take(conn, model: str, run_id: int, hashes: Sequence[str], ttl_seconds: float) -> Claimed:
    """Claim the texts ``hashes`` of ``model`` for ``run_id`` for ``ttl_seconds``, in one statement:
    a text with a vector is left alone, a text claimed by a live run (not expired, its run running)
    stays theirs, anything else (unclaimed, expired, a dead run's, this run's own from an earlier
    attempt) becomes this run's. Then one more look at the vectors: one written by another run
    between the claim's snapshot and its insert (that run's claim was gone by then) is seen, and
    its claim handed back."""
    wanted = sorted(set(hashes))
    out = Claimed()
    if not wanted:
        return out
    with conn.transaction():
        rows = conn.execute(
            """
            WITH stored AS (
                SELECT e.content_hash FROM embeddings e
                WHERE e.model = %(model)s AND e.content_hash = ANY(%(hashes)s::text[])
            ), claimed AS (
                INSERT INTO embedding_claims AS c (content_hash, model, run_id, expires_at)
                SELECT h, %(model)s, %(run)s, clock_timestamp() + make_interval(secs => %(ttl)s)
                FROM unnest(%(hashes)s::text[]) AS h
                WHERE h NOT IN (SELECT content_hash FROM stored)
                ORDER BY h
                ON CONFLICT (content_hash, model) DO UPDATE
                    SET run_id = EXCLUDED.run_id, claimed_at = clock_timestamp(), expires_at = EXCLUDED.expires_at
                    WHERE c.run_id = EXCLUDED.run_id OR c.expires_at < clock_timestamp()
                       OR NOT EXISTS (SELECT 1 FROM sync_runs r WHERE r.run_id = c.run_id AND r.status = 'running')
                RETURNING c.content_hash
            )
            SELECT content_hash, true FROM claimed
            UNION ALL
            SELECT content_hash, false FROM stored
            """, {"model": model, "run": run_id, "hashes": wanted, "ttl": float(ttl_seconds)}).fetchall()
    for content_hash, mine in rows:
        (out.mine if mine else out.stored).add(content_hash)
    if out.mine:
        # A fresh snapshot: a vector committed before our claim went in is visible now.
        late = landed(conn, model, out.mine)
        if late:
            release(conn, model, run_id, late)
            out.mine -= late
            out.stored |= late
    out.others = set(wanted) - out.mine - out.stored
    return out


def release(conn, model: str, run_id: int, hashes: Sequence[str] | set[str]) -> None:
    """Give up this run's claims of ``hashes`` (left pending: another run may embed them now)."""
    if hashes:
        conn.execute("DELETE FROM embedding_claims WHERE model = %s AND run_id = %s AND content_hash = ANY(%s::text[])",
                     (model, run_id, sorted(hashes)))


def release_run(conn, run_id: int) -> int:
    """Give up every claim of ``run_id`` (its embed step is over, whatever happened)."""
    return conn.execute("DELETE FROM embedding_claims WHERE run_id = %s", (run_id,)).rowcount


def landed(conn, model: str, hashes: Sequence[str] | set[str]) -> set[str]:
    """Which of ``hashes`` have a vector of ``model`` now."""
    if not hashes:
        return set()
    return {row[0] for row in conn.execute(
        "SELECT content_hash FROM embeddings WHERE model = %s AND content_hash = ANY(%s::text[])",
        (model, sorted(hashes))).fetchall()}


def prune(conn) -> int:
    """Forget claims that can no longer hold anyone up (expired, or their run is over)."""
    return conn.execute(
        "DELETE FROM embedding_claims c WHERE c.expires_at < clock_timestamp()"
        " OR NOT EXISTS (SELECT 1 FROM sync_runs r WHERE r.run_id = c.run_id AND r.status = 'running')").rowcount
