"""``fairstream init``: a pipeline config inferred from a few sample records, with comments on what to check.

The sample says which fields exist and what their values look like; the roles are inferred from that:

* **features**: every leaf that is a number in every record (booleans are not numbers here), except
  those another role takes (the id, a label, a score, a decision) and numbers that read as times;
* **s** and **u** (groups and strata): strings, integers or booleans with at most :data:`MAX_LEVELS`
  distinct values; a name that says so (``sex``, ``race``, ... for s; ``region``, ``branch``, ... for u)
  is preferred, then fewer values;
* **time**: ISO-8601 strings (a date and a time of day; naive ones are read as UTC), or numbers whose
  magnitude is epoch seconds or milliseconds of the years 2001 to 2286;
* **id**: a field unique over the sample: a string (over one or two records only if its name says id),
  or an integer whose name says id (``customer_id``); else the Kafka key (``$key``);
* **y**, **score**, **decision**: only from their names (``outcome``, ``model.score``, ``decision``,
  ...) and values (0/1 or booleans; a score in [0, 1]), because nothing else tells them apart.

Each choice the user can make up front (``s``, ``u``, ``label``) wins over the inference.
:func:`render_toml` writes the config with a comment above each role naming its candidates.

>>> loan = {"application_id": "A-1", "submitted_at": "2026-11-28T10:00:00Z",
...         "applicant": {"age": 37, "income": 52000, "sex": "F"}, "amount": 12000,
...         "channel": "web", "branch": "north"}
>>> other = {**loan, "application_id": "A-2", "applicant": {"age": 51, "income": 61000, "sex": "M"},
...          "channel": "app", "branch": "south"}
>>> inferred = infer_config([loan, other], name="loans", input_topic="loan-applications")
>>> inferred.features
{'age': 'applicant.age', 'income': 'applicant.income', 'amount': 'amount'}
>>> inferred.s.path, inferred.s.values, inferred.u.path, inferred.id
('applicant.sex', ('F', 'M'), 'branch', 'application_id')
>>> inferred.time
TimeField(path='submitted_at', format='iso8601')
>>> import tomllib
>>> tomllib.loads(render_toml(inferred))["mapping"]["s"]
{'path': 'applicant.sex'}
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Sequence

from .config import ConfigError, PipelineConfig
from .mapping import KAFKA_KEY, parse_path, path_text

MAX_LEVELS = 10
"""At most this many distinct values make a field a group or stratum candidate."""
EPOCH_RANGES = {"epoch_s": (1e9, 1e10), "epoch_ms": (1e12, 1e13)}
"""Magnitudes of epoch times from 2001-09-09 to 2286-11-20: no count or amount of a record is read as a time
unless it falls there."""
S_WORDS = ("sex", "gender", "race", "ethnic", "religion", "nationality", "disab", "marital", "citizen")
U_WORDS = ("region", "branch", "stratum", "strata", "segment", "state", "country", "city", "zone", "district",
           "area", "education", "site", "market")
OUTPUT_SUFFIX = ".fair"
"""The output topic is the input topic's name with this suffix."""
MAX_TOPIC = 249
"""Kafka's longest topic name."""
# Words that, in a field's last key (see _named), say its role: the values alone cannot tell a label from a flag.
ID_WORDS = ("id", "key", "uuid", "number")
TIME_WORDS = ("time", "ts", "date", "at", "when", "created", "submitted")
LABEL_WORDS = ("y", "label", "outcome", "target", "default", "defaulted", "repaid")
SCORE_WORDS = ("score", "prob", "probability", "pd")
DECISION_WORDS = ("decision", "approved", "approve", "prediction", "predicted", "pred", "accepted")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class InitError(ValueError):
    """The sample cannot give a config (no records, a chosen path it lacks, no group field); says what to pass."""


# --------------------------------------------------------------------------- what the sample holds


@dataclass(frozen=True)
class Leaf:
    """One scalar field of the sample: where it is and the values the records carrying it hold there."""

    segments: tuple[str, ...]
    values: tuple

    @property
    def path(self) -> str:
        """A dotted path, or a JSON Pointer where a key holds a character a dotted path cannot carry."""
        return path_text(self.segments)

    @property
    def kinds(self) -> frozenset[str]:
        """The JSON types seen: ``bool``, ``int``, ``float``, ``str``, ``null``."""
        return frozenset(_kind(value) for value in self.values)

    @property
    def distinct(self) -> tuple:
        """The distinct values in first-seen order (``True`` and ``1`` kept apart)."""
        return tuple({(_kind(value), value): value for value in self.values}.values())

    def is_numeric(self) -> bool:
        """A number in every record carrying it."""
        return bool(self.values) and self.kinds <= {"int", "float"}


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def parse_samples(values: Sequence[bytes | str], origins: Sequence[str]) -> list[dict]:
    """Sample records from their JSON texts; one that is not a JSON object is an InitError naming its origin.

    Parameters
    ----------
    values : sequence of bytes or str
        One JSON object each (a line of a JSON-lines file, a Kafka message's value).
    origins : sequence of str
        Where each came from, for the error (``samples.jsonl line 3``, ``partition 0 offset 12``).

    Returns
    -------
    list of dict
        The records.

    >>> parse_samples(['{"a": 1}'], ["line 1"])
    [{'a': 1}]
    >>> parse_samples(["[1]"], ["line 1"])
    Traceback (most recent call last):
    ...
    fairstream.streams.init_config.InitError: line 1: not a JSON object (a list); init reads JSON records
    """
    records = []
    for value, origin in zip(values, origins, strict=True):
        try:
            record = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InitError(f"{origin}: not JSON ({_not_json(value, exc)}); init reads JSON records") from None
        if not isinstance(record, dict):
            raise InitError(f"{origin}: not a JSON object (a {_JSON_NAMES.get(type(record), 'value')}); init reads "
                            "JSON records")
        records.append(record)
    return records


def _not_json(value: bytes | str, exc: Exception) -> str:
    """Why a value is not JSON: Avro's Confluent wire format is named, as the likeliest other format on a topic."""
    if isinstance(value, bytes) and len(value) > 5 and value[0] == 0:
        return f"Avro in the Confluent wire format? magic byte 0, schema id {int.from_bytes(value[1:5], 'big')}"
    return str(exc)


_JSON_NAMES = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def survey(samples: Sequence[dict]) -> list[Leaf]:
    """Every scalar leaf of the samples in first-seen order, with its values (lists are not mappable: left out)."""
    found: dict[tuple[str, ...], list] = {}
    for record in samples:
        for segments, value in _leaves(record, ()):
            found.setdefault(segments, []).append(value)
    return [Leaf(segments, tuple(values)) for segments, values in found.items()]


def _leaves(obj: dict, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in obj.items():
        if key == "":  # no path names an empty key: such a field can only pass through
            continue
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        elif not isinstance(value, list):
            yield (*prefix, key), value


# --------------------------------------------------------------------------- what the config says


@dataclass(frozen=True)
class TimeField:
    """The event time: a path and how it is written (``iso8601``, ``epoch_s`` or ``epoch_ms``)."""

    path: str
    format: str


@dataclass(frozen=True)
class GroupField:
    """A group (s) or stratum (u) field: its path, the labels of the values the sample shows (sorted), and the
    value map from a value's JSON text to its label where the values themselves cannot be labels (booleans)."""

    path: str
    values: tuple
    value_map: tuple[tuple[str, int], ...] = ()
    default: str | None = None

    @classmethod
    def of(cls, leaf: Leaf) -> "GroupField":
        """The group field of a leaf: strings and integers are their own labels, booleans are labelled 0 and 1."""
        if leaf.kinds == {"bool"}:
            seen = sorted(set(leaf.values))
            return cls(leaf.path, tuple(int(v) for v in seen), tuple((json.dumps(v), int(v)) for v in seen))
        return cls(leaf.path, tuple(sorted(leaf.distinct)))

    def describe(self) -> str:
        """``applicant.sex (2 values)``: a candidate as a comment lists it."""
        return f"{self.path} ({len(self.values)} value{'s' * (len(self.values) != 1)})"


@dataclass(frozen=True)
class InferredConfig:
    """The roles :func:`infer_config` found in a sample, the candidates it chose among, and what to check.

    Parameters
    ----------
    name : str
        The pipeline name.
    input_topic : str
        The topic the records are read from (the output topic is ``<input>.fair``; the pipeline's own topics are
        under the prefix ``fairstream.<name>``).
    records : int
        How many sample records the inference saw.
    id : str
        The id path, or ``"$key"`` for the Kafka key.
    s : GroupField
        The protected attribute and its values (the pipeline's groups).
    u : GroupField
        The stratum and its values (the pipeline's strata).
    features : dict of str to str
        Pipeline feature name -> path of a number.
    time : TimeField or None
        The event time, if the sample has one.
    y, score, decision : str or None
        Paths of a label, of an existing model's score and decision, if found.
    feature_candidates : tuple of str
        Every numeric leaf (the features are those no other role takes).
    group_candidates : tuple of GroupField
        Every field that could be s or u.
    id_candidates : tuple of str
        Every field unique over the sample.
    time_candidates : tuple of TimeField
        Every field that reads as a time.
    notes : tuple of str
        What the user should check, one sentence each.
    output_field : str
        The field fairstream writes under: ``fairstream``, or a variant no sample record has.
    """

    name: str
    input_topic: str
    records: int
    id: str
    s: GroupField
    u: GroupField
    features: dict[str, str]
    time: TimeField | None = None
    y: str | None = None
    score: str | None = None
    decision: str | None = None
    feature_candidates: tuple[str, ...] = ()
    group_candidates: tuple[GroupField, ...] = ()
    id_candidates: tuple[str, ...] = ()
    time_candidates: tuple[TimeField, ...] = ()
    notes: tuple[str, ...] = ()
    output_field: str = "fairstream"

    @property
    def monitor_only(self) -> bool:
        """Whether the records already carry a model's score or decision (a monitor-only chain can watch it)."""
        return self.score is not None or self.decision is not None


# --------------------------------------------------------------------------- the inference


def infer_config(samples: Sequence[dict], keys: Sequence | None = None, *, s: str | None = None,
                 u: str | None = None, label: str | None = None, name: str = "pipeline",
                 input_topic: str | None = None) -> InferredConfig:
    """Infer a pipeline's record mapping from sample records.

    Parameters
    ----------
    samples : sequence of dict
        The sample records (JSON objects), at least one.
    keys : sequence or None, default=None
        Their Kafka keys (bytes, str or None), when read from a topic: the id falls back to ``$key``.
    s, u, label : str or None, default=None
        Paths the user chose for the protected attribute, the stratum and the label (dotted or JSON Pointer).
    name : str, default='pipeline'
        The pipeline name (made valid: letters, digits, '_', '-' and inner dots).
    input_topic : str or None, default=None
        The input topic (default: the name).

    Returns
    -------
    InferredConfig
        The roles, their candidates and the notes on what to check.
    """
    if not samples:
        raise InitError("no sample records: init needs at least one JSON object")
    leaves, notes = survey(samples), []
    chosen = _chosen_leaves(leaves, {"s": s, "u": u, "label": label})
    times = time_candidates(leaves)
    time = _pick(times, lambda t: _named(t.path, TIME_WORDS))
    ids = id_candidates(leaves, len(samples), times)
    id_path = _id_path(ids, keys, notes)
    y = chosen["label"].path if "label" in chosen else _named_leaf(leaves, LABEL_WORDS, _is_binary)
    score = _named_leaf(leaves, SCORE_WORDS, _is_probability, other_than=y)
    decision = _named_leaf(leaves, DECISION_WORDS, _is_binary, other_than=y)
    # Every time-like number stays out of the features, not only the chosen time: a timestamp is no feature.
    taken = {id_path, y, score, decision, *(t.path for t in times)}
    groups = group_candidates(leaves, len(samples))
    top_keys = {key for record in samples for key in record}
    s_field, u_field = _group_roles(chosen, groups, taken, top_keys, notes)
    numeric = [leaf for leaf in leaves if leaf.is_numeric()]
    features = feature_names([leaf for leaf in numeric if leaf.path not in taken | {s_field.path, u_field.path}
                              and len(leaf.values) == len(samples)])
    if not features:
        raise InitError("no numeric field in every sample record: a pipeline repairs at least one feature")
    notes += _time_notes(time, leaves) + _feature_notes(numeric, len(samples), times, time)
    pipeline_name = valid_name(name)
    if input_topic is None:
        notes.append(f"topics.input: {pipeline_name!r} is a guess: set the topic the records are on")
    return InferredConfig(
        name=pipeline_name, input_topic=input_topic or pipeline_name, records=len(samples), id=id_path,
        s=s_field, u=u_field, features=features, time=time, y=y, score=score, decision=decision,
        feature_candidates=tuple(leaf.path for leaf in numeric), group_candidates=tuple(groups),
        id_candidates=tuple(leaf.path for leaf in ids), time_candidates=tuple(times), notes=tuple(notes),
        output_field=_unused_key("fairstream", top_keys))


def _chosen_leaves(leaves: Sequence[Leaf], paths: dict[str, str | None]) -> dict[str, Leaf]:
    """The leaves the user named by role; a path the sample lacks, or a label that is not 0/1, is an InitError."""
    by_path = {leaf.segments: leaf for leaf in leaves}
    chosen = {role: _chosen_leaf(by_path, path, f"--{role}") for role, path in paths.items() if path is not None}
    if "label" in chosen and not _is_binary(chosen["label"]):
        raise InitError(f"--label {paths['label']}: a label is 0/1 or true/false, the sample has "
                        f"{list(chosen['label'].distinct)[:MAX_LEVELS]}")
    if "s" in chosen and chosen["s"] is chosen.get("u"):
        raise InitError(f"--s and --u name one field, {paths['s']}: s and u are two attributes")
    return chosen


def _group_roles(chosen: dict[str, Leaf], groups: Sequence[GroupField], taken: set, top_keys: set,
                 notes: list[str]) -> tuple[GroupField, GroupField]:
    """s (required) and u (else one stratum for every record), each the user's choice or the best candidate."""
    s_field = _group_role(chosen.get("s"), groups, taken | {leaf.path for leaf in chosen.values()}, S_WORDS, "s",
                          notes)
    if s_field is None:
        raise InitError(f"no field for s: none holds strings, integers or booleans with at most {MAX_LEVELS} values; "
                        "pass --s PATH")
    u_field = _group_role(chosen.get("u"), groups, taken | {s_field.path}, U_WORDS, "u", notes) \
        or _one_stratum(top_keys, notes)
    return s_field, u_field


def _chosen_leaf(by_path: dict, path: str, option: str) -> Leaf:
    try:
        leaf = by_path.get(parse_path(path))
    except ValueError as exc:
        raise InitError(f"{option} {path}: {exc}") from None
    if leaf is None:
        known = ", ".join(path_text(segments) for segments in by_path)
        raise InitError(f"{option} {path}: no such field in the sample; its fields: {known}")
    return leaf


def _pick(candidates: Sequence, preferred) -> Any:
    """The first candidate ``preferred`` says yes to, else the first, else None."""
    return next((c for c in candidates if preferred(c)), candidates[0] if candidates else None)


def _named(path: str, words: Sequence[str]) -> bool:
    """Whether the path's last key, split into words (``submitted_at``, ``applicantSex``), holds one of ``words``
    or starts with one (``ethnicity``, ``probability``)."""
    last = parse_path(path)[-1] if path != KAFKA_KEY else path
    parts = re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", last).lower())
    return any(part == word or (len(word) > 2 and part.startswith(word)) for part in parts for word in words)


def time_candidates(leaves: Sequence[Leaf]) -> list[TimeField]:
    """Every leaf whose every value reads as a time: ISO-8601 text, else epoch s or ms by magnitude."""
    found = []
    for leaf in leaves:
        if leaf.values and all(isinstance(v, str) and _is_iso_time(v) for v in leaf.values):
            found.append(TimeField(leaf.path, "iso8601"))
        elif leaf.is_numeric():
            found += [TimeField(leaf.path, unit) for unit, (low, high) in EPOCH_RANGES.items()
                      if all(low <= value < high for value in leaf.values)]
    return found


def _is_iso_time(text: str) -> bool:
    """A date and a time of day (a date alone is more often a birthday than an event time)."""
    return len(text) >= 16 and text[10:11] in ("T", " ") and _iso_time(text) is not None


def _iso_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _time_notes(time: TimeField | None, leaves: Sequence[Leaf]) -> list[str]:
    if time is None or time.format != "iso8601":
        return []
    values = next(leaf.values for leaf in leaves if leaf.path == time.path)
    naive = sum(_iso_time(value).tzinfo is None for value in values)
    return [f"time: {naive} of the sample's {time.path} values have no UTC offset; fairstream reads them as UTC"] \
        if naive else []


def id_candidates(leaves: Sequence[Leaf], records: int, times: Sequence[TimeField] = ()) -> list[Leaf]:
    """Fields present in every record and unique over them: strings (named ids first), and integers named as ids
    (an amount or an income may well be unique over a small sample); never a time.

    >>> [leaf.path for leaf in id_candidates(survey([{"ref": "a", "n": 1}, {"ref": "b", "n": 2},
    ...                                               {"ref": "c", "n": 3}]), 3)]
    ['ref']
    """
    clock = {time.path for time in times}
    # Over one or two records most strings are unique: only a name then says a field is an id.
    unique = [leaf for leaf in leaves if len(leaf.values) == records and len(leaf.distinct) == records
              and leaf.path not in clock and leaf.kinds in ({"str"}, {"int"})
              and (_named(leaf.path, ID_WORDS) or (leaf.kinds == {"str"} and records > 2))]
    return sorted(unique, key=lambda leaf: (not _named(leaf.path, ID_WORDS), leaf.kinds != {"str"}))


def _id_path(ids: Sequence[Leaf], keys: Sequence | None, notes: list[str]) -> str:
    if ids:
        return ids[0].path
    if keys is None:
        notes.append("id: no field is unique over the sample, so the id is the Kafka key ($key): the records must "
                      "be keyed, uniquely")
    elif any(key is None for key in keys) or len(set(keys)) < len(keys):
        notes.append(f"id: no field is unique over the sample, and the Kafka keys are not either "
                     f"({sum(key is None for key in keys)} missing, {len(keys) - len(set(keys))} repeated): "
                     "outputs are told apart by their id")
    return KAFKA_KEY


def _is_binary(leaf: Leaf) -> bool:
    return bool(leaf.values) and (leaf.kinds == {"bool"} or (leaf.kinds == {"int"} and set(leaf.values) <= {0, 1}))


def _is_probability(leaf: Leaf) -> bool:
    return leaf.is_numeric() and all(0 <= value <= 1 for value in leaf.values)


def _named_leaf(leaves: Sequence[Leaf], words: Sequence[str], fits, other_than: str | None = None) -> str | None:
    """The first leaf named by one of ``words`` whose values ``fits`` (not the path a chosen label took)."""
    return next((leaf.path for leaf in leaves if _named(leaf.path, words) and fits(leaf) and leaf.path != other_than),
                None)


def group_candidates(leaves: Sequence[Leaf], records: int) -> list[GroupField]:
    """Fields that could be s or u: strings, 64-bit integers or booleans (one type per field) in every record, with
    at most :data:`MAX_LEVELS` values (an id among them is left to the id). Integers are numbers first, so they count
    only once the sample (of at least four records) repeats their values."""
    found = []
    for leaf in leaves:
        kinds, distinct = leaf.kinds, leaf.distinct
        # A group a record may lack dead-letters it; labels are 64-bit integers or text.
        if kinds not in ({"str"}, {"int"}, {"bool"}) or len(distinct) > MAX_LEVELS or len(leaf.values) < records \
                or (kinds == {"int"} and not all(-2**63 <= value < 2**63 for value in distinct)):
            continue
        if kinds == {"int"} and (records < 4 or len(distinct) == len(leaf.values)):
            continue
        found.append(GroupField.of(leaf))
    return found


def _group_role(leaf: Leaf | None, groups: Sequence[GroupField], taken: set, words: Sequence[str], role: str,
                notes: list[str]) -> GroupField | None:
    if leaf is not None:
        if leaf.kinds not in ({"str"}, {"int"}, {"bool"}):
            raise InitError(f"--{role} {leaf.path}: a group field holds strings, integers or booleans (one type), "
                            f"the sample has {sorted(leaf.kinds)}")
        return GroupField.of(leaf)
    free = [group for group in groups if group.path not in taken]
    # Preferred: a name that says the role, then the fewest values (a binary attribute is the usual s), then order.
    ranked = sorted(free, key=lambda g: (not _named(g.path, words), len(g.values) < 2,
                                         isinstance(g.values[0], int) and not g.value_map,
                                         len(g.values)))
    if not ranked:
        return None
    if len(ranked[0].values) < 2:
        notes.append(f"{role}: {ranked[0].path} shows one value in the sample; the pipeline's "
                     f"{'groups' if role == 's' else 'strata'} list every value it may take")
    return ranked[0]


ONE_STRATUM = "all"
"""The stratum of every record when no field can be u."""


def _one_stratum(keys: set, notes: list[str]) -> GroupField:
    """u as one stratum: a top-level key no sample record has, whose default every record then takes."""
    path = _unused_key("stratum", keys)
    notes.append(f"u: no field left for a stratum, so every record is in one stratum {ONE_STRATUM!r} (the default of "
                 f"{path}, a field the sample lacks); pass --u PATH to repair within strata")
    return GroupField(path, (ONE_STRATUM,), default=ONE_STRATUM)


def _unused_key(name: str, keys: set) -> str:
    """``name``, with as many '_' appended as it takes to be a key no record has (fairstream writes or reads it)."""
    return next(candidate for candidate in (name + "_" * i for i in range(len(keys) + 1)) if candidate not in keys)


def feature_names(leaves: Sequence[Leaf]) -> dict[str, str]:
    """Pipeline feature name -> path: each leaf's last key made a valid name, prefixed by its parents' keys where
    two leaves would share one (``applicant_age``), numbered if that is not enough."""
    names: dict[str, str] = {}
    for leaf in leaves:
        for depth in range(1, len(leaf.segments) + 1):
            candidate = valid_feature("_".join(leaf.segments[-depth:]))
            if candidate not in names:
                break
        number = 2
        while candidate in names:
            candidate, number = f"{valid_feature(leaf.segments[-1])}_{number}", number + 1
        names[candidate] = leaf.path
    return names


def valid_feature(key: str) -> str:
    """A feature name of letters, digits, '_' and '-' made from a record's key."""
    return _SAFE_NAME.sub("_", key).strip("_") or "feature"


def valid_name(text: str) -> str:
    """A pipeline or topic-prefix name (letters, digits, '_', '-' and inner dots, at most 200 characters)."""
    parts = [_SAFE_NAME.sub("-", part).strip("-") for part in text.split(".")]
    return ".".join(part for part in parts if part)[:200].strip(".") or "pipeline"


def _feature_notes(numeric: Sequence[Leaf], records: int, times: Sequence[TimeField],
                   time: TimeField | None) -> list[str]:
    notes = []
    partial = [leaf.path for leaf in numeric if len(leaf.values) < records]
    if partial:
        notes.append(f"features: {', '.join(partial)} missing from some sample records, so not features (a record "
                     "without a mapped feature is dead-lettered)")
    clocks = [f"{t.path} ({t.format})" for t in times if t != time and t.format != "iso8601"]
    if clocks:
        notes.append(f"features: {', '.join(clocks)} read as times, so not features")
    return notes


# --------------------------------------------------------------------------- the TOML


def render_toml(inferred: InferredConfig) -> str:
    """The pipeline config of an inference, with a comment above each role saying what to check.

    Parameters
    ----------
    inferred : InferredConfig
        What :func:`infer_config` found.

    Returns
    -------
    str
        TOML text for :meth:`fairstream.streams.config.PipelineConfig.from_toml`.
    """
    sections = (_header(inferred), _pipeline(inferred), _topics(inferred), _mapping(inferred), _features(inferred),
                _output(inferred), _agents(inferred))
    return "\n".join("".join(f"{_printable(line) if line.startswith('#') else line}\n" for line in section)
                     for section in sections)


def check_config(text: str) -> PipelineConfig:
    """The pipeline config ``text`` states, validated as a worker reads it (an InitError says what it refuses).

    Parameters
    ----------
    text : str
        TOML from :func:`render_toml`.

    Returns
    -------
    PipelineConfig
        The validated configuration.
    """
    try:
        return PipelineConfig.from_dict(tomllib.loads(text))
    except ConfigError as exc:
        raise InitError(f"the inferred config is refused ({exc}): choose the roles with --s, --u or --label") from None


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _printable(comment: str) -> str:
    """A comment line whose paths hold control characters (TOML forbids them in comments, a newline would end
    it) with those escaped."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", comment)


def _header(inferred: InferredConfig) -> list[str]:
    lines = [f"# Inferred by `fairstream init` from {inferred.records} sample record"
             f"{'s' * (inferred.records != 1)} of {inferred.input_topic!r}.",
             "# Check every role below; the comment above each names the other candidates."]
    return lines + [f"# CHECK {note}" for note in inferred.notes]


def _pipeline(inferred: InferredConfig) -> list[str]:
    lines = ["[pipeline]", f"name = {_value(inferred.name)}",
             f"features = {_value(list(inferred.features))}",
             f"groups = {_value(list(inferred.s.values))}  # the values of s in the sample: list every value it "
             "may take",
             f"strata = {_value(list(inferred.u.values))}  # the values of u in the sample",
             f"s_name = {_value(parse_path(inferred.s.path)[-1])}",
             f"u_name = {_value(parse_path(inferred.u.path)[-1])}"]
    if inferred.y is not None:
        lines.append("label = true  # records carry y (0 or 1)")
    return lines


def _topics(inferred: InferredConfig) -> list[str]:
    return ["[topics]", f"input = {_value(inferred.input_topic)}",
            f"output = {_value(inferred.input_topic[:MAX_TOPIC - len(OUTPUT_SUFFIX)] + OUTPUT_SUFFIX)}",
            'format = "json"  # or "avro"',
            "# The pipeline's own topics (control, dlq, ...): one prefix per pipeline keeps two pipelines apart.",
            f"prefix = {_value('fairstream.' + inferred.name)}"]


def _mapping(inferred: InferredConfig) -> list[str]:
    lines = ["[mapping]", f"# id: {_id_comment(inferred)}", f"id = {_value(inferred.id)}"]
    lines += _time_lines(inferred)
    lines += [f"# s: which field is the protected attribute? candidates: {_groups_comment(inferred, 's')}",
              "# (values = { F = \"female\" } renames values; pipeline.groups then lists the new names)",
              f"s = {_group_spec(inferred.s)}",
              f"# u: the stratum the repair is fitted within; candidates: {_groups_comment(inferred, 'u')}",
              f"u = {_group_spec(inferred.u)}"]
    for role, path in (("y", inferred.y), ("score", inferred.score), ("decision", inferred.decision)):
        if path is not None:
            lines += [f"{role} = {_value(path)}  # found by its name: check it is the {_ROLE_WORDS[role]}"]
    return lines + ["strict = false  # fields the mapping does not name pass through; true dead-letters them"]


def _group_spec(group: GroupField) -> str:
    values = ", ".join(f"{_value(text)} = {label}" for text, label in group.value_map)
    default = f", default = {_value(group.default)}" if group.default is not None else ""
    return f"{{ path = {_value(group.path)}" + (f", values = {{ {values} }}" if values else "") + default + " }"


_ROLE_WORDS = {"y": "label (0 or 1)", "score": "score of your model", "decision": "decision of your model"}


def _id_comment(inferred: InferredConfig) -> str:
    if inferred.id == KAFKA_KEY:
        return "the Kafka key ($key): no field is unique over the sample"
    others = [path for path in inferred.id_candidates if path != inferred.id]
    return ("unique over the sample" + (f"; also unique: {', '.join(others)}" if others else "")
            + "; outputs are de-duplicated by it")


def _time_lines(inferred: InferredConfig) -> list[str]:
    if inferred.time is None:
        return ["# time: no field reads as a time (ISO-8601, epoch seconds or milliseconds): records are filed at "
                "their arrival"]
    others = [f"{t.path} ({t.format})" for t in inferred.time_candidates if t != inferred.time]
    return [f"# time: the event time" + (f"; also a time: {', '.join(others)}" if others else ""),
            f"time = {{ path = {_value(inferred.time.path)}, format = {_value(inferred.time.format)} }}"]


def _groups_comment(inferred: InferredConfig, role: str) -> str:
    """The candidates for s or u that no other role took (u's leave out s)."""
    taken = {inferred.id, inferred.y, inferred.score, inferred.decision, inferred.time and inferred.time.path}
    taken |= {inferred.s.path} if role == "u" else set()
    free = [group for group in inferred.group_candidates if group.path not in taken]
    return ", ".join(group.describe() for group in free) or "no other field in the sample"


def _features(inferred: InferredConfig) -> list[str]:
    lines = ["# features: every number in the sample no other role takes; drop what is not to be repaired",
             "[mapping.features]"]
    return lines + [f"{_key(name)} = {_value(path)}" for name, path in inferred.features.items()]


def _output(inferred: InferredConfig) -> list[str]:
    return ["[output]", 'repaired = "in_place"  # or "under": the repaired values under `field`, the record untouched',
            f"field = {_value(inferred.output_field)}  # where fairstream writes the originals, scores and "
            "provenance", 'provenance = "field"  # or "headers"']


def _agents(inferred: InferredConfig) -> list[str]:
    lines = ["[agents.records]", 'artifact = ["plan"]  # repair the features with an optimal-transport plan']
    return lines + (_monitor_only_lines(inferred) if inferred.monitor_only else [])


MONITOR_ONLY = "#   "
"""The indent of the commented lines of the monitor-only alternative (uncommented, they are TOML)."""


def _monitor_only_lines(inferred: InferredConfig) -> list[str]:
    """The monitor-only alternative, commented: no chain, and the statistics of what the records carry (decisions:
    the DP gaps, with labels equal opportunity; a score alone: OTF)."""
    carried = " and ".join(f"{role} ({path})" for role, path in (("decision", inferred.decision),
                                                                 ("score", inferred.score)) if path is not None)
    statistics = ["dp_difference", "conditional_dp", *(["eopp"] if inferred.y else [])] if inferred.decision \
        else ["otf"]
    return ["", f"# Your records carry their own model's {carried}.",
            "# To monitor that model only, without repairing, put these lines in place of [agents.records] above:", f"{MONITOR_ONLY}[agents.records]",
            f"{MONITOR_ONLY}artifact = []", f"{MONITOR_ONLY}[monitor]", f"{MONITOR_ONLY}statistic = {_value(statistics)}"]


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value) -> str:
    """A TOML value: JSON's strings, integers, booleans and arrays are TOML's."""
    # JSON escapes every control character TOML forbids but DEL; non-ASCII stays raw (JSON's \u escapes of
    # astral characters are surrogate pairs, which TOML refuses).
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
