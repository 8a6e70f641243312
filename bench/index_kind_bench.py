"""Benchmark: the models' index over the vectors (halfvec) against one over their bits, on the
vectors a first sync stored.

HARVESTER_INDEX_KIND=bit makes each model's shared HNSW index hold its vectors' signs
(``binary_quantize(embedding)::bit(<dim>)``) and search rank the index's nearest candidates by
their stored halfvec (store/vectors.py ``nearest``). What that loses depends on the vectors, so this
bench measures it on a database a bench left: ``first_sync_bench.py --keep`` (its embedded
PostgreSQL, database ``bench``), whose vectors come from the local Gemini-protocol server
(``--vectors words``: texts sharing words are near, and every sample record is repeated about 40
times, so a query has dozens of near-ties).

For ``--queries`` query vectors (stored vectors plus a little noise, as first_sync_bench.py makes
them), against exact search (every stored vector compared, no index), it prints recall@10 of:

- the bits alone: every vector's Hamming distance taken (no index), the nearest 100 / 400 / 1,000
  ranked exactly: the most any index over the bits can give with that many candidates;
- an HNSW index over the bits for each of ``--builds`` (m:ef_construction), with its build time
  and bytes a vector, at each re-rank size;
- the halfvec index (Harvester's default, m 16, ef_construction 64) at ``--ef-search``.

The model's own index is dropped and built again by the bench; the database is otherwise left as
it was.

    .venv/bin/python bench/first_sync_bench.py --datasets 100000 --stages b --keep --home /var/tmp/fsb
    .venv/bin/python bench/index_kind_bench.py /var/tmp/fsb/first-sync-bench-*     # about 2 minutes
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins")]

K = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("home", type=Path, help="a working directory first_sync_bench.py --keep left")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--builds", default="16:64,32:128", help="m:ef_construction of the indexes over the bits")
    parser.add_argument("--rerank", default="400,1000", help="candidates taken from the index over the bits")
    parser.add_argument("--bits-alone", default="100,400,1000", help="candidates by every Hamming distance")
    parser.add_argument("--ef-search", type=int, default=800, help="hnsw.ef_search of the halfvec index")
    args = parser.parse_args()

    import numpy as np
    from psycopg import sql

    from harvester.store import db as store_db
    from harvester.store import vectors
    from harvester.store.embedded.server import EmbeddedServer

    if not (args.home / "pg").is_dir():
        parser.error(f"{args.home} holds no pg/ directory: give the working directory first_sync_bench.py --keep left")
    server = EmbeddedServer(args.home / "pg")
    server.start()
    try:
        with store_db.prepare(store_db.connect_url(server.url("bench"))) as conn:
            model, dim = conn.execute("SELECT m.name, vector_dims(e.embedding) FROM embeddings e"
                                      " JOIN embedding_models m ON m.id = e.model GROUP BY 1, 2"
                                      " ORDER BY count(*) DESC LIMIT 1").fetchone()
            number = vectors.model_id(conn, model)
            count = conn.execute("SELECT count(*) FROM embeddings WHERE model ="
                                 " (SELECT id FROM embedding_models WHERE name = %s)", (model,)).fetchone()[0]
            rng = np.random.default_rng(7)
            conn.execute("SELECT setseed(0.7)")  # the same queries each time on the same database
            queries = []
            for (text,) in conn.execute("SELECT embedding::text FROM embeddings WHERE model ="
                                        " (SELECT id FROM embedding_models WHERE name = %s) ORDER BY random()"
                                        " LIMIT %s", (model, args.queries)).fetchall():
                v = np.array(json.loads(text)) + rng.normal(0, 0.01, dim)
                queries.append((v / np.linalg.norm(v)).astype(np.float32))
            print(f"{model}: {count:,} vectors of {dim} dimensions, {len(queries)} queries (stored vectors plus noise)")
            print(f"| what | build | index bytes a vector | recall@{K} |")
            print("|---|---|---|---|")

            def recall(statement, params, setting: str | None = None) -> float:
                got = []
                for q, truth in zip(queries, truths):
                    with conn.transaction():
                        if setting:
                            conn.execute(setting)
                        rows = conn.execute(statement, {**params, "query": q}).fetchall()
                    got.append(len({r[0] for r in rows} & truth) / K)
                return statistics.fmean(got)

            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                truths = [{r[0] for r in conn.execute(
                    f"SELECT content_hash FROM embeddings WHERE model ="
                    f" (SELECT id FROM embedding_models WHERE name = %s)"
                    f" ORDER BY embedding <=> %s::halfvec({dim}) LIMIT {K}", (model, q))} for q in queries]
            alone = sql.SQL(
                "SELECT content_hash FROM (SELECT content_hash, embedding FROM embeddings"
                " WHERE model = %(model_id)s::integer"
                " ORDER BY {bits} <~> {query_bits} LIMIT %(rerank)s) c ORDER BY embedding <=> {q} LIMIT {k}").format(
                bits=vectors.index_expression(dim, "bit"), query_bits=vectors.query_cast(dim, kind="bit"),
                q=vectors.query_cast(dim, kind="halfvec"), k=sql.Literal(K))
            figures = [recall(alone, {"model_id": number, "rerank": n}, "SET LOCAL enable_indexscan = off")
                       for n in map(int, args.bits_alone.split(","))]
            print(f"| the bits alone, every Hamming distance, nearest {' / '.join(args.bits_alone.split(','))}"
                  f" ranked exactly | - | - | {' / '.join(f'{r:.3f}' for r in figures)} |", flush=True)

            def build(kind: str, options: str) -> tuple[float, float]:
                vectors.drop_index(conn, model)
                conn.execute("SET maintenance_work_mem = '1GB'")
                started = time.perf_counter()
                conn.execute(sql.SQL("CREATE INDEX {} ON embeddings USING hnsw ({} {}) {} WHERE model = {}").format(
                    sql.Identifier(vectors.index_name(model, kind)), vectors.index_expression(dim, kind),
                    sql.SQL(vectors.opclass(dim, kind)), sql.SQL(options), sql.Literal(number)))
                took = time.perf_counter() - started
                size = conn.execute("SELECT pg_relation_size(%s::regclass)",
                                    (vectors.index_name(model, kind),)).fetchone()[0]
                return took, size / count

            for spec in args.builds.split(","):
                m, efc = (int(x) for x in spec.split(":"))
                took, per = build("bit", f"WITH (m = {m}, ef_construction = {efc})")
                sizes = [int(x) for x in args.rerank.split(",")]
                figures = [recall(vectors.nearest(dim, "bit"), {"model_id": number, "n": K, "rerank": n},
                                  f"SET LOCAL hnsw.ef_search = {min(1000, n)}") for n in sizes]
                print(f"| HNSW over the bits, m {m}, ef_construction {efc}, rerank {' / '.join(map(str, sizes))} | "
                      f"{took:.1f} s | {per:,.0f} | {' / '.join(f'{r:.3f}' for r in figures)} |", flush=True)
            took, per = build("halfvec", "")
            figure = recall(vectors.nearest(dim, "halfvec"), {"model_id": number, "n": K},
                            f"SET LOCAL hnsw.ef_search = {args.ef_search}")
            print(f"| HNSW over the halfvec, m 16, ef_construction 64, ef_search {args.ef_search} | {took:.1f} s | "
                  f"{per:,.0f} | {figure:.3f} |")
            vectors.drop_index(conn, model)
            vectors.ensure_index(conn, model, dim)  # the database as it was: the configured kind's index
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
