"""The difference between two versions of a dataset (pure): what `harvester diff` prints and the
API's diff answers."""
from harvester.domain.diff import field_changes, snapshot_lines, unified_diff, versions_to_compare

OLD = {"title": "Street trees", "description": "Every street tree. Updated monthly; see the notes.",
       "tags": ["trees", "city"], "extras": {"source": "survey", "b": 1}, "license_id": "cc-by", "resources": []}
NEW = {**OLD, "title": "Street trees (revised)", "description": "Every street tree. Updated weekly; see the notes.",
       "tags": ["trees", "parks"]}


def test_snapshot_lines():
    assert snapshot_lines(OLD) == [
        "title: Street trees", "description:", "  Every street tree.", "  Updated monthly;", "  see the notes.",
        'extras.b: 1', 'extras.source: "survey"', 'license_id: "cc-by"', "resources: []",
        'tags[]: "trees"', 'tags[]: "city"']


def test_snapshot_lines_wrap_long_sentences_at_76_columns_and_read_an_empty_snapshot():
    long = " ".join(["word"] * 30) + "."
    lines = snapshot_lines({"title": "T", "description": long})
    assert lines == ["title: T", "description:", "  " + " ".join(["word"] * 15), "  " + " ".join(["word"] * 14)
                     + " word."]
    assert all(len(line) <= 78 for line in lines)
    assert snapshot_lines(None) == snapshot_lines({}) == ["title: ", "description:", "  "]


def test_unified_diff():
    assert unified_diff(OLD, NEW, "version 1", "version 2") == [
        "--- version 1", "+++ version 2", "@@ -1,11 +1,11 @@",
        "-title: Street trees", "+title: Street trees (revised)", " description:", "   Every street tree.",
        "-  Updated monthly;", "+  Updated weekly;", "   see the notes.", " extras.b: 1", ' extras.source: "survey"',
        ' license_id: "cc-by"', " resources: []", ' tags[]: "trees"', '-tags[]: "city"', '+tags[]: "parks"']
    assert unified_diff(OLD, dict(OLD), "version 2", "version 2") == []


def test_field_changes():
    assert field_changes(OLD, NEW) == [
        {"field": "title", "old": "Street trees", "new": "Street trees (revised)", "changed": True},
        {"field": "description", "old": OLD["description"], "new": NEW["description"], "changed": True},
        {"field": "extras", "old": OLD["extras"], "new": OLD["extras"], "changed": False},
        {"field": "license_id", "old": "cc-by", "new": "cc-by", "changed": False},
        {"field": "resources", "old": [], "new": [], "changed": False},
        {"field": "tags", "old": ["trees", "city"], "new": ["trees", "parks"], "changed": True}]


def test_field_changes_of_a_first_version_and_of_fields_one_side_lacks():
    assert field_changes(None, {"title": "T", "notes": "n"}) == [
        {"field": "title", "old": None, "new": "T", "changed": False},
        {"field": "description", "old": None, "new": None, "changed": False},
        {"field": "notes", "old": None, "new": "n", "changed": False}]
    assert field_changes({}, {"title": "T"}) == [
        {"field": "title", "old": None, "new": "T", "changed": True},
        {"field": "description", "old": None, "new": None, "changed": False}]


def test_versions_to_compare():
    assert versions_to_compare(3) == (2, 3)
    assert versions_to_compare(3, to=2) == (1, 2)
    assert versions_to_compare(3, from_=1) == (1, 3)
    assert versions_to_compare(3, from_=2, to=2) == (2, 2)
    assert versions_to_compare(1) == (None, 1)
    assert versions_to_compare(None) == (None, None)
