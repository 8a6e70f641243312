"""Change detection between two snapshots of a dataset, on real CKAN records (pure: no database,
no network)."""
import copy
import json
from collections import Counter

import pytest

from harvester.domain import changes as ch
from harvester.domain.dataset import clean_text, metadata_hash, normalize

PORTAL = "https://data.example.org"
GC_BEFORE = "data-gc-ca-snapshot-2013-06-17T11-50.jsonl"
GC_AFTER = "data-gc-ca-snapshot-2013-06-17T12-30.jsonl"


def snap(pkg, portal=PORTAL):
    rec = normalize(pkg, portal)
    assert rec.ok, rec.error
    return ch.snapshot(rec.title, rec.description, rec.raw)


def edited(pkg, **changes):
    out = copy.deepcopy(pkg)
    out.update(changes)
    return out


@pytest.fixture(scope="module")
def pkg(samples):
    """A real package (Birmingham) with a description, tags, an organization and one resource."""
    return samples("data-birmingham-gov-uk.jsonl")[0]


def extras_of(pkg):
    return {e["key"]: e["value"] for e in pkg.get("extras") or []}


def with_extra(pkg, key, value):
    out = copy.deepcopy(pkg)
    for extra in out["extras"]:
        if extra["key"] == key:
            extra["value"] = value
    return out


# -- snapshots ----------------------------------------------------------------------------------
def test_snapshot_is_json_deterministic_and_tracks_what_we_version(pkg):
    s = snap(pkg)
    assert json.loads(json.dumps(s)) == s
    assert list(s) == sorted(s)
    assert s["title"] == clean_text(pkg["title"]) and s["description"] == clean_text(pkg["notes"])
    assert s["name"] == pkg["name"] and s["url"] == pkg["url"]
    assert s["tags"] == ["feb2018", "payments", "purchase card", "transparency"]
    assert s["organization_name"] == "birmingham-city-council"
    assert [r["format"] for r in s["resources"]] == ["XLS"]
    assert "metadata_modified" not in s["fields"] and "name" not in s["fields"]
    assert s["fields"]["metadata_created"] == pkg["metadata_created"]

    shuffled = edited(pkg, tags=list(reversed(pkg["tags"])))
    shuffled = dict(reversed(list(shuffled.items())))
    assert snap(shuffled) == s
    assert ch.snapshot_of(normalize(pkg, PORTAL)) == s


def test_metadata_modified_alone_is_no_change(pkg):
    assert ch.detect(snap(pkg), snap(edited(pkg, metadata_modified="2030-01-01T00:00:00"))) is None
    assert ch.detect(snap(pkg), snap(pkg)) is None


def test_snapshots_differ_exactly_when_text_or_metadata_hash_do(samples):
    before = {p["id"]: p for p in samples(GC_BEFORE)}
    for pkg in samples(GC_AFTER):
        old = before.get(pkg["id"])
        if old is None:
            continue
        a, b = normalize(old, PORTAL), normalize(pkg, PORTAL)
        same_hashes = a.content_hash == b.content_hash and metadata_hash(old) == metadata_hash(pkg)
        assert (ch.snapshot_of(a) == ch.snapshot_of(b)) == same_hashes


# -- each change type ---------------------------------------------------------------------------
def test_new(pkg):
    change = ch.detect(None, snap(pkg))
    assert change == ch.Change("new", {}, 0.0, False, ("new",))
    flagged = ch.detect(None, snap(pkg), ch.SignificanceConfig(new=1.0))
    assert (flagged.significance, flagged.requires_review) == (1.0, True)


def test_content_updated(pkg):
    notes = pkg["notes"] + " Updated monthly."
    change = ch.detect(snap(pkg), snap(edited(pkg, notes=notes)))
    assert change.change_type == "content_updated" and change.kinds == ("content_updated",)
    assert change.significance == 0.4 and not change.requires_review
    desc = change.changed_fields["description"]
    old_len, new_len = len(clean_text(pkg["notes"])), len(clean_text(notes))
    assert (desc["length_old"], desc["length_new"]) == (old_len, new_len)
    assert "+Updated monthly." in desc["diff"].splitlines()
    assert set(change.changed_fields) == {"description"}


def test_title_changed(pkg):
    change = ch.detect(snap(pkg), snap(edited(pkg, title="March 2018 Purchase Card Transactions")))
    assert (change.change_type, change.significance, change.requires_review) == ("title_changed", 0.3, False)
    assert change.changed_fields == {"title": {"old": "February 2018 Purchase Card Transactions",
                                               "new": "March 2018 Purchase Card Transactions"}}


def test_date_changed_on_data_gc_ca_time_period_coverage(samples):
    pkg = next(p for p in samples(GC_BEFORE) if p.get("time_period_coverage_start"))
    start = pkg["time_period_coverage_start"]
    later = edited(pkg, time_period_coverage_start="2001-01-01 00:00:00")
    change = ch.detect(snap(pkg), snap(later))
    assert (change.change_type, change.significance, change.kinds) == ("date_changed", 0.2, ("date_changed",))
    assert change.changed_fields == {
        "dates": {"time_period_coverage_start": {"old": start, "new": "2001-01-01 00:00:00"}}}
    assert ch.summarize(change.changed_fields) == "dates: time_period_coverage_start"


def test_date_changed_on_dcat_issued_and_modified_in_extras(samples):
    pkg = next(p for p in samples("catalog-data-gov.jsonl")
               if {"issued", "modified"} <= set(extras_of(p)) and p.get("type") == "dataset")
    old = extras_of(pkg)
    newer = with_extra(with_extra(pkg, "modified", "2021-03-01"), "issued", "2011-10-22")
    change = ch.detect(snap(pkg), snap(newer))
    assert change.change_type == "date_changed" and change.significance == 0.2
    assert change.changed_fields == {"dates": {
        "extras.issued": {"old": old["issued"], "new": "2011-10-22"},
        "extras.modified": {"old": old["modified"], "new": "2021-03-01"},
    }}


def test_dkan_metadata_modified_extra_is_metadata_not_a_date(samples):
    pkg = samples("dkan-hauts-de-france.jsonl")[0]
    change = ch.detect(snap(pkg), snap(with_extra(pkg, "metadata_modified", "2020-01-01 00:00:00")))
    assert change.change_type == "metadata_updated" and change.significance == 0.0
    assert list(change.changed_fields) == ["extras"]


def test_metadata_updated_tags_weigh_nothing_but_are_recorded(pkg):
    tags = [t for t in pkg["tags"] if t["name"] != "feb2018"] + [{"name": "finance"}, {"name": "spend"}]
    change = ch.detect(snap(pkg), snap(edited(pkg, tags=tags)))
    assert change == ch.Change("metadata_updated", {"tags": {"added": ["finance", "spend"], "removed": ["feb2018"]}},
                               0.0, False, ("metadata_updated",))
    assert ch.summarize(change.changed_fields) == "tags +2 -1"


def test_metadata_updated_organization_groups_and_license(pkg):
    org = dict(pkg["organization"], name="west-midlands", title="West Midlands")
    change = ch.detect(snap(pkg), snap(edited(pkg, organization=org, groups=[{"name": "finance"}],
                                              license_id="other-closed")))
    assert change.change_type == "metadata_updated" and change.significance == 0.25
    cf = change.changed_fields
    assert cf["organization"] == {"old": pkg["organization"]["title"], "new": "West Midlands"}
    assert cf["organization_name"] == {"old": "birmingham-city-council", "new": "west-midlands"}
    assert cf["groups"] == {"added": ["finance"], "removed": []}
    assert cf["license"] == {"old": pkg["license_id"], "new": "other-closed"}
    assert ch.summarize(cf) == "organization; license; groups +1"


def test_resources_added_removed_and_changed(pkg):
    (res,) = pkg["resources"]
    other = dict(res, url="https://example.org/spend.csv", format="CSV", name="CSV")
    added = ch.detect(snap(pkg), snap(edited(pkg, resources=[res, other])))
    assert added.changed_fields == {"resources": {"added": ["https://example.org/spend.csv"], "removed": [],
                                                  "changed": []}}
    assert (added.change_type, added.significance) == ("metadata_updated", 0.1)

    removed = ch.detect(snap(pkg), snap(edited(pkg, resources=[])))
    assert removed.changed_fields["resources"] == {"added": [], "removed": [res["url"]], "changed": []}
    assert removed.significance == 0.1

    reformatted = ch.detect(snap(pkg), snap(edited(pkg, resources=[dict(res, format="XLSX")])))
    assert reformatted.changed_fields == {"resources": {"added": [], "removed": [], "changed": [
        {"url": res["url"], "old": {"format": "XLS"}, "new": {"format": "XLSX"}}]}}
    assert (reformatted.change_type, reformatted.significance) == ("metadata_updated", 0.0)
    opted_in = ch.detect(snap(pkg), snap(edited(pkg, resources=[dict(res, format="XLSX")])),
                         ch.SignificanceConfig(resources_changed=0.05))
    assert opted_in.significance == 0.05

    both = ch.detect(snap(pkg), snap(edited(pkg, resources=[dict(res, format="XLSX", name="All"), other])))
    assert both.changed_fields["resources"]["changed"] == [
        {"url": res["url"], "old": {"format": "XLS", "name": res["name"]}, "new": {"format": "XLSX", "name": "All"}}]
    assert ch.summarize(both.changed_fields) == "resources: +1, 1 format changed, 1 name changed"


def test_extras_and_custom_fields_per_key(samples):
    pkg = samples("govdata-de.jsonl")[0]
    old = extras_of(pkg)
    change = ch.detect(snap(pkg), snap(edited(with_extra(pkg, "contact_name", "Statistikstelle"),
                                              version="2.0")))
    assert change.change_type == "metadata_updated" and change.significance == 0.0
    assert change.changed_fields == {
        "extras": {"contact_name": {"old": old["contact_name"], "new": "Statistikstelle"}},
        "fields": {"version": {"old": pkg.get("version"), "new": "2.0"}},
    }
    assert ch.summarize(change.changed_fields) == "extras: contact_name; fields: version"


def test_long_values_get_lengths_and_a_bounded_diff(samples):
    pkg = next(p for p in samples("data-gov-uk.jsonl") if len(extras_of(p).get("metadata_provenance") or "") > 200)
    text = extras_of(pkg)["metadata_provenance"]
    change = ch.detect(snap(pkg), snap(with_extra(pkg, "metadata_provenance", text + "x")))
    entry = change.changed_fields["extras"]["metadata_provenance"]
    assert set(entry) == {"length_old", "length_new", "diff"}
    assert (entry["length_old"], entry["length_new"]) == (len(text), len(text) + 1)
    assert entry["diff"].startswith("@@")

    words = [f"Sentence {i} about spending." for i in range(2000)]
    big_old = " ".join(words)
    big_new = " ".join(w.replace("spending", "payments") for w in words)
    change = ch.detect(snap(edited(pkg, notes=big_old)), snap(edited(pkg, notes=big_new)))
    diff = change.changed_fields["description"]["diff"]
    lines = diff.splitlines()
    assert len(lines) <= ch.DIFF_MAX_LINES + 1 and len(diff) <= ch.DIFF_MAX_CHARS + 40
    assert lines[-1].endswith("more diff lines") and "-Sentence 0 about spending." in lines


# -- several kinds at once, significance arithmetic ---------------------------------------------
def test_title_content_and_length_is_0_9_and_needs_review(pkg):
    notes = pkg["notes"] + " " + pkg["notes"]  # doubles the length: over 20%
    change = ch.detect(snap(pkg), snap(edited(pkg, title="Purchase card spend", notes=notes)))
    assert change.change_type == "content_updated"
    assert change.kinds == ("content_updated", "title_changed")
    assert change.significance == 0.9 and change.requires_review
    assert set(change.changed_fields) == {"title", "description"}


def test_description_length_rule_is_strictly_over_20_percent(pkg):
    def score(old_text, new_text):
        return ch.detect(snap(edited(pkg, notes=old_text)), snap(edited(pkg, notes=new_text))).significance

    assert score("a" * 100, "b" * 120) == 0.4
    assert score("a" * 100, "a" * 121) == 0.6
    assert score("a" * 100, "a" * 79) == 0.6
    assert score("", "new text") == 0.6


def test_title_and_content_reach_the_threshold_exactly(pkg):
    change = ch.detect(snap(pkg), snap(edited(pkg, title="Spend", notes=pkg["notes"] + " More.")))
    assert change.significance == 0.7 and change.requires_review


def test_everything_at_once_is_capped_at_1(pkg):
    new = edited(pkg, title="T", notes="short", groups=[{"name": "g"}], resources=[],
                 organization=dict(pkg["organization"], title="Other"), date_published="2020-01-01")
    change = ch.detect(snap(pkg), snap(new))
    assert change.significance == 1.0 and change.requires_review
    assert change.kinds == ("content_updated", "metadata_updated", "title_changed", "date_changed")
    assert set(change.changed_fields) == {"title", "description", "groups", "resources", "organization", "dates"}
    old_len = len(clean_text(pkg["notes"]))
    percent = round((5 - old_len) * 100 / old_len)
    assert ch.summarize(change.changed_fields) == (
        f"title; description ({percent}% length); dates: date_published; organization; groups +1; resources: -1")


def test_most_significant_kind_wins_ties_by_fixed_order(pkg):
    (res,) = pkg["resources"]
    other = dict(res, url="https://example.org/x.csv")
    # metadata (organization 0.15 + groups 0.1 + resources 0.1 = 0.35) outweighs the title (0.3)
    heavy = edited(pkg, title="Other title", groups=[{"name": "g"}], resources=[res, other],
                   organization=dict(pkg["organization"], title="Other"))
    change = ch.detect(snap(pkg), snap(heavy))
    assert change.kinds == ("metadata_updated", "title_changed")
    assert change.change_type == "metadata_updated" and change.significance == 0.65
    # date 0.2 ties metadata 0.2 (groups + resources): date_changed comes first in the fixed order
    tie = edited(pkg, date_published="2020-01-01", groups=[{"name": "g"}], resources=[res, other])
    assert ch.detect(snap(pkg), snap(tie)).kinds == ("date_changed", "metadata_updated")
    # equal weights for content and title: content_updated first
    config = ch.SignificanceConfig(content=0.3, title=0.3)
    both = ch.detect(snap(pkg), snap(edited(pkg, title="X", notes=pkg["notes"] + "!")), config)
    assert both.kinds == ("content_updated", "title_changed")
    # a zero-weight kind still counts, after the weighted ones
    tags = ch.detect(snap(pkg), snap(edited(pkg, title="X", tags=[])))
    assert tags.kinds == ("title_changed", "metadata_updated") and tags.significance == 0.3


def test_rounding_is_half_up_in_decimal(pkg):
    config = ch.SignificanceConfig(title=0.125, content=0.333, review_threshold=0.46)
    assert ch.detect(snap(pkg), snap(edited(pkg, title="X"))).significance == 0.3
    assert ch.detect(snap(pkg), snap(edited(pkg, title="X")), config).significance == 0.13
    both = ch.detect(snap(pkg), snap(edited(pkg, title="X", notes=pkg["notes"] + ".")), config)
    assert (both.significance, both.requires_review) == (0.46, True)


def test_per_portal_weights_and_threshold(pkg):
    config = ch.SignificanceConfig.from_mapping({"title": 0.8, "review_threshold": 0.5, "groups": 0.6}, "canada")
    assert ch.detect(snap(pkg), snap(edited(pkg, title="X")), config).requires_review
    groups = ch.detect(snap(pkg), snap(edited(pkg, groups=[{"name": "g"}])), config)
    assert (groups.significance, groups.requires_review) == (0.6, True)
    assert not ch.detect(snap(pkg), snap(edited(pkg, groups=[{"name": "g"}]))).requires_review


# -- removed, restored --------------------------------------------------------------------------
def test_removal_and_restoration(pkg):
    assert ch.removal() == ch.Change("removed", {}, 0.5, False, ("removed",))
    assert ch.removal(ch.SignificanceConfig(removed=0.9)).requires_review

    assert ch.restoration(None, snap(pkg)) == ch.Change("restored", {}, 0.5, False, ("restored",))
    assert ch.restoration(snap(pkg), snap(pkg)) == ch.Change("restored", {}, 0.5, False, ("restored",))
    back = ch.restoration(snap(pkg), snap(edited(pkg, title="Back again")))
    assert back.change_type == "restored" and back.kinds == ("restored", "title_changed")
    assert (back.significance, back.requires_review) == (0.8, True)
    assert back.changed_fields == {"title": {"old": pkg["title"], "new": "Back again"}}


# -- configuration ------------------------------------------------------------------------------
def test_config_defaults_and_overrides():
    assert ch.SignificanceConfig.from_mapping(None, "canada") == ch.DEFAULT
    assert ch.SignificanceConfig.from_mapping({}, "canada") == ch.DEFAULT
    config = ch.SignificanceConfig.from_mapping({"title": 1, "review_threshold": 0.5}, "canada")
    assert (config.title, config.review_threshold, config.content) == (1.0, 0.5, 0.4)
    with pytest.raises(Exception):
        config.title = 0.1  # frozen


def test_config_validation_messages():
    valid = ("content, date, description_length, groups, new, organization, removed, resources, "
             "resources_changed, restored, review_threshold, title")
    with pytest.raises(ch.SignificanceConfigError) as err:
        ch.SignificanceConfig.from_mapping({"titel": 0.5}, "canada")
    assert str(err.value) == f"portal canada: significance: unknown key(s) titel; valid keys are: {valid}"

    with pytest.raises(ch.SignificanceConfigError) as err:
        ch.SignificanceConfig.from_mapping({"title": 1.5, "content": "high", "new": True, "zz": 1, "aa": 1})
    assert str(err.value) == (
        f"significance: unknown key(s) aa, zz; valid keys are: {valid}; content 'high' must be a number "
        "from 0 to 1; title 1.5 must be a number from 0 to 1; new True must be a number from 0 to 1")

    with pytest.raises(ch.SignificanceConfigError) as err:
        ch.SignificanceConfig.from_mapping({"review_threshold": -0.1}, "canada")
    assert str(err.value) == "portal canada: significance: review_threshold -0.1 must be a number from 0 to 1"

    with pytest.raises(ch.SignificanceConfigError) as err:
        ch.SignificanceConfig.from_mapping([0.5], "canada")
    assert str(err.value) == "portal canada: significance must be a mapping of weights, e.g. {title: 0.5}, got list"
    assert issubclass(ch.SignificanceConfigError, ValueError)


# -- dates rule, summary ------------------------------------------------------------------------
@pytest.mark.parametrize("key", [
    "issued", "modified", "date_published", "date_modified", "effective_date", "temporal_start",
    "temporal_end", "temporal_coverage_from", "temporal_coverage-to", "temporal-extent-begin",
    "time_period_coverage_start", "time_period_coverage_end", "dataset-reference-date", "publish-date",
    "dateFirstPublished", "dateLastUpdated", "timeRange", "last_modified", "data_issued", "published_at",
    "dataset_date", "portal_release_date", "Cobertura temporal",
])
def test_date_fields(key):
    assert ch.is_date_field(key)


@pytest.mark.parametrize("key", [
    "metadata_modified", "metadata_created", "metadata-date", "update_freq", "updateInterval",
    "frequency-of-update", "data_update_frequency", "updated_by_script", "unpublished", "publisher",
    "spatial", "release-notes", "maintenance_and_update_frequency", "accrualPeriodicity", "title_fra",
])
def test_not_date_fields(key):
    assert not ch.is_date_field(key)


def test_summary_line(pkg):
    (res,) = pkg["resources"]
    words = "word " * 20  # 100 characters
    old = edited(pkg, notes=words.strip() + "x")
    tags = [t for t in pkg["tags"] if t["name"] != "feb2018"] + [{"name": "finance"}, {"name": "spend"}]
    new = edited(pkg, title="Spend", notes=(words * 2)[:134] + "x", tags=tags, resources=[dict(res, format="CSV")])
    change = ch.detect(snap(old), snap(new))
    assert ch.summarize(change.changed_fields) == (
        "title; description (+35% length); tags +2 -1; resources: 1 format changed")
    assert ch.summarize({}) == ""
    assert ch.summarize({"description": {"length_old": 0, "length_new": 5, "diff": ""}}) == "description (added)"
    assert ch.summarize({"extras": {k: {"old": 1, "new": 2} for k in "abcde"}}) == "extras: a, b, c +2 more"


# -- the real data.gc.ca incremental change -----------------------------------------------------
def test_real_data_gc_ca_snapshot_pair(samples):
    portal = "https://data.gc.ca/data"
    before = {p["id"]: snap(p, portal) for p in samples(GC_BEFORE)}
    after = {p["id"]: snap(p, portal) for p in samples(GC_AFTER)}
    assert (len(before), len(after)) == (489, 501)

    found = {source_id: ch.detect(before.get(source_id), s) for source_id, s in after.items()}
    assert Counter(c.change_type if c else None for c in found.values()) == {
        None: 483, "new": 12, "metadata_updated": 6}
    updated = [c for c in found.values() if c and c.change_type == "metadata_updated"]
    for change in updated:
        assert list(change.changed_fields) == ["resources"]
        resources = change.changed_fields["resources"]
        assert resources["added"] == [] and resources["removed"] == [] and resources["changed"]
        assert all(item["old"] == {"format": "tiff"} and item["new"] == {"format": "geotif"}
                   for item in resources["changed"])
        assert (change.significance, change.requires_review, change.kinds) == (0.0, False, ("metadata_updated",))
    assert sorted(ch.summarize(c.changed_fields) for c in updated) == (
        ["resources: 1 format changed"] + ["resources: 2 format changed"] * 5)
    assert all(c.significance == 0.0 and c.kinds == ("new",) for c in found.values() if c and c.change_type == "new")
