"""Each model's partial HNSW index: a unique name per model (however long, whatever its slug),
indexes of databases made by earlier versions renamed rather than built twice, a model whose
dimension changed refused while its old vectors are stored, and HARVESTER_INDEX_KIND (the vectors
or their bits) changed both ways, the old index serving searches until the new one is valid."""
import hashlib
import re

import numpy as np
import pytest
from psycopg import sql

from harvester.store import vectors

# Two models whose names agree on more than the 40 characters earlier versions kept of the slug.
BASE = "organisation/multilingual-embedding-model-v2-base"
LARGE = "organisation/multilingual-embedding-model-v2-large"


def legacy_name(model: str) -> str:
    """What earlier versions called the index: the slug cut to 40 characters."""
    return "embeddings_hnsw_" + re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")[:40]


def h(text: str) -> str:
    """A text's content hash, as runs key its vector."""
    return hashlib.sha256(text.encode()).hexdigest()


def indexes(db) -> dict[str, str]:
    """index name -> the model of its predicate (``model = <its id in embedding_models>``, sql/042)."""
    return vectors.model_indexes(db)


def unit_vectors(n: int, dimension: int, seed: int = 0):
    rows = np.random.default_rng(seed).standard_normal((n, dimension)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_models_with_a_long_common_prefix_each_get_their_own_index(db):
    assert legacy_name(BASE) == legacy_name(LARGE)
    for model in (BASE, LARGE, "a-b", "a.b"):
        vectors.ensure_index(db, model, 8)
    found = indexes(db)
    assert sorted(found.values()) == sorted([BASE, LARGE, "a-b", "a.b"])
    for model in (BASE, LARGE, "a-b", "a.b"):
        name = vectors.index_name(model)
        assert found[name] == model and len(name) <= 63  # not cut short by PostgreSQL

    vectors.write(db, LARGE, 8, [h(f"h{i}") for i in range(50)], unit_vectors(50, 8))
    db.execute("SET enable_seqscan = off")  # 50 rows: read the plan PostgreSQL takes at scale
    plan = vectors.explain_search(db, LARGE, 8, unit_vectors(1, 8)[0])
    assert f"Index Scan using {vectors.index_name(LARGE)}" in plan, plan


def test_an_index_under_its_old_name_is_renamed_not_built_again(db):
    # A database made by an earlier version: BASE's index holds the name LARGE would have had.
    db.execute(sql.SQL("CREATE INDEX {} ON embeddings USING hnsw ((embedding::halfvec(8)) halfvec_cosine_ops)"
                       " WHERE model = {}").format(sql.Identifier(legacy_name(BASE)),
                                              sql.Literal(vectors.model_id(db, BASE, create=True))))
    oid = db.execute("SELECT %s::regclass::oid", (legacy_name(BASE),)).fetchone()[0]

    vectors.ensure_index(db, LARGE, 8)  # LARGE gets an index of its own; BASE's is left as it is
    assert indexes(db) == {legacy_name(BASE): BASE, vectors.index_name(LARGE): LARGE}

    vectors.ensure_index(db, BASE, 8)  # BASE's index takes its new name: the same index, not a second one
    assert indexes(db) == {vectors.index_name(BASE): BASE, vectors.index_name(LARGE): LARGE}
    assert db.execute("SELECT %s::regclass::oid", (vectors.index_name(BASE),)).fetchone()[0] == oid


def test_a_model_whose_dimension_changed_is_refused_until_its_vectors_are_invalidated(db):
    model = "local/my-model"
    vectors.ensure_index(db, model, 16)
    vectors.write(db, model, 16, [h("h1"), h("h2")], unit_vectors(2, 16))

    with pytest.raises(vectors.DimensionMismatch) as info:
        vectors.ensure_index(db, model, 24)
    message = str(info.value)
    assert "'local/my-model'" in message and "have 16 dimensions" in message and "now gives 24" in message
    assert "harvester embeddings invalidate --model local/my-model" in message
    with pytest.raises(vectors.DimensionMismatch):
        vectors.check_dimension(db, model, 24)
    vectors.check_dimension(db, model, 16)

    assert vectors.invalidate(db, model, all_of_model=True) == 2
    vectors.ensure_index(db, model, 24)  # the index of 16 dimensions would refuse the new vectors: replaced
    vectors.write(db, model, 24, [h("h1")], unit_vectors(1, 24))
    definitions = db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'embeddings'"
                             " AND indexdef LIKE %s", (f"% WHERE (model = {vectors.model_id(db, model)})",)).fetchall()
    assert len(definitions) == 1 and definitions[0][0] == vectors.index_name(model)
    assert "halfvec(24)" in definitions[0][1]


def test_an_index_of_full_precision_vectors_is_rebuilt_as_halfvec(db):
    """Earlier versions indexed models of up to 2000 dimensions as vector; searches now ask for the
    halfvec index (half the size, built in about half the time): the next run's upsert (restore_index)
    or embed step (ensure_index) replaces it, and searches use it again."""
    model = "older-model"
    db.execute("SET enable_seqscan = off")  # 50 rows: read the plan PostgreSQL takes at scale
    vectors.write(db, model, 8, [h(f"h{i}") for i in range(50)], unit_vectors(50, 8))
    db.execute(sql.SQL("CREATE INDEX {} ON embeddings USING hnsw ((embedding::vector(8)) vector_cosine_ops)"
                       " WHERE model = {}").format(sql.Identifier(vectors.index_name(model)),
                                              sql.Literal(vectors.model_id(db, model))))
    probe = unit_vectors(1, 8, seed=3)[0]
    # the old index (of the same name) does not serve the halfvec ordering searches use
    assert f"Index Scan using {vectors.index_name(model)}" not in vectors.explain_search(db, model, 8, probe)

    assert vectors.restore_index(db, model) is True
    definition = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                            (vectors.index_name(model),)).fetchone()[0]
    assert "halfvec(8)" in definition and "halfvec_cosine_ops" in definition
    assert f"Index Scan using {vectors.index_name(model)}" in vectors.explain_search(db, model, 8, probe)
    assert vectors.restore_index(db, model) is False  # nothing left to do

    db.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(vectors.index_name(model))))
    db.execute(sql.SQL("CREATE INDEX {} ON embeddings USING hnsw ((embedding::vector(8)) vector_cosine_ops)"
                       " WHERE model = {}").format(sql.Identifier("embeddings_hnsw_older"),
                                              sql.Literal(vectors.model_id(db, model))))
    vectors.ensure_index(db, model, 8)
    assert indexes(db) == {vectors.index_name(model): model}
    assert "halfvec" in db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                                   (vectors.index_name(model),)).fetchone()[0]


def test_a_build_is_given_the_memory_its_graph_needs_and_says_so(db, caplog):
    """3,000 vectors of 384 dimensions: a graph of 3,000 x (768 + 720) bytes, 4.3 MB; a tenth more
    is 5MB. With a cap of 1MB the graph does not fit: Harvester warns, and so does pgvector."""
    model, other = "sizing/model-a", "sizing/model-b"
    for m in (model, other):
        vectors.write(db, m, 384, [h(f"{m}-{i}") for i in range(3000)], unit_vectors(3000, 384, seed=len(m)))
    roomy = vectors.IndexSettings(build_memory="1MB", build_memory_max="64MB")
    caplog.set_level("INFO", logger="harvester.store.vectors")
    assert vectors.ensure_index(db, model, 384, roomy)
    said = [r.getMessage() for r in caplog.records]
    assert any("3000 vectors of 384 dimensions (halfvec), a graph of about 4 MB; maintenance_work_mem 5MB" in m
               for m in said), said
    assert not [m for m in said if "does not fit" in m or "no longer fits" in m]
    # the session's own setting is back as it was
    assert db.execute("SELECT current_setting('maintenance_work_mem')").fetchone()[0] != "5MB"

    caplog.clear()
    tight = vectors.IndexSettings(build_memory="1MB", build_memory_max="1MB")
    assert vectors.ensure_index(db, other, 384, tight)
    said = [r.getMessage() for r in caplog.records]
    assert any("does not fit in HARVESTER_INDEX_BUILD_MEMORY_MAX=1MB" in m for m in said), said
    assert any("hnsw graph no longer fits into maintenance_work_mem after" in m and "(maintenance_work_mem 1MB)" in m
               for m in said), said


def test_a_change_of_kind_is_built_beside_the_index_it_replaces_and_back(db, monkeypatch):
    """HARVESTER_INDEX_KIND=bit: the index over the vectors' signs is built beside the halfvec one,
    which searches scan until the new one is valid and which is dropped then; back to halfvec, the
    same the other way."""
    from harvester.store import search

    db.execute("SET enable_seqscan = off")  # 50 rows: read the plan PostgreSQL takes at scale
    vectors.write(db, BASE, 8, [h(f"h{i}") for i in range(50)], unit_vectors(50, 8))
    vectors.ensure_index(db, BASE, 8)
    probe = unit_vectors(1, 8, seed=3)[0]
    halfvec_index, bits_index = vectors.index_name(BASE, "halfvec"), vectors.index_name(BASE, "bit")
    assert halfvec_index != bits_index and len(bits_index) <= 63

    monkeypatch.setenv("HARVESTER_INDEX_KIND", "bit")
    assert vectors.index_name(BASE) == bits_index
    assert vectors.search_kind(db, BASE) == "halfvec"  # the one there is, until the new one is valid
    assert vectors.index_state(db, BASE) == "missing" and vectors.index_missing(db, BASE) == 8
    assert f"Index Scan using {halfvec_index}" in search.explain_vector_side(db, BASE, 8, probe)

    assert vectors.restore_index(db, BASE) is True
    assert indexes(db) == {bits_index: BASE}  # the halfvec one is gone
    assert vectors.search_kind(db, BASE) == "bit" and vectors.index_state(db, BASE) == "ready"
    definition = db.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (bits_index,)).fetchone()[0]
    assert "binary_quantize(embedding))::bit(8)" in definition and "bit_hamming_ops" in definition, definition
    assert f"Index Scan using {bits_index}" in search.explain_vector_side(db, BASE, 8, probe)
    assert vectors.restore_index(db, BASE) is False  # nothing left to do

    monkeypatch.setenv("HARVESTER_INDEX_KIND", "halfvec")
    assert vectors.search_kind(db, BASE) == "bit"
    assert f"Index Scan using {bits_index}" in search.explain_vector_side(db, BASE, 8, probe)
    assert vectors.restore_index(db, BASE) is True
    assert indexes(db) == {halfvec_index: BASE}
    assert vectors.search_kind(db, BASE) == "halfvec"
    assert f"Index Scan using {halfvec_index}" in search.explain_vector_side(db, BASE, 8, probe)


def test_a_failed_build_leaves_the_other_kind_serving(db, database_url, monkeypatch):
    """The build over the bits fails (here: its statement_timeout ends while it waits for an older
    snapshot): the halfvec index is still there, and searches still scan it; the next build
    replaces it."""
    from harvester.store import db as store_db

    vectors.write(db, LARGE, 8, [h(f"h{i}") for i in range(50)], unit_vectors(50, 8))
    vectors.ensure_index(db, LARGE, 8)
    monkeypatch.setenv("HARVESTER_INDEX_KIND", "bit")
    blocker = store_db.connect_url(database_url)
    try:
        # a snapshot older than the build, which waits for it
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute("SELECT count(*) FROM embeddings")
        with pytest.raises(vectors.IndexBuildError):
            vectors.ensure_index(db, LARGE, 8, vectors.IndexSettings(kind="bit", build_timeout=0.5))
    finally:
        blocker.close()
    # the build's invalid leftover (dropped by the next build, when no older snapshot holds it up)
    # is never what search scans
    assert vectors.index_name(LARGE, "halfvec") in indexes(db)
    assert vectors.search_kind(db, LARGE) == "halfvec" and vectors.index_state(db, LARGE) == "missing"

    assert vectors.restore_index(db, LARGE) is True
    assert indexes(db) == {vectors.index_name(LARGE, "bit"): LARGE}
    assert vectors.search_kind(db, LARGE) == "bit"


def test_a_build_of_the_bits_is_given_the_memory_of_their_graph(db, caplog, monkeypatch):
    """3,000 vectors of 384 dimensions as bits: a graph of 3,000 x (48 + 720) bytes, 2.2 MB; a
    tenth more is 3MB (their halfvec graph: 4.3 MB, 5MB)."""
    monkeypatch.setenv("HARVESTER_INDEX_KIND", "bit")
    model = "sizing/bits"
    vectors.write(db, model, 384, [h(f"{model}-{i}") for i in range(3000)], unit_vectors(3000, 384, seed=5))
    caplog.set_level("INFO", logger="harvester.store.vectors")
    assert vectors.ensure_index(db, model, 384, vectors.IndexSettings(kind="bit", build_memory="1MB",
                                                                      build_memory_max="64MB"))
    said = [r.getMessage() for r in caplog.records]
    assert any("3000 vectors of 384 dimensions (bit), a graph of about 2 MB; maintenance_work_mem 3MB" in m
               for m in said), said
    assert not [m for m in said if "does not fit" in m or "no longer fits" in m]
