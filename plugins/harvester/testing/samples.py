"""The real portal records tests, benches and the demo read: ``../shared/ckan-samples`` beside the
repository, or ``$HARVESTER_SAMPLES_DIR``. A missing file is an error that names it, never a skip."""
from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository


class SamplesMissing(FileNotFoundError):
    """A sample file the tests need is not there."""


def samples_dir() -> Path:
    return Path(os.environ.get("HARVESTER_SAMPLES_DIR") or ROOT.parent / "shared" / "ckan-samples")


def dcat_samples_dir() -> Path:
    return Path(os.environ.get("HARVESTER_DCAT_SAMPLES_DIR") or ROOT.parent / "shared" / "dcat-samples")


def portal_samples_dir(kind: str | None = None) -> Path:
    """``../shared/portal-samples`` (or ``$HARVESTER_PORTAL_SAMPLES_DIR``): the recorded answers of
    the native APIs, one folder per platform (``kind``: ``iso-waf``, ``udata``, ``sdmx``...)."""
    base = Path(os.environ.get("HARVESTER_PORTAL_SAMPLES_DIR") or ROOT.parent / "shared" / "portal-samples")
    return base / kind if kind else base


def portal_sample(kind: str, name: str) -> Path:
    """One recorded answer of ``../shared/portal-samples/<kind>/`` (SamplesMissing naming it otherwise)."""
    return existing(portal_samples_dir(kind) / name)


def sample_path(name: str, folder: Path | None = None) -> Path:
    path = (folder or samples_dir()) / name
    if not path.exists():
        raise SamplesMissing(f"sample file {path} is missing: tests read ../shared/ckan-samples "
                             "(or $HARVESTER_SAMPLES_DIR) beside the repository")
    return path


def existing(path: Path) -> Path:
    """``path``, a sample file that must be there (SamplesMissing naming it otherwise)."""
    if not path.exists():
        raise SamplesMissing(f"sample file {path} is missing: tests read ../shared (or $HARVESTER_SAMPLES_DIR, "
                             "$HARVESTER_DCAT_SAMPLES_DIR, $HARVESTER_PORTAL_SAMPLES_DIR) beside the repository")
    return path


def load_json(path: Path):
    """A JSON sample document (gzip-compressed when its name ends .gz)."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(existing(path), "rb") as handle:
        return json.load(handle)


def load_samples(name: str) -> list[dict]:
    """The records of one JSON-lines sample file."""
    with sample_path(name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def distinct_records(samples, n: int) -> list[dict]:
    """``n`` real records whose embedded texts all differ (``samples``: a loader like load_samples)."""
    from harvester.domain import dataset as ds

    seen, out = set(), []
    for pkg in samples("catalog-data-gov.jsonl") + samples("dados-gov-br.jsonl"):
        rec = ds.normalize(pkg, "http://x")
        if rec.ok and rec.content_hash not in seen:
            seen.add(rec.content_hash)
            out.append(pkg)
        if len(out) == n:
            return out
    raise AssertionError(f"the samples hold fewer than {n} records with distinct texts")


def edited(record: dict, **fields) -> dict:
    """A copy of ``record`` with ``fields`` changed and a metadata_modified later than any harvest:
    what a portal serves after an edit."""
    import copy

    out = copy.deepcopy(record)
    out.update(fields)
    out["metadata_modified"] = "2030-01-01T00:00:00"
    return out
