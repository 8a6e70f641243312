"""Memory sizes written in PostgreSQL's units (``256MB``, ``2GB``, ``1 TB``), as bytes.

The one parser of every size setting (the embedded server's shared_buffers, an index build's
maintenance_work_mem): each checks its value here, so all accept the same forms.
"""
from __future__ import annotations

import re

# PostgreSQL's memory units (case-sensitive, as PostgreSQL reads them), 1024 apart.
UNITS = {"kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}
_SIZE = re.compile(r"([0-9]+)\s*(kB|MB|GB|TB)")


def parse_size(text: str) -> int:
    """``text`` (a whole number and one of PostgreSQL's units kB, MB, GB or TB, spaces allowed
    around and between: ``512MB``, ``2 GB``) as a number of bytes. ValueError naming the text
    otherwise (no unit, another unit, a fraction, a negative number)."""
    found = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{text!r} is not a size: write a whole number and one of the units "
                         f"{', '.join(UNITS)} (case as shown), such as 512MB or 2GB")
    return int(found.group(1)) * UNITS[found.group(2)]


def format_size(size: int) -> str:
    """``size`` bytes (a whole number of kB) in the largest unit that writes it exactly, the form
    PostgreSQL is given: ``1GB``, ``1536MB``."""
    if size < 0 or size % 1024:
        raise ValueError(f"{size!r} bytes is not a whole number of kB")
    for unit in ("TB", "GB", "MB"):
        if size and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]}{unit}"
    return f"{size // 1024}kB"


# What pgvector's HNSW build (m = 16) holds in memory per vector besides the vector itself: measured
# from its notice "hnsw graph no longer fits into maintenance_work_mem after N tuples" with
# maintenance_work_mem = 16MB (384 and 768 dimensions, halfvec and vector: 715-718 bytes each).
HNSW_ELEMENT_OVERHEAD = 720
_BITS_PER_DIMENSION = {"bit": 1, "halfvec": 16, "vector": 32}


def hnsw_graph_bytes(vectors: int, dimension: int, kind: str = "halfvec") -> int:
    """The memory an HNSW build of ``vectors`` vectors of ``dimension`` (stored as ``kind``: bit,
    halfvec or vector) needs to hold its whole graph: 1,000,000 of 768 halfvec dimensions, about
    2.2 GB; of their 768 bits, about 0.8 GB."""
    per_vector = -(-_BITS_PER_DIMENSION[kind] * dimension // 8)
    return max(0, vectors) * (per_vector + HNSW_ELEMENT_OVERHEAD)


def build_memory(graph: int, floor: int, cap: int) -> int:
    """maintenance_work_mem for a build whose graph takes ``graph`` bytes: a tenth more than the
    graph, rounded up to a MB, at least ``floor`` and at most ``cap`` (a build whose graph does not
    fit still ends, an order of magnitude slower, rather than exhaust the server's memory)."""
    wanted = -(-int(graph * 1.1) // UNITS["MB"]) * UNITS["MB"]
    return min(max(wanted, floor), max(cap, floor))
