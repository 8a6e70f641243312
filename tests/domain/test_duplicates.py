"""Grouping (domain/duplicates.py) over plain data: evidence order, the one-dataset-per-portal
rule, operators' overrides and the canonical member."""
from datetime import datetime, timedelta, timezone

from harvester.domain.duplicates import Edge, Member, best_edges, group

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _members(spec: dict[int, str], live: set[int] | None = None, ages: dict[int, int] | None = None):
    return {i: Member(i, portal, T0 + timedelta(days=(ages or {}).get(i, 0)), live is None or i in live)
            for i, portal in spec.items()}


def _sets(result) -> set[frozenset]:
    return {frozenset(g) for g in result.groups}


def test_a_chain_across_portals_is_one_group_with_the_pointed_at_dataset_canonical():
    members = _members({1: "A", 2: "B", 3: "C"}, ages={1: 5, 2: 0, 3: 1})
    result = group(members, [Edge(1, 2, "identifier", copy=2), Edge(2, 3, "landing_page")])
    assert _sets(result) == {frozenset({1, 2, 3})}
    canonical = [m.dataset_id for m in result.members if m.is_canonical]
    # 2 copies 1 (its record points at 1): 1 is first-hand though 2 was seen first; 3 is only older than 1
    assert canonical == [3]  # 3 is no copy and older than 1
    by_id = {m.dataset_id: m for m in result.members}
    assert by_id[2].copy_of and by_id[2].evidence == "identifier" and by_id[2].matched_id == 1


def test_two_datasets_of_one_portal_never_share_a_group_by_evidence():
    members = _members({1: "A", 2: "A", 3: "B"})
    result = group(members, [Edge(1, 3, "content"), Edge(2, 3, "identifier")])
    assert _sets(result) == {frozenset({2, 3})}  # the stronger evidence wins the place


def test_different_blocks_even_a_transitive_path_and_same_forces():
    members = _members({1: "A", 2: "B", 3: "C"})
    edges = [Edge(1, 2, "identifier"), Edge(2, 3, "identifier")]
    assert _sets(group(members, edges, different=[(1, 3)])) == {frozenset({1, 2})}
    assert _sets(group(members, edges, different=[(1, 2), (2, 3)])) == set()
    forced = group(_members({1: "A", 2: "A"}), [], same=[(1, 2)])
    assert _sets(forced) == {frozenset({1, 2})}
    assert {m.evidence for m in forced.members} == {"override"}


def test_a_live_member_is_canonical_before_a_removed_first_hand_one():
    members = _members({1: "A", 2: "B"}, live={2})
    result = group(members, [Edge(1, 2, "identifier", copy=2)])
    assert [m.dataset_id for m in result.members if m.is_canonical] == [2]


def test_the_strongest_edge_of_a_pair_is_kept():
    edges = best_edges([Edge(1, 2, "content"), Edge(2, 1, "landing_page", copy=1), Edge(1, 2, "landing_page")])
    assert edges == [Edge(2, 1, "landing_page", copy=1)]


def test_a_copy_joins_the_live_dataset_rather_than_its_removed_predecessor():
    # 1 removed and re-created as 2 on portal A (same landing page); 3 on B points at that page
    members = _members({1: "A", 2: "A", 3: "B"}, live={2, 3})
    result = group(members, [Edge(1, 3, "landing_page", copy=3), Edge(2, 3, "landing_page", copy=3)])
    assert _sets(result) == {frozenset({2, 3})}
