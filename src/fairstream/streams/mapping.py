"""The record mapping: where each role (id, time, features, s, u, y, score, decision) is found in a team's own records.

A ``[mapping]`` table in the pipeline config names, for each role, a field path into the record: dotted
(``applicant.age``) or a JSON Pointer (``/applicant/age``, for keys that hold dots; ``~1`` is ``/`` and ``~0``
is ``~``), or ``"$key"`` for the Kafka key. A field spec is a path, or a table ``{path, format, values,
default}``. Everything the mapping does not name passes through to the output (``[output]``:
:class:`OutputLayout`). This module holds the model and its parsing, and the path helpers the codec and the
other readers share; :mod:`~fairstream.streams.codec.mapped` decodes and encodes records with it.

>>> mapping = parse_mapping({"id": "application_id", "s": {"path": "applicant.sex", "values": {"F": "female"}},
...                          "u": "branch", "features": {"age": "/applicant/age"}}, ("age",))
>>> mapping.feature("age").path, mapping.s.label("F")
(('applicant', 'age'), 'female')
>>> record = {"applicant": {"age": 37}}
>>> set_path(record, ("applicant", "age"), 38.5); set_path(record, ("fairstream", "score"), 0.2); record
{'applicant': {'age': 38.5}, 'fairstream': {'score': 0.2}}
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Literal

import msgspec

KAFKA_KEY = "$key"
"""The path of the Kafka key (its UTF-8 text): only the id may be read from it."""
TIME_FORMATS = ("epoch_s", "epoch_ms", "iso8601")
"""How an event time is written: seconds or milliseconds since the epoch, or ISO-8601 text (naive: UTC)."""
ROLES = ("id", "time", "s", "u", "y", "score", "decision")
"""The roles of a record besides its features, in the order a reason or the reference lists them."""
OPTIONAL_ROLES = ("time", "y", "score", "decision")
"""Roles a mapping may leave out."""
SPARSE_ROLES = ("time", "y")
"""Mapped roles a record may lack without a default (its time is then its arrival, its label unknown); a record
that lacks any other mapped field without a default is dead-lettered."""
SPEC_KEYS = ("path", "format", "values", "default")
MISSING = object()
"""What :func:`get_path` returns for a path the record does not hold."""


class MappingError(ValueError):
    """A mapping mistake; the message starts with the key at fault (``mapping.features.age: ...``)."""


# --------------------------------------------------------------------------- paths


def parse_path(text: str) -> tuple[str, ...]:
    """The keys of a field path: dotted (``a.b``), a JSON Pointer (``/a/b``), or ``"$key"`` (the empty path).

    >>> parse_path("applicant.age"), parse_path("/rates/1.5~1y"), parse_path(KAFKA_KEY)
    (('applicant', 'age'), ('rates', '1.5/y'), ())
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"a field path must be a non-empty string, got {text!r}")
    if text == KAFKA_KEY:
        return ()
    if text.startswith("/"):
        keys = tuple(_unescape(key) for key in text[1:].split("/"))
    else:
        keys = tuple(text.split("."))
    if "" in keys:
        raise ValueError(f"field path {text!r} has an empty key")
    return keys


def _unescape(key: str) -> str:
    if "~" in key.replace("~0", "").replace("~1", ""):
        raise ValueError(f"JSON Pointer key {key!r} has a '~' that is neither '~0' nor '~1'")
    return key.replace("~1", "/").replace("~0", "~")  # in this order (RFC 6901): "~01" is "~1"


def path_text(path: tuple[str, ...]) -> str:
    """The path as a reason shows it: dotted when that reads back the same, else a JSON Pointer.

    >>> path_text(("applicant", "age")), path_text(("rates", "1.5/y")), path_text(())
    ('applicant.age', '/rates/1.5~1y', '$key')
    """
    if not path:
        return KAFKA_KEY
    if not any("." in key or "/" in key or "~" in key or key == "" for key in path) and path[0] != KAFKA_KEY:
        return ".".join(path)
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


def get_path(obj, path: tuple[str, ...]):
    """The value at ``path`` in ``obj`` (nested dicts), or :data:`MISSING` when some key on the way is absent or a
    value on the way is not an object."""
    for key in path:
        if not isinstance(obj, dict):
            return MISSING
        obj = obj.get(key, MISSING)
        if obj is MISSING:
            return MISSING
    return obj


def set_path(obj: dict, path: tuple[str, ...], value) -> None:
    """Put ``value`` at ``path`` in ``obj``: a replaced value keeps its key's position, a new key is appended (and
    the objects on the way are created). A value on the way that is not an object raises ValueError."""
    for depth, key in enumerate(path[:-1]):
        inner = obj.get(key, MISSING)
        if inner is MISSING:
            inner = obj[key] = {}
        elif not isinstance(inner, dict):
            raise ValueError(f"{path_text(path[:depth + 1])} holds {type(inner).__name__}, not an object: "
                             f"cannot write {path_text(path)}")
        obj = inner
    obj[path[-1]] = value


def walk_paths(obj, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every leaf of ``obj`` (a value that is not a non-empty object), depth first in key order."""
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            yield from walk_paths(value, (*prefix, key))
    elif prefix:
        yield prefix


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class MappedField:
    """Where one role is found, and how its value is read.

    Parameters
    ----------
    path : tuple of str
        The keys leading to the value; empty for the Kafka key.
    text : str
        The path as configured (reasons name it).
    format : str or None
        Time only: one of :data:`TIME_FORMATS`.
    values : tuple of (str, label) pairs
        s and u only: a value map from a value's JSON text (``F``, ``1``, ``true``) to a configured label.
    default : object
        The value a record lacking the field takes (when ``has_default``).
    has_default : bool
        Whether ``default`` applies (TOML has no null, so None cannot say it).
    """

    path: tuple[str, ...]
    text: str
    format: str | None = None
    values: tuple[tuple[str, Any], ...] = ()
    default: Any = None
    has_default: bool = False

    @property
    def is_key(self) -> bool:
        """Whether the value is the Kafka key."""
        return not self.path

    def label(self, value):
        """The configured label a value stands for: its entry of the value map, else the value itself.

        A map's keys are the values' JSON text, so ``F``, ``1`` and ``true`` each name one value (and an
        integer 1 never passes for a boolean true).
        """
        if not self.values:
            return value
        text = ("true" if value else "false") if value.__class__ is bool else str(value)
        return self.value_map.get(text, value)

    @functools.cached_property
    def value_map(self) -> dict:
        """``values`` as a dict (built once: a label is looked up per record)."""
        return dict(self.values)


@dataclass(frozen=True)
class RecordMapping:
    """Where every role of a pipeline's records is found (``[mapping]``).

    Parameters
    ----------
    id : MappedField
        The record's id (a path, or the Kafka key).
    features : tuple of (name, MappedField) pairs
        Every pipeline feature, in the pipeline's order.
    s, u : MappedField
        The group and the stratum.
    time, y, score, decision : MappedField or None
        The optional roles: the event time, the label, an existing score in [0, 1] and decision (0/1).
    strict : bool
        Whether a field the mapping does not name dead-letters the record.
    """

    id: MappedField
    features: tuple[tuple[str, MappedField], ...]
    s: MappedField
    u: MappedField
    time: MappedField | None = None
    y: MappedField | None = None
    score: MappedField | None = None
    decision: MappedField | None = None
    strict: bool = False

    def feature(self, name: str) -> MappedField:
        """The field of feature ``name``."""
        return dict(self.features)[name]

    def fields(self) -> Iterator[tuple[str, MappedField]]:
        """(config key, field) of every mapped role: ``mapping.id``, ..., ``mapping.features.age``."""
        for role in ROLES:
            mapped = getattr(self, role)
            if mapped is not None:
                yield f"mapping.{role}", mapped
        for name, mapped in self.features:
            yield f"mapping.features.{name}", mapped

    def named_paths(self) -> set[tuple[str, ...]]:
        """Every record path the mapping reads (the Kafka key aside)."""
        return {mapped.path for _, mapped in self.fields() if mapped.path}


REPAIRED_MODES = ("in_place", "under")
PROVENANCE_PLACES = ("field", "headers")


@dataclass(frozen=True)
class OutputLayout:
    """Where a mapped record's output puts what fairstream adds (``[output]``).

    Parameters
    ----------
    repaired : {"in_place", "under"}
        "in_place": repaired values at their paths, the originals under ``<field>.original``; "under": the
        record untouched, the repaired values under ``<field>.features``.
    field : str
        The one path (dotted or a JSON Pointer) under which fairstream writes: scores, decisions,
        ``input_digest``, ``s_imputed``, the originals or the repaired features, and the provenance.
    provenance : {"field", "headers"}
        Provenance at ``<field>.provenance``, or as the Kafka header ``fairstream.provenance``.
    """

    repaired: Literal[REPAIRED_MODES] = "in_place"
    field: str = "fairstream"
    provenance: Literal[PROVENANCE_PLACES] = "field"

    def __post_init__(self) -> None:
        for key, allowed in (("repaired", REPAIRED_MODES), ("provenance", PROVENANCE_PLACES)):
            if getattr(self, key) not in allowed:
                raise MappingError(f"output.{key}: must be {' or '.join(map(repr, allowed))}, "
                                   f"got {getattr(self, key)!r}")
        try:
            path = parse_path(self.field)
        except ValueError as exc:
            raise MappingError(f"output.field: {exc}") from None
        if not path:
            raise MappingError("output.field: must be a field path, not the Kafka key")

    @property
    def path(self) -> tuple[str, ...]:
        """The keys of :attr:`field`."""
        return parse_path(self.field)


# --------------------------------------------------------------------------- parsing


def parse_mapping(table: dict, features: tuple[str, ...], groups: tuple = (), strata: tuple = ()) -> RecordMapping:
    """The record mapping a ``[mapping]`` table states, checked against the pipeline's features (and labels).

    Parameters
    ----------
    table : dict
        The parsed ``[mapping]`` table.
    features : tuple of str
        ``pipeline.features``: each must be mapped, and nothing else.
    groups, strata : tuple, optional
        ``pipeline.groups`` and ``pipeline.strata``: a value map must map to these (unchecked when empty).

    Returns
    -------
    RecordMapping
        The mapping; a mistake raises :class:`MappingError` naming the key.
    """
    if not isinstance(table, dict):
        raise MappingError(f"mapping: must be a table, got {table!r}")
    unknown = sorted(set(table) - {*ROLES, "features", "strict"})
    if unknown:
        raise MappingError(f"mapping: unknown key(s) {unknown}; allowed: {sorted({*ROLES, 'features', 'strict'})}")
    for role in ("id", "s", "u", "features"):
        if role not in table:
            raise MappingError(f"mapping.{role}: is required (a field path or a table {{path, ...}})")
    strict = table.get("strict", False)
    if not isinstance(strict, bool):
        raise MappingError(f"mapping.strict: must be true or false, got {strict!r}")
    labels = {"s": tuple(groups), "u": tuple(strata)}
    roles = {role: _field(table[role], f"mapping.{role}", role, labels.get(role, ()))
             for role in ROLES if role in table}
    mapping = RecordMapping(features=_features(table["features"], tuple(features)), strict=strict, **roles)
    _check_paths(mapping)
    return mapping


def _features(table, features: tuple[str, ...]) -> tuple[tuple[str, MappedField], ...]:
    if not isinstance(table, dict):
        raise MappingError(f"mapping.features: must be a table of feature = path, got {table!r}")
    for name in table:
        if name not in features:
            raise MappingError(f"mapping.features.{name}: {name!r} is not in pipeline.features {list(features)}")
    for name in features:
        if name not in table:
            raise MappingError(f"mapping.features.{name}: feature {name!r} has no path (every pipeline feature needs "
                               "one)")
    return tuple((name, _field(table[name], f"mapping.features.{name}", "feature")) for name in features)


def _field(spec, key: str, role: str, labels: tuple = ()) -> MappedField:
    """One field spec (a path, or a table {path, format, values, default}) of ``role``, checked."""
    table = {"path": spec} if isinstance(spec, str) else spec
    if not isinstance(table, dict):
        raise MappingError(f"{key}: must be a field path or a table {{path, format, values, default}}, got {spec!r}")
    unknown = sorted(set(table) - set(SPEC_KEYS))
    if unknown:
        raise MappingError(f"{key}: unknown key(s) {unknown}; allowed: {list(SPEC_KEYS)}")
    if "path" not in table:
        raise MappingError(f"{key}.path: is required")
    try:
        path = parse_path(table["path"])
    except ValueError as exc:
        raise MappingError(f"{key}.path: {exc}") from None
    if not path and role != "id":
        raise MappingError(f"{key}.path: only mapping.id may be {KAFKA_KEY!r} (the Kafka key)")
    return MappedField(path=path, text=table["path"], format=_format(table, key, role),
                       values=_values(table, key, role, labels), **_default(table, key, role, labels))


def _format(table: dict, key: str, role: str) -> str | None:
    if role != "time":
        if "format" in table:
            raise MappingError(f"{key}.format: only mapping.time has a format")
        return None
    fmt = table.get("format", "epoch_s")
    if fmt not in TIME_FORMATS:
        raise MappingError(f"{key}.format: unknown time format {fmt!r}; known: {list(TIME_FORMATS)}")
    return fmt


def _values(table: dict, key: str, role: str, labels: tuple) -> tuple[tuple[str, Any], ...]:
    if "values" not in table:
        return ()
    if role not in ("s", "u"):
        raise MappingError(f"{key}.values: only mapping.s and mapping.u have a value map")
    values = table["values"]
    if not isinstance(values, dict) or not values:
        raise MappingError(f"{key}.values: must be a non-empty table of value = label, got {values!r}")
    for value, label in values.items():
        if isinstance(label, bool) or not isinstance(label, (int, str)) or (labels and label not in labels):
            kind = "pipeline.groups" if role == "s" else "pipeline.strata"
            raise MappingError(f"{key}.values.{value}: {label!r} is not a configured label of {kind} {list(labels)}")
    return tuple(values.items())


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _default(table: dict, key: str, role: str, labels: tuple) -> dict:
    if "default" not in table:
        return {}
    default = table["default"]
    if role == "id":
        raise MappingError(f"{key}.default: an id has no default (each record names its own)")
    problem = {  # TOML has nan and inf: a default is held to what a record's own value must be, a finite number
        "feature": _finite_number,
        "time": _finite_number if table.get("format") != "iso8601" else _is_iso8601,
        "y": lambda v: v in (0, 1) and not isinstance(v, float),
        "decision": lambda v: v in (0, 1) and not isinstance(v, float),
        "score": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1,
    }.get(role)
    if problem is not None and not problem(default):
        raise MappingError(f"{key}.default: {default!r} is not a valid {role} value")
    if role in ("s", "u") and labels and default not in labels and not any(default == v for v, _ in
                                                                            table.get("values", {}).items()):
        raise MappingError(f"{key}.default: {default!r} is not a configured label {list(labels)}")
    return {"default": default, "has_default": True}


def _is_iso8601(value) -> bool:
    """Whether ``value`` is ISO-8601 (RFC 3339) text as the codec reads a time (msgspec's rules)."""
    try:
        msgspec.json.decode(msgspec.json.encode(value), type=datetime)
    except (msgspec.ValidationError, TypeError):
        return False
    return isinstance(value, str)


def _check_paths(mapping: RecordMapping) -> None:
    """Refuse paths that cannot work together: a feature's path shared with another role (in place, its repaired
    value would overwrite that role's), or one path inside another (a value cannot also be an object)."""
    owners: dict[tuple[str, ...], str] = {}
    for key, mapped in mapping.fields():
        if not mapped.path:
            continue
        other = owners.get(mapped.path)
        if other is not None and (key.startswith("mapping.features.") or other.startswith("mapping.features.")):
            raise MappingError(f"{key}: path {mapped.text!r} is also {other}'s: a feature's path must be its own")
        owners.setdefault(mapped.path, key)
    for path, key in owners.items():
        for outer, outer_key in owners.items():
            if len(outer) < len(path) and path[:len(outer)] == outer:
                raise MappingError(f"{key}: path {path_text(path)!r} lies inside {outer_key}'s "
                                   f"{path_text(outer)!r}, which must then be an object, not a value")


def check_layout(mapping: RecordMapping, layout: OutputLayout) -> None:
    """Refuse an output field that overlaps a mapped path (fairstream would overwrite what it reads)."""
    field_path = layout.path
    for key, mapped in mapping.fields():
        path = mapped.path
        if path and (path[:len(field_path)] == field_path or field_path[:len(path)] == path):
            raise MappingError(f"output.field: {layout.field!r} overlaps {key} ({mapped.text!r}): fairstream writes "
                               "under output.field, so it must be a path of its own")


def mapping_table(mapping: RecordMapping) -> dict:
    """The ``[mapping]`` table that :func:`parse_mapping` reads back to ``mapping`` (for ``to_toml``)."""
    def spec(mapped: MappedField):
        table = {"path": mapped.text}
        if mapped.format is not None and mapped.format != "epoch_s":
            table["format"] = mapped.format
        if mapped.values:
            table["values"] = dict(mapped.values)
        if mapped.has_default:
            table["default"] = mapped.default
        return table["path"] if len(table) == 1 else table

    table = {role: spec(getattr(mapping, role)) for role in ROLES if getattr(mapping, role) is not None}
    return {**table, "strict": mapping.strict, "features": {name: spec(mapped) for name, mapped in mapping.features}}


_SPEC = "a field path or a table {path, default}"
REFERENCE = [
    ("mapping", "id", "string or table", "required", f"a field path, or \"{KAFKA_KEY}\": the Kafka key (UTF-8)",
     "where the record's id is: a dotted path (applicant.id) or a JSON Pointer (/applicant/id), or the Kafka key; "
     "without a [mapping] table records are the fairstream envelope {id, features, s, u, ts, y}"),
    ("mapping", "time", "string or table", "none (arrival time)",
     f"{_SPEC}; format: {', '.join(map(repr, TIME_FORMATS))} (default 'epoch_s'; ISO-8601 with an offset, naive: UTC)",
     "the event time; a record without it is filed at its arrival"),
    ("mapping", "s", "string or table", "required", f"{_SPEC}; values: a table of value = configured group",
     "the group: a string, integer or boolean, mapped by values (keys: the value's JSON text, e.g. F, 1, true)"),
    ("mapping", "u", "string or table", "required", f"{_SPEC}; values: a table of value = configured stratum",
     "the stratum, read like s"),
    ("mapping", "y", "string or table", "none", f"{_SPEC}; 0/1 or true/false",
     "the label; a record without it is unlabelled"),
    ("mapping", "score", "string or table", "none", f"{_SPEC}; a number in [0, 1]",
     "an existing score the record carries (monitor-only pipelines read it)"),
    ("mapping", "decision", "string or table", "none", f"{_SPEC}; 0/1 or true/false",
     "an existing decision the record carries (monitor-only pipelines read it)"),
    ("mapping", "strict", "boolean", "false", "true or false",
     "true: a record with a field the mapping does not name is dead-lettered (the reason lists the paths); "
     "false: such fields pass through to the output"),
    ("mapping", "features", "table", "required", "keys: every name of pipeline.features, each a path to a number",
     "where each feature is; a mapped field a record lacks, or of the wrong type, dead-letters it with the path"),
    ("output", "repaired", "string", '"in_place"', "'in_place' or 'under'",
     "mapped records: \"in_place\" writes the repaired values at their paths and keeps the originals under "
     "<field>.original; \"under\" leaves the record untouched and writes them under <field>.features"),
    ("output", "field", "string", '"fairstream"', "a field path that no mapped path lies in or contains",
     "the one field under which fairstream writes what it adds: score, decision, input_digest, s_imputed, "
     "original or features, provenance"),
    ("output", "provenance", "string", '"field"', "'field' or 'headers'",
     "provenance (artifact kinds, versions, sha256, seeds) at <field>.provenance, or as the Kafka header "
     "fairstream.provenance (JSON)"),
]
"""(section, key, type, default, valid values, meaning) of the ``[mapping]`` and ``[output]`` keys."""
