"""What changed in a dataset between two harvests: snapshots, change types, significance.

Pure functions over plain data: no database, HTTP or Airflow here.

Snapshot
    ``snapshot(title, description, raw)`` is the version of a dataset we keep: the cleaned title and
    description (exactly what ``dataset.normalize`` produces; the description is kept whole, not
    capped like the embedded text), CKAN's ``name`` and ``url`` (the package's source link), and the
    tracked metadata of ``dataset.tracked_metadata``: tags, organization, organization_name, license,
    groups, resources [{url, format, name}], extras {key: value} and the portal's other top-level
    fields (dates included; ``metadata_modified`` and the other server bookkeeping are not
    tracked). It is JSON with sorted keys, so two snapshots are equal exactly when the dataset's
    text or its ``metadata_hash`` changed.

Change types (``Change.change_type``)
    ``new``               first time we see the dataset (``detect(None, snapshot)``)
    ``content_updated``   the description (the embedded text besides the title) changed
    ``title_changed``     the title changed
    ``date_changed``      a date field changed (see "Date fields" below)
    ``metadata_updated``  anything else we track: tags, organization, license, groups, resources,
                          name, url, extras and custom fields that are not dates
    ``removed``           the dataset is gone from the portal (``removal()``)
    ``restored``          a removed dataset is back (``restoration()``)

    One edit can be several kinds at once: ``Change.kinds`` lists all of them and
    ``changed_fields`` holds every changed field. ``change_type`` is the most significant kind:
    the kind whose weights contributed most to this change's score (with the portal's weights),
    ties broken by the fixed order content_updated > title_changed > date_changed >
    metadata_updated (``KIND_ORDER``). ``kinds`` is sorted the same way, so ``kinds[0]`` is the
    change type. A metadata_updated that no weight applies to (a tag, a license, a resource's
    format) scores 0.0: it is still a change and is recorded, it just never needs review.

Date fields
    A key of ``fields`` (top-level custom fields) or ``extras`` is a date field by its name,
    normalized first: camelCase split, lower-cased, runs of anything but letters and digits made
    ``_`` (``dateFirstPublished`` -> ``date_first_published``, ``temporal_coverage-from`` ->
    ``temporal_coverage_from``). Then, in this order:

    1. not a date if its first word is ``metadata`` (``metadata_modified``, ``metadata_created``,
       INSPIRE ``metadata-date``: bookkeeping about the record, not the data) or it has a word
       saying how often or how finely rather than when (``frequency``, ``freq``, ``periodicity``,
       ``granularity``, ``interval``, ``resolution``: ``update_freq``, ``updateInterval``);
    2. a date if a word is ``date`` or ``dates`` (``date_published``, ``date_modified``,
       ``effective_date``, ``dataset_date``, ``publish-date``, ``dataset-reference-date``);
    3. a date if a word is ``temporal`` (``temporal``, ``temporal_start``, ``temporal_end``,
       ``temporal_coverage_from``, ``temporal-extent-begin``), or the key contains ``time_period``,
       ``time_range`` or ``timespan`` (data.gc.ca ``time_period_coverage_start``/``_end``,
       Zürich ``timeRange``);
    4. a date if its last word is a DCAT/CKAN verb of time (``issued``, ``modified``,
       ``published``, ``updated``, ``created``, ``released``), also followed by ``at`` or ``on``
       (DCAT ``issued`` and ``modified`` in extras, ``data_modified``, ``last_modified``,
       ``published_at``; not ``updated_by_script``).

    The rule reads names only (values are not parsed) and knows English/DCAT/CKAN names only.
    Changed date fields are reported under ``changed_fields["dates"]``, keyed by the field's key
    for top-level fields and ``extras.<key>`` for extras; they are not repeated under ``fields`` /
    ``extras``.

Significance (0.0-1.0; ``SignificanceConfig`` holds the weights, overridable per portal)
    The weights of what changed are summed, capped at 1.0 and rounded to 2 decimals
    (half up, in decimal arithmetic): description changed ``content`` 0.4, its length changed by
    more than 20% of the old length ``description_length`` 0.2 (an empty description getting one
    counts), ``title`` 0.3, a date field ``date`` 0.2, organization (title or name)
    ``organization`` 0.15, groups ``groups`` 0.1, resources added or removed ``resources`` 0.1 (once,
    however many), a resource changed in place at the same url (format, name)
    ``resources_changed`` 0.0. Tags, license, name, url and other fields weigh nothing.
    ``new`` scores ``new`` (0.0: a new dataset is news, not an edit to review; set it to 1.0 to
    review every new dataset). ``removed`` scores ``removed`` (0.5). ``restored`` scores
    ``restored`` (0.5, as much as the removal it undoes) plus the weights of what changed while the
    dataset was gone, capped at 1.0. ``requires_review`` is ``significance >= review_threshold``
    (0.7), on the rounded score.

changed_fields
    ``title``, ``name``, ``url``, ``organization``, ``organization_name``, ``license``, and every
    key under ``extras`` / ``fields`` / ``dates``: ``{old, new}``, or ``{length_old, length_new,
    diff}`` when either side is longer than ``SHORT_TEXT_MAX`` characters (a value that is not a
    string is measured and diffed as indented JSON); ``description`` always has the long form.
    ``diff`` is a unified diff of the text cut in sentences and 80-column lines, one line of
    context, at most ``DIFF_MAX_LINES`` lines and ``DIFF_MAX_CHARS`` characters.
    ``tags``, ``groups``: ``{added: [...], removed: [...]}`` (sorted).
    ``resources``, matched by url: ``{added: [urls], removed: [urls], changed: [{url, old: {...},
    new: {...}}]}`` where ``old``/``new`` hold the fields that differ (``format``, ``name``).
    A key absent from a snapshot reads as None.
"""
from __future__ import annotations

import difflib
import json
import math
import re
import textwrap
from dataclasses import dataclass, fields as dataclass_fields
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Mapping

from harvester.domain.dataset import tracked_metadata

NEW = "new"
CONTENT_UPDATED = "content_updated"
TITLE_CHANGED = "title_changed"
DATE_CHANGED = "date_changed"
METADATA_UPDATED = "metadata_updated"
REMOVED = "removed"
RESTORED = "restored"
REIDENTIFIED = "reidentified"
CHANGE_TYPES = (NEW, CONTENT_UPDATED, TITLE_CHANGED, DATE_CHANGED, METADATA_UPDATED, REMOVED, RESTORED, REIDENTIFIED)
# Tie-break among kinds that contributed equally to a change's score, most significant first.
KIND_ORDER = (CONTENT_UPDATED, TITLE_CHANGED, DATE_CHANGED, METADATA_UPDATED)

# A description whose length changes by more than this fraction of the old length weighs extra.
DESCRIPTION_LENGTH_RATIO = 0.2
SHORT_TEXT_MAX = 200
DIFF_MAX_LINES = 40
DIFF_MAX_CHARS = 2000
_DIFF_WIDTH = 80


# -- configuration ------------------------------------------------------------------------------
class SignificanceConfigError(ValueError):
    """A portal's ``significance:`` block is not valid; the message names the bad key."""


@dataclass(frozen=True)
class SignificanceConfig:
    """Weights of each kind of change and the review threshold; every value in [0, 1]."""

    content: float = 0.4
    title: float = 0.3
    date: float = 0.2
    description_length: float = 0.2
    organization: float = 0.15
    groups: float = 0.1
    resources: float = 0.1
    resources_changed: float = 0.0
    new: float = 0.0
    removed: float = 0.5
    restored: float = 0.5
    review_threshold: float = 0.7

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclass_fields(cls))

    @classmethod
    def from_mapping(cls, data: Any, portal_name: str | None = None) -> "SignificanceConfig":
        """The ``significance:`` block of a portals.yaml entry; None or {} -> the defaults.

        Raises SignificanceConfigError naming every bad key: unknown keys (listing the valid
        ones) and values that are not numbers from 0 to 1. The message starts with
        ``portal <name>: `` when ``portal_name`` is given, then ``significance``.
        """
        prefix = f"portal {portal_name}: significance" if portal_name else "significance"
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise SignificanceConfigError(
                f"{prefix} must be a mapping of weights, e.g. {{title: 0.5}}, got {type(data).__name__}")
        valid = cls.keys()
        problems = []
        unknown = sorted(str(k) for k in data if k not in valid)
        if unknown:
            problems.append(f"unknown key(s) {', '.join(unknown)}; valid keys are: {', '.join(sorted(valid))}")
        values = {}
        for key in valid:
            if key not in data:
                continue
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value <= 1:
                problems.append(f"{key} {value!r} must be a number from 0 to 1")
            else:
                values[key] = float(value)
        if problems:
            raise SignificanceConfigError(f"{prefix}: " + "; ".join(problems))
        return cls(**values)


DEFAULT = SignificanceConfig()


# -- snapshots ----------------------------------------------------------------------------------
def _json_canonical(value: Any) -> Any:
    """JSON types only, dict keys sorted: the snapshot is stored and compared as JSON."""
    return json.loads(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str))


def snapshot(title: str, description: str, raw: Mapping, *, decoded: bool = False) -> dict:
    """The tracked version of a dataset: cleaned title and description + the raw package's metadata.

    ``decoded``: ``raw`` was just decoded from JSON (a jsonb column read back: str keys, JSON types
    only, no NaN) and ``title``, ``description`` are str or None. Then the snapshot is made of JSON
    types already, and the JSON round trip that makes it so (``_json_canonical``, a third of the
    cost of a snapshot: 4 s of a 100,000-dataset first sync, issue 40) would change nothing but the
    order of its keys, which neither jsonb nor a comparison of two snapshots sees."""
    meta = tracked_metadata(raw)
    custom = dict(meta.pop("fields"))
    name = custom.pop("name", None)
    url = custom.pop("url", None)
    tracked = {
        "title": title or "",
        "description": description or "",
        "name": name,
        "url": url,
        **meta,
        "fields": custom,
    }
    return tracked if decoded else _json_canonical(tracked)


def snapshot_of(record: Any) -> dict:
    """``snapshot`` of a ``dataset.DatasetRecord`` (its title, description and raw package)."""
    return snapshot(record.title, record.description, record.raw)


# -- date fields --------------------------------------------------------------------------------
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_WORD = re.compile(r"[\W_]+")
_NOT_WHEN = frozenset({"frequency", "freq", "periodicity", "granularity", "interval", "resolution"})
_TIME_VERBS = frozenset({"issued", "modified", "published", "updated", "created", "released"})


def _key_words(key: str) -> list[str]:
    text = _CAMEL.sub("_", str(key)).lower()
    return [w for w in _NON_WORD.sub("_", text).split("_") if w]


def is_date_field(key: str) -> bool:
    """Whether a custom field or extras key holds a date (the rule in the module docstring)."""
    words = _key_words(key)
    if not words or words[0] == "metadata" or _NOT_WHEN.intersection(words):
        return False
    if "date" in words or "dates" in words or "temporal" in words:
        return True
    joined = "_".join(words)
    if "time_period" in joined or "time_range" in joined or "timespan" in joined or "time_span" in joined:
        return True
    if words[-1] in _TIME_VERBS:
        return True
    return len(words) >= 2 and words[-1] in ("at", "on") and words[-2] in _TIME_VERBS


# -- changed_fields -----------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=1, default=str)


def _diff_lines(text: str) -> list[str]:
    lines: list[str] = []
    for raw_line in text.splitlines() or [""]:
        for sentence in _SENTENCE_END.split(raw_line):
            lines.extend(textwrap.wrap(sentence, _DIFF_WIDTH) or [""])
    return lines


def text_diff(old: str, new: str) -> str:
    """A bounded unified diff excerpt of two texts (cut into sentences and 80-column lines)."""
    lines = list(difflib.unified_diff(_diff_lines(old), _diff_lines(new), n=1, lineterm=""))[2:]
    out: list[str] = []
    size = 0
    for index, line in enumerate(lines):
        if index >= DIFF_MAX_LINES or size + len(line) + 1 > DIFF_MAX_CHARS:
            out.append(f"... {len(lines) - index} more diff lines")
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def _long_form(old: Any, new: Any) -> dict:
    old_text, new_text = _as_text(old), _as_text(new)
    return {"length_old": len(old_text), "length_new": len(new_text), "diff": text_diff(old_text, new_text)}


def _value_change(old: Any, new: Any) -> dict:
    if len(_as_text(old)) > SHORT_TEXT_MAX or len(_as_text(new)) > SHORT_TEXT_MAX:
        return _long_form(old, new)
    return {"old": old, "new": new}


def _list_change(old: Any, new: Any) -> dict:
    old_set = {json.dumps(x, sort_keys=True) if not isinstance(x, str) else x for x in old or []}
    new_set = {json.dumps(x, sort_keys=True) if not isinstance(x, str) else x for x in new or []}
    return {"added": sorted(new_set - old_set), "removed": sorted(old_set - new_set)}


def _resource_key(resource: Mapping) -> tuple:
    return (resource.get("url") or "", resource.get("format") or "", resource.get("name") or "")


def _resources_change(old: Any, new: Any) -> dict:
    """Resources matched by url: same url, other format/name -> changed; otherwise added/removed."""
    by_url: dict[str, tuple[list, list]] = {}
    for side, items in ((0, old or []), (1, new or [])):
        for resource in items:
            by_url.setdefault(resource.get("url") or "", ([], []))[side].append(resource)
    added: list[str] = []
    removed: list[str] = []
    changed: list[dict] = []
    for url in sorted(by_url):
        olds = sorted(by_url[url][0], key=_resource_key)
        news = sorted(by_url[url][1], key=_resource_key)
        for resource in list(olds):  # the same resource on both sides is no change
            if resource in news:
                olds.remove(resource)
                news.remove(resource)
        for before, after in zip(olds, news):
            keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            changed.append({"url": url, "old": {k: before.get(k) for k in keys},
                            "new": {k: after.get(k) for k in keys}})
        removed.extend(url for _ in olds[len(news):])
        added.extend(url for _ in news[len(olds):])
    return {"added": added, "removed": removed, "changed": changed}


def _mapping_changes(old: Any, new: Any) -> dict[str, tuple[Any, Any]]:
    old, new = old or {}, new or {}
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new), key=str)
            if k not in old or k not in new or old[k] != new[k]}


def _changed_fields(old: Mapping, new: Mapping) -> dict:
    changed: dict[str, Any] = {}
    for key in ("title", "name", "url"):
        if old.get(key) != new.get(key):
            changed[key] = _value_change(old.get(key), new.get(key))
    if (old.get("description") or "") != (new.get("description") or ""):
        changed["description"] = _long_form(old.get("description") or "", new.get("description") or "")
    for key in ("organization", "organization_name", "license"):
        if old.get(key) != new.get(key):
            changed[key] = _value_change(old.get(key), new.get(key))
    for key in ("tags", "groups"):
        if sorted(old.get(key) or []) != sorted(new.get(key) or []):
            changed[key] = _list_change(old.get(key), new.get(key))
    resources = _resources_change(old.get("resources"), new.get("resources"))
    if any(resources.values()):
        changed["resources"] = resources
    dates: dict[str, Any] = {}
    for section in ("fields", "extras"):
        others: dict[str, Any] = {}
        for key, (before, after) in _mapping_changes(old.get(section), new.get(section)).items():
            if is_date_field(key):
                dates[key if section == "fields" else f"extras.{key}"] = _value_change(before, after)
            else:
                others[key] = _value_change(before, after)
        if others:
            changed[section] = others
    if dates:
        changed["dates"] = dict(sorted(dates.items()))
    return changed


# -- detection ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    change_type: str
    changed_fields: dict
    significance: float
    requires_review: bool
    kinds: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"change_type": self.change_type, "changed_fields": self.changed_fields,
                "significance": self.significance, "requires_review": self.requires_review,
                "kinds": list(self.kinds)}


def _decimal(value: float) -> Decimal:
    return Decimal(str(value))


def _score(weights: list[float]) -> Decimal:
    total = min(sum((_decimal(w) for w in weights), Decimal(0)), Decimal(1))
    return total.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def _change(change_type: str, changed_fields: dict, weights: list[float], kinds: tuple[str, ...],
            config: SignificanceConfig) -> Change:
    score = _score(weights)
    return Change(change_type=change_type, changed_fields=changed_fields, significance=float(score),
                  requires_review=score >= _decimal(config.review_threshold), kinds=kinds)


def _description_length_changed(old: str, new: str) -> bool:
    if len(old) == len(new):
        return False
    if not old:
        return True
    return abs(len(new) - len(old)) / len(old) > DESCRIPTION_LENGTH_RATIO


def _kind_weights(old: Mapping, new: Mapping, changed: dict, config: SignificanceConfig) -> dict[str, list[float]]:
    """Each kind present in ``changed`` with the weights it contributes."""
    kinds: dict[str, list[float]] = {}
    if "description" in changed:
        weights = [config.content]
        if _description_length_changed(old.get("description") or "", new.get("description") or ""):
            weights.append(config.description_length)
        kinds[CONTENT_UPDATED] = weights
    if "title" in changed:
        kinds[TITLE_CHANGED] = [config.title]
    if "dates" in changed:
        kinds[DATE_CHANGED] = [config.date]
    metadata_keys = set(changed) - {"description", "title", "dates"}
    if metadata_keys:
        weights = []
        if metadata_keys & {"organization", "organization_name"}:
            weights.append(config.organization)
        if "groups" in metadata_keys:
            weights.append(config.groups)
        resources = changed.get("resources") or {}
        if resources.get("added") or resources.get("removed"):
            weights.append(config.resources)
        if resources.get("changed"):
            weights.append(config.resources_changed)
        kinds[METADATA_UPDATED] = weights
    return kinds


def _ranked(kinds: dict[str, list[float]]) -> tuple[str, ...]:
    return tuple(sorted(kinds, key=lambda k: (-sum(_decimal(w) for w in kinds[k]), KIND_ORDER.index(k))))


def detect(old: Mapping | None, new: Mapping, config: SignificanceConfig = DEFAULT) -> Change | None:
    """The change from snapshot ``old`` to snapshot ``new``; None when they are the same.

    ``old`` None -> ``new``. Otherwise every kind that applies is in ``kinds``, the most
    significant is ``change_type`` (module docstring), and ``significance`` sums their weights.
    """
    if old is None:
        return _change(NEW, {}, [config.new], (NEW,), config)
    changed = _changed_fields(old, new)
    if not changed:
        return None
    kinds = _kind_weights(old, new, changed, config)
    ranked = _ranked(kinds)
    return _change(ranked[0], changed, [w for k in ranked for w in kinds[k]], ranked, config)


def removal(config: SignificanceConfig = DEFAULT) -> Change:
    """The dataset is no longer on the portal."""
    return _change(REMOVED, {}, [config.removed], (REMOVED,), config)


def restoration(old: Mapping | None, new: Mapping, config: SignificanceConfig = DEFAULT) -> Change:
    """A removed dataset is back: ``restored`` plus whatever changed since ``old`` (its last snapshot)."""
    if old is None:
        return _change(RESTORED, {}, [config.restored], (RESTORED,), config)
    changed = _changed_fields(old, new)
    kinds = _kind_weights(old, new, changed, config)
    ranked = _ranked(kinds)
    weights = [config.restored] + [w for k in ranked for w in kinds[k]]
    return _change(RESTORED, changed, weights, (RESTORED, *ranked), config)


def reidentification(old: Mapping | None, new: Mapping, old_id: str, new_id: str,
                     config: SignificanceConfig = DEFAULT) -> Change:
    """The portal gave a dataset a new identifier (same text, listed under another id): a
    ``reidentified`` change recording both ids, plus whatever else changed, scored as that."""
    changed = {"source_id": _value_change(old_id, new_id)}
    if old is None:
        return _change(REIDENTIFIED, changed, [], (REIDENTIFIED,), config)
    fields = _changed_fields(old, new)
    kinds = _kind_weights(old, new, fields, config)
    ranked = _ranked(kinds)
    return _change(REIDENTIFIED, {**changed, **fields}, [w for k in ranked for w in kinds[k]],
                   (REIDENTIFIED, *ranked), config)


# -- summary ------------------------------------------------------------------------------------
def _names(keys: list[str], limit: int = 3) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" +{len(keys) - limit} more" if len(keys) > limit else "")


def _plus_minus(change: Mapping) -> str:
    parts = []
    if change.get("added"):
        parts.append(f"+{len(change['added'])}")
    if change.get("removed"):
        parts.append(f"-{len(change['removed'])}")
    return " ".join(parts)


def _description_summary(change: Mapping) -> str:
    before, after = change.get("length_old"), change.get("length_new")
    if before is None or after is None:
        before, after = len(_as_text(change.get("old"))), len(_as_text(change.get("new")))
    if before == after:
        return "description"
    if not before:
        return "description (added)"
    if not after:
        return "description (emptied)"
    percent = round((after - before) * 100 / before)
    return f"description ({percent:+d}% length)"


def summarize(changed_fields: Mapping) -> str:
    """One line for humans, e.g. ``title; description (+35% length); tags +2 -1; resources: 1 format changed``."""
    parts = []
    if "source_id" in changed_fields:
        ids = changed_fields["source_id"]
        parts.append(f"identifier {ids.get('old')} -> {ids.get('new')}")
    if "title" in changed_fields:
        parts.append("title")
    if "description" in changed_fields:
        parts.append(_description_summary(changed_fields["description"]))
    if "dates" in changed_fields:
        parts.append(f"dates: {_names(list(changed_fields['dates']))}")
    for key in ("name", "url"):
        if key in changed_fields:
            parts.append(key)
    if "organization" in changed_fields or "organization_name" in changed_fields:
        parts.append("organization")
    if "license" in changed_fields:
        parts.append("license")
    for key in ("groups", "tags"):
        if key in changed_fields:
            parts.append(f"{key} {_plus_minus(changed_fields[key])}".rstrip())
    if "resources" in changed_fields:
        resources = changed_fields["resources"]
        bits = [_plus_minus(resources)] if _plus_minus(resources) else []
        counts: dict[str, int] = {}
        for item in resources.get("changed") or []:
            for key in item.get("new") or {}:
                counts[key] = counts.get(key, 0) + 1
        bits.extend(f"{n} {key} changed" for key, n in sorted(counts.items()))
        parts.append("resources: " + ", ".join(bits))
    for key in ("extras", "fields"):
        if key in changed_fields:
            parts.append(f"{key}: {_names(list(changed_fields[key]))}")
    return "; ".join(parts)
