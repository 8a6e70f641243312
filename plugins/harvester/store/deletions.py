"""Per-run staging of the records a portal says it deleted (sql/026): an OAI-PMH header with
``status="deleted"``, a source's ``DatasetRecord`` marked ``deleted`` (domain/dataset.py
``deletion``). fetch_modified (pipeline/steps.py ``_stage``) writes them here instead of into
``staging_records``; the upsert's ``history.apply_removals`` removes the live datasets they name,
under the removal guard, on any run (an incremental one too: the portal said so, unlike an absence
from a listing that was not read whole). Cleared with the run's other staging."""
from __future__ import annotations

from typing import Iterable

from harvester.domain.dataset import DatasetRecord
from harvester.domain.screening import escaped
from harvester.store import staging


def write(conn, run_id: int, seq: int, records: Iterable[DatasetRecord]) -> int:
    """COPY the deletions of one staged page, each at ``seq`` (where they came in the listing: after
    the page's records, before the next page's); returns how many were written. An identifier
    PostgreSQL cannot store is written escaped, as a Failed record keeps it (never altered into
    another dataset's)."""
    n = 0
    with conn.cursor() as cur:
        with cur.copy("COPY staging_deleted (run_id, seq, source_id, metadata_modified) FROM STDIN (FORMAT BINARY)") \
                as copy:
            copy.set_types(["int8", "int8", "text", "timestamptz"])
            for rec in records:
                if rec.source_id:
                    copy.write_row((run_id, seq, escaped(rec.source_id), rec.metadata_modified))
                    n += 1
    return n


def clear(conn, run_id: int, from_seq: int = 0) -> None:
    """Forget the deletions the run staged from ``from_seq`` on (a retried step starts over); all
    of them (``from_seq`` 0): staging.release, the table truncated when no other run's are there."""
    if from_seq <= 0:
        staging.release(conn, "staging_deleted", run_id)
        return
    conn.execute("DELETE FROM staging_deleted WHERE run_id = %s AND seq >= %s", (run_id, from_seq))


def staged(conn, run_id: int) -> int:
    """How many deletions the run staged."""
    return conn.execute("SELECT count(*) FROM staging_deleted WHERE run_id = %s", (run_id,)).fetchone()[0]


# The condition (on ``datasets d``, with %(run)s) of a live dataset the run's staged deletions
# remove: named by a deletion, and not staged again by the run after it (a record deleted and then
# published again in the same listing stays), nor listed by its reconciliation with a later
# modification time.
DELETED_WHERE = """
    EXISTS (SELECT 1 FROM staging_deleted x WHERE x.run_id = %(run)s AND x.source_id = d.source_id
            AND NOT EXISTS (SELECT 1 FROM staging_records s WHERE s.run_id = %(run)s
                            AND s.source_id = d.source_id AND s.seq >= x.seq)
            AND NOT EXISTS (SELECT 1 FROM staging_listing l WHERE l.run_id = %(run)s
                            AND l.source_id = d.source_id AND l.metadata_modified > x.metadata_modified))
"""
