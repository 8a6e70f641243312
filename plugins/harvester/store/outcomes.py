"""Per-record outcomes (sql/017): what became of every record a run could not take as it is.

Written set-based, from what the run already holds in PostgreSQL: the staged records' problems
(``staging_records.problems``, written by the COPY that stages them), the datasets whose text has
no vector after the merge, the datasets the removal guard kept. Never one statement per record.

Which rows a run writes:

- every Failed record's errors, on every run that meets the record (it is still not stored: the
  latest run's report is the catalogue's state);
- the warnings of the records the run takes in (created, updated, re-identified): a record that
  did not change was reported when it did, so a second run of the same catalogue does not report
  its warnings again;
- ``embedding-deferred`` for a stored dataset whose new text has no vector yet, ``embedding-refused``
  when that is because the provider answered an unusable vector for it (embedding_failures, sql/021);
- ``removal-withheld`` for a dataset the portal no longer lists when the removal guard tripped.

A step that runs again (a retried task) replaces its own rows: nothing is counted twice. Rows are
kept ``HARVESTER_OUTCOMES_KEEP_DAYS``: each run deletes its portal's older rows (``expire``, in
``record_warnings``), and so does ``harvester purge`` (``prune``).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterator

from harvester.config.secrets import redact_url
from harvester.domain import outcomes as oc
from harvester.store import vectors

_STAGED = (oc.PARSE, oc.VALIDATE)
ROW_COLUMNS = ("run_id", "portal_url", "position", "source_id", "ordinal", "stage", "severity", "code", "field",
               "value", "message", "recorded_at")
# Listing order: a record's place in the listing, then its problems in the order found; rows of
# datasets that were not listed (embed, remove) after, by id.
_ORDER = "position NULLS LAST, source_id, ordinal"


def record_errors(conn, run_id: int, portal_url: str) -> int:
    """The Failed staged records' errors as the run's rows (parse and validate stages), replacing
    the errors this run wrote before (a retried step, a reconciliation that staged more records);
    returns how many."""
    return _record_staged(conn, run_id, portal_url, "error", "s.error IS NOT NULL")


def record_warnings(conn, run_id: int, portal_url: str, keep: timedelta | None = None) -> int:
    """Once the staged records are classified (hash_compare): the warnings of those the run takes
    in (created, updated, re-identified), replacing the warnings this run wrote before; returns
    how many. The portal's rows older than ``keep`` (default: HARVESTER_OUTCOMES_KEEP_DAYS) go
    (``expire``)."""
    written = _record_staged(conn, run_id, portal_url, "warning",
                             "s.error IS NULL AND s.outcome IN ('created', 'updated', 'reidentified')")
    expire(conn, portal_url, keep)
    return written


def expire(conn, portal_url: str, keep: timedelta | None = None) -> int:
    """Delete the portal's rows recorded more than ``keep`` ago (default: HARVESTER_OUTCOMES_KEEP_DAYS);
    returns how many. Every run does it (record_warnings), so the table holds the retention's runs
    and no more: a full sync records its failed records' errors again each time, and without this
    only `harvester purge` deleted them (issue 40: no table that grows without bound)."""
    if keep is None:
        from harvester.config.settings import report_settings

        keep = report_settings().keep
    return prune(conn, portal_url, datetime.now(timezone.utc) - keep)


def _record_staged(conn, run_id: int, portal_url: str, severity: str, records: str) -> int:
    params = {"run": run_id, "portal": portal_url, "severity": severity}
    with conn.transaction():
        conn.execute("DELETE FROM record_outcomes WHERE run_id = %(run)s AND stage IN ('parse', 'validate')"
                     " AND severity = %(severity)s", params)
        return conn.execute(
            f"""
            INSERT INTO record_outcomes (run_id, portal_url, position, source_id, ordinal, stage, severity, code,
                                         field, value, message)
            SELECT s.run_id, %(portal)s, s.seq + 1, s.source_id, (p.n - 1)::smallint, p.item->>'stage',
                   p.item->>'severity', p.item->>'code', p.item->>'field', p.item->>'value', p.item->>'message'
            FROM staging_records s
            CROSS JOIN LATERAL jsonb_array_elements(s.problems) WITH ORDINALITY AS p(item, n)
            WHERE s.run_id = %(run)s AND s.problems IS NOT NULL AND {records}
              AND p.item->>'severity' = %(severity)s
            """, params).rowcount


def record_deferred(conn, run_id: int, portal_url: str, model: str) -> int:
    """Inside the upsert's transaction, after the merge linked vectors: a row for every dataset the
    run took in whose new text has no vector of ``model``: ``embedding-refused`` when the provider
    answered an unusable vector for that text (its refusal in embedding_failures: what was wrong, the
    refusals in a row, when a run sends it again or that it was given up), ``embedding-deferred``
    otherwise (not embedded yet); returns how many (the run's ``skipped``). Then an
    ``embedding-refused`` row for every other live dataset of the portal whose text this run sent
    again and had refused once more (an unchanged record, retried after its backoff: its refusals
    grow, and the run that gives it up says so). Two statements, whatever the number of datasets."""
    params = {"run": run_id, "portal": portal_url, "model": model, "message": _deferred_message(model)}
    conn.execute("DELETE FROM record_outcomes WHERE run_id = %(run)s AND stage = 'embed'", params)
    skipped = conn.execute(
        f"""
        INSERT INTO record_outcomes (run_id, portal_url, position, source_id, stage, severity, code, field, message)
        SELECT s.run_id, %(portal)s, s.seq + 1, s.source_id, 'embed', 'warning',
               CASE WHEN f.content_hash IS NULL THEN 'embedding-deferred' ELSE 'embedding-refused' END, 'text',
               CASE WHEN f.content_hash IS NULL THEN %(message)s ELSE {_refused_message('s')} END
        FROM staging_records s
        LEFT JOIN embedding_failures f ON f.content_hash = s.content_hash AND f.model = %(model)s
        WHERE s.run_id = %(run)s AND {_TAKEN_IN}
          AND NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.content_hash = decode(s.content_hash, 'hex')
                            AND e.model = {vectors.MODEL_ID})
        """, params).rowcount
    conn.execute(
        f"""
        INSERT INTO record_outcomes (run_id, portal_url, position, source_id, stage, severity, code, field, message)
        SELECT %(run)s, d.portal_url, s.seq + 1, d.source_id, 'embed', 'warning', 'embedding-refused', 'text',
               {_refused_message('d')}
        FROM embedding_failures f
        JOIN datasets d ON d.content_hash = f.content_hash AND d.portal_url = %(portal)s AND d.removed_at IS NULL
        LEFT JOIN staging_records s ON s.run_id = %(run)s AND s.source_id = d.source_id
        WHERE f.model = %(model)s AND f.run_id = %(run)s AND NOT coalesce({_TAKEN_IN}, false)
        """, params)
    return skipped


# A staged record the run took in with a new text (the first statement's rows).
_TAKEN_IN = "s.outcome IN ('created', 'updated') AND s.content_changed"


def _deferred_message(model: str) -> str:
    return (f"stored without a vector of {model} (the embedding provider was unavailable, or the run's embedding "
            "budget ran out); the next run embeds it")


def _refused_message(record: str) -> str:
    """An embedding-refused row's message, as SQL over the text's refusal ``f`` (sql/021) and its
    dataset or staged record (alias ``record``): f.message names the provider, the model, what was
    wrong and the run that sent it (embeddings/batching.py); then the refusals in a row, and when a
    run sends the text again or that it was given up, with the command that resets it."""
    return f"""
    'stored without a vector: ' || f.message || '; refused ' || f.failures
    || CASE WHEN f.failures = 1 THEN ' time' ELSE ' times' END || ' in a row; '
    || CASE WHEN f.retry_at IS NULL
            THEN 'given up: sent again only once its text changes, or after `harvester embeddings invalidate '
                 || '--dataset ' || {record}.source_id || '` resets it'
            ELSE 'sent again, alone in its request, by the first run after '
                 || to_char(f.retry_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC' END"""


def record_withheld(conn, run_id: int, portal_url: str, gone_where: str, params: dict, message: str) -> int:
    """Inside the upsert's transaction: a ``removal-withheld`` row for every dataset that
    ``gone_where`` (a condition on ``datasets d`` over ``params``, store/history.apply_removals)
    finds gone, when the guard kept them; returns how many."""
    conn.execute("DELETE FROM record_outcomes WHERE run_id = %(run)s AND stage = 'remove'", {"run": run_id})
    return conn.execute(
        f"""
        INSERT INTO record_outcomes (run_id, portal_url, source_id, stage, severity, code, message)
        SELECT %(outcome_run)s, d.portal_url, d.source_id, 'remove', 'warning', 'removal-withheld', %(outcome_message)s
        FROM datasets d WHERE {gone_where}
        """, {**params, "outcome_run": run_id, "outcome_message": message}).rowcount


# -- reading ------------------------------------------------------------------------------------
def _filters(run_id: int, severity: str | None, code: str | None) -> tuple[str, dict]:
    where, params = ["run_id = %(run)s"], {"run": run_id}
    if severity is not None:
        if severity not in oc.SEVERITIES:
            raise ValueError(f"severity {severity!r} is not one of {', '.join(oc.SEVERITIES)}")
        where.append("severity = %(severity)s")
        params["severity"] = severity
    if code is not None:
        if code not in oc.CODES:
            raise ValueError(f"{code!r} is not a reason code (the list: {', '.join(oc.CODES)})")
        where.append("code = %(code)s")
        params["code"] = code
    return " AND ".join(where), params


def groups(conn, run_id: int, *, severity: str | None = None) -> list[dict]:
    """The run's rows grouped by reason code (``domain.outcomes.Group.as_dict()``, in
    ``group_order``): the count, the first records' labels and the first row's message, the same
    groups ``domain.outcomes.group`` makes of the rows in listing order. One statement."""
    where, params = _filters(run_id, severity, None)
    rows = conn.execute(
        f"""
        SELECT g.code, g.severity, g.stage, g.n, ex.rows
        FROM (SELECT code, severity, min(stage) AS stage, count(*) AS n FROM record_outcomes
              WHERE {where} GROUP BY code, severity) g
        CROSS JOIN LATERAL (
            SELECT json_agg(json_build_object('source_id', x.source_id, 'position', x.position,
                                              'message', x.message) ORDER BY x.k) AS rows
            FROM (SELECT source_id, position, message,
                         row_number() OVER (ORDER BY {_ORDER}) AS k
                  FROM record_outcomes o
                  WHERE o.run_id = %(run)s AND o.severity = g.severity AND o.code = g.code
                  ORDER BY {_ORDER} LIMIT %(sample)s) x
        ) ex
        """, {**params, "sample": oc.EXAMPLES * 8}).fetchall()
    out = []
    for code, sev, stage, n, sample in rows:
        examples: list[str] = []
        for item in sample or []:
            label = oc.record_label(item["source_id"], item["position"])
            if label not in examples and len(examples) < oc.EXAMPLES:
                examples.append(label)
        out.append(oc.Group(code, sev, stage, int(n), examples, sample[0]["message"] if sample else "").as_dict())
    return sorted(out, key=oc.group_order)


def page(conn, run_id: int, *, severity: str | None = None, code: str | None = None, limit: int = 50,
         offset: int = 0) -> tuple[list[dict], int]:
    """One page of the run's rows (errors first, then in listing order) and how many match."""
    where, params = _filters(run_id, severity, code)
    total = conn.execute(f"SELECT count(*) FROM record_outcomes WHERE {where}", params).fetchone()[0]
    rows = conn.execute(
        f"SELECT {', '.join(ROW_COLUMNS)} FROM record_outcomes WHERE {where}"
        f" ORDER BY severity, {_ORDER} LIMIT %(limit)s OFFSET %(offset)s",
        {**params, "limit": limit, "offset": offset}).fetchall()
    return [_row(r) for r in rows], int(total)


def iter_rows(conn, run_id: int, *, severity: str | None = None, code: str | None = None) -> Iterator[dict]:
    """Every row of the run (the page's order), streamed from the server, for the CSV download."""
    where, params = _filters(run_id, severity, code)
    with conn.cursor() as cur:
        for r in cur.stream(f"SELECT {', '.join(ROW_COLUMNS)} FROM record_outcomes WHERE {where}"
                            f" ORDER BY severity, {_ORDER}", params):
            yield _row(r)


def _row(values: tuple) -> dict:
    """A row as a page or a CSV shows it: its portal url through the redactor (a url stored before
    portals.yaml refused secrets in urls keeps none in a report)."""
    row = dict(zip(ROW_COLUMNS, values))
    row["portal_url"] = redact_url(row["portal_url"])
    return row


def counts(conn, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Errors and warnings of each run (runs without rows are left out)."""
    if not run_ids:
        return {}
    rows = conn.execute(
        "SELECT run_id, count(*) FILTER (WHERE severity = 'error'), count(*) FILTER (WHERE severity = 'warning')"
        " FROM record_outcomes WHERE run_id = ANY(%s) GROUP BY run_id", (list(run_ids),)).fetchall()
    return {int(r): {"errors": int(e), "warnings": int(w)} for r, e, w in rows}


def by_code(conn, run_id: int) -> dict[str, int]:
    """Rows of the run per reason code (the notification's counts)."""
    return {code: int(n) for code, n in conn.execute(
        "SELECT code, count(*) FROM record_outcomes WHERE run_id = %s GROUP BY code ORDER BY count(*) DESC, code",
        (run_id,)).fetchall()}


def prune(conn, portal_url: str, before: datetime, *, dry_run: bool = False) -> int:
    """Delete (``dry_run``: count) the portal's rows recorded before ``before``."""
    params = {"portal": portal_url, "before": before}
    where = "portal_url = %(portal)s AND recorded_at < %(before)s"
    if dry_run:
        return int(conn.execute(f"SELECT count(*) FROM record_outcomes WHERE {where}", params).fetchone()[0])
    return conn.execute(f"DELETE FROM record_outcomes WHERE {where}", params).rowcount
