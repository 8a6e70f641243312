"""The portals the database knows, found by the name their runs recorded."""
from harvester.store import runs
from harvester.store.known_portals import known_portals, portals_named


def _run(db, url, name, started):
    run = runs.start(db, portal_url=url, portal_name=name, dag_run_id=None, mode="full", since=None)
    db.execute("UPDATE sync_runs SET status = 'committed', started_at = %s::timestamptz WHERE run_id = %s",
               (started, run.run_id))


def test_a_portal_is_found_by_the_name_of_its_latest_run_and_a_moved_one_newest_first(db):
    _run(db, "http://127.0.0.1:8765", "demo", "2026-01-01")
    _run(db, "http://127.0.0.1:18765", "demo", "2026-02-01")
    _run(db, "https://mirror.example", "old-name", "2026-01-01")
    _run(db, "https://mirror.example", "mirror", "2026-03-01")
    assert [(p.name, p.url) for p in known_portals(db)] == [
        ("demo", "http://127.0.0.1:18765"), ("demo", "http://127.0.0.1:8765"), ("mirror", "https://mirror.example")]
    assert [p.url for p in portals_named(db, "demo")] == ["http://127.0.0.1:18765", "http://127.0.0.1:8765"]
    assert portals_named(db, "old-name") == [] and portals_named(db, "nothing") == []
