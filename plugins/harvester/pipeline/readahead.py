"""Reading a source's pages ahead of the caller, in a thread of their own.

A listing is IO (the portal answers), parsing and normalizing (CPU, in the source) and staging
(the database): read one after the other, the portal waits while we COPY and PostgreSQL waits
while we fetch. ``read_ahead`` iterates a source's pages in a background thread, at most ``depth``
pages ahead of the caller, so the next page is on its way while the current one is staged; what
the caller holds stays bounded (the page it stages, ``depth`` queued, the one being read). The
bound is in the items the source yields: a source whose pages can be large yields them in bounded
slices (a CKAN listing: at most ``CkanClient.slice_bytes`` of its answer each, whatever the page
size, issue 40), so what is held stays a few MB however large the portal's pages are.

* Pages come in the source's order; an exception of the source reaches the caller as it is (the
  same object), after the pages before it, and nothing after it.
* When the caller stops early (an error while staging, a break, an interrupt), the thread stops
  after the page it is reading and closes the source's iterator (its ``finally`` blocks run in the
  thread that ran it). On leaving the ``with`` block the thread has ended: the source's counters
  (requests made, bytes received) are final, and nothing reads the portal behind the caller's back.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Iterable, Iterator, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_END = object()


@contextlib.contextmanager
def read_ahead(pages: Iterable[T], depth: int = 1, *, name: str = "harvester-read-ahead") -> Iterator[Iterator[T]]:
    """``with read_ahead(source.iter_records(...)) as pages: for page in pages: ...``; ``depth``
    (>= 1) is how many pages may wait for the caller besides the one being read."""
    if depth < 1:
        raise ValueError("depth must be at least 1")
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        it = iter(pages)
        try:
            for page in it:
                handoff.put((page, None))
                del page
                if stop.is_set():
                    return
            handoff.put((_END, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            handoff.put((None, exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the caller has its own error, or none
                    log.warning("closing the listing after it stopped failed", exc_info=True)

    thread = threading.Thread(target=produce, name=name, daemon=True)

    def consume() -> Iterator[T]:
        while True:
            page, exc = handoff.get()
            if exc is not None:
                try:
                    raise exc
                finally:
                    del exc
            if page is _END:
                return
            yield page
            del page

    thread.start()
    try:
        yield consume()
    finally:
        stop.set()
        # The producer may be blocked handing a page over: keep taking (and dropping) them until
        # it has seen the stop and ended. It ends after the page it is reading, if any.
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                while True:
                    handoff.get_nowait()
            thread.join(0.05)
