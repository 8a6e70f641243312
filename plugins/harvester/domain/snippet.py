"""A search result's snippet: plain text whose only ``**`` are around the words that matched.

A dataset's description is its portal's text, often markdown (``**bold**``, ``[a link](url)``,
``## headings``, tables) or HTML a portal escaped as text. Shown as it is, its own ``**`` read as the
search's highlights and its markup leaks into the result. So the search marks its matches with
two private-use characters no description keeps (store/search.py removes them from the text
first), and this module drops the description's markup around them, then writes the matches
between ``**``: the API's, the CLI's and the Harvester page's snippet.
"""
from __future__ import annotations

import re

START, STOP = "\ue000", "\ue001"  # what the text search's headline puts around a match
MARK = "**"

_MARKUP = [
    (re.compile(r"<[a-zA-Z/!][^>]*>?"), " "),            # a tag, also one the fragment cut off
    (re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)?"), r"\1"),  # [text](url), ![alt](url): the text
    (re.compile(r"\]\([^)\s]*\)?"), " "),                # the rest of a link whose text was a match
    (re.compile(r"!?\[|\]"), ""),                        # brackets left of a link cut in two
    (re.compile(r"\*+|`+|_{2,}|~{2,}"), ""),             # emphasis, code, strike-through marks
    (re.compile(r"(?:(?<=\s)|^)#{1,6}(?=\s|$)"), " "),   # headings (the lines were joined)
    (re.compile(r"\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?|-{3,}|={3,}"), " "),  # table rules, horizontal rules
    (re.compile(r"\|"), " "),                            # table cells
]


def _plain(text: str) -> str:
    for pattern, replacement in _MARKUP:
        text = pattern.sub(replacement, text)
    return text


def plain_snippet(marked: str | None) -> str:
    """``marked`` (a description's fragment, matches between START and STOP) as plain text, the
    description's markup dropped, whitespace collapsed, each match between ``**``."""
    if not marked:
        return ""
    # the markup is dropped from the whole text at once (a link's text may hold a match); then the
    # marks are read in order, a stray one (its pair went with the markup) ignored
    text = _plain(marked)
    out, match, inside = [], [], False
    for char in text:
        if char == START and not inside:
            inside, match = True, []
        elif char == STOP and inside:
            inside = False
            words = " ".join("".join(match).split())
            if words and out and out[-1].endswith(MARK) and not match[0].isspace():  # two matches in a row: one
                out[-1] = f"{out[-1][:-len(MARK)]}{words}{MARK}{' ' if match[-1].isspace() else ''}"
            elif words:
                out.append(f"{' ' if match[0].isspace() else ''}{MARK}{words}{MARK}{' ' if match[-1].isspace() else ''}")
        elif char in (START, STOP):
            continue
        elif inside:
            match.append(char)
        else:
            out.append(char)
    if inside:  # a match the fragment cut off
        out.append("".join(match))
    return " ".join("".join(out).split())
