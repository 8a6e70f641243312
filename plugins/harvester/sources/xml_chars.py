"""Characters XML 1.0 forbids, in an answer that holds them all the same (issue 39).

XML 1.0 allows tab, LF, CR, U+0020-U+D7FF, U+E000-U+FFFD and U+10000-U+10FFFF: nothing else,
neither raw nor as a character reference (``&#0;``, ``&#x1;``, ``&#xD800;``, ``&#xFFFE;``). A parser
refuses the whole document holding one (expat: "reference to invalid character number", "not
well-formed (invalid token)"), yet repositories write them: TreeBASE's OAI provider a raw 0x1A,
Dataverse's U+0003 in a title, DSpace U+FFFE, the DNB's OAI-PMH answers ``&#55349;`` (a lone
surrogate). One such character in one record would fail its whole page, or an SDMX service's whole
message, on every run until the repository fixed it.

So an answer is scrubbed (``Forbidden.scrub``, only after a parse failed or, streamed, chunk by
chunk): each forbidden character, raw or referenced, becomes a marker character (one per forbidden
character, from the Supplementary Private Use Area-B, which XML allows and no metadata uses) and the
answer is parsed as usual. What is read from it then goes through ``Forbidden.restore``: the markers
become U+FFFD (�) and the record gets an ``invalid-xml-character`` warning naming what was there
(``\\x01``, ``\\ud800``, as Python's repr writes it); an identifier holding one is never altered, so
its record fails (``unstorable-identifier``), as a JSON identifier with a lone surrogate does. The
page's other records are read as if nothing happened.

Only ASCII-compatible encodings are scrubbed (UTF-8, ISO-8859-x, Windows-125x: their bytes for
``&#`` and for the C0 controls are ASCII's); a UTF-16 answer is left as it is."""
from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from typing import Callable

from harvester.domain.outcomes import Problem, problem
from harvester.http import Retryable, scrub_url
from harvester.sources.base import SourceError

log = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"
_FIRST_MARK, _LAST_MARK = 0x10F000, 0x10FFFD
_MARKS = re.compile("[\U0010F000-\U0010FFFD]")
# a character reference, or a raw C0 control other than tab/LF/CR, or U+FFFE/U+FFFF or a
# surrogate encoded in UTF-8 (CESU-style): what XML 1.0 forbids written raw
_SUSPECT = re.compile(rb"&#(?:[xX]([0-9a-fA-F]{1,16})|([0-9]{1,20}));|[\x00-\x08\x0b\x0c\x0e-\x1f]"
                      rb"|\xef\xbf[\xbe\xbf]|\xed[\xa0-\xbf][\x80-\xbf]")
_UNFINISHED = re.compile(rb"&(?:#[xX]?[0-9a-fA-F]{0,20})?$|\xef\xbf?$|\xed[\xa0-\xbf]?$")


def allowed(code: int) -> bool:
    """Whether XML 1.0 allows the character ``code``."""
    return code in (0x9, 0xA, 0xD) or 0x20 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or 0x10000 <= code <= 0x10FFFF


def shown(code: int | None, written: bytes) -> str:
    """A forbidden character as a report shows it: Python's escape (``\\x01``, ``\\ud800``), or the
    reference as written when it names no character at all (``&#x110000;``)."""
    if code is None or code > 0x10FFFF:
        return written.decode("ascii", "replace")[:40]
    return repr(chr(code))[1:-1]


class Forbidden:
    """The forbidden characters met in one source's answers, each with its marker."""

    def __init__(self):
        self._marks: dict[str, str] = {}  # what was there (shown) -> its marker
        self._shown: dict[str, str] = {}  # marker -> what was there

    @property
    def met(self) -> bool:
        return bool(self._marks)

    def _mark(self, what: str) -> bytes:
        mark = self._marks.get(what)
        if mark is None:
            mark = chr(min(_FIRST_MARK + len(self._marks), _LAST_MARK))
            self._marks.setdefault(what, mark)
            self._shown.setdefault(mark, what)
        return b"&#x%X;" % ord(mark)

    def _replace(self, m: re.Match) -> bytes:
        written = m.group()
        if written.startswith(b"&#"):
            digits = m.group(1) or m.group(2)
            code = int(digits, 16 if m.group(1) else 10)
            if allowed(code):
                return written
        elif written[0] < 0x20:
            code = written[0]
        else:
            code = ord(written.decode("utf-8", "surrogatepass"))
        return self._mark(shown(code, written))

    def scrub(self, body: bytes) -> bytes | None:
        """``body`` with each forbidden character (raw or referenced) a reference to its marker;
        None when it holds none (or is not in an ASCII-compatible encoding)."""
        if body[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00<" in body[:4] or b"<\x00" in body[:4]:
            return None  # UTF-16
        before = len(self._marks)
        scrubbed = _SUSPECT.sub(self._replace, body)
        if scrubbed == body and len(self._marks) == before:
            return None
        return scrubbed

    def answer(self, resp, parse_xml: Callable[[bytes], ET.Element], shown: str) -> ET.Element:
        """The root of an XML answer (``parse``). One that is not XML: an HTTP error's is a
        ``SourceError`` naming its status; any other (a proxy's page, a body cut short) is
        ``Retryable``, naming how it begins. ``parse_xml``'s other errors pass as they are."""
        body = resp.content or b""
        try:
            return self.parse(body, resp.status_code, parse_xml, shown)
        except ET.ParseError as exc:
            if resp.status_code >= 400:
                raise SourceError(f"{shown}: GET {scrub_url(resp.url)}: HTTP {resp.status_code}") from None
            start = body[:80].decode("utf-8", "replace").strip()
            raise Retryable(f"{shown}: the answer is not XML ({exc}; it begins {start!r})") from None

    def parse(self, body: bytes, status: int, parse_xml: Callable[[bytes], ET.Element], shown: str) -> ET.Element:
        """``parse_xml(body)``; when that fails and the answer (not an HTTP error's) holds characters
        XML 1.0 forbids, the body read again with each one marked (``scrub``), said once in the log.
        Any other failure raises ``parse_xml``'s own error, as it is."""
        try:
            return parse_xml(body)
        except ET.ParseError:
            scrubbed = self.scrub(body) if status < 400 else None
            if scrubbed is None:
                raise
        root = parse_xml(scrubbed)
        log.warning("%s: the answer holds characters XML 1.0 forbids: read with each one as U+FFFD, the records "
                    "holding one warned (invalid-xml-character)", shown)
        return root

    def scrub_stream(self, chunk: bytes, carry: bytes, final: bool) -> tuple[bytes, bytes]:
        """``scrub`` for a document read in chunks: (the chunk scrubbed, the bytes held back for the
        next one: a reference or a UTF-8 sequence the chunk ends in the middle of)."""
        data = carry + chunk
        held = b""
        if not final:
            end = _UNFINISHED.search(data[-24:])
            if end is not None:
                held = data[len(data) - len(end.group()):]
                data = data[:len(data) - len(held)]
        if not _SUSPECT.search(data):
            return data, held
        return _SUSPECT.sub(self._replace, data), held

    def restore(self, text: str) -> tuple[str, list[str]]:
        """(``text`` with its markers as U+FFFD, what they stood for in order of first appearance)."""
        if not self._marks or _MARKS.search(text) is None:
            return text, []
        found = list(dict.fromkeys(self._shown[m] for m in _MARKS.findall(text) if m in self._shown))
        return _MARKS.sub(lambda m: REPLACEMENT if m.group() in self._shown else m.group(), text), found

    def escaped(self, text: str) -> str:
        """``text`` with each marker as what it stood for (``oai:x\\x01:7``): an identifier as a report shows it."""
        if not self._marks:
            return text
        return _MARKS.sub(lambda m: self._shown.get(m.group(), m.group()), text)

    def marked(self, text: str | None) -> bool:
        return bool(self._marks and text and any(m in self._shown for m in _MARKS.findall(text)))

    def restore_element(self, element) -> list[str]:
        """Every text, tail and attribute value under an ElementTree ``element`` restored in place;
        what the markers stood for."""
        if not self._marks:
            return []
        found: list[str] = []
        for node in element.iter():
            for name in ("text", "tail"):
                value = getattr(node, name)
                if value:
                    fixed, met = self.restore(value)
                    if met:
                        setattr(node, name, fixed)
                        found += met
            for key, value in list(node.attrib.items()):
                fixed, met = self.restore(value)
                if met:
                    node.attrib[key] = fixed
                    found += met
        return list(dict.fromkeys(found))


def warning(record: str, found: list[str], field: str | None = None) -> Problem:
    """The ``invalid-xml-character`` warning of ``record`` for the characters ``found``."""
    listed = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return problem("invalid-xml-character", f"record {record!r}: its XML holds characters XML 1.0 forbids ({listed}), "
                   "which no XML parser reads: each was read as U+FFFD (\ufffd) and the rest of the answer as usual",
                   field, found[0])


def identifier_problem(record: str, found: list[str], field: str | None = None) -> Problem:
    """``unstorable-identifier`` for an identifier that held a forbidden character (shown escaped)."""
    return problem("unstorable-identifier", f"record {record!r}: its identifier holds a character XML 1.0 forbids "
                   f"({', '.join(found[:5])}): an identifier is not altered (altered, it could be another dataset's), "
                   "so the record is not stored", field, record)
