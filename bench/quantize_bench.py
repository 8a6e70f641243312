"""Benchmark: how much of a search's top 10 survives sign quantization, with and without centering.

Issue 40's storage and search goals both point at a binary-quantized vector index (each dimension
one bit: 96 bytes at 768 dimensions instead of 1,544 in half precision) that pre-ranks candidates
for an exact re-ranking. Built once at a million (bench/README.md, "Search at a million", first
round), its recall@10 was 0.830 without a filter, and centering the vectors before quantizing (a
per-model mean subtracted, so that a dimension's bit is no longer the same for most texts) was left
as the route to try. This bench measures the quantization alone, with no index: for each query,
every vector's Hamming distance to it, the ``candidates`` nearest re-ranked by the exact cosine,
and the share of the exact top 10 they hold (recall@10). What it says holds for any index over the
bits: an index can only lose more.

Two corpora:

- ``stand-in``: ``--datasets`` vectors of search_bench.py's stand-in model (the vectors of the
  million search bench: 768 dimensions, texts sharing words near each other) for its synthetic
  records; queries of two or three title words, as million_search_bench.py makes them.
- ``minilm``: the local default model (all-MiniLM-L6-v2 at 128 tokens, 384 dimensions, real
  vectors) over the distinct texts of every CKAN sample record (../shared/ckan-samples, title and
  description as a run embeds them); queries of a sample title's first three words. The corpus is
  small (about 2,600 texts), so candidates are given as shares of it.

The mean is of a sample of the corpus (10,000 vectors at most), as an index would keep it.

``--index`` then measures what the graph adds: the stand-in vectors in a fresh embedded PostgreSQL
(``--database-url``: an existing database with pgvector, where a scratch table is made and
dropped), HNSW indexes over their bits (``binary_quantize(v)::bit(768)``, ``bit_hamming_ops``;
``--builds``: m 16 and ef_construction 64 as Harvester's own vector index, then 32 and 128), each
one's build time and bytes a vector, and for each
``--ef-search`` the recall@10 and latency of a query that takes that many candidates from the
index and re-ranks them by the exact distance (halfvec, as stored), one connection, one query at a
time.

    .venv/bin/python bench/quantize_bench.py                      # about 2 minutes
    .venv/bin/python bench/quantize_bench.py --datasets 1000000   # the million's vectors (about 5 minutes, 13 GB of memory)
    .venv/bin/python bench/quantize_bench.py --corpora minilm
    .venv/bin/python bench/quantize_bench.py --corpora stand-in --index   # the index too (about 4 minutes)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "bench")]

MEAN_SAMPLE = 10_000


def unit(rows) -> np.ndarray:
    matrix = np.asarray(rows, dtype=np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def recall(corpus: np.ndarray, queries: np.ndarray, candidates: list[int], rng) -> dict:
    """{(centered, candidates): recall@10} over ``queries``."""
    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    mean = corpus[rng.choice(len(corpus), min(MEAN_SAMPLE, len(corpus)), replace=False)].mean(axis=0)
    out = {}
    for centered in (False, True):
        offset = mean if centered else np.zeros_like(mean)
        bits = np.packbits(corpus - offset > 0, axis=1)
        query_bits = np.packbits(queries - offset > 0, axis=1)
        found = {n: [] for n in candidates}
        for q, qb, truth in zip(queries, query_bits, exact):
            hamming = np.bitwise_count(np.bitwise_xor(bits, qb)).sum(axis=1, dtype=np.int32)
            order = np.argpartition(hamming, max(candidates))[:max(candidates)]
            order = order[np.argsort(hamming[order], kind="stable")]
            for n in candidates:
                top = order[:n]
                reranked = top[np.argsort(-(corpus[top] @ q))[:10]]
                found[n].append(len(set(reranked.tolist()) & set(truth.tolist())) / 10)
        for n in candidates:
            out[(centered, n)] = float(np.mean(found[n]))
    out["mean_norm"] = float(np.linalg.norm(mean))
    out["mean_positive"] = float((mean > 0).mean())
    return out


def index_recall(url: str, corpus: np.ndarray, queries: np.ndarray, efs: list[int],
                 builds: list[tuple[int, int]]) -> None:
    """The bits' HNSW index in PostgreSQL: its size, and recall@10 and latency after exact re-ranking."""
    import psycopg
    from pgvector import HalfVector
    from pgvector.psycopg import register_vector

    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    dimension = corpus.shape[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        conn.execute("DROP TABLE IF EXISTS quantize_bench_vectors")
        conn.execute(f"CREATE TABLE quantize_bench_vectors (id int, v halfvec({dimension}))")
        try:
            with conn.cursor() as cur, cur.copy("COPY quantize_bench_vectors (id, v) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int4", "halfvec"])
                for i, vector in enumerate(corpus):
                    copy.write_row((i, HalfVector(vector)))
            conn.execute("SET maintenance_work_mem = '2GB'")
            print(f"\nHNSW indexes over the bits of {len(corpus):,} stand-in vectors (Harvester's halfvec index:"
                  f" m 16, ef_construction 64, about 2,048 bytes a vector at 768 dimensions, storage_bench.py)\n")
            print("| m | ef_construction | build s | bytes a vector | hnsw.ef_search (candidates re-ranked) | recall@10"
                  " | p50 ms | p95 ms |")
            print("|---|---|---|---|---|---|---|---|")
            statement = (f"SELECT id FROM (SELECT id, v FROM quantize_bench_vectors"
                         f" ORDER BY binary_quantize(v)::bit({dimension}) <~> binary_quantize(%(q)s::halfvec)::bit({dimension})"
                         f" LIMIT %(ef)s) c ORDER BY v <=> %(q)s::halfvec LIMIT 10")
            for m, ef_construction in builds:
                conn.execute("DROP INDEX IF EXISTS quantize_bench_bits")
                t0 = time.perf_counter()
                conn.execute(f"CREATE INDEX quantize_bench_bits ON quantize_bench_vectors USING hnsw"
                             f" ((binary_quantize(v)::bit({dimension})) bit_hamming_ops)"
                             f" WITH (m = {int(m)}, ef_construction = {int(ef_construction)})")
                built = time.perf_counter() - t0
                size = conn.execute("SELECT pg_relation_size('quantize_bench_bits')").fetchone()[0]
                for ef in efs:
                    conn.execute(f"SET hnsw.ef_search = {int(ef)}")
                    found, took = [], []
                    for q, truth in zip(queries, exact):
                        t0 = time.perf_counter()
                        ids = [row[0] for row in conn.execute(statement, {"q": HalfVector(q), "ef": ef}).fetchall()]
                        took.append(time.perf_counter() - t0)
                        found.append(len(set(ids) & set(truth.tolist())) / 10)
                    print(f"| {m} | {ef_construction} | {built:.0f} | {size / len(corpus):,.0f} | {ef:,}"
                          f" | {np.mean(found):.3f} | {np.percentile(took, 50) * 1000:.1f}"
                          f" | {np.percentile(took, 95) * 1000:.1f} |", flush=True)
        finally:
            conn.execute("DROP TABLE IF EXISTS quantize_bench_vectors")


def stand_in(args, rng) -> tuple[np.ndarray, np.ndarray]:
    import million_search_bench as msb
    import search_bench as sb

    bases = sb.base_records()
    model = msb.stand_in_for(bases)  # the million search bench's vectors
    titles, rows = [], []
    for r in sb.synthetic_rows(args.datasets, bases=bases):
        rows.append(model.embed(r["title"], r["description"]))
        titles.append(r["title"])
    queries = []
    for i in rng.choice(len(titles), args.queries, replace=False):
        ws = [w for w in sb.words(titles[i]) if len(w) > 2] or sb.words(titles[i]) or ["data"]
        start = int(rng.integers(max(1, len(ws) - 2)))
        queries.append(model.embed(" ".join(ws[start:start + int(rng.choice((2, 3)))])))
    return unit(rows), unit(queries)


def minilm(args, rng) -> tuple[np.ndarray, np.ndarray]:
    from harvester.domain import dataset as ds
    from harvester.embeddings.local import LocalProvider
    from harvester.testing.ckan_portal import load_jsonl

    texts, titles = {}, []
    for path in sorted((ROOT.parent / "shared" / "ckan-samples").glob("*.jsonl")):
        for pkg in load_jsonl(path):
            rec = ds.normalize(pkg, "http://127.0.0.1/bench")
            if rec.ok:
                text = ds.embedding_text(rec.title, rec.description)
                if texts.setdefault(ds.content_hash(text), text) is text:
                    titles.append(rec.title)
    provider = LocalProvider()
    corpus = unit(provider.embed_documents(list(texts.values())))
    picked = rng.choice(len(titles), min(args.queries, len(titles)), replace=False)
    queries = unit([provider.embed_query(" ".join(titles[i].split()[:3])) for i in picked])
    return corpus, queries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", default="stand-in,minilm", help="comma-separated: stand-in, minilm")
    parser.add_argument("--datasets", type=int, default=200_000, help="the stand-in corpus's size")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--candidates", default="100,200,400,1000",
                        help="candidates re-ranked, for the stand-in corpus")
    parser.add_argument("--shares", default="0.01,0.02,0.04,0.08",
                        help="candidates re-ranked as shares of the corpus, for the minilm corpus")
    parser.add_argument("--index", action="store_true",
                        help="also build an HNSW index over the stand-in vectors' bits and measure it")
    parser.add_argument("--ef-search", default="100,400,1000", help="hnsw.ef_search values (candidates) for --index")
    parser.add_argument("--builds", default="16:64,32:128",
                        help="the indexes --index builds, one after the other: m:ef_construction, comma-separated")
    parser.add_argument("--database-url", help="an existing database with pgvector for --index (default: a fresh "
                                               "embedded server)")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    print("| corpus | vectors | dimensions | mean's norm (share of positive components) | candidates re-ranked"
          " | recall@10, signs as they are | recall@10, centered |")
    print("|---|---|---|---|---|---|---|")
    for name in args.corpora.split(","):
        t0 = time.perf_counter()
        corpus, queries = (stand_in if name == "stand-in" else minilm)(args, rng)
        if name == "stand-in":
            candidates = [int(c) for c in args.candidates.split(",")]
        else:
            candidates = [max(10, round(float(s) * len(corpus))) for s in args.shares.split(",")]
        figures = recall(corpus, queries, candidates, rng)
        for n in candidates:
            print(f"| {name} | {len(corpus):,} | {corpus.shape[1]} | {figures['mean_norm']:.3f}"
                  f" ({figures['mean_positive']:.0%}) | {n:,} ({n / len(corpus):.2%}) | {figures[(False, n)]:.3f}"
                  f" | {figures[(True, n)]:.3f} |", flush=True)
        print(f"<!-- {name}: {len(queries)} queries, {time.perf_counter() - t0:.0f} s -->", flush=True)
        if args.index and name == "stand-in":
            efs = [int(e) for e in args.ef_search.split(",")]
            builds = [tuple(int(x) for x in b.split(":")) for b in args.builds.split(",")]
            if args.database_url:
                index_recall(args.database_url, corpus, queries, efs, builds)
            else:
                import shutil
                import tempfile

                from harvester.store.embedded.server import EmbeddedServer

                home = Path(tempfile.mkdtemp(prefix="harvester-quantize-bench-"))
                server = EmbeddedServer(home)
                try:
                    index_recall(server.start(), corpus, queries, efs, builds)
                finally:
                    server.stop()
                    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
