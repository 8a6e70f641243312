"""Which datasets of different portals are one dataset: duplicate groups worked out from evidence
edges, pure functions over plain data (store/duplicates.py reads the edges and writes the groups).

Evidence, strongest first (sql/018_duplicates.sql derives every dataset's keys):

- ``identifier``: one record states the other's identifier (DCAT ``dct:identifier`` /
  ``adms:identifier``, CKAN extras ``guid`` / ``identifier`` / ``harvest_object_id``, a data.json
  ``identifier``), or both carry the same link-like identifier (a URI, a DOI, a UUID);
- ``landing_page``: the same landing page (normalized), e.g. an aggregator's ``dcat:landingPage``
  pointing back at the source portal's page of the dataset;
- ``distributions``: the same set of distribution URLs (normalized);
- ``content``: the same title and description (content hash) from the same publisher.

A key held by two live datasets of one portal says nothing (a portal-wide landing page, a series of
datasets with one description): it is not an edge. Groups are built greedily, strongest edge first:
an edge joins two groups unless the result would hold two datasets of one portal or two datasets an
operator said are different. An operator's "same" joins them whatever the evidence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# Confidence of a match by its evidence; a stated identifier is the strongest, the same text from the
# same publisher the weakest (two different datasets can share both, rarely).
CONFIDENCE = {"override": 1.0, "identifier": 1.0, "landing_page": 0.9, "distributions": 0.8, "content": 0.7}
EVIDENCE = ("identifier", "landing_page", "distributions", "content")


@dataclass(frozen=True)
class Member:
    """A dataset as grouping sees it."""
    id: int
    portal_url: str
    first_seen_at: datetime
    live: bool


@dataclass(frozen=True)
class Edge:
    """Evidence that ``a`` and ``b`` are one dataset. ``copy``: the id of the one whose record points
    at the other (it is the copy), when the evidence says which; None when it does not."""
    a: int
    b: int
    evidence: str
    copy: int | None = None

    @property
    def confidence(self) -> float:
        return CONFIDENCE[self.evidence]


@dataclass
class Membership:
    dataset_id: int
    group: int              # an index into the result's groups
    is_canonical: bool
    evidence: str
    confidence: float
    matched_id: int
    copy_of: bool


@dataclass
class Grouping:
    groups: list[list[int]] = field(default_factory=list)
    members: list[Membership] = field(default_factory=list)


def best_edges(edges: list[Edge]) -> list[Edge]:
    """One edge per pair of datasets: the strongest (directed before undirected at equal strength)."""
    best: dict[tuple[int, int], Edge] = {}
    for edge in edges:
        if edge.a == edge.b:
            continue
        pair = (min(edge.a, edge.b), max(edge.a, edge.b))
        known = best.get(pair)
        if known is None or (edge.confidence, edge.copy is not None) > (known.confidence, known.copy is not None):
            best[pair] = edge
    return sorted(best.values(), key=lambda e: (-e.confidence, e.copy is None, min(e.a, e.b), max(e.a, e.b)))


def group(members: dict[int, Member], edges: list[Edge], same: list[tuple[int, int]] = (),
          different: list[tuple[int, int]] = ()) -> Grouping:
    """The duplicate groups of ``members`` (groups of two or more; a dataset in none is alone).
    ``edges`` between ids not in ``members`` are ignored. ``same``/``different``: operators' pairs."""
    parent = {i: i for i in members}
    content: dict[int, set[int]] = {i: {i} for i in members}
    portals: dict[int, set[str]] = {i: {m.portal_url} for i, m in members.items()}
    apart: dict[int, set[int]] = {}
    for a, b in different:
        if a in members and b in members:
            apart.setdefault(a, set()).add(b)
            apart.setdefault(b, set()).add(a)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def blocked(ra: int, rb: int) -> bool:
        small, large = (ra, rb) if len(content[ra]) <= len(content[rb]) else (rb, ra)
        return any(apart.get(i, set()) & content[large] for i in content[small])

    def union(ra: int, rb: int) -> None:
        if len(content[ra]) < len(content[rb]):
            ra, rb = rb, ra
        parent[rb] = ra
        content[ra] |= content.pop(rb)
        portals[ra] |= portals.pop(rb)

    links: dict[int, list[Edge]] = {}
    forced = [Edge(a, b, "override") for a, b in same if a in members and b in members]
    # strongest first; at equal strength a link between live datasets first (a dataset re-created
    # under a new id on its portal is grouped, not its removed predecessor), then a directed one
    ordered = sorted(best_edges([e for e in edges if e.a in members and e.b in members]),
                     key=lambda e: (-e.confidence, not (members[e.a].live and members[e.b].live), e.copy is None,
                                    min(e.a, e.b), max(e.a, e.b)))
    for edge in forced + ordered:
        ra, rb = find(edge.a), find(edge.b)
        if ra == rb:
            links.setdefault(edge.a, []).append(edge)
            links.setdefault(edge.b, []).append(edge)
            continue
        if edge.evidence != "override" and (portals[ra] & portals[rb] or blocked(ra, rb)):
            continue
        union(ra, rb)
        links.setdefault(edge.a, []).append(edge)
        links.setdefault(edge.b, []).append(edge)

    out = Grouping()
    roots = sorted({find(i) for i in members if len(content[find(i)]) > 1}, key=lambda r: min(content[r]))
    for index, root in enumerate(roots):
        ids = sorted(content[root])
        copies = {e.copy for i in ids for e in links.get(i, ()) if e.copy is not None}
        canonical = min(ids, key=lambda i: (not members[i].live, i in copies, members[i].first_seen_at, i))
        out.groups.append(ids)
        for i in ids:
            own = [e for e in links.get(i, ()) if find(e.a) == root and find(e.b) == root] or [
                Edge(i, canonical, "override")]
            strongest = max(own, key=lambda e: (e.confidence, e.copy == i, e.b == canonical or e.a == canonical))
            out.members.append(Membership(
                dataset_id=i, group=index, is_canonical=i == canonical, evidence=strongest.evidence,
                confidence=strongest.confidence, matched_id=strongest.b if strongest.a == i else strongest.a,
                copy_of=strongest.copy == i))
    return out
