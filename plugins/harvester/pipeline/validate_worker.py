"""A validation in a process of its own, as the API runs each one (harvester.ui.validate_api): a
hostile catalogue costs a child process bounded in time, CPU and memory, never a thread or the
memory of the api-server.

The parent side, ``run`` (a coroutine: waiting costs the api-server no thread), starts
``python -m harvester.pipeline.validate_worker`` with an environment of its own (none of the
api-server's variables, secrets included), the request as JSON on its stdin and an uploaded
document as an inherited file descriptor (the temporary file the upload was streamed to: never
read into the api-server's memory). It kills the child (SIGKILL) once the validation's time is
past by ``KILL_MARGIN`` seconds.

The child, first thing, limits itself: RLIMIT_AS (the memory limit; Python's MemoryError past it),
RLIMIT_CPU and an alarm a little past the parent's kill (it ends even if its parent is gone), and
lowers its priority. It validates (harvester.pipeline.validate) with the FetchPolicy it was sent,
its deadline counted from when the parent started it, and answers one JSON object on stdout:
``{"report": ..., "peak_memory": bytes}`` (the report with the rows asked for) or ``{"error":
{"kind", "message", "limit"?}, "peak_memory": ...}``. On stderr it says what it is doing
(``doing: fetching <url>``), so that a validation stopped at its deadline says where it was.

Error kinds: ``refused`` (a URL or an address validation does not fetch), ``too-large`` (a body
over the size limit; ``limit``), ``timeout`` (the validation's time ran out), ``memory`` (over
the memory limit; ``limit``), ``transient`` (the portal failed: 5xx, connection errors),
``invalid`` (not a catalogue, or unreadable), ``failed`` (the child broke: a bug).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KILL_MARGIN = 1.0  # seconds past the validation's time before the parent kills the child
ALARM_MARGIN = 2  # ... and before the child's own alarm ends it (the parent gone)
NICE = 5  # the child's priority below the api-server's
NEAR_LIMIT = 0.85  # an error with the address space past this share of the limit is taken for the limit's
MAX_ANSWER = 64 * 1024 * 1024  # what the parent reads of a child's stdout (a report of 1000 rows: ~2 MB)
DOING = "doing: "
UPLOAD = "upload:///"  # the URL pipeline/validate.py serves an upload at
MODULE = "harvester.pipeline.validate_worker"
_PACKAGES = str(Path(__file__).resolve().parents[2])  # the folder holding the harvester package


@dataclass
class Outcome:
    """What one child did: ``report`` (the report's JSON) or ``error`` ({kind, message, limit?});
    its ``peak_memory`` in bytes (None: unknown), its ``seconds``, and what it was ``doing`` last."""

    report: dict | None
    error: dict | None
    peak_memory: int | None
    seconds: float
    doing: str | None = None


# -- the parent -----------------------------------------------------------------------------------
def policy_fields(policy) -> dict:
    """A FetchPolicy as the request sends it (JSON)."""
    return {"allow_private": policy.allow_private, "max_bytes": policy.max_bytes, "timeout": policy.timeout,
            "deadline": policy.deadline, "max_retries": policy.max_retries,
            "allowed": sorted([address, port] for address, port in policy.allowed)}


def _environment() -> dict[str, str]:
    """The child's whole environment: nothing of the api-server's (its secrets included)."""
    return {"PYTHONPATH": _PACKAGES, "LANG": "C.UTF-8", "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2"}


def _peak_of(pid: int) -> int | None:
    """The peak resident memory of a running process (Linux: VmHWM), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


async def _read_all(stream: asyncio.StreamReader, cap: int) -> bytes:
    parts, size = [], 0
    while True:
        chunk = await stream.read(64 * 1024)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > cap:
            raise OverflowError(f"the validation's answer is over {cap} bytes")
        parts.append(chunk)


async def _read_progress(stream: asyncio.StreamReader, doing: list, tail: deque) -> None:
    """The child's stderr: the last ``doing:`` line in ``doing[0]``, the other lines' tail in ``tail``."""
    pending = b""
    while True:
        chunk = await stream.read(64 * 1024)
        if not chunk:
            lines, pending = [pending] if pending else [], b""
        else:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            pending = pending[-4096:]
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith(DOING):
                doing[0] = line[len(DOING):][:500]
            elif line:
                tail.append(line[:2000])
        if not chunk:
            return


async def run(request: dict, *, deadline: float, memory: int, document: int | None = None) -> Outcome:
    """Validate in a child process: ``request`` (``url``, or ``name`` of the ``document``, an open
    file descriptor the child inherits; ``kind``, ``pages``, ``content_type``, ``rows``: rows
    answered, ``policy``: FetchPolicy fields), within ``deadline`` seconds from now (the child is
    killed KILL_MARGIN later) and ``memory`` bytes of address space."""
    started = time.monotonic()
    message = {**request, "fd": document, "deadline": deadline, "started": time.time(), "memory": memory}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-s", "-m", MODULE, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, pass_fds=() if document is None else (document,), env=_environment(),
        cwd="/", start_new_session=True)
    doing: list = [None]
    tail: deque = deque(maxlen=20)
    answer = asyncio.ensure_future(_read_all(proc.stdout, MAX_ANSWER))  # type: ignore[arg-type]
    progress = asyncio.ensure_future(_read_progress(proc.stderr, doing, tail))  # type: ignore[arg-type]
    try:
        proc.stdin.write(json.dumps(message).encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        left = started + deadline + KILL_MARGIN - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.gather(answer, progress, proc.wait()), max(left, 0.01))
        except asyncio.TimeoutError:
            peak = _peak_of(proc.pid)
            return Outcome(None, {"kind": "timeout", "killed": True, "message": _ran_out(deadline, doing[0])},
                           peak, time.monotonic() - started, doing[0])
        except OverflowError as exc:
            return Outcome(None, {"kind": "failed", "message": str(exc)}, None, time.monotonic() - started, doing[0])
        return _outcome(answer.result(), proc.returncode, list(tail), deadline, memory,  # type: ignore[arg-type]
                        time.monotonic() - started, doing[0])
    finally:
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            await asyncio.shield(proc.wait())
        for task in (answer, progress):
            task.cancel()


def _ran_out(deadline: float, doing: str | None) -> str:
    where = f" while {doing}" if doing else ""
    return f"the validation's time ran out (HARVESTER_VALIDATE_TIMEOUT_SECS={deadline:g}){where}: it was stopped"


def _outcome(out: bytes, status: int, tail: list[str], deadline: float, memory: int, seconds: float,
             doing: str | None) -> Outcome:
    """What a child that exited said, or what its exit says (a signal, a MemoryError it could not
    answer)."""
    try:
        said: Any = json.loads(out) if out.strip() else None
    except ValueError:
        said = None
    if isinstance(said, dict) and ("report" in said or "error" in said):
        return Outcome(said.get("report"), said.get("error"), said.get("peak_memory"), seconds, doing)
    text = "\n".join(tail)
    if status == -signal.SIGXCPU or status == -signal.SIGALRM:
        return Outcome(None, {"kind": "timeout", "message": _ran_out(deadline, doing)}, None, seconds, doing)
    if "MemoryError" in text or "Cannot allocate memory" in text or "std::bad_alloc" in text:
        return Outcome(None, {"kind": "memory", "limit": memory, "message": memory_message(memory, doing)}, None,
                       seconds, doing)
    how = f"signal {-status}" if status < 0 else f"exit status {status}"
    return Outcome(None, {"kind": "failed", "message": f"the validation's process ended with {how}"
                                                       + (f" while {doing}" if doing else ""), "output": text},
                   None, seconds, doing)


def memory_message(limit: int, doing: str | None = None) -> str:
    from harvester.domain.sizes import format_size

    shown = format_size(limit) if limit % 1024 == 0 else f"{limit} bytes"
    where = f" while {doing}" if doing else ""
    return (f"the validation needed more memory than HARVESTER_VALIDATE_MAX_MEMORY ({shown}) allows{where}: "
            "the document is too large or too intricate to validate here (the command line `harvester validate` "
            "has no such limit)")


# -- the child ------------------------------------------------------------------------------------------
_last: list = [None]  # what the child is doing


def _doing(what: str) -> None:
    _last[0] = what
    sys.stderr.write(f"{DOING}{what}\n")
    sys.stderr.flush()


def _limit_self(request: dict) -> None:
    """RLIMIT_AS, RLIMIT_CPU, an alarm and a lower priority, from the request."""
    memory = int(request["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    seconds = math.ceil(float(request["deadline"]) + KILL_MARGIN)
    resource.setrlimit(resource.RLIMIT_CPU, (seconds + 1, seconds + 2))
    signal.alarm(seconds + ALARM_MARGIN)
    try:
        os.nice(NICE)
    except OSError:
        pass


def _policy(request: dict):
    """The FetchPolicy sent, its deadline what is left of the validation's time, each session it
    makes saying what it fetches."""
    from dataclasses import replace
    from urllib.parse import unquote

    from harvester.http.guard import FetchPolicy

    class Watched(FetchPolicy):
        def session(self):
            session = super().session()
            send = session.send

            def watched(prepared, **kwargs):
                upload = prepared.url.startswith(UPLOAD)
                what = f"the upload {unquote(prepared.url[len(UPLOAD):])}" if upload else f"the answer of {prepared.url}"
                _doing("opening the upload" if upload else f"fetching {prepared.url}")
                response = send(prepared, **kwargs)
                _doing(f"reading and parsing {what}")
                return response

            session.send = watched  # type: ignore[method-assign]
            return session

    fields = dict(request.get("policy") or {})
    fields["allowed"] = frozenset((str(a), int(p)) for a, p in fields.get("allowed") or ())
    left = float(request["deadline"]) - (time.time() - float(request["started"]))
    return replace(Watched(**fields), deadline=max(left, 0.001))


def _status(field: str) -> int | None:
    """A size of this process's /proc/self/status (VmPeak, VmHWM), in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _error(exc: BaseException) -> dict:
    from harvester.http.guard import FetchTimeout, Refused, TooLarge

    if isinstance(exc, Refused):
        return {"kind": "refused", "message": str(exc)}
    if isinstance(exc, TooLarge):
        return {"kind": "too-large", "message": str(exc), "limit": exc.limit}
    if isinstance(exc, FetchTimeout):
        return {"kind": "timeout", "message": str(exc)}
    if getattr(exc, "transient", False):
        return {"kind": "transient", "message": str(exc)}
    if isinstance(exc, RecursionError):
        return {"kind": "invalid", "message": "the document is nested too deeply to be read"}
    return {"kind": "invalid", "message": str(exc)}


def validate(request: dict) -> dict:
    """The report (as JSON, with at most ``rows`` rows) the request asks for; exceptions as they come."""
    from harvester.pipeline import validate as v

    policy = _policy(request)
    rows = int(request.get("rows") or 0)
    if request.get("url"):
        report = v.validate_url(request["url"], request.get("kind"), pages=int(request.get("pages") or 3),
                                fetcher=policy, max_rows=rows)
    else:
        with os.fdopen(int(request["fd"]), "rb", closefd=True) as fp:
            _doing("reading the upload")
            report = v.validate_file(fp, request.get("kind"), request.get("name") or "upload",
                                     content_type=request.get("content_type"), fetcher=policy, max_rows=rows)
    _doing("writing the report")
    return report.as_dict(rows=rows)


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    _limit_self(request)
    _doing("starting")
    try:
        from harvester.sources import SourceError

        try:
            answer: dict = {"report": validate(request)}
        except (SourceError, ValueError, RecursionError) as exc:
            answer = {"error": _error(exc)}
    except MemoryError:
        answer = {"error": {"kind": "memory", "limit": int(request["memory"]),
                            "message": memory_message(int(request["memory"]), _last[0])}}
    except Exception as exc:  # a bug: said, not hidden (the traceback goes to the api-server's log)
        import traceback

        traceback.print_exc()
        answer = {"error": {"kind": "failed", "message": f"the validation failed: {type(exc).__name__}: {exc}"}}
    # An allocation refused inside a parser's C code need not surface as a MemoryError (rdflib's
    # Turtle parser: "SystemError: ... returned NULL", wrapped in the source's own error): an
    # error with the address space at the limit is the limit's.
    peak, limit = _status("VmPeak"), int(request["memory"])
    if "error" in answer and answer["error"]["kind"] in ("invalid", "failed") and peak and peak >= NEAR_LIMIT * limit:
        answer = {"error": {"kind": "memory", "limit": limit, "message": memory_message(limit, _last[0]),
                            "cause": answer["error"]["message"][:500]}}
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, from the api-server's forked copy
    answer["peak_memory"] = _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
