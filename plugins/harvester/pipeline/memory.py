"""The process's memory, as a task sees it: resident size now and at its peak, and giving back what
a finished step freed.

CPython returns freed small objects to its own arenas and larger ones to the C allocator, which keeps
the pages: after fetch_modified has parsed a page of 1,000 records (tens of MB of dicts) and let it
go, the process stays that large, and the next task of the same process (``airflow dags test``
runs them all in one; a Celery or local worker may reuse one too) adds its own peak on top.
``release()`` asks glibc to hand the free pages back (``malloc_trim``, about a millisecond; a
full garbage collection would cost 70 ms in a task's process and find little: the large values are
freed as soon as nothing refers to them). Elsewhere (no glibc) it does nothing.

``cap_arenas()`` keeps glibc from giving each thread that allocates an arena of its own (up to eight
per core): the embedding requests in flight and the read-ahead threads each left one holding freed
pages that malloc_trim could not hand back. Capped at two (what ``MALLOC_ARENA_MAX=2`` does when set
before a process starts), a 20,000-dataset full sync's embed steps stay at 318 MB instead of
361-375 MB (bench/first_sync_bench.py); the threads mostly wait on the network, so sharing arenas
costs them nothing measurable. A MALLOC_ARENA_MAX set in the environment is left to rule.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys

_libc = None
_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def _glibc_call(name: str):
    """The glibc function ``name``, or None where the C library is not glibc."""
    global _libc
    if _libc is None:
        found = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
        try:
            _libc = ctypes.CDLL(found) if found else False
        except OSError:
            _libc = False
    return getattr(_libc, name, None) if _libc else None


def _trim() -> bool:
    """malloc_trim(0) where the C library is glibc; False where there is none to call."""
    trim = _glibc_call("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def cap_arenas(arenas: int = 2) -> bool:
    """At most ``arenas`` glibc malloc arenas for the threads created from now on (see above);
    True when set. Not where MALLOC_ARENA_MAX is set, nor without glibc."""
    mallopt = _glibc_call("mallopt")
    if mallopt is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(mallopt(_M_ARENA_MAX, int(arenas)))


def rss_mb() -> float:
    """Resident size now (Linux: /proc/self/statm), or the peak where that cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's largest resident size so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KB elsewhere


def release() -> tuple[float, float]:
    """The C allocator's free pages handed back to the system: (resident MB before, after)."""
    before = rss_mb()
    _trim()
    return before, rss_mb()
