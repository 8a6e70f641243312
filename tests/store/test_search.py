"""Semantic search over the vectors (local MiniLM on real demo records), the HNSW index in use,
invalidation, pruning, and a model switch that never leaves search without vectors."""
import json
import random

import pytest
import yaml

from harvester.testing.gemini import FakeGemini
from harvester.cli.main import main
from harvester.embeddings.local import MODEL_NAME
from harvester.store import vectors

# Each test first harvests 75 demo records through the CLI with the local model (about 25 s each on a
# busy 2-core machine).
pytestmark = pytest.mark.slow

DEMO_SUBSET = ("data-humdata-org.jsonl", "data-birmingham-gov-uk.jsonl", "data-gov-uk.jsonl",
               "data-gov-au.jsonl", "data-stadt-zuerich-ch.jsonl", "envidat-ch.jsonl")


@pytest.fixture
def demo(database_url, portal_server, samples, tmp_path, monkeypatch, capsys):
    records = [r for name in DEMO_SUBSET for r in samples(name)]
    portal_server.set_records(records)
    path = tmp_path / "portals.yaml"
    path.write_text(yaml.safe_dump({"portals": [{"name": "demo", "url": portal_server.base_url,
                                                 "politeness_delay": 0}]}))
    monkeypatch.setenv("HARVESTER_PORTALS_FILE", str(path))
    monkeypatch.delenv("HARVESTER_EMBEDDING_PROVIDER", raising=False)
    assert main(["harvest", "demo", "--json"]) == 0
    capsys.readouterr()
    return records


def search(capsys, *args):
    assert main(["search", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_datasets_own_title_finds_it(demo, db, capsys):
    rows = db.execute("SELECT title, url FROM datasets ORDER BY source_id").fetchall()
    sample = random.Random(7).sample(rows, 10)
    found = 0
    for title, url in sample:
        results = search(capsys, title, "--limit", "5")
        assert [r["rank"] for r in results] == [1, 2, 3, 4, 5]
        assert all(r["portal"] == "demo" and -1 <= r["score"] <= 1 for r in results)
        found += url in [r["url"] for r in results]
    assert found >= 9, f"only {found} of 10 titles found their dataset in the top 5"


def test_search_text_output_and_portal_filter(demo, capsys):
    assert main(["search", "purchase card transactions", "-p", "demo", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "Search: 'purchase card transactions'" in out and "score" in out and "Purchase" in out


def test_search_uses_the_hnsw_index(demo, db):
    from harvester.embeddings.local import LocalProvider

    query = LocalProvider().embed_query("air quality")
    plan = vectors.explain_search(db, MODEL_NAME, 384, query)
    assert f"Index Scan using {vectors.index_name(MODEL_NAME)}" in plan, plan


def test_removed_datasets_are_not_found(demo, db, capsys):
    title, url = db.execute("SELECT title, url FROM datasets ORDER BY source_id LIMIT 1").fetchone()
    db.execute("UPDATE datasets SET removed_at = now() WHERE url = %s", (url,))
    assert url not in [r["url"] for r in search(capsys, title, "--limit", "20")]


def test_invalidate_and_prune(demo, db, capsys):
    source_id, content_hash = db.execute("SELECT source_id, content_hash FROM datasets ORDER BY source_id LIMIT 1"
                                         ).fetchone()
    assert main(["embeddings", "invalidate", "--dataset", source_id]) == 0
    assert "invalidated 1 vectors" in capsys.readouterr().out
    assert db.execute("SELECT embedded_content_hash FROM datasets WHERE source_id = %s", (source_id,)).fetchone() == (None,)
    assert main(["harvest", "demo", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["embedded"], stats["embedding_requests"], stats["created"], stats["updated"]) == (1, 1, 0, 0)

    db.execute("INSERT INTO embeddings (content_hash, model, dimension, embedding) VALUES"
               " (decode(md5('orphan'), 'hex'), (SELECT id FROM embedding_models WHERE name = %s), 384, %s)",
               (MODEL_NAME, "[" + ",".join(["0"] * 383 + ["1"]) + "]"))
    assert main(["embeddings", "prune"]) == 0
    assert capsys.readouterr().out.strip() == "pruned 1 vectors no dataset uses"
    assert db.execute("SELECT count(*) FROM embeddings WHERE content_hash = decode(%s, 'hex')",
                      (content_hash,)).fetchone()[0] == 1

    assert main(["embeddings", "invalidate", "--portal", "demo", "--dataset", source_id]) == 2
    assert "exactly one of --portal, --dataset, --model" in capsys.readouterr().err


def test_invalidating_a_model_marks_only_the_datasets_it_leaves_without_a_vector_pending(demo, db, capsys):
    def embedded():
        assert main(["datasets", "--limit", "1000", "--json"]) == 0
        return {r["embedded"] for r in json.loads(capsys.readouterr().out)}

    assert embedded() == {True}
    # An earlier model's vectors go: the datasets keep those of the active model.
    db.execute("INSERT INTO embedding_models (name) VALUES ('earlier-model')")
    db.execute("INSERT INTO embeddings (content_hash, model, dimension, embedding)"
               " SELECT content_hash, (SELECT id FROM embedding_models WHERE name = 'earlier-model'), dimension,"
               " embedding FROM embeddings")
    assert main(["embeddings", "invalidate", "--model", "earlier-model"]) == 0
    capsys.readouterr()
    assert embedded() == {True}
    # The active model's vectors go: no dataset has a vector any more.
    assert main(["embeddings", "invalidate", "--model", MODEL_NAME]) == 0
    capsys.readouterr()
    assert embedded() == {False}
    assert db.execute("SELECT count(*) FROM datasets WHERE embedded_content_hash IS NOT NULL").fetchone()[0] == 0


def test_switching_model_keeps_search_working_until_the_new_vectors_are_complete(demo, db, capsys, monkeypatch):
    live = db.execute("SELECT count(*) FROM datasets").fetchone()[0]
    with FakeGemini(valid_keys={"AIza-k"}) as fake:
        monkeypatch.setenv("HARVESTER_EMBEDDING_PROVIDER", "gemini")
        monkeypatch.setenv("GEMINI_API_KEY", "AIza-k")
        monkeypatch.setenv("GEMINI_BASE_URL", fake.base_url)
        monkeypatch.setenv("HARVESTER_EMBED_BACKLOG_PER_RUN", "30")
        title, url = db.execute("SELECT title, url FROM datasets ORDER BY source_id LIMIT 1").fetchone()
        covered = []
        while True:
            assert main(["harvest", "demo", "--json"]) == 0
            stats = json.loads(capsys.readouterr().out)
            assert stats["embedded"] <= 30 and stats["created"] == 0
            n = vectors.coverage(db)["gemini-embedding-001@768"][0]
            covered.append(n)
            # The old model's vectors stay while the new ones fill in, and search still answers.
            assert vectors.coverage(db)[MODEL_NAME] == (live, live)
            results = search(capsys, title, "--limit", "5")
            assert len(results) == 5
            if n == live:
                break
            assert url in [r["url"] for r in results], "searching with the complete old model"
        assert covered == sorted(covered) and len(covered) == -(-live // 30)
    assert main(["stats", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {m["model"] for m in report["cache"]["models"]} == {MODEL_NAME, "gemini-embedding-001@768"}
