"""A run's steps driven directly, without Airflow (what the DAG's tasks call), and SQL checks of
what a run leaves behind: shared by the tests and the benches."""
from __future__ import annotations

from harvester.config.portals import Portal
from harvester.domain.breaker import BreakerConfig
from harvester.embeddings import batching as embedder
from harvester.embeddings.gemini import GeminiProvider
from harvester.pipeline import steps as pipeline
from harvester.store import db as store_db

# Datasets whose copy in dataset_vectors differs from their vector in embeddings (0 when in step).
COPY_DRIFT = """
    SELECT count(*) FROM datasets d
    JOIN embedding_models m ON m.name = %(model)s
    JOIN embeddings e ON e.content_hash = decode(d.content_hash, 'hex') AND e.model = m.id
    LEFT JOIN dataset_vectors v ON v.dataset_id = d.id
    LEFT JOIN vector_scopes k ON k.id = v.scope
    WHERE v.dataset_id IS NULL OR k.model IS DISTINCT FROM m.name OR k.portal_url IS DISTINCT FROM d.portal_url
       OR v.content_hash <> e.content_hash OR v.embedding <> e.embedding
"""


def stage(portal_server, records) -> tuple[Portal, int]:
    """A running run of a portal with ``records`` fetched and classified: their texts are pending."""
    portal_server.set_records(records)
    portal = Portal(name="test", url=portal_server.base_url, politeness_delay=0)
    with store_db.open_cli() as conn, store_db.open_cli() as reader:
        run_id = pipeline.begin(conn, portal)["run_id"]
        pipeline.fetch_modified(conn, portal, run_id, pipeline.source_for(portal))
        pipeline.hash_compare(conn, reader, portal, run_id)
    return portal, run_id


def embed(portal, run_id, settings=None, breaker_config=None, provider=None) -> dict:
    with store_db.open_cli() as conn, store_db.open_cli() as reader:
        return embedder.embed_pending(conn, reader, portal.url, run_id, provider or GeminiProvider(),
                                      settings=settings, breaker_config=breaker_config or BreakerConfig())


def run_stats(db, run_id):
    return db.execute("SELECT stats FROM sync_runs WHERE run_id = %s", (run_id,)).fetchone()[0]
