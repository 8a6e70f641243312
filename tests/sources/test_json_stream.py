"""The stream filter the ijson sources read through (harvester.sources.json_stream, issue 36): a bare
NaN, Infinity or -Infinity and a lone surrogate escape reach the record as ``json.loads`` reads
them, wherever the stream's chunks split the document; strings, surrogate pairs and escaped
backslashes are left as they are; what is not JSON stays an error. The expectations are what
Python's json makes of the same bytes."""
from __future__ import annotations

import io
import json
import math
import random

import ijson
import pytest

from harvester.sources import json_stream
from harvester.sources.json_stream import StandIns, held_back

# One dataset with every bare token, others with the words in strings (after escaped quotes and
# backslashes too), a surrogate pair, lone halves (in a value and in a key), a backslash escaped
# before "ud800" text, and a lone low half after an escaped backslash.
DOCUMENT = (
    '{"dataset": [{"identifier": "bad", "size": NaN, "range": [-Infinity, Infinity, 1e3, -0.5], "n": -1},\n'
    ' {"identifier": "words", "title": "NaN Infinity -Infinity", "q": "say \\"NaN\\" -Infinity\\\\", '
    '"w": "\\\\\\"NaN\\\\\\\\", "NaN": ["NaN", "x NaN y"], "Infinity": {"-Infinity": "Infinity"}},\n'
    ' {"identifier": "x\\ud800y", "pair": "\\ud83d\\ude00 \\uD83D\\uDE00", "low": "\\udc00 \\ud800\\ud800\\udc00",'
    ' "k\\udbff": "\\\\ud800 is text", "after": "\\\\\\udfff"},\n'
    ' {"identifier": "last", "t": [NaN]}]}'
).encode()


class Chunks(io.RawIOBase):
    """``data`` read back ``sizes`` bytes at a time (cycled): the chunks a socket hands over."""

    def __init__(self, data: bytes, sizes):
        self.data, self.pos, self.sizes = data, 0, list(sizes)
        self.reads = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        size = min(len(buffer), self.sizes[self.reads % len(self.sizes)])
        self.reads += 1
        chunk = self.data[self.pos:self.pos + size]
        self.pos += len(chunk)
        buffer[:len(chunk)] = chunk
        return len(chunk)


def parsed(raw, backend=None) -> tuple[object, StandIns]:
    """The document through the filter and ijson, its stand-ins given back."""
    stream = StandIns(raw)
    items = (ijson.get_backend(backend) if backend else ijson).items(stream, "", use_float=True)
    value = stream.restore(next(items))
    return value, stream


def same(a, b) -> bool:
    """Equal, NaN equal to NaN, and floats only to floats."""
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return type(b) is list and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_the_document_reads_as_json_loads_reads_it():
    expected = json.loads(DOCUMENT)
    assert math.isnan(expected["dataset"][0]["size"]) and expected["dataset"][2]["identifier"] == "x\ud800y"
    value, stream = parsed(io.BytesIO(DOCUMENT))
    assert same(value, expected)
    assert stream.made == stream.restored == 4 + 5  # three tokens in "bad", one in "last"; five lone halves
    assert not stream.pending


def test_without_the_filter_ijson_refuses_or_alters_what_it_reads_past():
    with pytest.raises(ijson.JSONError):
        list(ijson.items(io.BytesIO(b'{"size": NaN}'), "", use_float=True))
    for backend in ("yajl2_c", "python"):
        try:
            items = ijson.get_backend(backend).items
        except ImportError:
            continue
        assert list(items(io.BytesIO(b'["x\\ud800y"]'), "item")) in (["x?y"], ["x\ud800y"])


@pytest.mark.parametrize("size", list(range(1, 19)) + [64, 1000])
def test_every_chunk_size_splits_the_tokens_and_escapes_somewhere_and_reads_the_same(size):
    expected = json.loads(DOCUMENT)
    value, stream = parsed(Chunks(DOCUMENT, [size]))
    assert same(value, expected) and stream.made == stream.restored == 9


def test_a_split_at_every_byte_reads_the_same():
    expected = json.loads(DOCUMENT)
    for at in range(1, len(DOCUMENT)):
        value, _ = parsed(Chunks(DOCUMENT, [at, len(DOCUMENT)]))
        assert same(value, expected), f"split at byte {at}: {DOCUMENT[max(0, at - 12):at + 12]!r}"


def test_random_documents_in_random_chunks_read_as_json_loads_reads_them():
    rng = random.Random(36)
    leaves = [math.nan, math.inf, -math.inf, 0, -2.5, 1e300, None, True, "NaN", "-Infinity", 'a "NaN" \\ b', "\\",
              '\\\\"NaN', "\ud800x", "\udc00", "a\U0001F600b", "\ud800\ud800\udc00", "\\ud800", "\\\ud800",
              "\ud800\\udc00", "\\ud800\udc00", "\ud83d\\\ude00", "é NaN ☃", "N", "Inf", "-"]

    def value(depth=0):
        if depth > 3 or rng.random() < 0.3:
            return rng.choice(leaves)
        if rng.random() < 0.5:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice(["NaN", "Infinity", 'q"', "k\\", "\udc00k"]) + str(i): value(depth + 1)
                for i in range(rng.randint(0, 4))}

    for _ in range(1500):
        text = json.dumps(value(), indent=rng.choice([None, 1]))
        body = text.encode()
        got, stream = parsed(Chunks(body, [rng.randint(1, 9) for _ in range(5)]))
        assert same(got, json.loads(body)), body
        assert stream.made == stream.restored


def test_the_python_backend_reads_the_same_through_the_filter():
    value, _ = parsed(Chunks(DOCUMENT, [5]), backend="python")
    assert same(value, json.loads(DOCUMENT))


@pytest.mark.parametrize("body", [b'[NaNx]', b'[-NaN]', b'[+Infinity]', b'[1NaN]', b'[NaN1]', b'[Infinityy]',
                                  b'[nan]', b'[NaN.5]', b'[Infinity-]', b'{"a": NaN "b": 1}', b'[1,]',
                                  b'{"a": tru}', b'{"dataset": [{"x": NaN}', b'["\\ud800'])
def test_what_is_not_json_stays_an_error_and_the_same_one(body):
    """The tokens are rewritten only whole, between delimiters: anything else is left for the
    parser to refuse, with the error it gives without the filter when the document has no token."""
    for size in (1, 2, 3, len(body)):
        with pytest.raises(ijson.JSONError) as err:
            parsed(Chunks(body, [size]))
        if b"NaN" not in body and b"Infinity" not in body and b"\\u" not in body:
            with pytest.raises(ijson.JSONError) as plain:
                list(ijson.items(io.BytesIO(body), "", use_float=True))
            assert str(err.value).splitlines()[0] == str(plain.value).splitlines()[0]


def test_stand_ins_are_new_for_each_stream_and_within_64_bits():
    first, second = StandIns(io.BytesIO(b"[NaN]")), StandIns(io.BytesIO(b"[NaN]"))
    a, b = first.read(), second.read()
    assert a != b
    for body in (a, b):
        number = int(body[1:-1])
        assert 2 ** 60 < number < 2 ** 63
    assert math.isnan(first.restore([int(a[1:-1])])[0]) and first.restore(int(a[1:-1]) + 7) == int(a[1:-1]) + 7


def test_held_back_keeps_only_what_may_begin_a_token_or_an_escape():
    assert held_back(b'{"a": 1, "b": Na', None) == 2
    assert held_back(b'{"a": 1, "b": -Infinity', None) == 9        # whole: what follows decides
    assert held_back(b'{"a": 1, "b": 12345', None) == 0
    assert held_back(b'{"a": "xyzNa', None) == 0                    # a longer word: never a token
    assert held_back(b'Na', ord("x")) == 0 and held_back(b'Na', ord(" ")) == 2
    assert held_back(b'"abc \\ud83d\\ude0', None) == 11              # a pair not complete yet
    assert held_back(b'"abc \\ud83d\\ude00', None) == 12             # its end decides nothing yet
    assert held_back(b'"abc \\ud83d\\ude00 and more', None) == 0
    assert held_back(b'"abc \\ud83d\\ude00xy', None) == 14           # the high half goes with the low
    assert held_back(b'x' * 100 + b'\\', None) == 1


def test_a_long_stream_is_passed_on_in_chunks_never_gathered():
    """Chunks in, chunks out: nothing accumulates, whatever the document's length."""
    entry = b'{"identifier": "i", "size": NaN, "title": "NaN \\ud83d\\ude00 \\u00e9", "bad": "\\udc00"},'
    body = b'{"dataset": [' + entry * 20000 + b'{}]}'
    stream = StandIns(Chunks(body, [65536]))
    largest = 0
    while chunk := stream.read(65536):
        largest = max(largest, len(chunk), len(stream._out), len(stream._held))
    assert largest <= 65536 and stream.made == 2 * 20000


# -- nesting of any depth (issue 36) ----------------------------------------------------------------
def _deep(levels: int, leaf: bytes = b'"bottom"') -> bytes:
    return b'{"in": ' * levels + leaf + b"}" * levels


def _levels(value) -> int:
    levels = 0
    while isinstance(value, dict):
        value, levels = value.get("in"), levels + 1
    return levels


def test_ijsons_paths_grow_with_the_depth_and_basic_events_do_not():
    """What the streaming sources read instead of ``ijson.parse``: yajl2_c has no depth limit, but
    ``parse`` builds each event's path as a string (a buffer's worth of events at once), so its
    memory grows as the square of the depth; ``basic_parse`` and ``build`` stay small."""
    import tracemalloc

    body = _deep(5_000)
    tracemalloc.start()
    try:
        sum(1 for _ in ijson.parse(io.BytesIO(body)))
        _, with_paths = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        events = ijson.basic_parse(io.BytesIO(body + b" "))
        value = json_stream.build(events, next(events)[0])
        _, built = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert with_paths > 10 * built and built < 5_000_000
    assert _levels(value) == json_stream.KEPT_LEVELS  # the rest read through, left out


def test_a_page_too_deep_for_pythons_json_reads_as_it_would_its_depth_cut_past_the_page_levels():
    page = (b'{"results": [{"id": "a", "size": NaN, "t": "x\\ud800"}, {"id": "deep", "tree": ' + _deep(100_000, b"NaN")
            + b', "after": [1, -Infinity]}, {"id": "c"}]}')
    with pytest.raises(RecursionError):
        json.loads(page)
    value = json_stream.loads(page)
    first, deep, last = value["results"]
    assert json.dumps(first) == json.dumps(json.loads(b'{"id": "a", "size": NaN, "t": "x\\ud800"}'))
    assert last == {"id": "c"} and deep["id"] == "deep" and deep["after"][0] == 1 and deep["after"][1] == -math.inf
    assert _levels(deep["tree"]) == json_stream.PAGE_LEVELS - 3  # (the page, results and the record above it)
    assert json_stream.loads(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}  # (json reads it: as it did)
    assert json_stream.loads_deep(b"\xef\xbb\xbf[1]") == [1] == json_stream.loads_deep("[1]".encode("utf-16"))


@pytest.mark.parametrize("body, reason", [
    (b'{"results": [' + b"[" * 5000, "premature EOF"),
    (b"[" * 5000 + b"]" * 5000 + b" x", "trailing garbage"),
    (b"[" * 5000 + b"123456789012345678901234567890" + b"]" * 5000, "integer overflow"),  # (json reads it)
])
def test_a_page_too_deep_for_pythons_json_that_ijson_cannot_read_is_a_value_error_saying_so(body, reason):
    """The sources take a ValueError as an answer that is not JSON (retried, then named), never a
    RecursionError out of the run."""
    with pytest.raises(ValueError) as exc:
        json_stream.loads(body)
    assert reason in str(exc.value) and "nests deeper than Python's json reads" in str(exc.value)
