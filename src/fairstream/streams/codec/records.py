"""Input records (``records.in``): a batch of raw Kafka values becomes arrays, and each unusable value a reason.

Wire format: one UTF-8 JSON object per message, the fields of :class:`~fairstream.streams.schemas.InputRecord`
(``id``, ``features``, ``s``, ``u``, optional ``ts`` and ``y``). A batch becomes numpy arrays plus a list of
(position, reason) for every value that cannot be used; the agent repairs the arrays in one vectorised call
and dead-letters the rest (:mod:`~fairstream.streams.codec.dead_letters`). Parsing JSON is one C call per
message (a typed msgspec decoder whose schema states the rules), with no Python per field; everything after
it (range, finiteness, repair) is on arrays. No single message can make a batch's decoding raise (whatever a
decoder raises on it, it is refused with a reason). The rules of an id, a number and a label live here and
are shared by the readers of the other messages; the repaired records are written by
:mod:`~fairstream.streams.codec.repaired`.

>>> from fairstream.streams.config import adult_config
>>> batch = decode_records([b'{"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}',
...                         b'{"id": 2, "features": {"age": "old"}, "s": 0, "u": 1}'], adult_config())
>>> batch.X.tolist(), batch.errors
([[30.0, 40.0]], [(1, "missing feature(s) ['hours-per-week']")])
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Annotated, Literal, Sequence, Union

import msgspec
import numpy as np
from msgspec.structs import astuple

from fairstream.repair.protocol import Batch
from fairstream.streams.config import PipelineConfig, is_unicode
from fairstream.streams.schemas import InputRecord

log = logging.getLogger(__name__)

_INPUT_REQUIRED = frozenset(InputRecord.required_fields())
_INPUT_ALLOWED = frozenset(InputRecord.field_names())


class Invalid(ValueError):
    """A record that cannot be repaired; the message is the dead-letter reason."""


@dataclass
class RecordFields:
    """The scalar fields of decoded records, column by column, as they arrived (re-encoded unchanged).

    ``digests`` holds each record's :func:`input_digest` (None for records built without their bytes).
    """

    ids: list
    ts: list
    s: list
    u: list
    y: list
    digests: list | None = None

    def __post_init__(self) -> None:
        if self.digests is None:
            self.digests = [None] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows) -> "RecordFields":
        """The fields of the records at ``rows`` (positions)."""
        rows = rows.tolist() if isinstance(rows, np.ndarray) else rows  # Python ints index lists fastest
        columns = (self.ids, self.ts, self.s, self.u, self.y, self.digests)
        return RecordFields(*([column[i] for i in rows] for column in columns))

    @classmethod
    def of(cls, records: Sequence[dict], values: Sequence[bytes] | None = None) -> "RecordFields":
        """From parsed JSON records (``id``, ``ts``, ``s``, ``u``, ``y``) and, if given, the bytes they came from."""
        return cls([r["id"] for r in records], [r.get("ts") for r in records], [r["s"] for r in records],
                   [r["u"] for r in records], [r.get("y") for r in records],
                   None if values is None else [input_digest(v) for v in values])


DIGEST_HEX = 32
"""Hex digits of :func:`input_digest` (128 bits: distinct inputs of one id never collide in practice)."""


def input_digest(value: bytes | None) -> str:
    """The digest every output carries of its input message: the first 128 bits of the value's sha256, in hex.

    Replays of a message (the same bytes) carry the same digest; two messages that share an id but
    differ in any byte carry different ones, so consumers can tell a replay from a conflict.
    """
    return hashlib.sha256(value or b"").hexdigest()[:DIGEST_HEX]


@dataclass
class DecodedRecords:
    """The usable records of a batch as arrays, and why the others are not usable."""

    index: np.ndarray  # positions (in the input batch) of the usable records
    fields: RecordFields  # their id, ts, s, u, y as they arrived, in the same order
    keys: np.ndarray  # record keys for the deterministic repair: str(id)
    X: np.ndarray  # (n, d) features in configured order
    s: np.ndarray
    u: np.ndarray
    errors: list[tuple[int, str]] = field(default_factory=list)

    impute_s: bool = False  # records without s were accepted, to be repaired under an imputed s
    columns: tuple[str, ...] | None = None  # the features, in the order of X's columns (reasons name them)
    # Mapped records only (codec/mapped.py): each usable record as it came (bytes, or the object another format
    # decoded), for the pass-through, and the score and decision the record carries when the mapping names them.
    originals: list | None = None
    score: np.ndarray | None = None
    decision: np.ndarray | None = None

    def batch(self) -> Batch:
        """The usable records as the modules' :class:`~fairstream.repair.protocol.Batch`."""
        y = self.fields.y
        labelled = bool(y) and None not in y
        return Batch(X=self.X, keys=self.keys, s=self.s, u=self.u, y=np.array(y, dtype=np.int64) if labelled else None,
                     impute_s=self.impute_s, columns=self.columns)


def parse_json_object(value: bytes | None, limit: int, constants: bool = True) -> dict:
    """The JSON object a message of at most ``limit`` bytes holds (the reference path of every input reader).

    ``constants=False`` also refuses ``NaN``, ``Infinity`` and ``-Infinity``, which Python's parser accepts
    but JSON has not: a reader that passes fields through unread must not pass them on. Raises
    :class:`Invalid`, whose message is the dead-letter reason, for anything else.
    """
    if not value:
        raise Invalid("empty message")
    if len(value) > limit:
        raise Invalid(f"message of {len(value)} bytes exceeds the limit of {limit} bytes")
    try:
        # Decode explicitly: json.loads(bytes) would also accept UTF-16/32 by guessing the encoding.
        obj = json.loads(value.decode("utf-8"), **({} if constants else {"parse_constant": _not_json}))
    except UnicodeDecodeError as exc:
        raise Invalid(f"message is not UTF-8: {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, the int digit limit, deep nesting
        raise Invalid(f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise Invalid(f"a record must be a JSON object, got {type(obj).__name__}")
    return obj


def check_fields(obj: dict, required: frozenset, allowed: frozenset) -> None:
    """Refuse (:class:`Invalid`) an object without every ``required`` field or with one not ``allowed``."""
    keys = obj.keys()
    if keys >= required and keys <= allowed:
        return
    missing = sorted(required - keys)
    if missing:
        raise Invalid(f"missing field(s) {missing}")
    raise Invalid(f"unexpected field(s) {sorted(keys - allowed)}")


def finite_number(value, what: str) -> float:
    """``value`` as a finite float; :class:`Invalid` names ``what`` when it is not a JSON number or not finite."""
    # bool is an int in Python but never a valid measurement.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{what} has a non-numeric value {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise Invalid(f"{what} has a value beyond the float range") from None
    if not math.isfinite(number):
        raise Invalid(f"{what} has a non-finite value {value!r}")
    return number


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value")


MAX_ID_CHARS = 1024
"""Characters of an id's text (its record key), at most. The keys of a batch are one fixed-width array that
the repair hashes character by character: one id of 500,000 characters would make a batch of 1,000 records
cost 6 GB and seconds, and its escaped text alone could exceed the output limit."""


def record_key(obj: dict) -> str:
    """The record key of ``obj``'s id (its text); :class:`Invalid` says why the id cannot be one."""
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise Invalid(f"id must be a non-empty string or an integer, got {rid!r}")
    text = str(rid)
    if len(text) > MAX_ID_CHARS:
        raise Invalid(f"id must be at most {MAX_ID_CHARS} characters long, got {len(text)}")
    if "\x00" in text:  # NUL would be lost in the fixed-width key arrays
        raise Invalid(f"id must not contain NUL characters, got {rid!r}")
    if not is_unicode(text):  # json.loads keeps "\ud800", whose key has no UTF-8 bytes
        raise Invalid(f"id must be Unicode text without lone surrogates, got {rid!r}")
    return text


def check_label(value, configured: frozenset, name: str, listed: tuple) -> None:
    """Refuse (:class:`Invalid`) a group (``name`` s) or stratum (u) label that is not among ``configured``."""
    # Only ints and strings are labels: 1.0 and True must not pass as group 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value not in configured:
        kind = "group" if name == "s" else "stratum"
        raise Invalid(f"{name} value {value!r} is not a configured {kind} {list(listed)}")


def _check_record(obj: dict, config: PipelineConfig, groups: frozenset, strata: frozenset) -> list[float]:
    imputes = config.imputes_s
    check_fields(obj, _INPUT_REQUIRED - {"s"} if imputes else _INPUT_REQUIRED, _INPUT_ALLOWED)
    record_key(obj)
    features = obj["features"]
    if not isinstance(features, dict):
        raise Invalid(f"features must be a JSON object, got {type(features).__name__}")
    if features.keys() != set(config.features):
        missing = sorted(set(config.features) - features.keys())
        raise Invalid(f"missing feature(s) {missing}" if missing else f"unexpected feature(s) {sorted(features.keys() - set(config.features))}")
    row = [finite_number(features[name], f"feature {name!r}") for name in config.features]
    if not (imputes and obj.get("s") is None):  # a missing s is imputed by the plan
        check_label(obj["s"], groups, "s", config.groups)
    check_label(obj["u"], strata, "u", config.strata)
    if obj.get("ts") is not None:
        finite_number(obj["ts"], "ts")
    y = obj.get("y")
    if y is not None and (isinstance(y, bool) or not isinstance(y, int) or y not in (0, 1)):
        raise Invalid(f"y must be 0 or 1, got {y!r}")
    return row


def decode_records(values: Sequence[bytes | None], config: PipelineConfig) -> DecodedRecords:
    """Parse and validate a batch of raw values from ``records.in``.

    The batch first goes whole through a typed decoder that validates while it parses (msgspec: the
    id, label, y and number rules are its schema), one C call per message and no Python per field;
    the features come out as rows, every other field as a column. Only a batch in which some value
    is refused goes message by message: a value the typed decoder does not accept takes the
    reference path, which accepts exactly the same records and words the dead-letter reason. The
    pipeline's valid ranges are then checked on the decoded features of both paths at once
    (:func:`range_errors`).

    No message can make the batch raise: one that makes a decoder raise anything (deep nesting makes
    msgspec raise ``RecursionError``) is refused with a reason naming the error.
    """
    fast = _FastRecords.for_config(config)
    records = fast.decode_all(values)
    columns = fast.columns(records) if records is not None else None
    if columns is not None:  # the common case: every value is a record the typed decoder accepts
        index, errors, usable = np.arange(len(values), dtype=np.intp), [], values
    else:
        positions, records, errors = _decode_each(values, fast, config)
        columns, usable = fast.columns(records, checked=True), [values[i] for i in positions]
        index = np.array(positions, dtype=np.intp)
    ids, ts, s_values, u_values, ys, X = columns
    fields = RecordFields(ids, ts, s_values, u_values, ys, _digests(usable))
    outside = range_errors(X, config)
    if outside:  # rare: only then are the columns copied
        keep = np.ones(len(index), dtype=bool)
        keep[[row for row, _ in outside]] = False
        errors = sorted(errors + [(int(index[row]), reason) for row, reason in outside])
        index, X, fields = index[keep], X[keep], fields.take(np.flatnonzero(keep))
    return DecodedRecords(
        index=index, fields=fields, keys=_record_keys(fields.ids),
        X=X, s=labels_array(fields.s), u=labels_array(fields.u), errors=errors, impute_s=config.imputes_s,
        columns=tuple(config.features),
    )


def _decode_each(values: Sequence[bytes | None], fast: "_FastRecords", config: PipelineConfig) -> tuple:
    """(positions, records, errors) of a batch decoded message by message: the typed decoder, else the reference."""
    groups, strata = frozenset(config.groups), frozenset(config.strata)

    def decode(value):
        record = fast.decode(value)
        if record is None:
            obj = parse_json_object(value, config.max_message_bytes)
            record = fast.record(obj, _check_record(obj, config, groups, strata))
        return record

    return decode_each_message(values, decode, "records")


def decode_each_message(values: Sequence[bytes | None], decode, agent: str) -> tuple[list[int], list, list]:
    """(positions, decoded, errors): ``decode`` of every value; what it refuses (:class:`Invalid`), or anything
    else one message makes it raise, is that message's reason, never the batch's error."""
    index, decoded, errors, unexpected = [], [], [], []
    for i, value in enumerate(values):
        try:
            result = decode(value)
        except Invalid as exc:
            errors.append((i, str(exc)))
            continue
        except Exception as exc:  # anything else one message makes a decoder raise: refused, not the batch
            errors.append((i, _unexpected(exc, unexpected)))
            continue
        index.append(i)
        decoded.append(result)
    _log_unexpected(unexpected, agent)
    return index, decoded, errors


def _digests(values: Sequence[bytes]) -> list[str]:
    """:func:`input_digest` of every (non-empty) value, without a Python call per value."""
    sha256 = hashlib.sha256
    return [sha256(value).hexdigest()[:DIGEST_HEX] for value in values]


def _record_keys(ids: list) -> np.ndarray:
    """The record keys of ``ids``: their text (numpy writes an integer as ``str`` does)."""
    return np.array(ids, dtype=str) if ids else np.array([], dtype=str)


def _unexpected(exc: Exception, seen: list) -> str:
    """The dead-letter reason of a message that made a decoder raise something other than :class:`Invalid`."""
    seen.append(exc)
    return f"the record could not be decoded ({type(exc).__name__}: {str(exc)[:200]})"


def _log_unexpected(seen: list, agent: str) -> None:
    # Once per batch: a flood of one poison message must not flood the log too.
    if seen:
        log.error("%d %s message(s) of a batch made the decoder raise (first: %s: %s); dead-lettered", len(seen),
                  agent, type(seen[0]).__name__, str(seen[0])[:200], exc_info=seen[0])


def range_errors(X: np.ndarray, config: PipelineConfig) -> list[tuple[int, str]]:
    """(row, reason) for every row of ``X`` with a feature outside the pipeline's valid range (``valid_ranges``).

    Impossible values (an age of 1e308) are refused here, whatever the plan does with values that
    are valid but outside its grid (it clamps or refuses those, and flags them out of range).
    """
    if not config.valid_ranges or not len(X):
        return []
    lo, hi = (np.array(bound, dtype=np.float64) for bound in config.range_bounds())
    outside = (X < lo) | (X > hi)
    if not outside.any():
        return []
    rows = np.flatnonzero(outside.any(axis=1))
    first = outside[rows].argmax(axis=1)
    names = config.features
    return [(int(i), f"feature {names[j]!r} value {X[i, j].item()!r} is outside its valid range "
                     f"[{_bound(lo[j])}, {_bound(hi[j])}] (pipeline.valid_ranges)")
            for i, j in zip(rows.tolist(), first.tolist())]


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


INT64_RANGE = (-(2**63), 2**63 - 1)
"""The smallest and largest 64-bit integer: the range of an integer id, ts or artifact version."""
_SMALL_INT = Annotated[int, msgspec.Meta(ge=INT64_RANGE[0], le=INT64_RANGE[1])]


class _FastRecords:
    """The typed decoder of one pipeline's records: accepts a subset of what the reference path accepts.

    Its schema states the rules: an id is a 64-bit integer or a non-empty string of at most
    :data:`MAX_ID_CHARS` characters (msgspec refuses lone surrogates), s and u are configured labels
    (``Literal``: 1.0 and true are not 1), y is 0 or 1, ts a 64-bit integer or a float, features are
    floats (msgspec refuses numbers beyond the float range, and JSON has no NaN). What a schema
    cannot say (no NUL in an id) is checked once per batch. Anything else (longer integer ids, a
    larger integer ts) is left to the reference path, which decides and words the reason.
    """

    _cache: dict = {}

    def __init__(self, config: PipelineConfig):
        names = [f"f{k}" for k in range(len(config.features))]
        columns = [(n, float) for n in names]
        try:
            features = msgspec.defstruct("Features", columns, forbid_unknown_fields=True, gc=False,
                                         rename=dict(zip(names, config.features)))
        except ValueError:  # feature names msgspec cannot match (quotes, backslashes): reference path only
            features, decodable = msgspec.defstruct("Features", columns, gc=False), False
        else:
            decodable = True
        text_id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
        groups, strata = Literal[tuple(config.groups)], Literal[tuple(config.strata)]
        # A missing s is allowed only where it is imputed; its default then marks it missing.
        s_field = ("s", Union[groups, None], None) if config.imputes_s else ("s", groups)
        self._record = msgspec.defstruct("Record", [("id", Union[_SMALL_INT, text_id]), ("features", features),
                                                    ("u", strata), s_field,
                                                    ("ts", Union[_SMALL_INT, float, None], None),
                                                    ("y", Union[Literal[0, 1], None], None)],
                                         forbid_unknown_fields=True, gc=False)  # no cycles: the collector skips them
        self._features = features
        try:
            self._decoder = msgspec.json.Decoder(self._record) if decodable else None
        except (TypeError, ValueError):  # labels msgspec cannot state as literals: reference path only
            self._decoder = None
        self.limit = config.max_message_bytes
        self.width = len(config.features)

    @classmethod
    def for_config(cls, config: PipelineConfig) -> "_FastRecords":
        """The decoder of ``config`` (built once per distinct pipeline)."""
        key = (tuple(config.features), tuple(config.groups), tuple(config.strata), config.max_message_bytes,
               config.imputes_s)
        if key not in cls._cache:
            cls._cache[key] = cls(config)
        return cls._cache[key]

    def decode_all(self, values: Sequence[bytes | None]) -> list | None:
        """Every value's record, or None when some value must take the reference path (and perhaps a reason)."""
        if self._decoder is None or not values:
            return None
        try:
            if max(map(len, values)) > self.limit:  # a None value raises TypeError: None too
                return None
            return list(map(self._decoder.decode, values))  # an empty value raises: None
        except Exception:  # DecodeError, ValidationError, bad UTF-8, RecursionError: message by message then
            return None

    def decode(self, value: bytes | None):
        """The record, or None when the reference path must decide (and explain)."""
        if self._decoder is None or not value or len(value) > self.limit:
            return None
        try:
            record = self._decoder.decode(value)
        except Exception:  # DecodeError, ValidationError, bad UTF-8, RecursionError (deep nesting): the reference
            return None  # path decides and words the reason
        return record if _without_nul([record.id]) else None

    def record(self, obj: dict, row: list[float]):
        """The record the reference path accepted (``obj``, its features ``row``), as the typed decoder's."""
        return self._record(id=obj["id"], features=self._features(*row), u=obj["u"], s=obj.get("s"),
                            ts=obj.get("ts"), y=obj.get("y"))

    def columns(self, records: list, checked: bool = False) -> tuple | None:
        """(ids, ts, s, u, y, X) of ``records``: lists of the fields as they arrived, and the (n, d) features.

        None if some id holds NUL (only ``checked`` records, from :meth:`decode` or the reference, are taken
        as they are): then the batch goes message by message.
        """
        if not records:
            return [], [], [], [], [], np.empty((0, self.width), dtype=np.float64)
        ids, features, u, s, ts, y = map(list, zip(*map(astuple, records)))
        if not checked and not _without_nul(ids):
            return None
        X = np.fromiter(chain.from_iterable(map(astuple, features)), dtype=np.float64,
                        count=len(records) * self.width).reshape(len(records), self.width)
        return ids, ts, s, u, y, X


def _without_nul(ids: list) -> bool:
    """No string id of ``ids`` holds NUL (it would be lost in the fixed-width key arrays)."""
    try:
        return "\x00" not in "".join(ids)
    except TypeError:  # integer ids among them
        return not any("\x00" in rid for rid in ids if isinstance(rid, str))


def labels_array(values: list) -> np.ndarray:
    """Group/stratum labels as an array that compares like the fitted classes (ints stay ints)."""
    if values:
        ints = np.array(values)  # one C pass: integer labels come out as integers, anything else does not
        if ints.dtype.kind == "i":
            return ints.astype(np.int64, copy=False)
    return np.array(values, dtype=object)

