"""Benchmark: hybrid search (harvester.store.search) for relevance on the real samples, and for speed at scale.

(a) Relevance. Every file of ../shared/ckan-samples is harvested as its own portal (the local CKAN
    portal over HTTP, the pipeline's real steps, the local embedding model), and the Argentine
    DCAT-AR catalogue of ../shared/dcat-samples as a dcat-json portal (Spanish), into a fresh
    embedded database. The queries (--set): the hand-written bench/relevance/queries.yaml
    (curated), the set bench/relevance/generate.py builds from the records (generated: pasted
    titles per language, data.gc.ca's French titles against the English-indexed datasets, and
    agency / programme codes found in 1-5 datasets and in 6 to 1% of the corpus), or both (all, the
    default). Each runs in the three modes (`vector`, `text`, `hybrid`); printed: nDCG@10 and MRR
    of the curated set overall and per language (as before), then recall@10 and nDCG@10 per set,
    kind and language, and how many code answers text has in its top 5 but hybrid not (issue 40's
    goal: none, for codes in up to 1% of the catalogue). A query's vector is computed once and
    given to all three modes. --local-model MODEL scores another local model (sets
    HARVESTER_LOCAL_MODEL); the output names the model. --home DIR --reuse scores the database an
    earlier run kept in DIR again (no harvest); --search-setting rare_matches=0 scores hybrid
    without its rare-exact-match rule, --baseline rare_matches=0 scores it both ways in one run
    (a `baseline` column, the same query vectors: before / after); --no-dcat leaves datos.gob.ar
    out (the 3,122 CKAN datasets alone); --results FILE keeps the per-query figures (JSON).

(b) Scale. --datasets synthetic datasets derived from the samples (titles and descriptions varied
    deterministically, spread over portals, organizations, tags, formats, licenses and dates) are
    loaded set-based (COPY) into datasets / embeddings of a second database, with a deterministic
    stand-in for the local model's vectors (384 dimensions: an IDF-weighted sum of fixed word
    directions lying mostly in a 48-dimensional subspace, so texts sharing words are near each
    other and the data has a low intrinsic dimension, like real sentence embeddings; --stand-in
    random for isotropic directions, a harder case). Then it prints:
    the build time of the indexes (HNSW, GIN full text, metadata_modified); recall@10 of the HNSW
    side against exact search (index scans off) at several ef_search values; p50 / p95 latency of
    hybrid queries without and with filters, excluding the query's embedding; the local model's
    query embedding time, separately; the share of filtered queries that returned a full k.

Prints figures; asserts nothing about time (the exit status is 1 when hybrid does not beat both
other modes on nDCG@10 and MRR of the curated set, or recall@10 at the chosen ef_search is below 0.95).

    .venv/bin/python bench/search_bench.py                      # both parts, 100,000 datasets
    .venv/bin/python bench/search_bench.py --datasets 5000      # a smoke run (~4 min: the relevance
                                                                # part embeds 3,122 records locally)
    .venv/bin/python bench/search_bench.py --part scale --datasets 5000   # ~30 s
    .venv/bin/python bench/search_bench.py --part relevance [--set curated|generated|all] [--local-model MODEL]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import unicodedata
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins")]
SAMPLES = Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")
DCAT_SAMPLES = Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples")
QUERIES = ROOT / "bench" / "relevance" / "queries.yaml"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODES = ("vector", "text", "hybrid")
K = 10
DIMENSION = 384
# The text-search configuration each sample portal is harvested with (its `language:`).
LANGUAGE = {"dados-gov-br.jsonl": "portuguese", "govdata-de.jsonl": "german",
            "data-stadt-zuerich-ch.jsonl": "german", "dkan-hauts-de-france.jsonl": "french"}


MISSING = ("search_bench: harvester.store.search does not provide the hybrid search API yet ({}); this benchmark needs "
           "search(conn, query, mode=..., filters=SearchFilters(...), limit=..., settings=SearchSettings(...), "
           "query_vector=...) returning .items and .timings")


def search_api():
    """harvester.store.search's hybrid API, or None (with a clear message) when it is not there yet."""
    try:
        from harvester.store.search import SearchFilters, SearchSettings, search
    except ImportError as exc:
        print(MISSING.format(exc), file=sys.stderr)
        return None
    return search, SearchFilters, SearchSettings


def settings_with(SearchSettings, **changes):
    base = SearchSettings()
    return dataclasses.replace(base, **changes) if dataclasses.is_dataclass(base) else SearchSettings(**changes)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


# -- (a) relevance -------------------------------------------------------------------------------
def ndcg_mrr(ranked: list[str], relevant: set[str]) -> tuple[float, float]:
    """Binary nDCG@K and reciprocal rank of a ranked list of ids (repeats after the first dropped:
    the same dataset harvested from two portals is one answer)."""
    ndcg, rr, _ = scores_of(ranked, relevant)
    return ndcg, rr


def _unique(ranked: list[str]) -> list[str]:
    return list(dict.fromkeys(ranked))


def scores_of(ranked: list[str], relevant: set[str]) -> tuple[float, float, float]:
    """(binary nDCG@K, reciprocal rank, recall@K) of a ranked list of ids, repeats dropped."""
    ids = _unique(ranked)[:K]
    dcg = sum(1 / math.log2(i + 2) for i, item in enumerate(ids) if item in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(len(relevant), K)))
    rr = next((1 / (i + 1) for i, item in enumerate(ids) if item in relevant), 0.0)
    recall = len(relevant & set(ids)) / len(relevant) if relevant else 0.0
    return dcg / ideal if ideal else 0.0, rr, recall


def generator():
    """bench/relevance/generate.py, loaded by path (the generated relevance set)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("relevance_generate", ROOT / "bench" / "relevance" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def relevance_entries(which: str) -> list[dict]:
    """The queries of --set: curated (queries.yaml, by hand), generated (generate.py) or all."""
    import yaml

    entries = []
    if which in ("curated", "all"):
        entries += [{**e, "set": "curated", "kind": "curated"}
                    for e in yaml.safe_load(QUERIES.read_text(encoding="utf-8"))["queries"]]
    if which in ("generated", "all"):
        entries += generator().generate()
    return entries


def harvest_samples(conn, reader, provider, dcat: bool = True) -> int:
    """Every ckan-samples file as its own portal, and generate.DCAT_FILES (datos.gob.ar) as a
    dcat-json portal; the datasets created."""
    import gzip

    from harvester.config.portals import Portal
    from harvester.pipeline import steps as pipeline
    from harvester.testing.ckan_portal import DemoPortal
    from harvester.testing.dcat_portal import DcatServer

    harvested = 0
    for name in sorted(p.name for p in SAMPLES.glob("*.jsonl")):
        with DemoPortal(files=[SAMPLES / name]) as portal_server:
            slug = re.sub(r"[^a-z0-9]+", "_", name.removesuffix(".jsonl").lower())[:40]
            portal = Portal(name=slug, url=portal_server.base_url, politeness_delay=0,
                            language=LANGUAGE.get(name, "english"))
            stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
            harvested += stats["created"]
    for name, language in (generator().DCAT_FILES.items() if dcat else ()):
        with DcatServer() as dcat:
            dcat.set_document("/data.json", gzip.decompress((DCAT_SAMPLES / name).read_bytes()))
            slug = re.sub(r"[^a-z0-9]+", "_", name.split("/")[0].lower())[:40]
            portal = Portal(name=slug, url=dcat.url("/data.json"), type="dcat-json", politeness_delay=0,
                            language=language)
            stats = pipeline.harvest(conn, reader, portal, pipeline.source_for(portal), provider, full_sync=True)
            harvested += stats["created"]
    return harvested


def _overrides(SearchSettings, pairs) -> dict:
    """--search-setting NAME=VALUE pairs as SearchSettings fields of the right type."""
    types = {f.name: type(f.default) for f in dataclasses.fields(SearchSettings)}
    out = {}
    for pair in pairs or []:
        name, _, value = pair.partition("=")
        if name not in types:
            raise SystemExit(f"--search-setting: {name!r} is not one of {', '.join(types)}")
        out[name] = types[name](value)
    return out


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def relevance(server, args) -> bool:
    from harvester.embeddings.local import LocalProvider
    from harvester.store import db

    api = search_api()
    if api is None:
        print("relevance part not run: " + MISSING.format("import failed"))
        return False
    search, SearchFilters, SearchSettings = api
    base = settings_with(SearchSettings, **_overrides(SearchSettings, args.search_setting))
    # --baseline: hybrid scored a second time with other settings, with the same query vectors
    baseline = dataclasses.replace(base, **_overrides(SearchSettings, args.baseline)) if args.baseline else None
    modes = MODES + (("baseline",) if baseline else ())
    entries = relevance_entries(args.set)
    admin = server.url("postgres")
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'bench_relevance'").fetchone()
        reuse = args.reuse and exists
        if not reuse:
            conn.execute("DROP DATABASE IF EXISTS bench_relevance")
            conn.execute("CREATE DATABASE bench_relevance")
    url = server.url("bench_relevance")
    provider = LocalProvider()
    started = time.perf_counter()
    with db.prepare(db.connect_url(url)) as conn, db.prepare(db.connect_url(url)) as reader:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        if reuse:
            models = {r[0] for r in conn.execute("SELECT DISTINCT m.name FROM embeddings e"
                                                 " JOIN embedding_models m ON m.id = e.model").fetchall()}
            if provider.model not in models:
                print(f"--reuse: the kept database holds vectors of {sorted(models)}, not {provider.model}: "
                      "run without --reuse", file=sys.stderr)
                return False
            print(f"relevance set-up: the kept database reused (--reuse), model {provider.model}")
        else:
            harvested = harvest_samples(conn, reader, provider, dcat=not args.no_dcat)
            for table in ("datasets", "dataset_search", "embeddings"):  # as autovacuum keeps a live database
                conn.execute(f"ANALYZE {table}")
            print(f"relevance set-up: the sample files harvested as portals, {harvested} datasets, "
                  f"model {provider.model}, in {time.perf_counter() - started:.0f}s")
        present = {r[0] for r in conn.execute("SELECT DISTINCT source_id FROM datasets WHERE removed_at IS NULL")}
        missing = [e for e in entries if not {x["id"] for x in e["expected"]} & present]
        if missing:
            print(f"left out: {len(missing)} queries none of whose expected datasets is in the database: "
                  + ", ".join(repr(e["query"]) for e in missing[:10]))
        entries = [e for e in entries if e not in missing]

        results = []  # one dict per query: set, kind, language, query, and per mode nDCG, RR, recall, top 5 hit
        embed_ms = []
        query_vectors = []
        for entry in entries:
            relevant = {e["id"] for e in entry["expected"]} & present
            t0 = time.perf_counter()
            vector = provider.embed_query(entry["query"])
            embed_ms.append((time.perf_counter() - t0) * 1000)
            query_vectors.append(vector)
            row = {key: entry[key] for key in ("set", "kind", "language", "query")}
            for mode in modes:
                found = search(conn, entry["query"], mode="hybrid" if mode == "baseline" else mode,
                               filters=SearchFilters(), limit=K, settings=baseline if mode == "baseline" else base,
                               query_vector=vector)
                ranked = [item["source_id"] for item in found.items]
                ndcg, rr, recall = scores_of(ranked, relevant)
                row[mode] = {"ndcg": ndcg, "rr": rr, "recall": recall,
                             "top5": sorted(relevant & set(_unique(ranked)[:5])),
                             "first": [ranked.index(i) + 1 for i in relevant if i in ranked][:1] or None}
            results.append(row)
            if args.verbose:
                print(f"  {row['kind']:8s} {row['language']} {entry['query'][:44]:44s} "
                      + "  ".join(f"{m} {row[m]['ndcg']:.2f}" for m in modes))

        curated = [(e, v) for e, v in zip(entries, query_vectors) if e["set"] == "curated"]
        sweep = []
        default = base
        if curated and not args.no_sweep:
            # the settings of the fusion: N per side and the RRF constant, around the defaults (curated set)
            for candidates in sorted({10, 20, 30, 50, 100, default.candidates}):
                for rrf_k in sorted({20, 60, 100, default.rrf_k}):
                    settings = dataclasses.replace(base, candidates=candidates, rrf_k=rrf_k)
                    got = [ndcg_mrr([i["source_id"] for i in search(conn, e["query"], mode="hybrid", limit=K,
                                                                     settings=settings, query_vector=v).items],
                                    {x["id"] for x in e["expected"]}) for e, v in curated]
                    sweep.append((candidates, rrf_k, statistics.fmean(g[0] for g in got),
                                  statistics.fmean(g[1] for g in got)))

    if args.results:
        Path(args.results).write_text(json.dumps({"model": provider.model, "settings": dataclasses.asdict(default),
                                                  "queries": results}, indent=1))
    print()
    print(f"relevance: model {provider.model}; {len(results)} queries over the real samples (--set {args.set}); "
          f"k={K}; settings {dataclasses.asdict(default)}")
    if baseline:
        print(f"baseline: hybrid with {', '.join(args.baseline)} (same query vectors)")
    rows_curated = [r for r in results if r["set"] == "curated"]
    ok = True
    if rows_curated:
        languages = sorted({r["language"] for r in rows_curated}, key=lambda l: (l != "en", l))
        print(f"curated set (queries.yaml), nDCG@{K} / MRR@{K}:")
        print(f"{'queries':22s} {'n':>4s} " + " ".join(f"{m + ' nDCG':>12s} {m + ' MRR':>11s}" for m in modes))
        for label, keep in [("all", None)] + [(f"language {lang}", lang) for lang in languages] \
                + ([("non-English", "!en")] if len(languages) > 1 else []):
            rows = [r for r in rows_curated if keep is None or r["language"] == keep
                    or (keep == "!en" and r["language"] != "en")]
            print(f"{label:22s} {len(rows):4d} " + " ".join(
                f"{_mean(r[m]['ndcg'] for r in rows):12.3f} {_mean(r[m]['rr'] for r in rows):11.3f}" for m in modes))
        wins = {m: sum(r[m]["ndcg"] == max(r[x]["ndcg"] for x in modes) for r in rows_curated) for m in modes}
        print("curated queries where the mode has the best nDCG (ties count for each): "
              + ", ".join(f"{m} {wins[m]}" for m in modes))
        mean = {m: (_mean(r[m]["ndcg"] for r in rows_curated), _mean(r[m]["rr"] for r in rows_curated)) for m in modes}
        ok = all(mean["hybrid"][i] > max(mean["vector"][i], mean["text"][i]) for i in (0, 1))

    print()
    print(f"by set, kind and language: recall@{K} / nDCG@{K} per mode")
    print(f"{'set':10s} {'kind':9s} {'lang':5s} {'n':>4s} " + " ".join(f"{m:>15s}" for m in modes))
    kinds = list(dict.fromkeys((r["set"], r["kind"]) for r in results))
    for set_name, kind in kinds:
        rows = [r for r in results if (r["set"], r["kind"]) == (set_name, kind)]
        languages = sorted({r["language"] for r in rows}, key=lambda l: (l != "en", l))
        for lang in (["all"] if len(languages) > 1 else []) + languages:
            sel = [r for r in rows if lang == "all" or r["language"] == lang]
            print(f"{set_name:10s} {kind:9s} {lang:5s} {len(sel):4d} " + " ".join(
                f"{_mean(r[m]['recall'] for r in sel):7.3f} {_mean(r[m]['ndcg'] for r in sel):7.3f}" for m in modes))
    generated = [r for r in results if r["set"] == "generated"]
    if generated:
        languages = sorted({r["language"] for r in generated}, key=lambda l: (l != "en", l))
        print(f"{'generated':10s} {'all':9s} {'all':5s} {len(generated):4d} " + " ".join(
            f"{_mean(r[m]['recall'] for r in generated):7.3f} {_mean(r[m]['ndcg'] for r in generated):7.3f}"
            for m in modes))
        for lang in languages:
            sel = [r for r in generated if r["language"] == lang]
            print(f"{'generated':10s} {'all':9s} {lang:5s} {len(sel):4d} " + " ".join(
                f"{_mean(r[m]['recall'] for r in sel):7.3f} {_mean(r[m]['ndcg'] for r in sel):7.3f}" for m in modes))
    for code_kind, which in (("code", "in 1-5 datasets"), ("code-wide", "in 6 datasets to 1% of the corpus")):
        codes = [r for r in results if r["kind"] == code_kind]
        if not codes:
            continue
        found = [r for r in codes if r["text"]["top5"]]
        answers = sum(len(r["text"]["top5"]) for r in found)
        print(f"{code_kind} queries (codes {which}): {len(codes)}, with an answer in text's top 5: {len(found)} "
              f"({answers} such answers; issue 40's goal: hybrid's top 5 keeps every one)")
        for mode in [m for m in modes if m in ("hybrid", "baseline")]:
            lost_all = [r for r in found if not r[mode]["top5"]]
            lost_some = [r for r in found if set(r["text"]["top5"]) - set(r[mode]["top5"])]
            pushed = sum(len(set(r["text"]["top5"]) - set(r[mode]["top5"])) for r in found)
            print(f"  {mode}: its top 5 lacks every such answer for {len(lost_all)} queries, at least one for "
                  f"{len(lost_some)} ({pushed} of {answers} answers pushed out of the top 5, goal 0)"
                  + (": " + ", ".join(f"{r['query']} ({r['language']}, {len(r['text']['top5'])} in text's top 5, "
                                      f"{len(r[mode]['top5'])} in {mode}'s)" for r in lost_some) if lost_some else ""))
    if sweep:
        print(f"hybrid by settings, curated set (N = candidates per side, k = RRF constant; defaults "
              f"N={default.candidates}, k={default.rrf_k}):")
        for candidates, rrf_k, n, rr in sweep:
            mark = "  <- default" if (candidates, rrf_k) == (default.candidates, default.rrf_k) else ""
            print(f"  N={candidates:<4d} k={rrf_k:<4d} nDCG {n:.3f}  MRR {rr:.3f}{mark}")
    print(f"query embedding ({provider.model}, {len(embed_ms)} queries): p50 {percentile(embed_ms, .5):.1f} ms, "
          f"p95 {percentile(embed_ms, .95):.1f} ms")
    if rows_curated:
        print(f"hybrid beats both vector and text on nDCG@{K} and MRR (curated set): {'yes' if ok else 'NO'}")
    return ok



# -- (b) scale -----------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z0-9]+")


def fold(text: str) -> str:
    return unicodedata.normalize("NFKD", text or "").encode("ascii", "ignore").decode().lower()


def words(text: str) -> list[str]:
    return _WORD.findall(fold(text))


class StandIn:
    """A deterministic stand-in for the local model (same dimension as all-MiniLM-L6-v2): every word
    gets a fixed random direction (seeded by its CRC32); a text is the normalized, IDF-weighted sum
    of its words' directions (title words counted twice, words in over a tenth of the corpus
    dropped). Texts sharing rare words are near each other, as with real embeddings.

    ``rank``: word directions drawn mostly within a fixed 48-dimensional subspace (plus a little
    noise), as sentence embeddings have a low intrinsic dimension; ``rank=None`` (--stand-in
    random): isotropic directions, i.e. near-random 384-dimensional data, a much harder case
    for any ANN index than real embeddings."""

    def __init__(self, dimension: int = DIMENSION, rank: int | None = 48):
        import numpy as np

        self.np, self.dimension, self.rank = np, dimension, rank
        self.index: dict[str, int] = {}
        self.directions = []
        self.idf: dict[str, float] = {}
        if rank:  # a fixed orthonormal basis of a rank-dimensional subspace
            self.basis = np.linalg.qr(np.random.default_rng(0).standard_normal((dimension, rank)))[0].T

    @staticmethod
    def tokens(title: str, description: str = "") -> list[str]:
        return words(title) * 2 + words(description)[:80]

    def fit(self, texts) -> "StandIn":
        df: dict[str, int] = {}
        n = 0
        for title, description in texts:
            n += 1
            for token in set(self.tokens(title, description)):
                df[token] = df.get(token, 0) + 1
        self.idf = {t: math.log(n / c) for t, c in df.items() if c <= max(1, n // 10)}
        return self

    def _row(self, token: str) -> int:
        row = self.index.get(token)
        if row is None:
            row = self.index[token] = len(self.directions)
            rng = self.np.random.default_rng(zlib.crc32(token.encode()))
            if self.rank:  # mostly in the subspace, a little noise around it
                direction = rng.standard_normal(self.rank) @ self.basis \
                    + rng.standard_normal(self.dimension) * 0.3 * math.sqrt(self.rank / self.dimension)
            else:
                direction = rng.standard_normal(self.dimension)
            self.directions.append(direction.astype("float32"))
        return row

    def embed(self, title: str, description: str = ""):
        np = self.np
        weights: dict[int, float] = {}
        for token in self.tokens(title, description):
            w = self.idf.get(token)
            if w:
                row = self._row(token)
                weights[row] = weights.get(row, 0.0) + w
        if not weights:
            weights[self._row("(empty)")] = 1.0
        rows = list(weights)
        out = np.asarray(list(weights.values()), dtype="float32") @ np.stack([self.directions[r] for r in rows])
        return out / (np.linalg.norm(out) or 1.0)


PLACES = ["north", "south", "east", "west", "central", "coastal", "rural", "urban", "metropolitan", "district",
          "county", "region", "municipal", "state", "provincial", "federal", "national", "local", "island", "valley"]
TOPICS = ["annual", "monthly", "quarterly", "weekly", "historical", "preliminary", "revised", "summary", "detailed",
          "archive", "survey", "census", "register", "inventory", "indicators", "statistics", "report", "map",
          "series", "estimates"]


def base_records() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(SAMPLES.glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            out += [(path.name, json.loads(line)) for line in handle if line.strip()]
    return out


def synthetic_rows(n: int, seed: int = 11, first: int = 0, bases: list | None = None):
    """Deterministic synthetic datasets derived from the samples: one dict per dataset with the
    columns the harvester stores, and the metadata the filters look at. ``first``: the number of
    the first dataset (a slice of a larger catalogue, bench/million_search_bench.py: each slice
    has a random sequence of its own, so slices can be made in any order)."""
    from harvester.domain.dataset import clean_text, content_hash, embedding_text, sha256_hex

    bases = bases or base_records()
    rng = random.Random(seed if not first else seed * 1_000_003 + first)
    start = datetime(2015, 1, 1, tzinfo=timezone.utc)
    now = datetime.now(timezone.utc)
    rows = []
    for i in range(first, first + n):
        name, base = bases[i % len(bases)]
        variant = i // len(bases)
        other = bases[rng.randrange(len(bases))][1]
        extra = [w for w in words(other.get("title") or "") if len(w) > 3][:2]
        title = clean_text(base.get("title")) or base.get("name") or "dataset"
        if variant:
            title = f"{title} {rng.choice(PLACES)} {rng.choice(TOPICS)} {' '.join(extra)} {1990 + rng.randrange(36)}"
        notes = clean_text(base.get("notes"))[:1500]
        if variant:  # a cut of the original description, and a passage of another record's
            notes = notes[:int(len(notes) * rng.uniform(0.3, 1.0))]
            passage = clean_text(bases[rng.randrange(len(bases))][1].get("notes")).split()
            begin = rng.randrange(max(1, len(passage) - 30))
            notes = f"{notes} {' '.join(passage[begin:begin + rng.randrange(15, 40)])}"
        description = f"{notes} {rng.choice(TOPICS)} data for the {rng.choice(PLACES)} area, {' '.join(extra)}".strip()
        org = base.get("organization") if isinstance(base.get("organization"), dict) else {}
        organization = org.get("title") or org.get("name") or None
        tags = sorted({(t.get("name") if isinstance(t, dict) else str(t)) for t in base.get("tags") or []} - {None, ""})
        resources = [{"format": (r.get("format") or "").strip(), "url": r.get("url") or ""}
                     for r in (base.get("resources") or [])[:3] if isinstance(r, dict)]
        license_id = base.get("license_id") or base.get("license_title")
        portal = f"https://{name.removesuffix('.jsonl')}.bench{variant % 4}.example"
        modified = start + timedelta(seconds=rng.randrange(int((now - start).total_seconds())))
        source_id = f"bench-{i:07d}"
        text = embedding_text(title, description)
        raw = {"id": source_id, "name": f"{base.get('name') or 'dataset'}-{i}", "title": title, "notes": description,
               "license_id": license_id, "tags": [{"name": t} for t in tags], "resources": resources,
               "organization": {"name": org.get("name"), "title": organization} if organization else None,
               "metadata_modified": modified.isoformat()}
        url = f"{portal}/dataset/{raw['name']}"
        rows.append({
            "portal_url": portal, "source_id": source_id, "name": raw["name"], "url": url, "url_hash": sha256_hex(url),
            "content_hash": content_hash(text), "metadata_hash": sha256_hex(source_id), "title": title,
            "description": description, "tags": tags, "organization": organization, "metadata_modified": modified,
            "raw": raw, "search_config": LANGUAGE.get(name, "english"),
            "formats": sorted({r["format"].lower() for r in resources if r["format"]}), "license": license_id,
        })
    return rows


def load(conn, rows, stand_in, model: str) -> tuple[float, float]:
    """COPY the rows into datasets and their vectors into embeddings; (seconds datasets, seconds vectors)."""
    from harvester.store import vectors


    now = datetime.now(timezone.utc)
    columns = ("portal_url", "source_id", "name", "url", "url_hash", "content_hash", "metadata_hash", "title",
               "description", "tags", "organization", "metadata_modified", "first_seen_at", "updated_at",
               "embedded_content_hash", "raw", "search_config")
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        with cur.copy(f"COPY datasets ({', '.join(columns)}) FROM STDIN") as copy:
            for r in rows:
                copy.write_row((r["portal_url"], r["source_id"], r["name"], r["url"], r["url_hash"], r["content_hash"],
                                r["metadata_hash"], r["title"], r["description"], json.dumps(r["tags"]),
                                r["organization"], r["metadata_modified"], now, now, r["content_hash"],
                                json.dumps(r["raw"]), r["search_config"]))
    datasets_s = time.perf_counter() - started
    from pgvector import HalfVector

    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        number = vectors.model_id(conn, model, create=True)
        with cur.copy("COPY embeddings (content_hash, model, dimension, embedding) FROM STDIN (FORMAT BINARY)") as copy:
            # the hash as bytes and the model's id (sql/042), stored in half precision (sql/019)
            copy.set_types(["bytea", "int4", "int2", "halfvec"])
            for r in rows:
                copy.write_row((bytes.fromhex(r["content_hash"]), number, DIMENSION,
                                HalfVector(stand_in.embed(r["title"], r["description"]))))
    return datasets_s, time.perf_counter() - started


def scale(server, args) -> bool:
    import psycopg
    from psycopg import sql

    from harvester.embeddings.local import LocalProvider
    from harvester.store import db, vectors

    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS bench_scale")
        conn.execute("CREATE DATABASE bench_scale")
    url = server.url("bench_scale")
    provider = LocalProvider()
    model = provider.model  # the stand-in's vectors are stored as the local model's: search reads that model
    rng = random.Random(5)

    started = time.perf_counter()
    rows = synthetic_rows(args.datasets)
    stand_in = StandIn(rank=None if args.stand_in == "random" else 48).fit((r["title"], r["description"]) for r in rows)
    print(f"scale set-up: {len(rows):,} synthetic datasets derived from {len(base_records()):,} sample records "
          f"in {time.perf_counter() - started:.1f}s")
    with db.prepare(db.connect_url(url)) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        # Loaded first, indexed after (as a bulk load is): each index's definition kept, dropped, built again.
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
            " AND tablename = 'dataset_search' AND indexname <> 'dataset_search_pkey' ORDER BY indexname"
        ).fetchall()
        for name, _ in indexes:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
        datasets_s, vectors_s = load(conn, rows, stand_in, model)
        print(f"COPY: datasets {datasets_s:.1f}s (with dataset_search, filled by its trigger), vectors {vectors_s:.1f}s")
        conn.execute("SET maintenance_work_mem = '512MB'")
        builds = []
        t0 = time.perf_counter()
        vectors.ensure_index(conn, model, DIMENSION)
        builds.append((f"HNSW ({vectors.opclass(DIMENSION)}, defaults m=16 ef_construction=64)", time.perf_counter() - t0))
        for name, definition in indexes:
            t0 = time.perf_counter()
            conn.execute(definition)
            builds.append((f"{name}", time.perf_counter() - t0))
        t0 = time.perf_counter()  # what each run's upsert does for its portal
        with conn.transaction():
            for (portal_url,) in conn.execute("SELECT DISTINCT portal_url FROM datasets").fetchall():
                vectors.copy_for_search(conn, portal_url, model)
        builds.append(("dataset_vectors (the vectors by dataset, for exact ranking)", time.perf_counter() - t0))
        conn.execute("ANALYZE datasets")
        conn.execute("ANALYZE dataset_search")
        conn.execute("ANALYZE embeddings")
        conn.execute("ANALYZE dataset_vectors")
        size = conn.execute("SELECT pg_size_pretty(pg_relation_size(%s::regclass))",
                            (vectors.index_name(model),)).fetchone()[0]

        # recall@10 of the HNSW side against exact search, at several ef_search (an index of the bits,
        # HARVESTER_INDEX_KIND=bit: at several re-rank sizes, the nearest by the bits ranked exactly)
        search, SearchFilters, SearchSettings = search_api() or (None, None, None)
        kind = vectors.index_kind()
        knob = "rerank" if kind == "bit" else "ef_search"
        chosen = getattr(SearchSettings(), knob, 100) if SearchSettings else 100
        ef_values = sorted({int(v) for v in args.ef_search.split(",")} | {int(chosen)})
        picks = [rows[rng.randrange(len(rows))] for _ in range(args.queries)]
        query_texts = []
        for r in picks:
            ws = [w for w in words(r["title"]) if len(w) > 2]
            start = rng.randrange(max(1, len(ws) - 2))
            query_texts.append(" ".join(ws[start:start + rng.choice((2, 3))]) or r["title"])
        query_vectors = [stand_in.embed(q) for q in query_texts]
        knn = vectors.nearest(DIMENSION, kind, query="q")
        # the truth: every stored vector compared, exactly (no index)
        exact_knn = sql.SQL("SELECT e.content_hash, embedding::vector({dim}) <=> %(q)s::vector({dim})"
                            " FROM embeddings e WHERE e.model = %(model_id)s::integer ORDER BY 2 LIMIT {k}").format(
            dim=sql.Literal(DIMENSION), k=sql.Literal(K))
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + knn, {
            "model_id": vectors.model_id(conn, model), "q": query_vectors[0], "n": K, "rerank": chosen}))
        if "hnsw" not in plan.lower() and vectors.index_name(model) not in plan:
            print("warning: the nearest-neighbour query does not use the HNSW index:\n" + plan)
        exact, exact_ms = [], []
        for q in query_vectors:
            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                t0 = time.perf_counter()
                exact.append(conn.execute(exact_knn, {"model_id": vectors.model_id(conn, model), "q": q}).fetchall())
                exact_ms.append((time.perf_counter() - t0) * 1000)
        recall = {}
        for ef in ef_values:
            got, tied, ms = [], [], []
            for q, truth in zip(query_vectors, exact):
                with conn.transaction():
                    conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(min(1000, ef))))
                    t0 = time.perf_counter()
                    found = conn.execute(knn, {"model_id": vectors.model_id(conn, model), "q": q, "n": K,
                                               "rerank": ef}).fetchall()
                    ms.append((time.perf_counter() - t0) * 1000)
                wanted = max(1, min(K, len(truth)))
                got.append(len({r[0] for r in found} & {r[0] for r in truth}) / wanted)
                # ann-benchmarks' definition: a result counts when it is as near as the k-th true
                # neighbour (equally distant datasets are equally right answers)
                kth = truth[wanted - 1][1] if truth else 0.0
                tied.append(sum(1 for r in found if r[1] <= kth + 1e-6) / wanted)
            recall[ef] = (statistics.fmean(got), statistics.fmean(tied), percentile(ms, .5), percentile(ms, .95))

        # the local model's query embedding time, separately
        for text in ("warm-up", "a second warm-up query", "and a third"):
            provider.embed_query(text)
        embed_ms = []
        for q in query_texts[:args.embed_queries]:
            t0 = time.perf_counter()
            provider.embed_query(q)
            embed_ms.append((time.perf_counter() - t0) * 1000)

        print()
        print(f"scale: {len(rows):,} datasets, {len(rows):,} vectors of {DIMENSION} dimensions (stand-in), "
              f"{args.queries} queries, k={K}, {os.cpu_count()} CPUs, stand-in {args.stand_in}")
        print(f"{'index build':58s} {'seconds':>10s}")
        for label, took in builds:
            print(f"  {label:56s} {took:10.1f}")
        print(f"  {'(HNSW index size ' + size + ')':56s}")
        print(f"{'HNSW recall@10 vs exact (ids / distance, ties counted)':58s} {'recall':>10s} {'p50 ms':>8s} "
              f"{'p95 ms':>8s}")
        print(f"  {'exact (index scans off)':56s} {'1.000':>10s} {percentile(exact_ms, .5):8.1f} "
              f"{percentile(exact_ms, .95):8.1f}")
        for ef, (r, t, p50, p95) in recall.items():
            mark = "  <- chosen" if ef == chosen else ""
            print(f"  {knob + '=' + str(ef):56s} {f'{r:.3f} / {t:.3f}':>10s} {p50:8.1f} {p95:8.1f}{mark}")
        print(f"{'query embedding, local model (' + str(len(embed_ms)) + ' queries)':58s} {'':10s} "
              f"{percentile(embed_ms, .5):8.1f} {percentile(embed_ms, .95):8.1f}")
        ok = recall[chosen][0] >= 0.95

        if search is None:
            print("\nhybrid latency and filtered-query figures not measured: " + MISSING.format("import failed"))
            return False

        # hybrid latency without and with filters, the query's embedding excluded (vector given)
        by = {key: {} for key in ("portal_url", "organization", "tag", "format", "license")}
        for r in rows:
            for key, values in (("portal_url", [r["portal_url"]]), ("organization", [r["organization"]]),
                                ("tag", r["tags"]), ("format", r["formats"]), ("license", [r["license"]])):
                for v in values:
                    if v:
                        by[key][v] = by[key].get(v, 0) + 1
        modified = sorted(r["metadata_modified"] for r in rows)
        settings = settings_with(SearchSettings, **{knob: chosen})
        kinds = ("portal_url", "organization", "tag", "format", "license", "since", "portal_url+since")
        # Warm-up: as many other queries, unfiltered and by portal, so that the measured ones meet
        # the caches of a server in use (not the same queries: their own pages would be cached).
        warm = random.Random(11)
        for _ in range(len(picks)):
            r = rows[warm.randrange(len(rows))]
            ws = [w for w in words(r["description"] or r["title"]) if len(w) > 2] or ["data"]
            q = " ".join(warm.sample(ws, min(2, len(ws))))
            for filters in (SearchFilters(), SearchFilters(portal_url=r["portal_url"])):
                search(conn, q, mode="hybrid", filters=filters, limit=K, settings=settings,
                       query_vector=stand_in.embed(q))
        plain_ms, plain_sql, filtered_ms, filtered_sql = [], [], {}, {}
        full, eligible_full, eligible = 0, 0, 0
        for n, (r, q, v) in enumerate(zip(picks, query_texts, query_vectors)):
            t0 = time.perf_counter()
            result = search(conn, q, mode="hybrid", filters=SearchFilters(), limit=K, settings=settings, query_vector=v)
            plain_ms.append((time.perf_counter() - t0) * 1000)
            plain_sql.append(result.timings.get("sql_ms", float("nan")))
            kind = kinds[n % len(kinds)]
            filters, matching = {}, len(rows)
            if kind in ("portal_url", "organization", "license") and r[kind]:
                filters[kind], matching = r[kind], by[kind][r[kind]]
            elif kind == "tag" and r["tags"]:
                filters["tag"] = r["tags"][n % len(r["tags"])]
                matching = by["tag"][filters["tag"]]
            elif kind == "format" and r["formats"]:
                filters["format"] = r["formats"][0]
                matching = by["format"][filters["format"]]
            if kind in ("since", "portal_url+since"):
                since = modified[rng.randrange(len(modified) // 2, len(modified))]
                filters["since"] = since
                matching = sum(1 for m in modified if m >= since)
                if kind == "portal_url+since":
                    filters["portal_url"] = r["portal_url"]
                    matching = sum(1 for x in rows if x["portal_url"] == r["portal_url"] and x["metadata_modified"] >= since)
            if not filters:  # the dataset has no value for that filter: filter by its portal
                filters["portal_url"], matching = r["portal_url"], by["portal_url"][r["portal_url"]]
            t0 = time.perf_counter()
            result = search(conn, q, mode="hybrid", filters=SearchFilters(**filters), limit=K, settings=settings,
                            query_vector=v)
            filtered_ms.setdefault(kind, []).append((time.perf_counter() - t0) * 1000)
            filtered_sql.setdefault(kind, []).append(result.timings.get("sql_ms", float("nan")))
            got = len(result.items) >= K
            full += got
            if matching >= K:
                eligible += 1
                eligible_full += got

        all_filtered = [x for v in filtered_ms.values() for x in v]
        all_filtered_sql = [x for v in filtered_sql.values() for x in v]
        print(f"{'hybrid query latency, embedding excluded':58s} {'queries':>10s} {'p50 ms':>8s} {'p95 ms':>8s} "
              f"{'sql p50':>8s} {'sql p95':>8s}")
        print(f"  {'no filter':56s} {len(plain_ms):10d} {percentile(plain_ms, .5):8.1f} {percentile(plain_ms, .95):8.1f} "
              f"{percentile(plain_sql, .5):8.1f} {percentile(plain_sql, .95):8.1f}")
        print(f"  {'with filters (all kinds)':56s} {len(all_filtered):10d} {percentile(all_filtered, .5):8.1f} "
              f"{percentile(all_filtered, .95):8.1f} {percentile(all_filtered_sql, .5):8.1f} "
              f"{percentile(all_filtered_sql, .95):8.1f}")
        for kind in kinds:
            if kind in filtered_ms:
                ms, sq = filtered_ms[kind], filtered_sql[kind]
                print(f"    {kind:54s} {len(ms):10d} {percentile(ms, .5):8.1f} {percentile(ms, .95):8.1f} "
                      f"{percentile(sq, .5):8.1f} {percentile(sq, .95):8.1f}")
        outside = [w - q for w, q in zip(plain_ms + all_filtered, plain_sql + all_filtered_sql)]
        coverage_ms = []
        for _ in range(5):
            t0 = time.perf_counter()
            vectors.coverage(conn)
            coverage_ms.append((time.perf_counter() - t0) * 1000)
        print(f"  time outside search()'s sql_ms (wall - sql_ms): p50 {percentile(outside, .5):.1f} ms, "
              f"p95 {percentile(outside, .95):.1f} ms; one vectors.coverage() (run by choose_provider only while "
              f"two models hold vectors, then cached 60 s): p50 {percentile(coverage_ms, .5):.1f} ms")
        total = len(all_filtered)
        print(f"filtered queries that returned a full k={K}: {full}/{total} ({full / max(1, total):.1%}); "
              f"of those whose filter matches at least {K} datasets: {eligible_full}/{eligible} "
              f"({eligible_full / max(1, eligible):.1%})")
        p95 = max(percentile(plain_ms, .95), percentile(all_filtered, .95))
        print(f"recall@10 at the chosen {knob}={chosen}: {recall[chosen][0]:.3f} (target >= 0.95: "
              f"{'yes' if ok else 'NO'}); hybrid p95 {p95:.1f} ms (target <= 30 ms: {'yes' if p95 <= 30 else 'NO'})")
        return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100000, help="synthetic datasets for the scale part")
    parser.add_argument("--queries", type=int, default=200, help="queries of the scale part (recall and latency)")
    parser.add_argument("--embed-queries", type=int, default=30, help="queries embedded with the local model, timed")
    parser.add_argument("--ef-search", default="40,100,200,400", help="ef_search values for recall (comma-separated; "
                        "the search's default is always added; with HARVESTER_INDEX_KIND=bit, re-rank sizes)")
    parser.add_argument("--stand-in", choices=("lowrank", "random"), default="lowrank",
                        help="the stand-in vectors: word directions within a 48-dimensional subspace (like real "
                             "sentence embeddings, default) or isotropic random ones (a harder case)")
    parser.add_argument("--part", choices=("all", "relevance", "scale"), default="all")
    parser.add_argument("--set", choices=("curated", "generated", "all"), default="all",
                        help="the relevance queries: curated (bench/relevance/queries.yaml, written by hand), "
                             "generated (bench/relevance/generate.py, built from the records) or both (default)")
    parser.add_argument("--local-model", metavar="MODEL",
                        help="the local provider's model: all-MiniLM-L6-v2 (the default), multilingual-e5-small, "
                             "or a sentence-transformers model directory (sets HARVESTER_LOCAL_MODEL for the run)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --home: score the bench_relevance database kept there by an earlier run "
                             "(same model) instead of harvesting again")
    parser.add_argument("--search-setting", action="append", metavar="NAME=VALUE",
                        help="a SearchSettings field for the relevance part (repeatable), e.g. rare_matches=0 "
                             "to score hybrid without the rare-exact-match rule")
    parser.add_argument("--no-dcat", action="store_true",
                        help="harvest the ckan-samples only (the corpus of the figures before the generated set: "
                             "3,122 datasets); the generated set's datos.gob.ar queries are then left out")
    parser.add_argument("--baseline", action="append", metavar="NAME=VALUE",
                        help="score hybrid a second time (column `baseline`) with these SearchSettings changed "
                             "(repeatable), with the same query vectors, e.g. rare_matches=0: before / after")
    parser.add_argument("--no-sweep", action="store_true", help="skip the N / k sweep of the relevance part")
    parser.add_argument("--results", metavar="FILE", help="write the relevance part's per-query figures (JSON)")
    parser.add_argument("--verbose", action="store_true", help="per-query nDCG of the relevance part")
    parser.add_argument("--home", type=Path, help="the embedded server's directory, kept afterwards (databases "
                        "bench_scale and bench_relevance stay there to explore; default: a new temporary one)")
    args = parser.parse_args()
    if args.local_model:  # a named choice as it is, a directory resolved
        os.environ["HARVESTER_LOCAL_MODEL"] = args.local_model if not Path(args.local_model).exists() \
            else str(Path(args.local_model).resolve())

    from harvester.store.embedded.server import EmbeddedServer

    home = args.home or Path(tempfile.mkdtemp(prefix="harvester-search-bench-"))
    server = EmbeddedServer(home)
    server.start()
    os.environ["HARVESTER_EMBED_RETRY_DELAY_SECS"] = "0"
    ok = True
    try:
        if args.part in ("all", "relevance"):
            ok &= relevance(server, args)
            print()
        if args.part in ("all", "scale"):
            ok &= scale(server, args)
    finally:
        server.stop()
        if args.home is None:  # a temporary server: its data goes with it
            shutil.rmtree(home, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
