"""`harvester stats | embeddings`: the embedding cache, re-embedding (invalidate), dropping unused vectors
(prune), building the models' missing HNSW indexes now (reindex), the per-portal indexes (portal-indexes)."""
from __future__ import annotations

import argparse

from harvester.cli import options
from harvester.cli.output import error, print_json, table


def cmd_stats(args) -> int:
    from harvester.embeddings import get_provider
    from harvester.store import db, runs, vectors

    model = get_provider().model
    with db.open_cli() as conn:
        cache = vectors.cache_stats(conn)
        totals = runs.embedding_totals(conn, model)
    portals = []
    for t in totals:
        looked_up = t["embedded"] + t["reused"]
        portals.append({"portal": t["portal"], "runs": t["runs"], "embedding_requests": t["embedding_requests"],
                        "embedded": t["embedded"], "reused": t["reused"],
                        "hit_rate": round(t["reused"] / looked_up, 4) if looked_up else None,
                        "calls_saved": t["calls_saved"], "tokens_saved": t["tokens_saved"],
                        "datasets": t["datasets"], "with_vector": t["with_vector"]})
    if args.json:
        print_json({"active_model": model, "cache": cache, "portals": portals})
        return 0
    table(f"Embedding cache ({cache['bytes'] / 1e6:.1f} MB)", ["model", "dimension", "vectors"],
          [(m["model"] + (" (active)" if m["model"] == model else ""), m["dimension"], m["vectors"])
           for m in cache["models"]])
    table("Per portal (committed runs)", ["portal", "runs", "requests", "embedded", "reused", "hit rate",
                                          "calls saved", "tokens saved", "with vector"],
          [(p["portal"], p["runs"], p["embedding_requests"], p["embedded"], p["reused"],
            "-" if p["hit_rate"] is None else f"{p['hit_rate']:.0%}", p["calls_saved"], p["tokens_saved"],
            f"{p['with_vector']}/{p['datasets']}") for p in portals])
    return 0


def cmd_embeddings(args) -> int:
    from harvester.embeddings import EmbeddingError, get_provider
    from harvester.store import db, vectors

    if args.action == "local":
        return _local()
    with db.open_cli() as conn:
        if args.action == "prune":
            print(f"pruned {vectors.prune(conn)} vectors no dataset uses")
            return 0
        if args.action == "reindex":
            return _reindex(conn, args.model)
        if args.action == "portal-indexes":
            return _portal_indexes(conn, getattr(args, "portal", None), getattr(args, "build", False))
        chosen = [x for x in (args.portal, args.dataset, args.model) if x]
        if len(chosen) != 1:
            return error("invalidate takes exactly one of --portal, --dataset, --model")
        if args.model:
            try:
                active = get_provider().model
            except EmbeddingError:  # no usable provider configured: every dataset that lost its vector is pending
                active = None
            n = vectors.invalidate(conn, args.model, all_of_model=True, active_model=active)
            print(f"invalidated {n} vectors of model {args.model}")
            return 0
        model = get_provider().model
        n = vectors.invalidate(conn, model, portal_url=options.find_portal_url(conn, args.portal),
                               source_id=args.dataset)
        print(f"invalidated {n} vectors of {model}; their datasets are embedded again on the next run")
    return 0


def _local() -> int:
    """The local model as a task would load it: which one, what runs it, and its ONNX export (made
    now when the cache holds none: run it once in a worker image, or on a shared
    HARVESTER_MODEL_CACHE, and no task pays for the export)."""
    import time

    from harvester.embeddings import EmbeddingError
    from harvester.embeddings.local import LocalProvider

    started = time.perf_counter()
    try:
        provider = LocalProvider()
        encoder = provider._encoder()
        dimension = provider.dimension
    except EmbeddingError as exc:
        return error(str(exc))
    print(f"model: {provider.model} ({dimension} dimensions), from {provider.path}")
    if encoder is None:
        why = "HARVESTER_LOCAL_RUNTIME=torch" if provider.runtime == "torch" else "its export is not possible (see the warning)"
        print(f"runtime: PyTorch (sentence-transformers): {why}")
    else:
        m = encoder.manifest
        print(f"runtime: ONNX Runtime {m['onnxruntime']}, {m['precision']}, {encoder.threads} threads, "
              f"up to {encoder.max_tokens} tokens a text; vectors within cosine {m['probe_min_cosine']:.4f} of "
              "PyTorch's on the export's probe texts")
        print(f"export: {encoder.directory} (made in {m['export_seconds']:.1f} s; checked and loaded in "
              f"{time.perf_counter() - started:.1f} s)")
    return 0


def _reindex(conn, model: str | None) -> int:
    """Build each model's missing HNSW index (or ``model``'s) now, as the next run's upsert would:
    concurrently, with the memory its graph needs (store/vectors.ensure_index logs what it sets)."""
    from harvester.store import vectors

    models = [model] if model else [r[0] for r in conn.execute(
        "SELECT m.name FROM embedding_models m WHERE EXISTS (SELECT 1 FROM embeddings e WHERE e.model = m.id)"
        " ORDER BY 1")]
    if model and vectors.stored_dimension(conn, model) is None:
        return error(f"no vector of model {model!r} is stored (see `harvester stats`)")
    for name in models:
        state = vectors.index_state(conn, name)
        if state != "missing":
            print(f"{name}: index {'ready' if state == 'ready' else 'being built by another connection'}")
            continue
        try:
            built = vectors.restore_index(conn, name)
        except vectors.IndexBuildError as exc:
            return error(str(exc))
        print(f"{name}: index {'built' if built else 'left to the connection building it'}"
              f" over {vectors.held(conn, name)} vectors")
    return 0


def _portal_indexes(conn, portal: str | None, build: bool) -> int:
    """List the per-portal HNSW indexes (store/portal_indexes.py); with ``build``, first bring each
    portal's (or ``portal``'s) in line with the rule as its next run would: built, kept or dropped."""
    from harvester.embeddings import get_provider
    from harvester.store import portal_indexes

    if build:
        url = portal if portal is None or "://" in portal else options.find_portal_url(conn, portal)
        portals = [url] if url else [r[0] for r in conn.execute(
            "SELECT DISTINCT portal_url FROM datasets WHERE removed_at IS NULL ORDER BY 1")]
        model = get_provider().model
        settings = portal_indexes.PortalIndexSettings.from_env()
        for url in portals:
            try:
                done = portal_indexes.maintain(conn, url, model, settings=settings)
            except Exception as exc:  # noqa: BLE001 - one portal's failure is reported, the others go on
                print(f"{url}: failed: {type(exc).__name__}: {str(exc).strip()}")
                continue
            extra = f" in {done['seconds']:.1f}s over {done['datasets']} datasets" if done["action"] == "built" else ""
            why = f" ({done['reason']})" if done.get("reason") else ""
            dropped = f"; dropped {', '.join(done['dropped'])}" if done["dropped"] else ""
            print(f"{url}: {done['action']}{extra}{why}{dropped}")
        for name in portal_indexes.drop_orphans(conn, settings):
            print(f"dropped {name} (its portal has no live dataset)")
    rows = portal_indexes.listing(conn)
    if not rows:
        print("no per-portal HNSW index (a portal gets one when its live datasets exceed "
              "HARVESTER_PORTAL_INDEX_MIN_DATASETS)")
        return 0
    table("per-portal HNSW indexes", ("portal", "model", "index", "datasets", "build s", "MB", "state", "searched"),
          [(r["portal_url"], r["model"], r["index_name"], r["datasets"], f"{r['build_seconds']:.1f}",
            f"{r['bytes'] / 2 ** 20:.1f}", r["state"], "yes" if r["searched"] else "no") for r in rows])
    return 0


def register(subparsers) -> None:
    """Add stats and embeddings to the ``harvester`` subparsers."""
    p = subparsers.add_parser("stats", help="the embedding cache: size, hit rate and savings per portal")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    top = subparsers.add_parser("embeddings", help="force re-embedding (invalidate), drop unused vectors (prune), "
                                                   "build the models' missing HNSW indexes now (reindex), or show "
                                                   "the local model and make its ONNX export now (local)")
    # Each action is a subcommand with its own --help. Their options may still come before the
    # action (`harvester embeddings --model M reindex`, as the one parser of old took them): the
    # parent keeps them, hidden, and a subcommand's own (default SUPPRESS) never overwrites them.
    for flags in (("-p", "--portal"), ("--dataset",), ("--model",)):
        top.add_argument(*flags, help=argparse.SUPPRESS)
    actions = top.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = actions.add_parser("invalidate", help="force re-embedding: drop the active model's vectors of a portal's "
                                              "datasets or of one dataset, or every vector of a model; give "
                                              "exactly one of --portal, --dataset, --model",
                           argument_default=argparse.SUPPRESS)
    p.add_argument("-p", "--portal", help="the active model's vectors of this portal's datasets (its name in "
                                          "portals.yaml, or as its runs recorded it)")
    p.add_argument("--dataset", help="the active model's vector of this dataset (its CKAN id)")
    p.add_argument("--model", help="every vector of this model")
    p.set_defaults(func=cmd_embeddings)

    p = actions.add_parser("prune", help="delete the vectors no dataset uses")
    p.set_defaults(func=cmd_embeddings)

    p = actions.add_parser("reindex", help="build the models' missing HNSW indexes now",
                           argument_default=argparse.SUPPRESS)
    p.add_argument("--model", help="only this model's index")
    p.set_defaults(func=cmd_embeddings)

    p = actions.add_parser("portal-indexes", help="list the per-portal HNSW indexes; --build: build, keep or drop "
                                                  "each portal's now, as its next run would",
                           argument_default=argparse.SUPPRESS)
    p.add_argument("-p", "--portal", help="only this portal (its name in portals.yaml, or its URL)")
    p.add_argument("--build", action="store_true", help="build the missing ones and drop the unwanted ones first")
    p.set_defaults(func=cmd_embeddings)

    p = actions.add_parser("local", help="the local model, its runtime and its ONNX export (made now if missing)")
    p.set_defaults(func=cmd_embeddings)
