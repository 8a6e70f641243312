"""embedding_claims: a text is claimed before it is sent to the embedding provider (sql/016).

Runs of different portals meet the same texts (portals republish each other's records). Without
a claim, two runs that select "texts with no vector yet" at the same moment both pay for them.
With one, a text is sent by at most one run at a time: the run that claims it embeds it, the
others wait for its vector and link it (counted as reused). A claim ends when its vector is
written (vectors.write deletes it in the same transaction), when its run releases it (the batch
kept failing, or the breaker stopped the calls), when it expires (``ttl``), or as soon as its run is
no longer running (failed, abandoned, committed): a dead run's claims never hold anyone up for
long. Rows are taken in content-hash order, so two runs claiming overlapping batches cannot deadlock.

A text whose vector the provider answered unusable (``refuse``, sql/021: not finite, of the wrong
size, empty, a batch answered with another count of vectors) is given back with a failure recorded
in the same transaction: it is not claimed again before its ``retry_at``, nor ever once given up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from harvester.store import staging, vectors


@dataclass
class Claimed:
    """What a claim of some texts gave: ``mine`` to embed now, ``stored`` (a vector of the model
    is already there: nothing to pay), ``others`` (another live run is embedding them: wait),
    ``held`` (the provider's answer for them was unusable lately: not sent before their retry, or
    given up; see ``refuse``)."""
    mine: set[str] = field(default_factory=set)
    stored: set[str] = field(default_factory=set)
    others: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)


# A text held back by an earlier refusal: waiting for its retry, or given up (retry_at NULL).
_HELD = "(f.retry_at IS NULL OR f.retry_at > clock_timestamp())"


def take(conn, model: str, run_id: int, hashes: Sequence[str], ttl_seconds: float) -> Claimed:
    """Claim the texts ``hashes`` of ``model`` for ``run_id`` for ``ttl_seconds``, in one statement:
    a text with a vector is left alone, a text held back by an earlier refusal (``refuse``) is not
    claimed, a text claimed by a live run (not expired, its run running) stays theirs, anything
    else (unclaimed, expired, a dead run's, this run's own from an earlier attempt) becomes this
    run's. Then one more look at the vectors: one written by another run
    between the claim's snapshot and its insert (that run's claim was gone by then) is seen, and
    its claim handed back, and so is one refused by another run meanwhile."""
    wanted = sorted(set(hashes))
    out = Claimed()
    if not wanted:
        return out
    with conn.transaction():
        rows = conn.execute(
            """
            WITH stored AS (
                SELECT encode(e.content_hash, 'hex') AS content_hash FROM embeddings e
                WHERE e.model = """ + vectors.MODEL_ID + """ AND e.content_hash = ANY(%(keys)s::bytea[])
            ), held AS (
                SELECT f.content_hash FROM embedding_failures f
                WHERE f.model = %(model)s AND f.content_hash = ANY(%(hashes)s::text[])
                  AND (f.retry_at IS NULL OR f.retry_at > clock_timestamp())
                  AND f.content_hash NOT IN (SELECT content_hash FROM stored)
            ), claimed AS (
                INSERT INTO embedding_claims AS c (content_hash, model, run_id, expires_at)
                SELECT h, %(model)s, %(run)s, clock_timestamp() + make_interval(secs => %(ttl)s)
                FROM unnest(%(hashes)s::text[]) AS h
                WHERE h NOT IN (SELECT content_hash FROM stored) AND h NOT IN (SELECT content_hash FROM held)
                ORDER BY h
                ON CONFLICT (content_hash, model) DO UPDATE
                    SET run_id = EXCLUDED.run_id, claimed_at = clock_timestamp(), expires_at = EXCLUDED.expires_at
                    WHERE c.run_id = EXCLUDED.run_id OR c.expires_at < clock_timestamp()
                       OR NOT EXISTS (SELECT 1 FROM sync_runs r WHERE r.run_id = c.run_id AND r.status = 'running')
                RETURNING c.content_hash
            )
            SELECT content_hash, 'mine' FROM claimed
            UNION ALL
            SELECT content_hash, 'stored' FROM stored
            UNION ALL
            SELECT content_hash, 'held' FROM held
            """, {"model": model, "run": run_id, "hashes": wanted, "keys": vectors.keys(wanted),
                  "ttl": float(ttl_seconds)}).fetchall()
    for content_hash, what in rows:
        getattr(out, what).add(content_hash)
    if out.mine:
        # A fresh snapshot: a vector committed before our claim went in is visible now, and so is a
        # refusal another run recorded as it gave the text back.
        late = landed(conn, model, out.mine)
        refused = held(conn, model, out.mine - late)
        if late or refused:
            release(conn, model, run_id, late | refused)
            out.mine -= late | refused
            out.stored |= late
            out.held |= refused
    out.others = set(wanted) - out.mine - out.stored - out.held
    return out


def release(conn, model: str, run_id: int, hashes: Sequence[str] | set[str]) -> None:
    """Give up this run's claims of ``hashes`` (left pending: another run may embed them now)."""
    if hashes:
        conn.execute("DELETE FROM embedding_claims WHERE model = %s AND run_id = %s AND content_hash = ANY(%s::text[])",
                     (model, run_id, sorted(hashes)))


def release_run(conn, run_id: int) -> int:
    """Give up every claim of ``run_id`` (its embed step is over, whatever happened); the table
    truncated when no other run holds claims (staging.release: its emptied index pages go too)."""
    return staging.release(conn, "embedding_claims", run_id)


def held(conn, model: str, hashes: Sequence[str] | set[str]) -> set[str]:
    """Which of ``hashes`` are held back by an earlier refusal now (waiting for their retry, or given up)."""
    if not hashes:
        return set()
    return {row[0] for row in conn.execute(
        f"SELECT f.content_hash FROM embedding_failures f WHERE f.model = %s AND f.content_hash = ANY(%s::text[])"
        f" AND {_HELD}", (model, sorted(hashes))).fetchall()}


@dataclass(frozen=True)
class Refused:
    """A text whose vector was unusable, as ``refuse`` recorded it: its refusals in a row so far,
    and when it may be sent again (None: given up)."""
    content_hash: str
    failures: int
    retry_at: object  # datetime | None


def refuse(conn, model: str, run_id: int, refused: dict[str, tuple[str, str]], *, attempts: int,
           backoff_seconds: float, max_backoff_seconds: float) -> list[Refused]:
    """The provider answered ``refused`` (content hash -> (reason, message)) with vectors that cannot
    be stored: in one transaction, record a refusal of each (sql/021) and give this run's claims of
    them back. A text's n-th refusal in a row holds it back ``backoff_seconds`` x 2^(n-1) (at most
    ``max_backoff_seconds``); its ``attempts``-th gives it up (retry_at NULL): it is sent again only
    once its text changes (another content hash), or an operator deletes its row (``harvester
    embeddings invalidate``). Set-based, in content-hash order (no deadlock with another writer)."""
    if not refused:
        return []
    hashes = sorted(refused)
    params = {"model": model, "run": run_id, "hashes": hashes, "reasons": [refused[h][0] for h in hashes],
              "messages": [refused[h][1] for h in hashes], "attempts": int(attempts),
              "backoff": float(backoff_seconds), "max": float(max_backoff_seconds)}
    with conn.transaction():
        rows = conn.execute(
            """
            INSERT INTO embedding_failures AS f (content_hash, model, failures, reason, message, first_failed_at,
                                                 last_failed_at, retry_at, run_id)
            SELECT u.h, %(model)s, 1, u.reason, u.message, clock_timestamp(), clock_timestamp(),
                   CASE WHEN %(attempts)s <= 1 THEN NULL
                        ELSE clock_timestamp() + make_interval(secs => least(%(max)s, %(backoff)s)) END, %(run)s
            FROM unnest(%(hashes)s::text[], %(reasons)s::text[], %(messages)s::text[]) AS u(h, reason, message)
            ORDER BY u.h
            ON CONFLICT (content_hash, model) DO UPDATE SET
                failures = f.failures + 1, reason = EXCLUDED.reason, message = EXCLUDED.message,
                last_failed_at = EXCLUDED.last_failed_at, run_id = EXCLUDED.run_id,
                retry_at = CASE WHEN f.failures + 1 >= %(attempts)s THEN NULL
                                ELSE EXCLUDED.last_failed_at
                                     + make_interval(secs => least(%(max)s, %(backoff)s * 2 ^ f.failures)) END
            RETURNING f.content_hash, f.failures, f.retry_at
            """, params).fetchall()
        conn.execute("DELETE FROM embedding_claims WHERE model = %s AND run_id = %s AND content_hash = ANY(%s::text[])",
                     (model, run_id, hashes))
    return [Refused(h, int(n), retry_at) for h, n, retry_at in rows]


def landed(conn, model: str, hashes: Sequence[str] | set[str]) -> set[str]:
    """Which of ``hashes`` have a vector of ``model`` now."""
    if not hashes:
        return set()
    return {row[0] for row in conn.execute(
        "SELECT encode(content_hash, 'hex') FROM embeddings"
        f" WHERE model = {vectors.MODEL_ID} AND content_hash = ANY(%(keys)s::bytea[])",
        {"model": model, "keys": vectors.keys(sorted(hashes))}).fetchall()}


def prune(conn) -> int:
    """Forget claims that can no longer hold anyone up (expired, or their run is over)."""
    return conn.execute(
        "DELETE FROM embedding_claims c WHERE c.expires_at < clock_timestamp()"
        " OR NOT EXISTS (SELECT 1 FROM sync_runs r WHERE r.run_id = c.run_id AND r.status = 'running')").rowcount
