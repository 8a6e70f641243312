"""The local provider's model identity: vectors are stored under the name and dimension of the
model actually loaded (HARVESTER_LOCAL_MODEL), and a model whose dimension no longer matches its
stored vectors fails the run at once, with no retries. The models are real sentence-transformers
models built offline from the bundled all-MiniLM-L6-v2 with an extra Dense layer."""
import copy
import logging

import pytest

from harvester.cli.main import main
from harvester.embeddings import TerminalEmbeddingError, provider_for_model
from harvester.embeddings.local import FULL_NAME, MODEL_NAME, LocalProvider, bundled_path, model_identity
from harvester.store import vectors

BIRMINGHAM = "data-birmingham-gov-uk.jsonl"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two models in directories both named custom-model: 32 and 48 dimensions."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    base = SentenceTransformer(bundled_path(), device="cpu")
    out = {}
    for size in (32, 48):
        torch.manual_seed(size)
        path = tmp_path_factory.mktemp(f"model{size}") / "custom-model"
        SentenceTransformer(modules=[*base, Dense(in_features=384, out_features=size)], device="cpu").save(str(path))
        out[size] = str(path)
    return out


@pytest.fixture
def local(monkeypatch):
    monkeypatch.delenv("HARVESTER_EMBEDDING_PROVIDER", raising=False)
    monkeypatch.delenv("HARVESTER_LOCAL_MODEL", raising=False)
    return monkeypatch


def last_run(db):
    return db.execute("SELECT status, stats, error FROM sync_runs ORDER BY run_id DESC LIMIT 1").fetchone()


def test_the_identity_comes_from_what_is_loaded(tmp_path, models, local):
    assert LocalProvider().model == MODEL_NAME == "sentence-transformers/all-MiniLM-L6-v2@max_seq_128"
    assert model_identity(bundled_path()) == FULL_NAME == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_identity(bundled_path(), 128) == MODEL_NAME
    snapshot = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "5c38ec7c"
    snapshot.mkdir(parents=True)
    assert model_identity(str(snapshot)) == "BAAI/bge-small-en-v1.5"
    assert model_identity("intfloat/e5-small-v2") == "intfloat/e5-small-v2"  # a name in the Hugging Face cache

    local.setenv("HARVESTER_LOCAL_MODEL", models[32])
    provider = LocalProvider()
    assert (provider.model, provider.dimension) == ("local/custom-model", 32)
    assert len(provider.embed_query("rivers")) == 32


def test_a_local_model_directory_stores_its_own_name_and_dimension(harvest, portal_server, db, samples, models,
                                                                   local, capsys):
    local.setenv("HARVESTER_LOCAL_MODEL", models[32])
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"
    status, stats, _ = last_run(db)
    assert (status, stats["embedded"], stats["skipped"]) == ("committed", len(records), 0)
    assert db.execute("SELECT DISTINCT m.name, e.dimension FROM embeddings e"
                      " JOIN embedding_models m ON m.id = e.model").fetchall() == [("local/custom-model", 32)]
    index = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                       (vectors.index_name("local/custom-model"),)).fetchone()
    assert index and "halfvec(32)" in index[0] and f"(model = {vectors.model_id(db, 'local/custom-model')})" in index[0]

    # Search embeds the query with the same model, through its index.
    capsys.readouterr()
    assert main(["search", "purchase card transactions", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "(hybrid, local/custom-model)" in out and "Purchase" in out


def test_search_finds_the_local_model_that_made_the_vectors(models, local):
    local.setenv("HARVESTER_LOCAL_MODEL", models[32])
    custom = provider_for_model("local/custom-model")
    assert (custom.model, custom.dimension, len(custom.embed_query("rivers"))) == ("local/custom-model", 32, 32)
    # The bundled model's vectors are searched with the bundled model, whatever HARVESTER_LOCAL_MODEL says.
    default = provider_for_model(MODEL_NAME)
    assert (default.model, default.dimension, len(default.embed_query("rivers"))) == (MODEL_NAME, 384, 384)
    with pytest.raises(TerminalEmbeddingError, match="HARVESTER_LOCAL_MODEL loads 'local/custom-model'"):
        provider_for_model("local/another-model")


def test_the_default_reads_128_tokens_under_a_name_of_its_own_and_the_256_token_version_stays_searchable(local):
    """Issue 40: the default all-MiniLM-L6-v2 reads 128 tokens (its training length, 1.4-1.7 times
    faster); a longer text then gets another vector than with 256, so its vectors are stored under a
    name of their own and the model switch embeds them anew, while search keeps embedding queries for
    the vectors stored before (sentence-transformers/all-MiniLM-L6-v2) with the 256-token version."""
    import numpy as np

    from harvester.embeddings import local as local_module

    # An earlier test of the session may have loaded the export from a cache of its own
    # (HARVESTER_MODEL_CACHE in a temporary directory): both versions are loaded here, from one cache.
    local_module._onnx_encoder.cache_clear()
    short = "Preço de medicamentos no Brasil"
    long = ("Open government data portal listing datasets from federal agencies: budgets, health, transport, "
            "environment, education and more, in machine-readable formats. ") * 8  # about 300 tokens
    default, full = LocalProvider(), LocalProvider("all-MiniLM-L6-v2")
    assert (default.model, default.max_tokens, default._encoder().max_tokens) == (MODEL_NAME, 128, 128)
    assert (full.model, full.max_tokens, full._encoder().max_tokens) == (FULL_NAME, None, 256)
    assert default._encoder().directory == full._encoder().directory  # one export serves both
    ours, theirs = np.asarray(default.embed_documents([short, long])), np.asarray(full.embed_documents([short, long]))
    assert np.array_equal(ours[0], theirs[0])  # a text within 128 tokens: the same vector
    assert float(ours[1] @ theirs[1]) < 0.999  # a longer one: another vector, hence another name
    local.setenv("HARVESTER_LOCAL_MODEL", "all-MiniLM-L6-v2")
    assert LocalProvider().model == FULL_NAME  # the 256-token version, by its name
    for model, vectors in ((MODEL_NAME, ours), (FULL_NAME, theirs)):  # search: the model of the stored vectors
        found = provider_for_model(model)
        assert found.model == model and np.allclose(found.embed_documents([short, long]), vectors, atol=1e-6)
    # PyTorch reads as many tokens as ONNX Runtime, per provider, from one shared model
    slow_short = LocalProvider("all-MiniLM-L6-v2-128", runtime="torch")
    slow_full = LocalProvider("all-MiniLM-L6-v2", runtime="torch")
    assert slow_short.model == MODEL_NAME and slow_full.model == FULL_NAME
    for _ in range(2):
        assert float(np.asarray(slow_short.embed_documents([long]))[0] @ ours[1]) >= 0.99
        assert float(np.asarray(slow_full.embed_documents([long]))[0] @ theirs[1]) >= 0.99


def test_a_dimension_that_no_longer_matches_fails_at_once_then_invalidate_fixes_it(
        harvest, portal_server, db, samples, models, local, capsys):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    local.setenv("HARVESTER_LOCAL_MODEL", models[32])
    records = samples(BIRMINGHAM)
    portal_server.set_records(records)
    harvest.configure(portal_server.base_url)
    assert harvest.run().state == "success"

    # Another model, in a directory of the same name, and one dataset's text changes.
    local.setenv("HARVESTER_LOCAL_MODEL", models[48])
    local.setenv("HARVESTER_TASK_RETRIES", "2")
    local.setenv("HARVESTER_TASK_RETRY_DELAY_SECS", "1")
    changed = copy.deepcopy(records[3])
    changed["title"] = "Purchase card transactions, corrected"
    changed["metadata_modified"] = "2030-01-01T00:00:00.000001"
    portal_server.upsert_record(changed)
    dag_run = harvest.run()
    assert dag_run.state == "failed"
    status, _, error = last_run(db)
    assert status == "failed"
    assert "'local/custom-model'" in error and "have 32 dimensions" in error and "now gives 48" in error
    assert "harvester embeddings invalidate --model local/custom-model" in error
    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(run_id=dag_run.run_id, task_id="embed_changed").one()
        assert ti.state == "failed" and ti.try_number == 1, "a dimension mismatch is not retried"
    assert db.execute("SELECT DISTINCT dimension FROM embeddings").fetchall() == [(32,)]
    capsys.readouterr()
    assert main(["search", "purchase card transactions"]) == 2  # search says the same, no SQL error
    assert "have 32 dimensions, but the model now gives 48" in capsys.readouterr().err

    # Doing what the message says: the old vectors go, the next run embeds everything again.
    capsys.readouterr()
    assert main(["embeddings", "invalidate", "--model", "local/custom-model"]) == 0
    assert capsys.readouterr().out.strip() == f"invalidated {len(records)} vectors of model local/custom-model"
    assert harvest.run().state == "success"
    status, stats, _ = last_run(db)
    assert (status, stats["embedded"], stats["skipped"]) == ("committed", len(records), 0)
    assert db.execute("SELECT DISTINCT m.name, e.dimension FROM embeddings e"
                      " JOIN embedding_models m ON m.id = e.model").fetchall() == [("local/custom-model", 48)]
    indexes = db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'embeddings'"
                         " AND indexdef LIKE %s", (f"% WHERE (model = {vectors.model_id(db, 'local/custom-model')})",)
                         ).fetchall()
    assert len(indexes) == 1 and indexes[0][0] == vectors.index_name("local/custom-model")
    assert "halfvec(48)" in indexes[0][1]


def test_loading_the_model_draws_no_progress_bar(tmp_path):
    """Each load of the model used to print transformers' "Loading weights: 100%|...| 103/103" bar into
    the task log and the CLI's stderr (issue 27). A fresh process, as a task is: nothing is loaded yet."""
    import os
    import subprocess
    import sys

    from harvester.embeddings.local import bundled_path

    if bundled_path() is None:
        pytest.fail("the bundled model (requirements-local.txt) is part of the test environment")
    code = ("from harvester.embeddings.local import LocalProvider; "
            "print(len(LocalProvider().embed_documents(['a water quality dataset'])[0]))")
    env = {**os.environ, "HARVESTER_LOCAL_MODEL": "", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "384"
    for bar in ("Loading weights", "it/s]", "%|"):
        assert bar not in done.stderr and bar not in done.stdout, done.stderr[-2000:]


def test_a_model_the_onnx_export_cannot_take_runs_on_pytorch_saying_why(models, local, caplog):
    from harvester.embeddings import local as local_module

    local_module._onnx_encoder.cache_clear()
    local.setenv("HARVESTER_LOCAL_MODEL", models[32])  # Transformer, Pooling, Normalize, then a Dense layer
    with caplog.at_level(logging.WARNING, logger="harvester.embeddings.local"):
        provider = LocalProvider()
        assert provider.runtime == "onnx" and provider._encoder() is None
        assert len(provider.embed_query("rivers")) == 32
    assert any("local/custom-model runs on PyTorch" in m and "Dense" in m for m in caplog.messages), caplog.messages
