"""Duplicate groups in PostgreSQL (sql/018_duplicates.sql): each dataset's evidence keys, the groups
domain/duplicates.py works out from them, and operators' overrides.

A run's commit queues (``queue_run``, sql/022_duplicate_pending.sql) the datasets it created,
changed, re-identified, removed or restored (every dataset of a portal never scanned before); right
after the commit, in a transaction of its own, ``regroup_pending`` takes the whole queue (every
portal's), re-keys those datasets and regroups their neighbourhood: those datasets, the datasets
sharing a key with them, and every member of the groups any of these are in. A run that changed
nothing examines nothing. All SQL is set-based: one statement per step, whatever the number of
datasets.

Groups of several portals are written by one transaction at a time (an advisory lock), so two
groupings cannot split a group between them. The commit itself takes no such lock: a portal whose
grouping takes minutes (a first scan of a million datasets) never makes another portal's commit
wait, time out and roll back (bench/regroup_bench.py). Groups trail the commit by the grouping's
time; a grouping that cannot take the lock within its wait leaves the queue to the next one.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from harvester.domain import duplicates as dd
from harvester.store.db import LOCK_TIMEOUT_ENV, LockWaitTimeout, lock_timeout

log = logging.getLogger(__name__)

# Queued rows one grouping (one transaction) takes at most. A grouping's transaction holds back every
# CREATE INDEX CONCURRENTLY begun meanwhile (it waits for older transactions): four portals of
# 100,000 first-synced at once grouped 300,000 in one transaction of 754 s, and the model's HNSW
# build waited 714 s for it (bench/regroup_bench.py). 100,000 groups in tens of seconds.
GROUPING_CHUNK = 100_000
# Any constant: only grouping takes it.
_LOCK_KEY = 0x48445550  # "HDUP"
# A run that writes this many keys (or groups this many datasets) analyzes the table it wrote: about
# 0.1 s, against a plan gone wrong on stale statistics.
ANALYZE_AFTER = 10_000


class DuplicateError(LookupError):
    """An override names a dataset that does not exist, or a dataset with itself."""


GROUPING_WAIT_ENV = "HARVESTER_GROUPING_WAIT_SECS"


def grouping_wait(environ=None) -> float:
    """HARVESTER_GROUPING_WAIT_SECS: how long the grouping after a run's commit waits for another
    grouping to end before leaving its queue to the next one (a warning in the task log; the
    task does not fail). Default 600 s: a first scan of a million datasets groups in about 145 s."""
    from harvester.config.settings import SettingError, env_value
    from harvester.store.db import DatabaseConfigError

    try:
        return env_value(GROUPING_WAIT_ENV, environ)
    except SettingError as exc:
        raise DatabaseConfigError(str(exc)) from None


class GroupsBusy(LockWaitTimeout):
    """The groups' lock stayed held past the session's lock_timeout: nothing was changed (transient)."""


def lock(conn) -> None:
    """The groups' lock, until the caller's transaction ends (an operator's split, merge or forget,
    a purge): waits at most the session's lock_timeout (HARVESTER_LOCK_TIMEOUT_SECS), then GroupsBusy."""
    from psycopg import errors

    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
    except errors.LockNotAvailable:
        raise GroupsBusy(f"a duplicate grouping held the groups' lock for more than {lock_timeout():g}s "
                         f"({LOCK_TIMEOUT_ENV}; a first scan of a large portal groups for minutes): nothing was "
                         "changed, try again when it ends") from None


# -- keys ------------------------------------------------------------------------------------------
def refresh_keys(conn) -> int:
    """Rewrite the evidence keys of the datasets of the scope (``_scope``) from their rows; returns
    the keys written."""
    conn.execute(f"DELETE FROM dataset_keys WHERE dataset_id IN (SELECT id FROM {SCOPE})")
    cur = conn.execute(
        f"""
        INSERT INTO dataset_keys (dataset_id, key, portal_url, evidence, claimed, live)
        SELECT k.dataset_id, k.key, d.portal_url, k.evidence, k.claimed, d.removed_at IS NULL
        FROM harvester_keys_of(ARRAY(SELECT id FROM {SCOPE})) k JOIN datasets d ON d.id = k.dataset_id
        """)
    return cur.rowcount


# -- the scope: the datasets a regrouping examines, kept in PostgreSQL ------------------------------
# A portal's first scan examines all its datasets: a million ids held in this process (and sent back
# and forth as arrays) took the upsert from 360 to 728 MB (bench/scale_bench.py). They stay in a
# temporary table of the transaction instead; only what has a link comes here.
SCOPE = "harvester_duplicate_scope"


def _scope(conn) -> None:
    """An empty scope table for the caller's transaction (dropped at its end)."""
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status == TransactionStatus.IDLE:  # no transaction open
        raise RuntimeError("duplicate grouping runs inside the caller's transaction (it holds the lock)")
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {SCOPE} (id bigint PRIMARY KEY) ON COMMIT DROP")
    conn.execute(f"TRUNCATE {SCOPE}")


def _scope_add(conn, select: str, params: dict | None = None) -> int:
    """Add the ids ``select`` returns to the scope; returns how many were new."""
    return conn.execute(f"INSERT INTO {SCOPE} (id) {select} ON CONFLICT DO NOTHING", params or {}).rowcount


def _analyze_scope(conn, added: int) -> None:
    if added >= ANALYZE_AFTER:  # temporary tables get no statistics of their own: the joins need them
        conn.execute(f"ANALYZE {SCOPE}")


def queue_run(conn, run_id: int, portal_url: str) -> int:
    """Inside a run's commit transaction: queue for grouping the datasets the run touched (its change
    rows: new, edits, removals, restores; and its staged created / updated / re-identified records,
    a hash change no change row shows), or every dataset of a portal never scanned (marking it
    scanned). Takes no lock and waits for no grouping. Returns how many rows were queued."""
    first = conn.execute(
        "INSERT INTO duplicate_scans (portal_url) VALUES (%s) ON CONFLICT DO NOTHING", (portal_url,)).rowcount
    if first:
        return conn.execute("INSERT INTO duplicate_pending (dataset_id) SELECT id FROM datasets WHERE portal_url = %s",
                            (portal_url,)).rowcount
    return conn.execute("""
        INSERT INTO duplicate_pending (dataset_id)
        SELECT dataset_id FROM dataset_changes WHERE run_id = %(run)s
        UNION
        SELECT d.id FROM staging_records s JOIN datasets d ON d.portal_url = %(portal)s AND d.source_id = s.source_id
        WHERE s.run_id = %(run)s AND s.outcome IN ('created', 'updated', 'reidentified')
        """, {"run": run_id, "portal": portal_url}).rowcount


def waiting(conn) -> int:
    """Datasets queued for grouping and not yet grouped."""
    return conn.execute("SELECT count(DISTINCT dataset_id) FROM duplicate_pending").fetchone()[0]


# -- grouping --------------------------------------------------------------------------------------
def _neighbourhood(conn, ids: list[int] | None = None) -> int:
    """Into the scope: ``ids`` (None: the scope itself), the datasets sharing a key with them, and
    the members of all their groups; returns how many were new."""
    seed = f"SELECT id FROM {SCOPE}" if ids is None else "SELECT unnest(%(ids)s::bigint[]) AS id"
    return conn.execute(
        f"""
        WITH seed AS MATERIALIZED ({seed}),
        near AS (
            SELECT id FROM seed
            UNION
            SELECT o.dataset_id FROM dataset_keys k JOIN seed ON k.dataset_id = seed.id
            JOIN dataset_keys o ON o.key = k.key AND o.portal_url <> k.portal_url
        )
        INSERT INTO {SCOPE} (id)
        SELECT id FROM near
        UNION
        SELECT m2.dataset_id FROM near JOIN duplicate_members m ON m.dataset_id = near.id
        JOIN duplicate_members m2 ON m2.group_id = m.group_id
        ON CONFLICT DO NOTHING
        """, {"ids": ids}).rowcount


def _edges(conn) -> list[dd.Edge]:
    """Evidence edges between datasets of the scope (of different portals), leaving out keys that
    two live datasets of one portal hold."""
    rows = conn.execute(
        f"""
        WITH k AS MATERIALIZED (SELECT dk.* FROM dataset_keys dk JOIN {SCOPE} l ON dk.dataset_id = l.id),
        ambiguous AS (
            SELECT o.key FROM dataset_keys o WHERE o.key IN (SELECT key FROM k) AND o.live
            GROUP BY o.key, o.portal_url HAVING count(*) > 1
        )
        SELECT a.dataset_id, b.dataset_id, a.evidence, b.evidence, a.claimed, b.claimed
        FROM k a JOIN k b ON b.key = a.key AND b.portal_url <> a.portal_url AND a.dataset_id < b.dataset_id
        WHERE a.key NOT IN (SELECT key FROM ambiguous)
        """).fetchall()
    edges = []
    for a, b, ev_a, ev_b, claimed_a, claimed_b in rows:
        evidence = min((ev_a, ev_b), key=dd.EVIDENCE.index)
        copy = a if claimed_a and not claimed_b else b if claimed_b and not claimed_a else None
        edges.append(dd.Edge(a, b, evidence, copy))
    return edges


def _members(conn, ids: list[int]) -> dict[int, dd.Member]:
    rows = conn.execute("SELECT id, portal_url, first_seen_at, removed_at IS NULL FROM datasets WHERE id = ANY(%s)",
                        (ids,)).fetchall()
    return {r[0]: dd.Member(*r) for r in rows}


def _overrides(conn) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Operators' decisions about datasets of the scope: (same pairs, different pairs)."""
    rows = conn.execute(f"SELECT a, b, decision FROM duplicate_overrides WHERE a IN (SELECT id FROM {SCOPE})"
                        f" OR b IN (SELECT id FROM {SCOPE})").fetchall()
    return [(a, b) for a, b, d in rows if d == "same"], [(a, b) for a, b, d in rows if d == "different"]


def _expand(conn) -> None:
    """The scope grown to its neighbourhood, plus the datasets operators tied to it ('same') and
    their neighbourhoods, until nothing more is tied."""
    _analyze_scope(conn, _neighbourhood(conn))
    while True:
        same, _ = _overrides(conn)
        more = [r[0] for r in conn.execute(
            f"SELECT u.id FROM unnest(%s::bigint[]) u(id) WHERE NOT EXISTS (SELECT 1 FROM {SCOPE} s WHERE s.id = u.id)",
            (sorted({i for pair in same for i in pair}),))]
        if not more:
            return
        _neighbourhood(conn, more)


def regroup(conn, ids: list[int]) -> dict:
    """Regroup the neighbourhood of ``ids`` (inside the caller's transaction, which holds ``lock``).
    Group ids are kept: a group keeps the id most of its members had."""
    _scope(conn)
    if not _scope_add(conn, "SELECT unnest(%(ids)s::bigint[])", {"ids": list(ids)}):
        return {"examined": 0, "groups": 0, "grouped": 0}
    return _regroup_scope(conn)


def _regroup_scope(conn) -> dict:
    """Regroup the neighbourhood of the scope's datasets."""
    _expand(conn)
    same, different = _overrides(conn)
    edges = _edges(conn)
    # only datasets with a link (or an operator's 'same') can be grouped: the others of the scope are
    # alone, and a portal's first scan with no other portal holds none in memory
    linked = sorted({i for e in edges for i in (e.a, e.b)} | {i for pair in same for i in pair})
    grouping = dd.group(_members(conn, linked), edges, same, different)
    # the groups the linked datasets were in (the scope's others are in none after this)
    old = dict(conn.execute("SELECT dataset_id, group_id FROM duplicate_members WHERE dataset_id = ANY(%s)",
                            (linked,)).fetchall())
    ids_of_groups, taken = [], set()
    for group_members in grouping.groups:
        votes: dict[int, int] = {}
        for i in group_members:
            if i in old:
                votes[old[i]] = votes.get(old[i], 0) + 1
        choice = next((g for g, _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0])) if g not in taken), None)
        ids_of_groups.append(choice)
        if choice is not None:
            taken.add(choice)
    fresh = sum(1 for g in ids_of_groups if g is None)
    if fresh:
        new_ids = iter(r[0] for r in conn.execute(
            "SELECT nextval('duplicate_group_ids') FROM generate_series(1, %s)", (fresh,)).fetchall())
        ids_of_groups = [g if g is not None else next(new_ids) for g in ids_of_groups]
    conn.execute(f"DELETE FROM duplicate_members WHERE dataset_id IN (SELECT id FROM {SCOPE})")
    if grouping.members:
        m = grouping.members
        conn.execute(
            """
            INSERT INTO duplicate_members (dataset_id, group_id, portal_url, is_canonical, evidence, confidence,
                                           matched_id, copy_of)
            SELECT u.id, u.g, d.portal_url, u.canonical, u.evidence, u.confidence, u.matched, u.copy_of
            FROM unnest(%s::bigint[], %s::bigint[], %s::boolean[], %s::text[], %s::real[], %s::bigint[],
                        %s::boolean[]) AS u(id, g, canonical, evidence, confidence, matched, copy_of)
            JOIN datasets d ON d.id = u.id
            """, ([x.dataset_id for x in m], [ids_of_groups[x.group] for x in m], [x.is_canonical for x in m],
                  [x.evidence for x in m], [x.confidence for x in m], [x.matched_id for x in m],
                  [x.copy_of for x in m]))
    examined = conn.execute(f"SELECT count(*) FROM {SCOPE}").fetchone()[0]
    return {"examined": examined, "groups": len(grouping.groups), "grouped": len(grouping.members)}


class GroupingDeferred(RuntimeError):
    """The groups' lock stayed held past the grouping's wait: the queue is left to the next grouping."""


def regroup_pending(conn, *, wait: float, chunk: int | None = None, until: float | None = None) -> dict:
    """Group what is queued (every portal's), ``chunk`` queued rows at a time (GROUPING_CHUNK), each
    chunk in a transaction of its own under the groups' lock, until the queue is empty or
    ``until`` (a time.monotonic() value) has passed. The first chunk waits at most ``wait`` seconds
    for the lock (GroupingDeferred past that: the queue stays); a later chunk that finds the lock
    taken leaves the rest to that grouping. The chunk bounds a grouping's memory and lock time
    (every portal re-keyed at once after an upgrade is one queue); it is correct in any cut, since
    each chunk re-keys its datasets and regroups around them with every key already written.
    Returns the chunks' figures added up, with ``chunks``, ``left`` (rows queued after the last
    chunk) and ``stopped`` (None: the queue was empty at the last take; "deadline"; "taken over")."""
    chunk = chunk or GROUPING_CHUNK
    total = {"examined": 0, "groups": 0, "grouped": 0, "touched": 0, "keys": 0, "waited": 0.0, "seconds": 0.0,
             "chunks": 0, "left": 0, "stopped": None}
    while True:
        try:
            out = _regroup_chunk(conn, wait, chunk)
        except GroupingDeferred:
            if not total["chunks"]:
                raise
            total["stopped"] = "taken over"  # another grouping has the lock: it takes the rest of the queue
            break
        total["chunks"] += 1
        for key in ("examined", "groups", "grouped", "touched", "keys", "waited", "seconds"):
            total[key] += out[key]
        if out["taken"] < chunk:
            break
        if until is not None and time.monotonic() >= until:
            total["stopped"] = "deadline"
            break
    total["left"] = conn.execute("SELECT count(*) FROM duplicate_pending").fetchone()[0]
    total["waited"], total["seconds"] = round(total["waited"], 3), round(total["seconds"], 3)
    return total


def _regroup_chunk(conn, wait: float, chunk: int) -> dict:
    """One grouping: up to ``chunk`` queued rows taken, in a transaction of its own under the groups'
    lock, waiting at most ``wait`` seconds for it. The queue's ids stay in PostgreSQL (the scope
    table): a first scan of a million datasets costs this process no more memory than a run that
    changed ten."""
    from psycopg import errors

    started = time.perf_counter()
    locked = False
    try:
        with conn.transaction():
            before = conn.execute("SELECT current_setting('lock_timeout')").fetchone()[0]
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(wait * 1000))}ms",))
            # (the comment names the statement in pg_stat_activity: bench/regroup_bench.py)
            conn.execute("SELECT pg_advisory_xact_lock(%s) /* grouping after commit */", (_LOCK_KEY,))
            locked = True
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (before,))
            waited = time.perf_counter() - started
            _scope(conn)
            # Rows queued by commits after this statement stay for the next grouping.
            taken, touched = conn.execute(f"""
                WITH taken AS (
                    DELETE FROM duplicate_pending
                    WHERE ctid = ANY(ARRAY(SELECT ctid FROM duplicate_pending LIMIT %s))
                    RETURNING dataset_id),
                added AS (
                    INSERT INTO {SCOPE} (id)
                    SELECT DISTINCT t.dataset_id FROM taken t JOIN datasets d ON d.id = t.dataset_id
                    ON CONFLICT DO NOTHING RETURNING id)
                SELECT (SELECT count(*) FROM taken), (SELECT count(*) FROM added)
                """, (chunk,)).fetchone()
            if not touched:
                return {"examined": 0, "groups": 0, "grouped": 0, "touched": 0, "keys": 0, "taken": taken,
                        "waited": waited, "seconds": time.perf_counter() - started}
            _analyze_scope(conn, touched)
            keys = refresh_keys(conn)
            if keys >= ANALYZE_AFTER:
                # Fresh statistics before the self-joins on dataset_keys: without them (a new or
                # migrated database, a first scan) PostgreSQL plans a nested loop over every key per
                # dataset, and a 100,000-dataset first scan never ends; with them, hash joins
                # (bench/duplicates_bench.py).
                conn.execute("ANALYZE dataset_keys")
            out = _regroup_scope(conn)
            if out["grouped"] >= ANALYZE_AFTER:
                conn.execute("ANALYZE duplicate_members")
    except errors.LockNotAvailable as exc:
        why = (f"a statement waited more than {before} for a lock another session holds ({str(exc).strip()})"
               if locked else f"another grouping held the duplicate groups' lock for more than {wait:g}s")
        raise GroupingDeferred(
            f"{why}: this run's datasets stay queued (the grouping under way takes what was queued when it "
            "began); the next run of any portal groups them, or `harvester duplicates regroup`") from None
    out.update(touched=touched, keys=keys, taken=taken, waited=waited, seconds=time.perf_counter() - started)
    return out


def regroup_run(conn, run_id: int, portal_url: str, *, wait: float = 30.0) -> dict:
    """Queue what a run touched and group the queue at once (tests, benches, a run's commit when
    nothing else runs): ``queue_run`` in a transaction of its own, then ``regroup_pending``."""
    with conn.transaction():
        queue_run(conn, run_id, portal_url)
    return regroup_pending(conn, wait=wait)


# -- overrides -------------------------------------------------------------------------------------
def _pair(a: int, b: int) -> tuple[int, int]:
    if a == b:
        raise DuplicateError(f"dataset {a} cannot be a duplicate of itself")
    return (a, b) if a < b else (b, a)


def _require(conn, ids: list[int]) -> None:
    found = {r[0] for r in conn.execute("SELECT id FROM datasets WHERE id = ANY(%s)", (ids,))}
    missing = sorted(set(ids) - found)
    if missing:
        raise DuplicateError(f"no dataset with id {', '.join(map(str, missing))}")


def _decide(conn, pairs: list[tuple[int, int]], decision: str, by: str, note: str | None) -> None:
    conn.execute(
        """
        INSERT INTO duplicate_overrides (a, b, decision, decided_by, note)
        SELECT a, b, %s, %s, %s FROM unnest(%s::bigint[], %s::bigint[]) AS u(a, b)
        ON CONFLICT (a, b) DO UPDATE SET decision = EXCLUDED.decision, decided_by = EXCLUDED.decided_by,
                                         decided_at = now(), note = EXCLUDED.note
        """, (decision, by, note, [p[0] for p in pairs], [p[1] for p in pairs]))


def split(conn, dataset_id: int, *, by: str, note: str | None = None, from_ids: list[int] | None = None) -> dict:
    """Take ``dataset_id`` out of its group (or only apart from ``from_ids``): an override
    'different' with each other member, kept across runs. Returns the dataset's group afterwards."""
    with conn.transaction():
        lock(conn)
        _require(conn, [dataset_id] + list(from_ids or []))
        others = list(from_ids) if from_ids else [r[0] for r in conn.execute(
            "SELECT m2.dataset_id FROM duplicate_members m JOIN duplicate_members m2 ON m2.group_id = m.group_id"
            " WHERE m.dataset_id = %s AND m2.dataset_id <> m.dataset_id", (dataset_id,))]
        if not others:
            raise DuplicateError(f"dataset {dataset_id} is in no duplicate group")
        _decide(conn, [_pair(dataset_id, o) for o in others], "different", by, note)
        regroup(conn, [dataset_id] + others)
    return group_of(conn, dataset_id)


def merge(conn, dataset_id: int, other_id: int, *, by: str, note: str | None = None) -> dict:
    """Put two datasets in one group: an override 'same', kept across runs."""
    with conn.transaction():
        lock(conn)
        pair = _pair(dataset_id, other_id)
        _require(conn, list(pair))
        _decide(conn, [pair], "same", by, note)
        regroup(conn, list(pair))
    return group_of(conn, dataset_id)


def forget(conn, dataset_id: int) -> int:
    """Drop every override about ``dataset_id``; the evidence alone decides again. Returns how many."""
    with conn.transaction():
        lock(conn)
        _require(conn, [dataset_id])
        pairs = conn.execute("DELETE FROM duplicate_overrides WHERE a = %(id)s OR b = %(id)s RETURNING a, b",
                             {"id": dataset_id}).fetchall()
        regroup(conn, sorted({dataset_id} | {i for p in pairs for i in p}))
    return len(pairs)


def portals_concerned(conn, dataset_id: int, *, others: list[int] = (), group: bool = False,
                      overrides: bool = False) -> dict[str, str | None]:
    """The portals of the datasets an override operation about ``dataset_id`` decides about, portal
    url -> the name its runs recorded (None when none): the dataset's own and ``others``' (a merge's
    other dataset, a split's ``from_ids``); with ``group``, every other member of its group (a split
    from all of them writes a decision with each); with ``overrides``, every dataset an override
    about it names (``forget`` drops those decisions). Ask inside the transaction that holds
    ``lock`` and makes the change: the group cannot change in between."""
    rows = conn.execute(
        """
        WITH ids AS (
            SELECT unnest(%(ids)s::bigint[]) AS id
            UNION
            SELECT m2.dataset_id FROM duplicate_members m JOIN duplicate_members m2 ON m2.group_id = m.group_id
            WHERE %(group)s AND m.dataset_id = %(id)s
            UNION
            SELECT CASE WHEN o.a = %(id)s THEN o.b ELSE o.a END FROM duplicate_overrides o
            WHERE %(overrides)s AND (o.a = %(id)s OR o.b = %(id)s)
        )
        SELECT DISTINCT d.portal_url, p.portal_name FROM ids JOIN datasets d ON d.id = ids.id
        LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
        """, {"ids": [dataset_id, *others], "id": dataset_id, "group": group, "overrides": overrides}).fetchall()
    return dict(rows)


# -- reading ---------------------------------------------------------------------------------------
_MEMBER_COLUMNS = """d.id, d.portal_url, coalesce(p.portal_name, d.portal_url), d.source_id, d.title, d.url,
                     d.removed_at, m.is_canonical, m.evidence, m.confidence, m.matched_id, m.copy_of, m.group_id"""


def _member_dict(row: tuple) -> dict:
    return {"dataset_id": row[0], "portal_url": row[1], "portal_name": row[2], "source_id": row[3], "title": row[4],
            "url": row[5], "live": row[6] is None, "removed_at": row[6], "is_canonical": row[7],
            "evidence": row[8], "confidence": round(float(row[9]), 2), "matched_id": row[10], "copy_of": row[11]}


def group_of(conn, dataset_id: int) -> dict:
    """The group of a dataset: {group_id, members: [...] canonical first}; group_id None when alone.
    Each member also lists the operators' overrides about it."""
    rows = conn.execute(
        f"""
        SELECT {_MEMBER_COLUMNS}
        FROM duplicate_members me JOIN duplicate_members m ON m.group_id = me.group_id
        JOIN datasets d ON d.id = m.dataset_id
        LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
        WHERE me.dataset_id = %s
        ORDER BY m.is_canonical DESC, d.removed_at IS NOT NULL, d.first_seen_at, d.id
        """, (dataset_id,)).fetchall()
    overrides = [{"a": a, "b": b, "decision": d, "decided_by": by, "decided_at": at, "note": note}
                 for a, b, d, by, at, note in conn.execute(
                     "SELECT a, b, decision, decided_by, decided_at, note FROM duplicate_overrides"
                     " WHERE a = %(id)s OR b = %(id)s ORDER BY decided_at, a, b", {"id": dataset_id})]
    return {"dataset_id": dataset_id, "group_id": rows[0][12] if rows else None,
            "members": [_member_dict(r) for r in rows], "overrides": overrides}


def any_groups(conn) -> bool:
    """Whether any dataset is in a duplicate group (one index probe)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM duplicate_members)").fetchone()[0]


def groups_for(conn, ids: list[int]) -> dict[int, dict]:
    """For search: each dataset of ``ids`` that is in a group -> {group_id, canonical_id, members:
    [live members as dicts, canonical first]}."""
    if not ids:
        return {}
    rows = conn.execute(
        f"""
        SELECT me.dataset_id, {_MEMBER_COLUMNS}
        FROM duplicate_members me JOIN duplicate_members m ON m.group_id = me.group_id
        JOIN datasets d ON d.id = m.dataset_id
        LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
        WHERE me.dataset_id = ANY(%s)
        ORDER BY me.dataset_id, m.is_canonical DESC, d.removed_at IS NOT NULL, d.first_seen_at, d.id
        """, (ids,)).fetchall()
    out: dict[int, dict] = {}
    for row in rows:
        entry = out.setdefault(row[0], {"group_id": row[13], "canonical_id": None, "members": []})
        member = _member_dict(row[1:])
        if member["is_canonical"]:
            entry["canonical_id"] = member["dataset_id"]
        entry["members"].append(member)
    return out


def portal_copies(conn, portal_url: str) -> dict:
    """How many of a portal's live datasets are copies of other portals' (by the canonical member's
    portal), and how many of its datasets other portals copy."""
    copies = conn.execute(
        """
        SELECT c.portal_url, coalesce(p.portal_name, c.portal_url), count(*)
        FROM duplicate_members m
        JOIN datasets d ON d.id = m.dataset_id AND d.removed_at IS NULL
        JOIN duplicate_members c ON c.group_id = m.group_id AND c.is_canonical
        LEFT JOIN portal_sync_status p ON p.portal_url = c.portal_url
        WHERE m.portal_url = %s AND NOT m.is_canonical
        GROUP BY 1, 2 ORDER BY 3 DESC, 2
        """, (portal_url,)).fetchall()
    copied = conn.execute(
        """
        SELECT m.portal_url, coalesce(p.portal_name, m.portal_url), count(DISTINCT c.dataset_id)
        FROM duplicate_members c
        JOIN duplicate_members m ON m.group_id = c.group_id AND NOT m.is_canonical
        JOIN datasets d ON d.id = m.dataset_id AND d.removed_at IS NULL
        LEFT JOIN portal_sync_status p ON p.portal_url = m.portal_url
        WHERE c.portal_url = %s AND c.is_canonical
        GROUP BY 1, 2 ORDER BY 3 DESC, 2
        """, (portal_url,)).fetchall()
    return {"copies_of": [{"portal_url": u, "portal_name": n, "datasets": c} for u, n, c in copies],
            "copied_by": [{"portal_url": u, "portal_name": n, "datasets": c} for u, n, c in copied],
            "copies": sum(c for _, _, c in copies)}


def list_groups(conn, portal_url: str | None = None, *, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
    """Groups (with a member on ``portal_url``), largest and newest first, and how many there are."""
    where = "WHERE group_id IN (SELECT group_id FROM duplicate_members WHERE portal_url = %(portal)s)" \
        if portal_url else ""
    total = conn.execute(f"SELECT count(DISTINCT group_id) FROM duplicate_members {where}",
                         {"portal": portal_url}).fetchone()[0]
    rows = conn.execute(
        f"""
        WITH g AS (
            SELECT group_id, count(*) AS members, max(grouped_at) AS grouped_at FROM duplicate_members {where}
            GROUP BY group_id ORDER BY members DESC, grouped_at DESC, group_id LIMIT %(limit)s OFFSET %(offset)s
        )
        SELECT g.group_id, g.members, {_MEMBER_COLUMNS}
        FROM g JOIN duplicate_members m ON m.group_id = g.group_id
        JOIN datasets d ON d.id = m.dataset_id
        LEFT JOIN portal_sync_status p ON p.portal_url = d.portal_url
        ORDER BY g.members DESC, g.grouped_at DESC, g.group_id, m.is_canonical DESC, d.first_seen_at, d.id
        """, {"portal": portal_url, "limit": limit, "offset": offset}).fetchall()
    groups: dict[int, dict] = {}
    for row in rows:
        groups.setdefault(row[0], {"group_id": row[0], "members": []})["members"].append(_member_dict(row[2:]))
    return list(groups.values()), total


def find_dataset_id(conn, portal_url: str, source_id: str) -> int:
    row = conn.execute("SELECT id FROM datasets WHERE portal_url = %s AND source_id = %s",
                       (portal_url, source_id)).fetchone()
    if row is None:
        raise DuplicateError(f"no dataset {source_id!r} on {portal_url}")
    return row[0]


@dataclass(frozen=True)
class Summary:
    groups: int
    grouped: int


def summary(conn) -> Summary:
    row = conn.execute("SELECT count(DISTINCT group_id), count(*) FROM duplicate_members").fetchone()
    return Summary(row[0], row[1])
