"""What a record must be before it is hashed or stored, whichever portal sent it (issue 36).

Portals' answers are read by Python's json, which takes what PostgreSQL and UTF-8 refuse: NaN and
±Infinity (``"size": NaN``), lone UTF-16 surrogates (``"\\ud800"``, in any string or key), U+0000
(which neither PostgreSQL text nor jsonb can hold), and nesting and sizes of any measure. One such
record used to fail the whole COPY of its page (or the hashing of its text) on every run until the
portal fixed it; now it is that record's coded outcome and the run commits the others:

- a NaN or ±Infinity becomes null: ``non-finite-number`` (warning, the record is stored);
- a lone surrogate becomes U+FFFD (the replacement character): ``lone-surrogate`` (warning);
- U+0000 is removed: ``nul-character`` (warning). Other control characters are kept: PostgreSQL
  stores them and JSON escapes them;
- more than MAX_DEPTH levels of objects and arrays: ``record-too-deep`` (error, not stored);
- more than MAX_RECORD_BYTES of JSON: ``record-too-large`` (error, not stored);
- a lone surrogate or U+0000 in the record's identifier: ``unstorable-identifier`` (error, not
  stored). An identifier is not neutralised: ``x\\ud800`` made ``x\\ufffd`` (or ``a\\u0000b`` made
  ``ab``) could be another dataset's identifier, and the record would overwrite it. The message
  shows the identifier with the character escaped (``'x\\ud800'``, as Python's repr writes it).

A record is screened twice. First as its portal published it, before a source maps it
(``published``, through ``dataset.screened_as_published``): too deep or too large, it fails there,
and its NaN and ±Infinity are made null there, because a mapping reads the record first and
writes what it has no field for into ``extras`` as texts (``json.dumps``: NaN as ``"NaN"``, which
no later screening can tell from a word, any depth hidden in a string, and a RecursionError some
hundreds of levels down). Then the package the mapping made (``screen``, in
``dataset.package_record``): its lone surrogates and NULs, and what the mapping added.

The caps leave a wide margin over real records: the sample catalogues' deepest record has 6 levels
(the record itself the first) and the largest is 310 KB (a data.json entry with a detailed
spatial polygon). Each kind is one problem per record however often it occurs, naming the first
field (a JSON path) and how many values were changed.

Pure: no IO. orjson and pickle serve only as fast, exact tests of the common clean record.
"""
from __future__ import annotations

import io
import math
import pickle
import re
from itertools import accumulate
from typing import Any

import orjson

from harvester.domain.outcomes import Problem, problem

MAX_DEPTH = 64  # levels of objects and arrays in one record, the record itself the first
MAX_RECORD_BYTES = 10 * 1024 * 1024  # one record's JSON (UTF-8)

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"
# A non-finite float (NaN, ±Infinity) in a pickle: BINFLOAT ("G" and 8 bytes, big-endian IEEE 754)
# with every exponent bit set. Strings and integers may show the pattern by chance (then the slow,
# exact walk decides); a non-finite float always shows it.
_NON_FINITE = re.compile(rb"G[\x7f\xff][\xf0-\xff]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}

_MESSAGES = {
    "non-finite-number": "a non-finite number ({value}) was made null",
    "lone-surrogate": "a lone surrogate (a UTF-16 half, not a character) was replaced with U+FFFD",
    "nul-character": "a NUL character (U+0000, which PostgreSQL cannot store) was removed",
}


class _TooDeep(Exception):
    def __init__(self, path: str):
        self.path = path


class Screen:
    """What screening found in one record: the first field and value of each kind, and counts."""

    def __init__(self, label: str):
        self.label = label
        self.found: dict[str, list] = {}  # code -> [count, first path, first value]

    def note(self, code: str, path: str, value: Any) -> None:
        seen = self.found.get(code)
        if seen is None:
            self.found[code] = [1, path, value]
        else:
            seen[0] += 1

    def text(self, value: str, path: str) -> str:
        """``value`` with lone surrogates replaced and U+0000 removed (each noted)."""
        if _BAD_CHAR.search(value) is None:
            return value
        if "\x00" in value:
            self.note("nul-character", path, value)
            value = value.replace("\x00", "")
        if _SURROGATE.search(value):
            self.note("lone-surrogate", path, value)
            value = _SURROGATE.sub(REPLACEMENT, value)
        return value

    def derived(self, value: str, field: str) -> str:
        """A text the source derived from the record (its title, its url, ...) as it can be
        stored; noted as ``field`` only when the record itself showed nothing (else the record's
        own field is the one named)."""
        if _BAD_CHAR.search(value) is None:
            return value
        return self.text(value, field) if not self.found else fix_text(value)

    def problems(self) -> tuple[Problem, ...]:
        out = []
        for code, (count, path, value) in self.found.items():
            what = _MESSAGES[code].format(value=_number(value) if code == "non-finite-number" else value)
            more = f" ({count} values in all)" if count > 1 else ""
            shown_value = _number(value) if code == "non-finite-number" else fix_text(value)
            out.append(problem(code, f"record {self.label!r}: {what} at {path}{more}",
                               path, shown_value))
        return tuple(out)


def _number(value: float) -> str:
    """A non-finite float as JSON readers write it."""
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def escaped(value: str) -> str:
    """``value`` with its lone surrogates and U+0000 written as escapes (``\\ud800``, ``\\x00``, as
    Python's repr writes them), everything else as it is: a text that can be stored and still
    shows what the portal sent."""
    if _BAD_CHAR.search(value) is None:
        return value
    return _BAD_CHAR.sub(lambda m: repr(m.group())[1:-1], value)


def identifier_problem(identifier: str | None) -> Problem | None:
    """``unstorable-identifier`` when ``identifier`` holds a lone surrogate or U+0000; else None.
    Unlike any other text of a record it is not neutralised: the identifier, altered, could be
    another dataset's (its record would overwrite that one)."""
    if not isinstance(identifier, str) or _BAD_CHAR.search(identifier) is None:
        return None
    what = []
    surrogate = _SURROGATE.search(identifier)
    if surrogate is not None:
        what.append(f"a lone surrogate ({escaped(surrogate.group())}: a UTF-16 half, not a character)")
    if "\x00" in identifier:
        what.append("a NUL character (U+0000)")
    return problem("unstorable-identifier",
                   f"record {identifier!r}: its identifier holds {' and '.join(what)}, which PostgreSQL cannot store: "
                   f"an identifier is not altered (altered, it could be another dataset's), so the record is not "
                   f"stored", None, escaped(identifier))


def fix_text(value: str) -> str:
    """A text as it can be stored: lone surrogates as U+FFFD, U+0000 removed (nothing noted)."""
    if _BAD_CHAR.search(value) is None:
        return value
    return _SURROGATE.sub(REPLACEMENT, value.replace("\x00", ""))


def without_surrogates(value: str) -> str:
    """A text with its lone surrogates as U+FFFD (and nothing else changed)."""
    return _SURROGATE.sub(REPLACEMENT, value)


def non_finite_as_null(value: Any, label: str) -> tuple[Any, Screen]:
    """``value`` with its NaN and ±Infinity floats made null, each noted as ``screen`` notes it
    (``non-finite-number``, at its JSON path), and nothing else changed (a new container only
    where something changed; deeper than MAX_DEPTH levels, nothing). For a source whose mapping
    writes numbers as texts (``json.dumps`` writes NaN as ``NaN``), so that they are made null
    before it; ``screen`` does the rest afterwards."""
    found = Screen(label)
    return _nulled(value, "", 0, found), found


def _nulled(value: Any, path: str, depth: int, found: Screen) -> Any:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found.note("non-finite-number", path or "(record)", float(value))
        return None
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, dict):
        out = {k: _nulled(v, _path(path, k), depth + 1, found) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if isinstance(value, (list, tuple)):
        items = [_nulled(v, _path(path, i), depth + 1, found) for i, v in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


def published(value: Any, label: str, *, nulls: bool = True) -> tuple[Any, Screen]:
    """``value`` (a record as its portal published it, before a source maps it) with its NaN and
    ±Infinity made null (each noted, as ``non_finite_as_null``; ``nulls`` False: left as they
    are, and not looked for); Unfit when it is too deep (``record-too-deep``, at the place
    ``screen`` names) or too large (``record-too-large``).
    Lone surrogates and U+0000 are left to ``screen``, which the mapped package goes through: an
    identifier is judged as the source reads it, never altered before.

    A mapping reads the record before ``screen`` sees the package: it writes numbers and nested
    values as texts (``json.dumps`` writes NaN as ``NaN``, which no screening sees afterwards, and
    raises RecursionError at some hundreds of levels), so the record is screened here first. No
    recursion at any depth: the depth is read from orjson's text (orjson refuses more than 254
    levels) or, failing that, by a walk with a stack of its own, which stops at MAX_DEPTH."""
    found = Screen(label)
    try:
        text = orjson.dumps(value)
    except TypeError:  # (more than 254 levels, a lone surrogate, an integer beyond 64 bits, ...)
        text = None
    if text is not None:
        if len(text) > MAX_RECORD_BYTES:
            raise Unfit(_too_large(label, len(text)))
        deep = text.count(b"[") + text.count(b"{") > MAX_DEPTH and _depth(text) > MAX_DEPTH
        if not deep:
            if not nulls or not may_hold_non_finite(value):
                return value, found
            return _nulled(value, "", 0, found), found
    where = _too_deep_at(value)
    if where is not None:
        raise Unfit(_too_deep(label, where))
    nulled = _nulled(value, "", 0, found) if nulls else value
    if text is None:
        size = _size(nulled)
        if size > MAX_RECORD_BYTES:
            raise Unfit(_too_large(label, size))
    return nulled, found


def _too_deep_at(value: Any) -> str | None:
    """The JSON path of the first object or array (in document order, as ``_walk`` meets it)
    that is more than MAX_DEPTH levels deep; None when there is none. A stack, not recursion."""
    stack = [(value, "", 0)] if isinstance(value, (dict, list, tuple)) else []
    while stack:
        node, path, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return path or "(record)"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((child, _path(path, key), depth + 1) for key, child in reversed(list(items))
                     if isinstance(child, (dict, list, tuple)))
    return None


def _path(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    key = fix_text(str(key))
    return f"{parent}.{key}" if parent else key


def _walk(value: Any, path: str, depth: int, screen: Screen) -> Any:
    """``value`` made storable (a new container only where something changed)."""
    kind = type(value)
    if kind is str:
        return screen.text(value, path or "(record)")
    if kind is float:
        if math.isfinite(value):
            return value
        screen.note("non-finite-number", path or "(record)", value)
        return None
    if kind is dict or kind is list or kind is tuple or isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            raise _TooDeep(path or "(record)")
        if isinstance(value, dict):
            out, changed = {}, False
            for k, v in value.items():
                key = screen.text(k, _path(path, k)) if isinstance(k, str) else k
                new = _walk(v, _path(path, key), depth + 1, screen)
                changed = changed or key is not k or new is not v
                out[key] = new
            return out if changed else value
        items = [_walk(v, _path(path, i), depth + 1, screen) for i, v in enumerate(value)]
        if all(a is b for a, b in zip(items, value)):
            return value
        return items
    if isinstance(value, float) and not math.isfinite(value):
        screen.note("non-finite-number", path or "(record)", float(value))
        return None
    return value


def may_hold_non_finite(value: Any) -> bool:
    """Whether ``value`` may hold a NaN or ±Infinity float (never False when it does). A pickle
    without memo (fast mode: a tree of JSON values has nothing to share) is a cheap walk in C."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True
    try:
        pickler.dump(value)
    except Exception:  # noqa: BLE001 - not picklable: the exact walk decides
        return True
    return _NON_FINITE.search(buf.getbuffer()) is not None


def _depth(text: bytes) -> int:
    """Levels of objects and arrays in a JSON text (its strings taken out first)."""
    # Escaped backslashes and quotes out first: every quote left opens or closes a string.
    unquoted = text.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2]
    brackets = b"".join(unquoted).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # what orjson refuses (integers beyond 64 bits, ...): the standard library
        import json

        return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


class Unfit(Exception):
    """A record no neutralising can make storable (too deep, too large): ``problem`` says why."""

    def __init__(self, found: Problem):
        super().__init__(found.message)
        self.problem = found


def screen(value: Any, label: str, *, published_fit: bool = False) -> tuple[Any, Screen]:
    """``value`` (a record's JSON, as Python's json reads it) made storable, with what was changed;
    Unfit when it is too deep or too large. ``label`` names the record in messages (its id).

    The common clean record costs one orjson serialization and one pickle, both in C: orjson
    refuses lone surrogates and more than 254 levels, the pickle shows any non-finite float, the
    serialized text shows U+0000 (escaped) and the size; only a record that may hold one of them is
    walked in Python. ``published_fit``: ``value`` is what ``published`` gave back, unchanged
    since (a CKAN package is the record as published): its depth and numbers are not read again."""
    found = Screen(label)
    try:
        text = orjson.dumps(value)
    except TypeError:
        text = None
    if text is not None:
        if len(text) > MAX_RECORD_BYTES:
            raise Unfit(_too_large(label, len(text)))
        if published_fit:
            if b"\\u0000" not in text:
                return value, found
        else:
            deep = text.count(b"[") + text.count(b"{") > MAX_DEPTH and _depth(text) > MAX_DEPTH
            if not deep and b"\\u0000" not in text and not may_hold_non_finite(value):
                return value, found
    try:
        clean = _walk(value, "", 0, found)
    except _TooDeep as exc:
        raise Unfit(_too_deep(label, exc.path)) from None
    if text is None or clean is not value:
        size = _size(clean)
        if size > MAX_RECORD_BYTES:
            raise Unfit(_too_large(label, size))
    return clean, found


def _too_deep(label: str, path: str) -> Problem:
    return problem("record-too-deep", f"record {label!r} nests objects and arrays more than {MAX_DEPTH} levels "
                                      f"deep (at {path}): it is not stored", path)


def _too_large(label: str, size: int) -> Problem:
    return problem("record-too-large", f"record {label!r} is {size:,} bytes of JSON, more than the "
                                       f"{MAX_RECORD_BYTES:,} a record may have: it is not stored", None, size)


def screen_problems(problems: tuple[Problem, ...] | list[Problem]) -> tuple[Problem, ...]:
    """Problems whose texts can be stored (a message quoting a bad value, a field named by a bad key)."""
    out = []
    for p in problems:
        if any(isinstance(t, str) and _BAD_CHAR.search(t) for t in (p.message, p.field, p.value)):
            p = Problem(p.code, fix_text(p.message), None if p.field is None else fix_text(p.field),
                        None if p.value is None else fix_text(p.value))
        out.append(p)
    return tuple(out)
