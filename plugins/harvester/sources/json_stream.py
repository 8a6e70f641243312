"""What the sources that stream JSON with ijson share: reading what its C parser refuses or alters
(issue 36), so that one bad value is its record's outcome rather than the end of the document.

Python's json reads two things that yajl2_c (ijson's backend, and the fastest) does not:

- the bare tokens ``NaN``, ``Infinity`` and ``-Infinity``, which ``json.dumps`` writes for a float
  NaN or infinity and real portals' writers too (``"size": NaN``). ijson refuses them whichever
  backend it uses (yajl2_c: "invalid char in json text"; python: "Unexpected symbol"), before any
  record exists. A spelling that overflows to infinity is no way round: yajl2_c refuses ``1e999``
  with use_float ("numeric (floating point) overflow").
- a lone UTF-16 surrogate escape (``"\\ud800"`` not followed by a low half, or ``"\\udc00"`` not
  preceded by a high one): yajl2_c turns a lone high half into ``?`` without a word (an identifier
  ``x\\ud800y`` becomes ``x?y``, which may be another dataset's), and a lone low half into bytes
  that are not UTF-8, failing the document with a UnicodeDecodeError.

``StandIns`` wraps the document's byte stream and writes each of these as a stand-in the parser
takes: a bare token outside strings as an integer literal, a lone surrogate escape as a private-use
character followed by a mark; both chosen at random per stream (the integers within 64 bits, which
yajl2_c takes, and far beyond what real records hold). ``restore`` then gives a value built from
the events back what the document meant, as ``json.loads`` reads it (``nan``, ``inf``, ``-inf``,
``"\\ud800"``), so the record's screening (domain/screening.py) sees it and says so. A string
holding ``NaN`` (``"NaN"``, ``"a \\"NaN\\" b"``), a surrogate pair and an escaped backslash before
``ud800`` are left as they are; so is anything that is not exactly one of the three tokens between
delimiters (``NaNx``, ``-NaN``, ``+Infinity``): the parser's errors about them are the ones it gave
before.

Nesting, which Python's json and ijson read differently again (issue 36). ``json.loads`` raises
RecursionError at about 1,000 levels (the interpreter's recursion limit), for the whole page it was
reading; yajl2_c has no depth limit (its ``basic_parse`` reads 100,000 levels in linear time and
little memory), but ijson's ``parse`` and ``items`` give every event the path of its value as a
string, which grows with the depth and is built for each event of a buffer: a document 30,000
levels deep took 2.2 GB, 100,000 levels a MemoryError (a 600 KB document). So the streaming sources
read ``basic_parse``'s events and build their values with ``build``, which keeps at most
``KEPT_LEVELS`` levels: a record deeper is more than MAX_DEPTH levels deep all the same, and its
screening fails it as ``record-too-deep`` at the same place (domain/screening.py), from a value
that no later step can recurse too deep into. A page read whole (a CKAN, Socrata, OpenDataSoft or
ArcGIS Hub answer) is read by Python's json as before, and only when that raises RecursionError,
by ``loads`` here: the same value, its objects and arrays beyond ``PAGE_LEVELS`` levels left out,
so that the other records of the page are read and the deep one fails alone.

Streaming is kept, and the work done in C wherever it can be: a chunk is passed on as it came
unless it holds ``\\ud`` (then its escaped backslashes masked, one regular expression finds the
lone halves exactly) or ``NaN`` or ``Infinity`` (in a string, mostly: only such a chunk is scanned
string by string, to find the bare ones). Whether a chunk ends inside a string is counted from its
unescaped quotes. Only the few bytes at its end that may begin a token or an escape (12 at most,
18 for a high half that may pair with what follows) are held back for the next.
"""
from __future__ import annotations

import io
import json
import math
import re
import secrets
from typing import Any, BinaryIO, Iterator

import ijson

from harvester.domain.screening import MAX_DEPTH

_TOKENS = (b"NaN", b"Infinity", b"-Infinity")
_LONGEST_TOKEN = max(map(len, _TOKENS))
# Outside a string: a quote (a string begins) or a whole token between delimiters (a "word" is a
# run of the bytes numbers and literals are made of).
_OUTSIDE = re.compile(rb'"|(?<![\w.+\-])(NaN|-?Infinity)(?![\w.+\-])')
# The rest of a string, up to (not including) its closing quote or the end of the bytes.
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)
# A lone half, once escaped backslashes are masked (every backslash left begins an escape): a high
# half not followed by a low one, or a low half not preceded by a high one. (The backslash first:
# the engine then looks for it alone, in C, and tries the rest only there.)
_LONE_HALF = re.compile(rb'\\(?:u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})'
                        rb'|(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\)u[dD][c-fC-F][0-9a-fA-F]{2})')
_HIGH_HALF = re.compile(rb'\\u[dD][89abAB][0-9a-fA-F]{2}')
_ESCAPE_BYTES = 12  # a surrogate pair's escapes: the longest unit whose end decides how it reads
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")
_BACKSLASH, _QUOTE = b"\\", b'"'


def held_back(data: bytes, before: int | None) -> int:
    """How many bytes at the end of ``data`` to keep for the next chunk: what may begin a token
    (a word that is a prefix of one, ``NaN`` and ``-Infinity`` themselves included: what follows
    decides) or an escape whose reading depends on bytes not read yet (from the first backslash of
    the last 12 bytes, and a high half just before it). ``before``: the byte preceding ``data``
    (None at the start of the document)."""
    n = len(data)
    cut = n
    start = n
    while start > 0 and n - start <= _LONGEST_TOKEN and data[start - 1] in _WORD_BYTES:
        start -= 1
    word = data[start:]
    if word and len(word) <= _LONGEST_TOKEN and any(t.startswith(word) for t in _TOKENS) \
            and not (start == 0 and before is not None and before in _WORD_BYTES):
        cut = start
    backslash = data.find(_BACKSLASH, max(0, n - _ESCAPE_BYTES))
    if backslash >= 0:
        cut = min(cut, backslash)
        if cut >= 6 and _HIGH_HALF.fullmatch(data, cut - 6, cut):
            cut -= 6  # (a high half pairs with a low half that follows it, or is alone)
    return n - cut


class StandIns(io.RawIOBase):
    """``raw`` (JSON bytes) with its bare NaN, Infinity and -Infinity and its lone surrogate
    escapes written as stand-ins that ``restore`` gives back. ``made``: stand-ins written so far;
    ``restored``: given back (``pending`` while fewer)."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        base = (1 << 61) + secrets.randbelow(1 << 60)  # < 2**62: within 64 bits, signed
        self._literal = {b"NaN": b"%d" % base, b"Infinity": b"%d" % (base + 1),
                         b"-Infinity": b"-%d" % (base + 1)}
        self._floats = {base: math.nan, base + 1: math.inf, -(base + 1): -math.inf}
        mark = secrets.token_hex(8)
        self._half = b"\\ue000" + mark.encode("ascii")  # then the half's 4 hex digits
        self._text_mark = "\ue000" + mark
        self._halves = re.compile(re.escape(self._text_mark) + "([0-9a-fA-F]{4})")
        self._held = b""          # bytes read but not yet passed on
        self._out = b""           # bytes passed on, not yet read
        self._before: int | None = None   # the last byte passed on
        self._in_string = False
        self._escaped = False     # in a string, the next byte is escaped
        self._eof = False
        self.made = 0
        self.restored = 0

    def readable(self) -> bool:
        return True

    @property
    def pending(self) -> bool:
        return self.made > self.restored

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while chunk := self.read(1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        if size == 0:
            return b""
        while not self._out and not self._eof:
            self._fill(size)
        out, self._out = self._out[:size], self._out[size:]
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _fill(self, size: int) -> None:
        chunk = self._raw.read(size)
        if not chunk:
            self._eof = True
            data, self._held = self._held, b""
        else:
            data = self._held + chunk if self._held else chunk
            keep = held_back(data, self._before)
            data, self._held = (data[:-keep], data[-keep:]) if keep else (data, b"")
        if data:
            if b"\\ud" in data or b"\\uD" in data:
                data = self._lone_halves(data)
            self._out = self._scan(data) if b"NaN" in data or b"Infinity" in data else self._count_quotes(data)
            self._before = data[-1]

    def _lone_halves(self, data: bytes) -> bytes:
        """``data`` with its lone surrogate escapes as stand-ins. Escaped backslashes are masked
        first (pairs from the first of each run, as in a string; the chunk's first byte when the
        last one's final backslash escapes it), the length kept: every backslash left begins an
        escape, at the same place in ``data``. (Outside strings a backslash is not JSON: the
        parser's error about it is unchanged.)"""
        skip = 1 if self._escaped else 0
        masked = data[skip:].replace(b"\\\\", b"//")
        pieces, last = [], 0
        for found in _LONE_HALF.finditer(masked):
            start = found.start() + skip
            pieces += (data[last:start], self._half + found.group()[2:].lower())
            last = start + 6
            self.made += 1
        if not pieces:
            return data
        pieces.append(data[last:])
        return b"".join(pieces)

    def _count_quotes(self, data: bytes) -> bytes:
        """``data`` as it is, noting whether what follows it is in a string, from its unescaped
        quotes (a run of backslashes in a string is escapes from its first: pairs, then perhaps
        one escaping the next byte)."""
        counted = data
        if self._escaped:
            counted, self._escaped = counted[1:], False
        if _BACKSLASH in counted:
            counted = counted.replace(b"\\\\", b"")
            self._escaped = counted.endswith(_BACKSLASH)
            counted = counted.replace(b'\\"', b"")
        if counted.count(_QUOTE) % 2:
            self._in_string = not self._in_string
        self._escaped = self._escaped and self._in_string
        return data

    def _scan(self, data: bytes) -> bytes:
        """``data`` string by string, its bare tokens written as stand-ins."""
        before = b"" if self._before is None else bytes((self._before,))
        text, n = before + data, len(before) + len(data)
        pos = len(before)
        pieces: list[bytes] = []
        last = pos
        if self._in_string:
            pos = self._string_end(text, pos + self._escaped)
        while pos < n and not self._in_string:
            found = _OUTSIDE.search(text, pos)
            if found is None:
                break
            token = found.group(1)
            if token is None:
                pos = self._string_end(text, found.end())
                continue
            pieces += (text[last:found.start()], self._literal[token])
            self.made += 1
            pos = last = found.end()
        if not pieces:
            return data
        pieces.append(text[last:])
        return b"".join(pieces)

    def _string_end(self, text: bytes, pos: int) -> int:
        """Past the closing quote of the string whose bytes go on at ``pos``, or the end of
        ``text`` (then still in the string, escaping the next byte when ``text`` ends with a lone
        backslash)."""
        n = len(text)
        end = _STRING_REST.match(text, pos).end() if pos < n else n
        if end < n and text[end] == _QUOTE[0]:
            self._in_string = self._escaped = False
            return end + 1
        self._in_string = True
        self._escaped = end < n  # (only a lone backslash at the very end stops the match there)
        return n

    def restore(self, value: Any) -> Any:
        """``value`` (built from the parser's events) with each stand-in given back, in place
        (a dict whose keys held one is rebuilt, in the same order); counted in ``restored``.
        Iterative: however deep the value, no recursion."""
        kind = type(value)
        if kind is int or kind is str:
            return self._restored(value)
        stack = [value] if kind is dict or kind is list else []
        while stack:
            container = stack.pop()
            if type(container) is dict:
                if any(self._text_mark in key for key in container):
                    items = [(self._restored(k), v) for k, v in container.items()]
                    container.clear()
                    container.update(items)
                items = container.items()
            else:
                items = enumerate(container)
            for key, item in items:
                kind = type(item)
                if kind is int or kind is str:
                    restored = self._restored(item)
                    if restored is not item:
                        container[key] = restored
                elif kind is dict or kind is list:
                    stack.append(item)
        return value

    def _restored(self, value: int | str) -> Any:
        if type(value) is int:
            if value in self._floats:
                self.restored += 1
                return self._floats[value]
            return value
        if self._text_mark not in value:
            return value
        text, count = self._halves.subn(lambda m: chr(int(m.group(1), 16)), value)
        self.restored += count
        return text


# -- values of any depth --------------------------------------------------------------------------
# Levels of objects and arrays of a record that ``build`` keeps: one more than screening allows, so
# that a deeper record is still too deep, at the same place (the first container past the cap).
KEPT_LEVELS = MAX_DEPTH + 1
# Levels of a whole page that ``loads`` keeps: a page's records are at most a few levels down its
# answer (CKAN's result.results[*] is the fourth), so each keeps more than MAX_DEPTH levels.
PAGE_LEVELS = 2 * MAX_DEPTH
_STARTS = frozenset({"start_map", "start_array"})


def build(events: Iterator[tuple[str, Any]], event: str, kept: int = KEPT_LEVELS,
          stand_ins: StandIns | None = None) -> Any:
    """The object or array that starts with ``event``, built from ijson's basic events up to its
    end, with at most ``kept`` levels of objects and arrays (itself the first): one deeper is read
    to its end and left out, its parent keeping its other members. No recursion, and memory for
    ``kept`` levels, however deep the value. ``stand_ins``: the stream's (``StandIns``), so that
    the stand-ins of what is left out are counted as given back (none stays ``pending``)."""
    root: Any = {} if event == "start_map" else []
    stack = [root]
    key = None
    for ev, value in events:
        if ev == "map_key":
            key = value
            continue
        if ev == "start_map" or ev == "start_array":
            if len(stack) >= kept:
                skip(events, stand_ins)
                continue
            value = {} if ev == "start_map" else []
        elif ev == "end_map" or ev == "end_array":
            stack.pop()
            if not stack:
                return root
            continue
        parent = stack[-1]
        if type(parent) is dict:
            parent[key] = value
        else:
            parent.append(value)
        if ev == "start_map" or ev == "start_array":
            stack.append(value)
    raise ijson.IncompleteJSONError("the document ends inside a value")


def skip(events: Iterator[tuple[str, Any]], stand_ins: StandIns | None = None) -> None:
    """Reads the rest of an object or array whose start was just read, building nothing (its
    stand-ins counted as given back, when ``stand_ins`` has any pending)."""
    depth = 1
    for ev, value in events:
        if ev == "start_map" or ev == "start_array":
            depth += 1
        elif ev == "end_map" or ev == "end_array":
            depth -= 1
            if not depth:
                return
        elif stand_ins is not None and stand_ins.pending and (type(value) is str or type(value) is int):
            stand_ins.restore(value)
    raise ijson.IncompleteJSONError("the document ends inside a value")


def loads(data: bytes | str) -> Any:
    """What ``json.loads(data)`` gives, for a document of any depth: when Python's json raises
    RecursionError (about 1,000 levels), the document is read again by ijson (``loads_deep``).
    A document that is not JSON raises ValueError, as json does."""
    try:
        return json.loads(data)
    except RecursionError:
        return loads_deep(data)


def answer_json(resp) -> Any:
    """``resp.json()`` (a requests Response) for a document of any depth: when Python's json raises
    RecursionError, the body (as ``resp.json()`` decodes it) read again by ``loads_deep``."""
    try:
        return resp.json()
    except RecursionError:
        return loads_deep(resp.text if resp.encoding else resp.content)


def loads_deep(data: bytes | str) -> Any:
    """``data`` read by ijson through ``StandIns`` (a bare NaN and a lone surrogate escape read
    as ``json.loads`` reads them), its objects and arrays beyond PAGE_LEVELS levels left out
    (``build``): no recursion, memory for what is kept. ValueError when it is not JSON (or is
    what yajl2_c refuses and Python's json reads: an integer beyond 64 bits, ``1e999``)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    else:
        encoding = json.detect_encoding(data)
        if encoding == "utf-8-sig":
            data = data[3:]
        elif encoding != "utf-8":
            data = data.decode(encoding).encode("utf-8", "surrogatepass")
    stand_ins = StandIns(io.BytesIO(data))
    events = ijson.basic_parse(stand_ins, use_float=True)
    try:
        event, value = next(events)
        if event in _STARTS:
            value = build(events, event, PAGE_LEVELS, stand_ins)
        for _ in events:  # (the end of the document: anything after its value is an error)
            pass
    except StopIteration:
        raise ValueError("the document is empty") from None
    except ijson.JSONError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{reason[:200]} (read by ijson: the document nests deeper than Python's json "
                         f"reads)") from None
    return stand_ins.restore(value) if stand_ins.pending else value
