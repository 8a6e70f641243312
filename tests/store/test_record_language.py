"""Languages (issue 39): a record's declared language chooses its text-search configuration (else
its portal's `language:`), and the titles it carries in other languages
(raw["translations"], as the DCAT, CSW and SDMX sources keep them) are in its search text. On a
real PostgreSQL, through the run's own steps and store/search.py's search()."""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from harvester.config.languages import text_search_config
from harvester.config.portals import Portal
from harvester.domain.dataset import package_record
from harvester.pipeline import steps as pipeline
from harvester.sources.base import Capabilities
from harvester.store import db as store_db
from harvester.store import migrations
from harvester.store.search import search
from harvester.sources.dcat_rdf import parse_page, records_from_graph

# the DCAT samples tests/sources/test_dcat_rdf.py reads
DCAT_SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR")
                    or Path(__file__).resolve().parents[3] / "shared" / "dcat-samples" / "dcat-ap")
SWISS = "ckanext-dcatapchharvest/catalog.xml"
MODEL = "test-model"  # no embedding here: the texts stay pending, full text is what is searched
PORTAL_URL = "https://stats.example.org"


class Catalogue:
    """The whole catalogue in one page, as a source of a kind that lists everything each run."""

    kind = "test"
    capabilities = Capabilities()

    def __init__(self, records, complete: bool = True):
        self.records, self.complete = records, complete
        self.requests_made = self.bytes_received = 0
        self.total = None

    def iter_records(self, since, page_size, listing, validators=None):
        self.requests_made += 1
        yield list(self.records)
        listing.complete = self.complete


def record(source_id: str, title: str, *, language: str | None = None, translations: dict | None = None,
           description: str = ""):
    pkg = {"id": source_id, "title": title, "notes": description, "metadata_modified": "2024-03-01T00:00:00Z"}
    if translations is not None:
        pkg["translations"] = translations
    return package_record(pkg, source_id=source_id, url=f"{PORTAL_URL}/{source_id}", title=title,
                          description=description, tags=[], organization=None, language=language)


def harvest(conn, reader, records, language: str = "english", complete: bool = True) -> dict:
    portal = Portal(name="stats", url=PORTAL_URL, politeness_delay=0, language=language)
    run_id = pipeline.begin(conn, portal, full_sync=True)["run_id"]
    pipeline.fetch_modified(conn, portal, run_id, Catalogue(records, complete))
    pipeline.hash_compare(conn, reader, portal, run_id, MODEL)
    return pipeline.upsert(conn, portal, run_id, MODEL)


def configs(conn) -> dict[str, tuple]:
    """Each dataset's (datasets.search_config, dataset_search.config), by source id."""
    return {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT d.source_id, d.search_config::text, s.config::text FROM datasets d"
        " JOIN dataset_search s ON s.dataset_id = d.id")}


class NoVectors:
    """An embedding provider that is down: hybrid search answers with its text side alone."""
    name, model, dimension, max_batch = "local", MODEL, 384, 1

    def embed_query(self, text):
        from harvester.embeddings import EmbeddingError

        raise EmbeddingError("provider down")


def found(conn, query: str, mode: str = "text") -> list[str]:
    return [item["title"] for item in search(conn, query, mode=mode, limit=5, provider=NoVectors()).items]


@pytest.mark.parametrize("declared, config", [
    ("fr", "french"), ("FR", "french"), ("fr-CA", "french"), ("pt_BR", "portuguese"), ("sr-Latn", "serbian"),
    ("fra", "french"), ("fre", "french"), ("eng; USA", "english"), ("GER", "german"), ("nob", "norwegian"), ("french", "french"),
    ("http://publications.europa.eu/resource/authority/language/FRA", "french"),
    ("http://id.loc.gov/vocabulary/iso639-2/ita", "italian"),
    ("pl", None), ("zh-Hans", None), ("und", None), ("mul", None), ("simple", None), ("", None), (None, None),
    (12, None), (["fr"], None), ("f", None), ("fr CA", None), ("x" * 200, None),
])
def test_a_declared_language_as_its_text_search_configuration(declared, config):
    assert text_search_config(declared) == config


def dcat_records(name: str, language: str | None):
    url = f"http://samples.test/{name}"
    return records_from_graph(parse_page((DCAT_SAMPLES / name).read_bytes(), None, url), url, language)


def test_a_dcat_record_declares_the_language_of_the_title_it_shows():
    """DCAT RDF: the xml:lang of the title picked (the portal's language, else English, else the
    first) is the record's language (an untagged title declares none)."""
    assert {r.language for r in dcat_records(SWISS, "fr")} == {"fr"}
    assert {r.language for r in dcat_records(SWISS, None)} == {"de"}  # no English: the first language
    some = "https://dati.unibo.it/dataset/0824deeb-8e76-4281-9120-c2177d0b13ca"
    unibo = "ckanext-dcatapit/catalog_dati_unibo.rdf"
    assert {r.source_id: r for r in dcat_records(unibo, "it")}[some].language == "it"
    assert {r.source_id: r for r in dcat_records(unibo, None)}[some].language == "en"


def test_a_record_declaring_its_language_is_indexed_and_found_in_it(db, reader):
    harvest(db, reader, [record("horses", "Les chevaux de trait des régions", language="fr-FR"),
                         record("wells", "Water wells of the county")])
    assert configs(db) == {"horses": ("french", "french"), "wells": ("english", "english")}
    assert db.execute("SELECT language::text FROM datasets WHERE source_id = 'horses'").fetchone()[0] == "french"
    # French stemming: "cheval" is the stem of "chevaux" (English keeps "chevaux" whole)
    assert found(db, "cheval") == ["Les chevaux de trait des régions"]
    assert found(db, "région") == ["Les chevaux de trait des régions"]


def test_every_language_of_a_title_finds_the_dataset(db, reader):
    translations = {"title": {"fr": "Chômage trimestriel", "en": "Quarterly unemployment"},
                    "description": {"fr": "Taux de chômage par département", "en": "Unemployment rate by county"}}
    harvest(db, reader, [record("unemployment", "Quarterly unemployment", translations=translations,
                                description="Unemployment rate by county"),
                         record("wells", "Water wells of the county")])
    for query in ("Quarterly unemployment", "chômage trimestriel", "chomage", "trimestriel"):
        assert found(db, query) == ["Quarterly unemployment"], query
    # through hybrid search too (its text side)
    assert found(db, "chômage trimestriel", mode="hybrid")[:1] == ["Quarterly unemployment"]
    # the other language's title weighs as a title: above a match in a description
    harvest(db, reader, [record("unemployment", "Quarterly unemployment", translations=translations),
                         record("wells", "Water wells of the county", description="Chômage trimestriel des puisatiers")])
    assert found(db, "chômage trimestriel") == ["Quarterly unemployment", "Water wells of the county"]
    # the stored record keeps every language
    raw = db.execute("SELECT raw FROM datasets WHERE source_id = 'unemployment'").fetchone()[0]
    assert raw["translations"]["title"] == {"fr": "Chômage trimestriel", "en": "Quarterly unemployment"}


def test_translations_of_any_shape_are_stored_and_never_fail_the_run(db, reader):
    """raw is the portal's: translations that are not {field: {language: text}} are skipped, and a
    huge one is indexed by its start (a tsvector holds at most 1 MB)."""
    huge = " ".join(f"mot{i}" for i in range(200_000))  # 1.5 MB of distinct words
    shapes = {"list": ["Chômage"], "text": "Chômage", "numbers": {"title": {"fr": 3, "de": None}},
              "nested": {"title": {"fr": {"text": "Chômage"}}}, "huge": {"title": {"fr": huge + " chômage"}},
              "titles": {"title": "Chômage", "description": {"fr": "Chômage"}}}
    stats = harvest(db, reader, [record(name, f"Shape {name}", translations=value) for name, value in shapes.items()])
    assert stats["created"] == len(shapes) and stats["failed"] == 0
    assert found(db, "mot1") == ["Shape huge"]  # the start of the huge one
    assert found(db, "chômage") == []  # the end of the huge one, and no other shape, is search text


def test_a_changed_portal_language_reindexes_only_the_datasets_without_their_own(db, reader):
    records = [record("horses", "Les chevaux de trait", language="fr"), record("wells", "Water wells"),
               record("babel", "Babel", language="pl")]  # Polish: no configuration, the portal's
    harvest(db, reader, records)
    assert configs(db) == {"horses": ("french", "french"), "wells": ("english", "english"),
                           "babel": ("english", "english")}
    harvest(db, reader, records, language="german")  # the same records: all unchanged
    assert configs(db) == {"horses": ("french", "french"), "wells": ("german", "german"),
                           "babel": ("german", "german")}
    # a record's declared language is in no hash: one that stops declaring, or starts, is unchanged,
    # and indexed again all the same
    stats = harvest(db, reader, [replace(records[0], language=None), replace(records[1], language="it"),
                                 records[2]], language="german")
    assert stats["unchanged"] == 3
    assert configs(db) == {"horses": ("german", "german"), "wells": ("italian", "italian"),
                           "babel": ("german", "german")}
    assert db.execute("SELECT source_id FROM datasets WHERE language IS NOT NULL").fetchall() == [("wells",)]


def test_the_migration_keeps_the_rows_it_finds_and_their_next_run_indexes_their_translations(
        empty_database_url, tmp_path):
    """sql/025 on a database with datasets: no rewrite of the table, every row kept, the language
    columns empty; the portal's next run indexes its datasets with translations again (once)."""
    files = migrations.migration_files()
    ours = next(path for version, path in files if path.name == "025_record_language.sql")
    for version, path in files:
        if version < 25:
            shutil.copy(path, tmp_path)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        migrations.migrate(conn, tmp_path)
        conn.execute("INSERT INTO portal_sync_status (portal_url, portal_name, sync_status, search_config) VALUES (%s, 'stats',"
                     " 'completed', 'english')", (PORTAL_URL,))
        conn.execute(
            """
            INSERT INTO datasets (portal_url, source_id, url, url_hash, content_hash, metadata_hash, title,
                description, tags, raw, first_seen_at, updated_at, last_seen_at, search_config)
            SELECT %s, 'd' || i, 'https://x/' || i, md5('u' || i) || md5('u' || i), md5('c' || i) || md5('c' || i),
                   md5('m' || i) || md5('m' || i), 'Dataset ' || i, '', '[]',
                   jsonb_build_object('id', 'd' || i, 'translations', jsonb_build_object('title',
                       jsonb_build_object('fr', 'Chômage trimestriel ' || i))),
                   now(), now(), now(), 'english'
            FROM generate_series(1, 2000) i
            """, (PORTAL_URL,))
        before = conn.execute("SELECT pg_relation_filenode('datasets')").fetchone()[0]
        shutil.copy(ours, tmp_path)
        assert migrations.migrate(conn, tmp_path) == ["025_record_language.sql"]
        assert conn.execute("SELECT pg_relation_filenode('datasets')").fetchone()[0] == before  # not rewritten
        assert conn.execute("SELECT count(*), count(language) FROM datasets").fetchone() == (2000, 0)
        assert conn.execute("SELECT search_text FROM portal_sync_status").fetchone() == (None,)
        # the rows are the same as before until their portal's next run
        assert conn.execute("SELECT count(*) FROM dataset_search WHERE document @@ 'chomag'").fetchone()[0] == 0
        for _, path in files:  # the migrations after ours (other helpers' of issue 39)
            shutil.copy(path, tmp_path)
        migrations.migrate(conn, tmp_path)

    url = empty_database_url
    with store_db.prepare(store_db.connect_url(url)) as conn, store_db.prepare(store_db.connect_url(url)) as reader:
        harvest(conn, reader, [record("new", "A new dataset", translations={"title": {"fr": "Nouveau"}})],
                complete=False)
        assert conn.execute("SELECT search_text FROM portal_sync_status").fetchone() == (25,)
        held = conn.execute("SELECT count(*) FROM dataset_search WHERE document @@ to_tsquery('english', 'chomag')"
                            ).fetchone()[0]
        assert held == 2000
        assert found(conn, "nouveau") == ["A new dataset"]
        # a portal that comes after the migration starts at the current search text
        conn.execute("INSERT INTO portal_sync_status (portal_url, portal_name, sync_status) VALUES ('https://new.example.org', 'n', 'completed')")
        assert conn.execute("SELECT search_text FROM portal_sync_status WHERE portal_name = 'n'").fetchone() == (25,)
