"""A team's own records (a pipeline with a ``[mapping]``): decoded by field paths, passed through with what fairstream adds.

Decoding is one C call per message: a typed msgspec decoder generated from the mapping (nested structs for nested
paths, unknown fields skipped unless ``strict``, ``datetime`` for ISO-8601 times, floats for features) and one
``attrgetter`` that reads every role of the decoded struct. A message the typed decoder refuses takes the
reference path, which decodes it to a dict and words the reason with the path (``missing field applicant.sex
(mapping.s)``); no message makes a batch raise. Encoding keeps every field the input had: ``under`` splices the
added field into the input's bytes (the original text untouched), ``in_place`` decodes the record once, writes
the repaired values at their paths and encodes it once (both in C). :meth:`MappedRecords.decode_objects` and
:meth:`MappedRecords.repaired_objects` do the same for records another format already deserialized (Avro).

>>> from fairstream.streams.config import PipelineConfig
>>> config = PipelineConfig.from_dict({"pipeline": {"name": "loans", "features": ["age"], "groups": ["female", "male"],
...     "strata": ["north"]}, "mapping": {"id": "$key", "s": {"path": "sex", "values": {"F": "female"}},
...     "u": {"path": "branch", "default": "north"}, "features": {"age": "applicant.age"}},
...     "output": {"repaired": "under"}})
>>> codec = MappedRecords(config)
>>> decoded = codec.decode([b'{"applicant": {"age": 37}, "sex": "F", "channel": "web"}', b'{"sex": "F"}'], [b"A-1", b"A-2"])
>>> decoded.X.tolist(), decoded.fields.ids, decoded.errors
([[37.0]], ['A-1'], [(1, 'missing field applicant.age (mapping.features.age)')])
>>> outputs, refused = codec.encode(decoded, [0], decoded.X + 1.5, {"version": 1})
>>> outputs[0][:72]
b'{"applicant": {"age": 37}, "sex": "F", "channel": "web","fairstream":{"f'
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import operator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Sequence, Union

import msgspec
import numpy as np

from fairstream.streams.config import PipelineConfig
from fairstream.streams.mapping import (
    MISSING,
    SPARSE_ROLES,
    MappedField,
    RecordMapping,
    get_path,
    path_text,
    set_path,
    walk_paths,
)

from .json_text import describe
from .records import (
    DIGEST_HEX,
    INT64_RANGE,
    MAX_ID_CHARS,
    DecodedRecords,
    Invalid,
    RecordFields,
    decode_each_message,
    input_digest,
    labels_array,
    parse_json_object,
    range_errors,
    record_key,
)
from .repaired import float_tokens, json_tokens, template_literal

PROVENANCE_HEADER = "fairstream.provenance"
"""The Kafka header that carries the provenance (JSON) when ``output.provenance = "headers"``."""
_ROLES = ("id", "time", "s", "u", "y", "score", "decision")  # a row's order: these, then the features


@dataclass(frozen=True)
class _Role:
    """One value a row holds: its config key and field."""

    key: str  # mapping.s, mapping.features.age
    name: str  # s, age
    field: MappedField
    feature: bool = False
    sparse: bool = False  # a record may lack it without a default (None then)


def _roles(mapping: RecordMapping, imputes_s: bool) -> list[_Role]:
    """The mapped roles in row order (absent optional roles left out; their column is None)."""
    sparse = {*SPARSE_ROLES, *(("s",) if imputes_s else ())}  # a missing s is imputed where the pipeline says so
    roles = [_Role(f"mapping.{name}", name, getattr(mapping, name), sparse=name in sparse) for name in _ROLES
             if getattr(mapping, name) is not None]
    return roles + [_Role(f"mapping.features.{name}", name, field, True) for name, field in mapping.features]


def _shown(value) -> str:
    """A value of the wrong type as a reason shows it: JSON text for a scalar, containers by kind."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)[:200]
    return describe(value)


# --------------------------------------------------------------------------- the typed decoder

_SMALL_INT = Annotated[int, msgspec.Meta(ge=INT64_RANGE[0], le=INT64_RANGE[1])]
_TEXT_ID = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
_SCORE = Annotated[float, msgspec.Meta(ge=0, le=1)]
def _missing(obj: dict, role: _Role) -> str:
    """Why ``role``'s path leads nowhere in ``obj``: a key is absent, or a value on the way is no object."""
    path = role.field.path
    for depth in range(1, len(path)):
        value = get_path(obj, path[:depth])
        if value is not MISSING and not isinstance(value, dict):
            return (f"mapping: {role.field.text}: {path_text(path[:depth])} holds {_shown(value)}, not an object "
                    f"({role.key})")
    return f"missing field {role.field.text} ({role.key})"


_ISO = msgspec.json.Decoder(datetime)  # the reference reads a time as the typed decoder does (RFC 3339)


def _typed(role: _Role, config: PipelineConfig):
    """The msgspec type of a role's value: the rules the reference path states in Python, stated as a schema."""
    name, field = ("feature" if role.feature else role.name), role.field
    if name == "id":
        return Union[_SMALL_INT, _TEXT_ID]
    if name == "time":
        return datetime if field.format == "iso8601" else float
    if name in ("s", "u"):
        labels = config.groups if name == "s" else config.strata
        return Union[bool, int, str] if field.values else Literal[tuple(labels)]
    if name in ("y", "decision"):
        return Union[bool, Literal[0, 1]]
    return _SCORE if name == "score" else float


def _default(role: _Role):
    """The value a record lacking the role's field takes (as the typed decoder would read it), else NODEFAULT."""
    if role.field.has_default:
        if role.name == "time" and role.field.format == "iso8601":
            return _ISO.decode(msgspec.json.encode(role.field.default))  # checked at config load: a str
        return role.field.default
    return None if role.sparse else msgspec.NODEFAULT


class _TypedRecords:
    """A msgspec struct per object of the mapping's paths, and the attrgetter that reads a row out of one."""

    def __init__(self, config: PipelineConfig, roles: list[_Role]):
        tree: dict = {}
        roles = [role for role in roles if not role.field.is_key]  # the Kafka key is read column-wise
        for position, role in enumerate(roles):
            node = tree
            for key in role.field.path[:-1]:
                node = node.setdefault(key, {})
            node[role.field.path[-1]] = position
        self._counter, attributes = 0, [None] * len(roles)
        strict = config.mapping.strict
        try:
            self.struct = self._struct(tree, (), roles, config, strict, attributes)
            self.decoder = msgspec.json.Decoder(self.struct)
        except (TypeError, ValueError):  # names or labels msgspec cannot state: the reference path reads every record
            self.decoder = None
        self.row = operator.attrgetter(*attributes) if self.decoder is not None and len(attributes) > 1 else None

    def _struct(self, tree: dict, prefix: tuple, roles, config, strict: bool, attributes: list):
        columns, rename = [], {}
        for key, node in tree.items():
            self._counter += 1
            attr = f"f{self._counter}"
            rename[attr] = key
            path = (*prefix, attr)
            if isinstance(node, dict):
                inner = self._struct(node, path, roles, config, strict, attributes)
                optional = all(f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT
                               for f in msgspec.structs.fields(inner))
                columns.append((attr, inner, msgspec.field(default_factory=inner)) if optional else (attr, inner))
            else:
                role = roles[node]
                attributes[node] = ".".join(path)
                kind, default = _typed(role, config), _default(role)
                if default is msgspec.NODEFAULT:
                    columns.append((attr, kind))
                else:
                    columns.append((attr, Union[kind, None] if default is None else kind, default))
        return msgspec.defstruct("Mapped", columns, rename=rename, forbid_unknown_fields=strict, gc=False,
                                 kw_only=True)  # required fields may follow optional ones

    def rows(self, values: Sequence[bytes]) -> list[tuple] | None:
        """Every value's row, or None when some value must take the reference path."""
        if self.decoder is None or not values:
            return None
        try:
            return list(map(self.row, map(self.decoder.decode, values)))
        except Exception:  # DecodeError, ValidationError, bad UTF-8, RecursionError, None: message by message then
            return None

    def row_of(self, value: bytes | None) -> tuple | None:
        """One value's row, or None when the reference path must decide (and explain)."""
        if self.decoder is None or not value:
            return None
        try:
            return self.row(self.decoder.decode(value))
        except Exception:  # nothing is dropped: the reference path re-reads the value and words its reason
            return None


# --------------------------------------------------------------------------- the reference path


class _ReferenceRows:
    """Reads a row out of a parsed record in Python, with a reason naming the path for whatever it refuses."""

    def __init__(self, config: PipelineConfig, roles: list[_Role]):
        self.config, self.roles = config, roles
        self.labels = {"s": frozenset(config.groups), "u": frozenset(config.strata)}
        self.named = [role.field.path for role in roles if role.field.path]
        self.read = [role for role in roles if not role.field.is_key]  # the Kafka key is read column-wise

    def row(self, obj: dict) -> tuple:
        """The row of ``obj`` (the roles read from the record); raises :class:`Invalid` with the reason."""
        row = tuple(self._value(role, obj) for role in self.read)
        if self.config.mapping.strict:
            self._check_known(obj)
        return row

    def _value(self, role: _Role, obj: dict):
        field = role.field
        value = get_path(obj, field.path)
        if value is MISSING:
            if field.has_default or role.sparse:
                return _default(role)
            raise Invalid(_missing(obj, role))
        if value is None and role.sparse and not field.has_default:
            return None
        return self._checked(role, value)

    def _checked(self, role: _Role, value):
        where, name = f"mapping: {role.field.text}", "feature" if role.feature else role.name
        if name == "time" and isinstance(value, datetime):  # Avro's timestamp logical types arrive as datetimes
            return value
        if name == "feature" or (name == "time" and role.field.format != "iso8601"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise Invalid(f"{where}: expected a number, found {_shown(value)}")
            try:
                number = float(value)
            except OverflowError:
                raise Invalid(f"{where}: expected a number, found one beyond the float range") from None
            if not math.isfinite(number):
                raise Invalid(f"{where}: expected a finite number, found {_shown(value)}")
            return number
        if name == "time":
            try:
                return _ISO.decode(msgspec.json.encode(value))
            except (msgspec.ValidationError, TypeError):
                raise Invalid(f"{where}: expected an ISO-8601 time, found {_shown(value)}") from None
        if name == "id":
            try:
                record_key({"id": value})
            except Invalid as exc:
                raise Invalid(f"{where}: {exc}") from None
            if isinstance(value, int) and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
                return str(value)  # the id's text: a key beyond 64 bits reads back the same
            return value
        if name in ("s", "u"):
            return self._label(role, value, where)
        if name in ("y", "decision"):
            if value not in (0, 1) or isinstance(value, float):
                raise Invalid(f"{where}: expected 0, 1, true or false, found {_shown(value)}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:  # score
            raise Invalid(f"{where}: expected a number in [0, 1], found {_shown(value)}")
        return float(value)

    def _label(self, role: _Role, value, where: str):
        if isinstance(value, (bool, int, str)):
            label = role.field.label(value)
            if not isinstance(label, bool) and label in self.labels[role.name]:
                return value
        kind = "group" if role.name == "s" else "stratum"
        labels = self.config.groups if role.name == "s" else self.config.strata
        mapped = f" (value map: {dict(role.field.values)})" if role.field.values else ""
        raise Invalid(f"{where}: {_shown(value)} is not a configured {kind} {list(labels)}{mapped}")

    def _check_known(self, obj: dict) -> None:
        """Strict: refuse fields the mapping does not name, listing their paths."""
        unknown = [path_text(path) for path in walk_paths(obj)
                   if not any(path[:len(named)] == named or named[:len(path)] == path for named in self.named)]
        if unknown:
            shown = unknown[:20] + (["..."] if len(unknown) > 20 else [])
            raise Invalid(f"unexpected field(s) {shown} (mapping.strict)")


# --------------------------------------------------------------------------- the codec


class MappedRecords:
    """The codec of a pipeline with a ``[mapping]``: decode by field paths, encode with everything passed through.

    Parameters
    ----------
    config : PipelineConfig
        A pipeline whose ``mapping`` is set; ``output`` says where the added fields go.
    """

    _cache: dict = {}

    def __init__(self, config: PipelineConfig):
        if config.mapping is None:
            raise ValueError("MappedRecords needs a pipeline with a [mapping] table")
        self.config, self.mapping, self.layout = config, config.mapping, config.output
        self.roles = _roles(config.mapping, config.imputes_s)
        self.key_role = next((i for i, role in enumerate(self.roles) if role.field.is_key), None)
        self.positions = {role.key: i for i, role in enumerate(self.roles)}
        self.typed = _TypedRecords(config, self.roles)
        self.reference = _ReferenceRows(config, self.roles)
        self.field_path = self.layout.path
        # The splice writes the field as the input's last key: only a top-level field absent from the input.
        self._splice_key = json.dumps(self.field_path[0]).encode() if len(self.field_path) == 1 else None
        self._features = [self.positions[f"mapping.features.{name}"] for name in config.features]
        # The value maps keyed by the values themselves: "1" also by 1 (booleans go through MappedField.label).
        self._lookups = {name: {**{int(k): v for k, v in getattr(self.mapping, name).values if _is_int_text(k)},
                                **dict(getattr(self.mapping, name).values)} for name in ("s", "u")}

    @classmethod
    def for_config(cls, config: PipelineConfig) -> "MappedRecords":
        """The codec of ``config`` (built once per distinct pipeline)."""
        if config not in cls._cache:
            cls._cache[config] = cls(config)
        return cls._cache[config]

    # ------------------------------------------------------------------ decoding

    def decode(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> DecodedRecords:
        """Decode a batch of JSON messages (and their Kafka keys) into arrays, and a reason for every unusable one.

        Parameters
        ----------
        values : sequence of bytes or None
            The messages' values.
        keys : sequence of bytes or None
            The messages' Kafka keys (the id, when ``mapping.id = "$key"``).

        Returns
        -------
        DecodedRecords
            The usable records (``originals``: their bytes) and ``errors``: (position, reason naming the path).
        """
        limit = self.config.max_message_bytes
        rows = self.typed.rows(values) if _all_within(values, limit) and all(map(_utf8, values)) else None
        if rows is not None:
            positions, errors = list(range(len(values))), []
        else:
            def decode(value):
                # The typed decoder skips unmapped fields unread: a value it accepts must still be UTF-8 JSON.
                row = self.typed.row_of(value) if value is not None and len(value) <= limit and _utf8(value) else None
                return row if row is not None else self.reference.row(parse_json_object(value, limit, constants=False))

            positions, rows, errors = decode_each_message(values, decode, "records")
        usable = values if len(positions) == len(values) else [values[i] for i in positions]
        sha256 = hashlib.sha256
        return self._decoded(positions, rows, errors, usable, keys,
                             [sha256(value).hexdigest()[:DIGEST_HEX] for value in usable])  # input_digest, inlined

    def decode_objects(self, objects: Sequence[dict], keys: Sequence[bytes | None],
                       values: Sequence[bytes] | None = None) -> DecodedRecords:
        """Decode records another format already deserialized (Avro) through the reference path.

        Parameters
        ----------
        objects : sequence of dict or Exception
            The records; an exception in place of one is why its message could not be deserialized (its reason).
        keys : sequence of bytes or None
            Their Kafka keys.
        values : sequence of bytes, optional
            The messages they came from (for ``input_digest``).

        Returns
        -------
        DecodedRecords
            As :meth:`decode`; ``originals`` are the objects.
        """
        def decode(obj):
            if isinstance(obj, Exception):
                raise Invalid(str(obj))
            if not isinstance(obj, dict):
                raise Invalid(f"a record must be an object, got {type(obj).__name__}")
            return self.reference.row(obj)

        positions, rows, errors = decode_each_message(objects, decode, "records")
        digests = [input_digest(values[i]) for i in positions] if values is not None else None
        return self._decoded(positions, rows, errors, [objects[i] for i in positions], keys, digests)

    def _decoded(self, positions: list, rows: list, errors: list, originals: list, keys, digests) -> DecodedRecords:
        """The rows as columns, checked column-wise (ids, labels); a row a check refuses is worded by the reference."""
        columns = [list(column) for column in zip(*rows)] if rows else [[] for _ in self.reference.read]
        if self.key_role is not None:  # its column is read from the keys
            columns.insert(self.key_role, [None] * len(rows))
        labels = {name: self._labels(columns, name) for name in ("s", "u")}
        refused = self._column_problems(columns, [keys[i] for i in positions], labels)
        if refused:
            keep = [j for j in range(len(rows)) if j not in refused]
            errors = errors + [(positions[j], reason) for j, reason in refused.items()]
            positions, originals = [positions[j] for j in keep], [originals[j] for j in keep]
            digests = None if digests is None else [digests[j] for j in keep]
            columns = [[column[j] for j in keep] for column in columns]
            labels = {name: [column[j] for j in keep] for name, column in labels.items()}
        X = np.array([columns[p] for p in self._features], dtype=np.float64).T.reshape(len(positions),
                                                                                     len(self._features))
        index = np.array(positions, dtype=np.intp)
        fields = RecordFields(self._column(columns, "id"), self._times(columns), labels["s"], labels["u"],
                              self._binary(columns, "y"), digests)
        outside = range_errors(X, self.config)
        if outside:
            keep = np.ones(len(index), dtype=bool)
            keep[[row for row, _ in outside]] = False
            errors = errors + [(int(index[row]), reason) for row, reason in outside]
            kept = np.flatnonzero(keep)
            index, X, fields = index[keep], X[keep], fields.take(kept)
            originals = [originals[j] for j in kept.tolist()]
            columns = [[column[j] for j in kept.tolist()] for column in columns]
        score, decision = self._column(columns, "score"), self._binary(columns, "decision")
        return DecodedRecords(
            index=index, fields=fields, keys=np.array(fields.ids, dtype=str) if len(index) else np.array([], dtype=str),
            X=X, s=labels_array(fields.s), u=labels_array(fields.u), errors=sorted(errors),
            impute_s=self.config.imputes_s, columns=tuple(self.config.features), originals=originals,
            score=None if score is None else np.array(score, dtype=np.float64),
            decision=None if decision is None else np.array(decision, dtype=np.int64))

    def _column_problems(self, columns: list, keys: list, mapped: dict) -> dict[int, str]:
        """(row -> reason) of rows the column checks refuse: an id from the key, a NUL in an id, a mapped label."""
        refused: dict[int, str] = {}
        ids = columns[self.positions["mapping.id"]]
        if self.mapping.id.is_key:
            ids[:] = [_key_id(key, refused, j) for j, key in enumerate(keys)]
        elif any(isinstance(rid, str) and "\x00" in rid for rid in ids):
            refused.update({j: "mapping: " + self.mapping.id.text + ": id must not contain NUL characters"
                            for j, rid in enumerate(ids) if isinstance(rid, str) and "\x00" in rid})
        for name in ("s", "u"):
            role = self.roles[self.positions[f"mapping.{name}"]]
            if role.field.values:  # the typed decoder took any string, integer or boolean: the map decides
                column, labels = columns[self.positions[f"mapping.{name}"]], self.reference.labels[name]
                bad = [j for j, label in enumerate(mapped[name])
                       if label.__class__ is bool or (label not in labels and label is not None)]
                for j in bad:
                    try:
                        self.reference._label(role, column[j], f"mapping: {role.field.text}")
                    except Invalid as exc:
                        refused.setdefault(j, str(exc))
        return refused

    def _column(self, columns: list, name: str) -> list | None:
        position = self.positions.get(f"mapping.{name}")
        return None if position is None else columns[position]

    def _labels(self, columns: list, name: str) -> list:
        """The configured labels of the s or u column (through the value map: strings and integers by one lookup)."""
        field = getattr(self.mapping, name)
        column = columns[self.positions[f"mapping.{name}"]]
        if not field.values:
            return column
        lookup, label = self._lookups[name], field.label
        return [lookup.get(value, value) if value.__class__ is not bool else label(value) for value in column]

    def _binary(self, columns: list, name: str) -> list | None:
        """A 0/1 column (y, decision) as integers (true/false read as 1/0); None when the role is not mapped."""
        column = self._column(columns, name)
        if column is None:
            return None if name != "y" else [None] * len(columns[0])
        return [None if value is None else int(value) for value in column]

    def _times(self, columns: list) -> list:
        """Event times in seconds since the epoch (None where a record has none)."""
        column = self._column(columns, "time")
        if column is None:
            return [None] * len(columns[0])
        scale = 1000.0 if self.mapping.time.format == "epoch_ms" else 1.0
        return [None if t is None else _epoch(t) if isinstance(t, datetime) else t / scale for t in column]

    # ------------------------------------------------------------------ encoding

    def encode(self, decoded: DecodedRecords, rows: Sequence[int], repaired: np.ndarray, prov: dict,
               imputed: np.ndarray | None = None, added: dict | None = None) -> tuple[list[bytes], list[tuple]]:
        """JSON outputs of the decoded records at ``rows``: each input with every field it had, plus what fairstream adds.

        Parameters
        ----------
        decoded : DecodedRecords
            What :meth:`decode` returned.
        rows : sequence of int
            Positions in ``decoded`` of the records to write.
        repaired : ndarray of shape (len(rows), n_features)
            Their repaired features (finite).
        prov : dict
            The provenance (written at ``<field>.provenance`` unless it goes in headers).
        imputed : ndarray of bool, optional
            Which records' s was imputed (``<field>.s_imputed``, on pipelines that impute).
        added : dict of str to ndarray, optional
            The columns the chain adds (score, decision), for the records at ``rows``.

        Returns
        -------
        outputs : list of bytes
            One output per row that could be written.
        refused : list of (int, str)
            (position in ``rows``, reason) of a row that could not (a pass-through value JSON cannot carry).
        """
        rows = list(rows)
        originals = [decoded.originals[j] for j in rows]
        if self.layout.repaired == "under" and self._splice_key is not None:
            tails = self._tails(decoded, rows, repaired, prov, imputed, added)
            outputs, refused = [], []
            for k, (original, tail) in enumerate(zip(originals, tails)):
                spliced = _splice(original, self._splice_key, tail) if isinstance(original, bytes) else None
                if spliced is None:  # the input holds the field already (or is an object): the dict path decides
                    spliced = self._encoded(k, original, decoded, rows, repaired, prov, imputed, added, refused)
                if spliced is not None:
                    outputs.append(spliced)
            return outputs, refused
        outputs, refused = [], []
        for k, original in enumerate(originals):
            value = self._encoded(k, original, decoded, rows, repaired, prov, imputed, added, refused)
            if value is not None:
                outputs.append(value)
        return outputs, refused

    def repaired_objects(self, decoded: DecodedRecords, rows: Sequence[int], repaired: np.ndarray, prov: dict,
                         imputed: np.ndarray | None = None,
                         added: dict | None = None) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
        """The outputs of :meth:`encode` as objects (what another format, Avro, serializes); the inputs are not changed.

        Parameters are those of :meth:`encode`.

        Returns
        -------
        objects : list of (int, dict)
            (position in ``rows``, output object) of every row that could be written, in order.
        refused : list of (int, str)
            (position in ``rows``, reason) of a row that could not (e.g. its output field would sit under a value
            that is not an object): that record alone is dead-lettered, as :meth:`encode` does.
        """
        rows, objects, refused = list(rows), [], []
        for k, j in enumerate(rows):
            try:
                objects.append((k, self._object(k, decoded.originals[j], decoded, rows, repaired, prov, imputed,
                                                added)))
            except ValueError as exc:  # a path through a non-object: this record's reason, never the batch's
                refused.append((k, f"the output could not be written: {exc}"))
        return objects, refused

    def headers(self, prov: dict) -> list[tuple[str, bytes]]:
        """The Kafka headers every output adds: the provenance when ``output.provenance = "headers"``, else none."""
        if self.layout.provenance != "headers":
            return []
        return [(PROVENANCE_HEADER, json.dumps(prov, separators=(",", ":")).encode())]

    def _encoded(self, k, original, decoded, rows, repaired, prov, imputed, added, refused) -> bytes | None:
        try:
            return _JSON.encode(self._object(k, original, decoded, rows, repaired, prov, imputed, added))
        except Exception as exc:  # a pass-through value JSON cannot carry (1e400), a path through a non-object
            refused.append((k, f"the output could not be written: {type(exc).__name__}: {str(exc)[:200]}"))
            return None

    def _object(self, k: int, original, decoded, rows, repaired, prov, imputed, added) -> dict:
        """The output of row ``k`` as an object."""
        record = _decoded_object(original)
        j = rows[k]
        features = [(name, self.mapping.feature(name).path) for name in self.config.features]
        added_field: dict[str, Any] = {}
        if self.layout.repaired == "in_place":
            originals = {}
            for (name, path), value in zip(features, repaired[k].tolist()):
                before = get_path(record, path)
                originals[name] = decoded.X[j, self.config.features.index(name)].item() if before is MISSING \
                    else before
                set_path(record, path, value)
            added_field["original"] = originals
        else:
            added_field["features"] = dict(zip(self.config.features, repaired[k].tolist()))
        for name, column in (added or {}).items():
            added_field[name] = np.asarray(column)[k].item()
        if self.config.imputes_s:
            added_field["s_imputed"] = bool(imputed[k]) if imputed is not None else False
        added_field["input_digest"] = decoded.fields.digests[j]
        if self.layout.provenance == "field":
            added_field["provenance"] = prov
        set_path(record, self.field_path, added_field)
        return record

    def _tails(self, decoded, rows, repaired, prov, imputed, added) -> list[bytes]:
        """The added field's JSON text of every row (under), one template filled column by column."""
        n, d = len(rows), len(self.config.features)
        tokens = float_tokens(repaired)
        columns = [tokens[f::d] for f in range(d)]
        names = ",".join(f"{template_literal(json.dumps(name))}:%s" for name in self.config.features)
        template = '{"features":{' + names + "}"
        for name, column in (added or {}).items():
            column = np.asarray(column)
            template += f",{template_literal(json.dumps(name))}:%s"
            columns.append(float_tokens(column) if column.dtype.kind == "f" else json_tokens(column.tolist()))
        if self.config.imputes_s:
            template += ',"s_imputed":%s'
            flags = imputed.tolist() if imputed is not None else [False] * n
            columns.append([b"true" if flag else b"false" for flag in flags])
        template += ',"input_digest":%s'
        columns.append(json_tokens([decoded.fields.digests[j] for j in rows]))
        if self.layout.provenance == "field":
            template += ',"provenance":' + template_literal(json.dumps(prov, separators=(",", ":")))
        template = (template + "}").encode()
        return [template % row for row in zip(*columns)]


_JSON = msgspec.json.Encoder()
_NOT_A_VALUE = frozenset((b"{", b" ", b"\t", b"\n", b"\r", b""))  # what may precede the closing brace of a record


def _is_int_text(text: str) -> bool:
    """Whether ``text`` is how JSON writes an integer (a value map's key then also names that integer)."""
    try:
        return str(int(text)) == text
    except ValueError:
        return False


def _all_within(values: Sequence, limit: int) -> bool:
    """Whether every value is bytes of at most ``limit`` (else the batch goes message by message)."""
    try:
        return bool(values) and max(map(len, values)) <= limit
    except TypeError:  # a None value
        return False


def _utf8(value: bytes) -> bool:
    """Whether ``value`` is UTF-8 text (ASCII, the common case, is checked in one C pass)."""
    if value.isascii():
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400: a valid JSON number no float holds, so no output could carry it
        raise ValueError(f"the pass-through number {text[:40]} is beyond the float range: it cannot be written in "
                         "place (output.repaired = \"under\" keeps it as it came)")
    return number


def _splice(original: bytes, key: bytes, tail: bytes) -> bytes | None:
    """``original`` with ``"key":tail`` as its last member, its own text untouched; None when it may hold ``key``."""
    if key in original:  # perhaps the field itself (or only text that holds it): the dict path decides
        return None
    if original[-1:] == b"}" and original[-2:-1] not in _NOT_A_VALUE:  # the common case: one copy of the bytes
        return b"".join((memoryview(original)[:-1], b",", key, b":", tail, b"}"))
    body = original.rstrip()
    inner = body[:-1].rstrip()
    return inner + (b"," if not inner.endswith(b"{") else b"") + key + b":" + tail + b"}"


def _decoded_object(original) -> dict:
    """A copy of the input as an object that the output may change (bytes decoded once, in C)."""
    if isinstance(original, dict):
        return copy.deepcopy(original)
    try:
        return msgspec.json.decode(original)
    except msgspec.DecodeError:  # a number msgspec will not read (1e400): the reference parser decides
        return json.loads(original, parse_float=_finite_float)


def _epoch(moment: datetime) -> float:
    """Seconds since the epoch of an ISO-8601 time (naive: UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _key_id(key: bytes | None, refused: dict, row: int):
    """The id a Kafka key holds (its UTF-8 text); a key that cannot be one refuses ``row`` with the reason."""
    where = 'mapping.id = "$key"'
    if key is None:
        refused[row] = f"missing Kafka key ({where})"
        return None
    try:
        return record_key({"id": key.decode("utf-8")})
    except UnicodeDecodeError:
        refused[row] = f"the Kafka key is not UTF-8 text ({where})"
    except Invalid as exc:
        refused[row] = f"the Kafka key: {exc} ({where})"
    return None
