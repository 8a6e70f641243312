"""sources/xml_chars.py: characters XML 1.0 forbids, marked so that the rest of an answer is read
(issue 39). The pipeline tests (tests/pipeline/test_unstorable_values.py) plant them in OAI-PMH
pages and SDMX messages; these check the scrubbing itself, at every chunk boundary."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from harvester.sources.xml_chars import Forbidden, allowed

PLANTED = ('<r a="v&#x1;"><t>a&#0;b&#xD800;c\x1ad&#65;e&#x10FFFF;f&#x110000;g\uFFFEh\u00e9i&#9;&#10;'
           '&#xFFFD;&#55349;&amp;#1;</t></r>').encode("utf-8", "surrogatepass")


def _restored(body: bytes, forbidden: Forbidden) -> tuple[str, str, list[str]]:
    root = ET.fromstring(body)
    found = forbidden.restore_element(root)
    return root.find("t").text, root.get("a"), found


def test_every_forbidden_character_raw_or_referenced_is_read_as_u_fffd_and_named():
    with pytest.raises(ET.ParseError):
        ET.fromstring(PLANTED)
    forbidden = Forbidden()
    text, attr, found = _restored(forbidden.scrub(PLANTED), forbidden)
    assert text == "a\ufffdb\ufffdc\ufffddAe\U0010ffff f\ufffdg\ufffdhéi\t\n\ufffd\ufffd&#1;".replace(" ", "")
    assert attr == "v\ufffd"
    assert found == ["\\x01", "\\x00", "\\ud800", "\\x1a", "&#x110000;", "\\ufffe", "\\ud835"]
    assert Forbidden().scrub(b"<r>&#65;&#x10FFFF;&amp;#1;\xc3\xa9</r>") is None  # nothing forbidden: untouched
    assert Forbidden().scrub("<r>\x01</r>".encode("utf-16")) is None  # not an ASCII-compatible encoding


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_a_streamed_answer_is_scrubbed_alike_wherever_its_chunks_end(size):
    """A reference or a UTF-8 sequence cut by a chunk's end is held back for the next chunk."""
    whole = Forbidden()
    expected = _restored(whole.scrub(PLANTED), whole)
    streamed, out, carry = Forbidden(), b"", b""
    chunks = [PLANTED[i:i + size] for i in range(0, len(PLANTED), size)] + [b""]
    for n, chunk in enumerate(chunks):
        data, carry = streamed.scrub_stream(chunk, carry, n == len(chunks) - 1)
        out += data
    assert carry == b"" and _restored(out, streamed) == expected


def test_allowed_is_xml_1_0s_char_production():
    assert [c for c in range(0x20) if allowed(c)] == [0x9, 0xA, 0xD]
    assert not any(allowed(c) for c in (0xD800, 0xDFFF, 0xFFFE, 0xFFFF, 0x110000))
    assert all(allowed(c) for c in (0x20, 0xD7FF, 0xE000, 0xFFFD, 0x10000, 0x10FFFF))
