"""Batch decoding, validation and encoding of the JSON records the agents exchange.

A batch of raw Kafka values becomes numpy arrays plus a list of (position, reason) for every value
that cannot be used; the agent repairs the arrays in one vectorised call and dead-letters the rest.
Parsing JSON is one C call per message (a typed msgspec decoder whose schema states the rules), with
no Python per field; everything after it (range, finiteness, repair) is on arrays. No single message
can make a batch's decoding raise (whatever a decoder raises on it, it is refused with a reason).
Encoding writes each output column in one C call and fills one template per batch whose constant
parts (field names, provenance) are precomputed bytes; floats are written in their shortest
round-trip form, so a repaired value read back equals the batch ``transform`` bit for bit, and a
record's bytes do not depend on its batch. Only JSON is written: a NaN or an infinity never reaches
an output (:func:`non_finite_rows` finds the rows that hold one, and the encoders refuse them).

>>> from fairstream.streams.config import adult_config
>>> batch = decode_records([b'{"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}',
...                         b'{"id": 2, "features": {"age": "old"}, "s": 0, "u": 1}'], adult_config())
>>> batch.X.tolist(), batch.errors
([[30.0, 40.0]], [(1, "missing feature(s) ['hours-per-week']")])
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from itertools import chain
from typing import Annotated, Literal, Sequence, Union

import msgspec
import numpy as np
from msgspec.structs import astuple

from fairstream.repair.protocol import COLUMNS, Batch
from fairstream.streams.config import PipelineConfig, is_unicode

from .schemas import DeadLetter, EmbeddingRecord, InputRecord

log = logging.getLogger(__name__)

_INPUT_REQUIRED = frozenset(InputRecord.required_fields())
_INPUT_ALLOWED = frozenset(InputRecord.field_names())
_EMBEDDING_REQUIRED = frozenset(EmbeddingRecord.required_fields())
_EMBEDDING_ALLOWED = frozenset(EmbeddingRecord.field_names())


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

    def batch(self) -> Batch:
        """The usable records as the modules' :class:`~fairstream.repair.protocol.Batch`."""
        y = self.fields.y
        labelled = bool(y) and None not in y
        return Batch(X=self.X, keys=self.keys, s=self.s, u=self.u, y=np.array(y, dtype=np.int64) if labelled else None,
                     impute_s=self.impute_s, columns=self.columns)


def _parse(value: bytes | None, limit: int) -> dict:
    if not value:
        raise Invalid("empty message")
    if len(value) > limit:
        raise Invalid(f"message of {len(value)} bytes exceeds the limit of {limit} bytes")
    try:
        # Decode explicitly: json.loads(bytes) would also accept UTF-16/32 by guessing the encoding.
        obj = json.loads(value.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Invalid(f"message is not UTF-8: {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, the int digit limit, deep nesting
        raise Invalid(f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise Invalid(f"a record must be a JSON object, got {type(obj).__name__}")
    return obj


def _check_fields(obj: dict, required: frozenset, allowed: frozenset) -> None:
    keys = obj.keys()
    if keys >= required and keys <= allowed:
        return
    missing = sorted(required - keys)
    if missing:
        raise Invalid(f"missing field(s) {missing}")
    raise Invalid(f"unexpected field(s) {sorted(keys - allowed)}")


def _number(value, what: str) -> float:
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


MAX_ID_CHARS = 1024
"""Characters of an id's text (its record key), at most. The keys of a batch are one fixed-width array that
the repair hashes character by character: one id of 500,000 characters would make a batch of 1,000 records
cost 6 GB and seconds, and its escaped text alone could exceed the output limit."""


def _key(obj: dict) -> str:
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


def _label(value, configured: frozenset, name: str, listed: tuple) -> None:
    # Only ints and strings are labels: 1.0 and True must not pass as group 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value not in configured:
        kind = "group" if name == "s" else "stratum"
        raise Invalid(f"{name} value {value!r} is not a configured {kind} {list(listed)}")


def _check_record(obj: dict, config: PipelineConfig, groups: frozenset, strata: frozenset) -> list[float]:
    imputes = config.imputes_s
    _check_fields(obj, _INPUT_REQUIRED - {"s"} if imputes else _INPUT_REQUIRED, _INPUT_ALLOWED)
    _key(obj)
    features = obj["features"]
    if not isinstance(features, dict):
        raise Invalid(f"features must be a JSON object, got {type(features).__name__}")
    if features.keys() != set(config.features):
        missing = sorted(set(config.features) - features.keys())
        raise Invalid(f"missing feature(s) {missing}" if missing else f"unexpected feature(s) {sorted(features.keys() - set(config.features))}")
    row = [_number(features[name], f"feature {name!r}") for name in config.features]
    if not (imputes and obj.get("s") is None):  # a missing s is imputed by the plan
        _label(obj["s"], groups, "s", config.groups)
    _label(obj["u"], strata, "u", config.strata)
    if obj.get("ts") is not None:
        _number(obj["ts"], "ts")
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
            obj = _parse(value, config.max_message_bytes)
            record = fast.record(obj, _check_record(obj, config, groups, strata))
        return record

    return _each_message(values, decode, "records")


def _each_message(values: Sequence[bytes | None], decode, agent: str) -> tuple[list[int], list, list]:
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


_INT64 = (-(2**63), 2**63 - 1)
_SMALL_INT = Annotated[int, msgspec.Meta(ge=_INT64[0], le=_INT64[1])]


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


def _finite(number) -> bool:
    try:
        return math.isfinite(number)  # an int beyond the float range overflows here
    except OverflowError:
        return False


def _plain_id(rid: int | str) -> bool:
    """An id the embedding fast path accepts as it is (msgspec refuses lone surrogates); others take the reference."""
    if isinstance(rid, str):
        return bool(rid) and len(rid) <= MAX_ID_CHARS and "\x00" not in rid
    return rid.bit_length() <= _MAX_ID_BITS


_MAX_ID_BITS = 3_300  # fewer than 1,000 digits: within MAX_ID_CHARS (and Python's 4,300-digit limit on int parsing)


def labels_array(values: list) -> np.ndarray:
    """Group/stratum labels as an array that compares like the fitted classes (ints stay ints)."""
    if values:
        ints = np.array(values)  # one C pass: integer labels come out as integers, anything else does not
        if ints.dtype.kind == "i":
            return ints.astype(np.int64, copy=False)
    return np.array(values, dtype=object)


@dataclass
class DecodedEmbeddings:
    """The usable embedding records of a batch as arrays, and why the others are not usable."""
    index: np.ndarray
    records: list[dict]  # {"id", "group", "identity"} of each record (None where absent); vectors are in ``vectors``
    keys: np.ndarray
    vectors: np.ndarray  # (n, dimension)
    errors: list[tuple[int, str]] = field(default_factory=list)
    digests: list = field(default_factory=list)  # each record's input_digest

    def batch(self) -> Batch:
        """The usable vectors as the modules' :class:`~fairstream.repair.protocol.Batch`."""
        return Batch(X=self.vectors, keys=self.keys)


def _check_embedding(obj: dict, dimension: int) -> list[float]:
    _check_fields(obj, _EMBEDDING_REQUIRED, _EMBEDDING_ALLOWED)
    _key(obj)
    for name in ("group", "identity"):
        _optional_label(obj.get(name), name)
    vector = obj["vector"]
    if not isinstance(vector, list):
        raise Invalid(f"vector must be a JSON array, got {type(vector).__name__}")
    if len(vector) != dimension:
        raise Invalid(f"vector has {len(vector)} values, expected {dimension}")
    return [_number(v, f"vector[{j}]") for j, v in enumerate(vector)]


def _optional_label(value, name: str) -> None:
    # A label, like the configured groups: an integer or a string (NaN, 1.5, true or an array are not), or absent.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise Invalid(f"{name} must be an integer or a string, got {_describe(value)}")


def _describe(value) -> str:
    """A value of the wrong type, for a reason: containers by kind (printing a 900-deep array recurses)."""
    if isinstance(value, (list, dict)):
        return "a JSON array" if isinstance(value, list) else "a JSON object"
    return json.dumps(value) if isinstance(value, bool) else repr(value)  # a float: 1.5, nan, inf


_EMBEDDING_DECODER = msgspec.json.Decoder(msgspec.defstruct(
    "Embedding", [("id", Union[int, str]), ("vector", list[float]), ("group", Union[int, str, None], None),
                  ("identity", Union[int, str, None], None)], forbid_unknown_fields=True))
"""The typed fast path of ``embeddings.in``: accepts a subset of what the reference path accepts (512 floats
are one C call here, 512 Python checks there)."""


def _fast_embedding(value: bytes | None, dimension: int, limit: int):
    """The record, or None when the reference path must decide (and explain)."""
    if not value or len(value) > limit:
        return None
    try:
        record = _EMBEDDING_DECODER.decode(value)
    except Exception:  # DecodeError, ValidationError, bad UTF-8, RecursionError (deep nesting): the reference
        return None  # path decides and words the reason
    rid = record.id
    if not _plain_id(rid):
        return None
    return record if len(record.vector) == dimension else None


def _decode_embedding(value: bytes | None, dim: int, limit: int) -> tuple[dict, list[float]]:
    """One record's {"id", "group", "identity"} and its vector; :class:`Invalid` says why not."""
    fast = _fast_embedding(value, dim, limit)
    if fast is not None:  # msgspec refuses NaN, Infinity and out-of-range numbers: every float is finite
        return {"id": fast.id, "group": fast.group, "identity": fast.identity}, fast.vector
    parsed = _parse(value, limit)
    row = _check_embedding(parsed, dim)
    return {"id": parsed["id"], "group": parsed.get("group"), "identity": parsed.get("identity")}, row


def decode_embeddings(values: Sequence[bytes | None], config: PipelineConfig) -> DecodedEmbeddings:
    """Parse and validate a batch of raw values from ``embeddings.in`` (typed fast path, reference path on doubt).

    ``group`` and ``identity`` are labels (an integer or a string) or absent; no message can make the batch raise.
    """
    dim, limit = config.embeddings.dimension, config.max_message_bytes
    index, decoded, errors = _each_message(values, lambda value: _decode_embedding(value, dim, limit), "embeddings")
    records, rows = [obj for obj, _ in decoded], [row for _, row in decoded]
    digests = [input_digest(values[i]) for i in index]
    return DecodedEmbeddings(index=np.array(index, dtype=np.intp), records=records,
                             keys=np.array([str(r["id"]) for r in records], dtype=str),
                             vectors=np.array(rows, dtype=np.float64).reshape(len(rows), dim), errors=errors,
                             digests=digests)


def provenance(stages: Sequence[tuple[str, int, str, str]]) -> dict:
    """What every output record says about the artifacts that produced it: (kind, version, sha256, seed) per stage.

    The top-level fields name the first stage (the repair, for readers that follow one version);
    ``chain`` lists every stage in the order applied, so a record names one version of each.

    >>> provenance([("flow", 3, "ab", ""), ("scorer", 1, "cd", "")])["chain"][1]
    {'kind': 'scorer', 'version': 1, 'sha256': 'cd', 'seed': ''}
    """
    chain = [{"kind": kind, "version": int(version), "sha256": sha256, "seed": seed}
             for kind, version, sha256, seed in stages]
    return {**chain[0], "chain": chain}


def _scalar(value) -> str:
    """JSON text of a validated scalar field (id, ts, s, u, y, group, identity) without json.dumps' overhead.

    Only JSON is written: anything but null, a string, a boolean, an integer or a finite float raises
    (the decoders let nothing else through, so this never fires on a record they accepted).
    """
    kind = type(value)  # exact types first: this runs six times per record
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int or (kind is float and value - value == 0.0):  # finite: inf - inf and nan - nan are nan
        return repr(value)  # repr of an int or a finite float is valid, exact JSON
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return encode_basestring_ascii(str(value))
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):  # subclasses (numpy floats)
        return repr(int(value) if isinstance(value, int) else float(value))
    raise ValueError(f"{value!r} is not a JSON scalar (null, string, boolean, integer or finite number)")


def non_finite_rows(columns: dict[str, tuple[np.ndarray, Sequence | None]]) -> list[tuple[int, str]]:
    """(row, reason) for every row of the output ``columns`` that holds a NaN or an infinity.

    ``columns`` maps a field's name to its values, (n,) or (n, k), and the names of its k entries
    (None: numbered). JSON has no NaN or infinity, and an output with one is not JSON (``repr``
    writes ``inf``; msgspec writes ``null``, a silent change of value): such a row is dead-lettered
    with this reason instead, and the encoders refuse it (:func:`_require_finite`). One vectorised
    check per column: a few microseconds for a batch of 1,000 records.
    """
    if not columns:
        return []
    flat = {name: (_columns_of(values), names) for name, (values, names) in columns.items()}
    finite = np.logical_and.reduce([np.isfinite(values).all(axis=1) for values, _ in flat.values()])
    return [(int(i), _non_finite_reason(flat, int(i))) for i in np.flatnonzero(~finite)]


def _columns_of(values) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[:, None] if values.ndim == 1 else values


def _non_finite_reason(flat: dict, row: int) -> str:
    for name, (values, names) in flat.items():
        bad = np.flatnonzero(~np.isfinite(values[row]))
        if bad.size:
            j = int(bad[0])
            entry = "" if values.shape[1] == 1 and names is None else f"[{names[j]!r}]" if names else f"[{j}]"
            return (f"the output's {name}{entry} would be {values[row, j].item()!r}, which JSON cannot carry "
                    f"(no NaN or infinity is written): the record is not sent")
    raise AssertionError("a row flagged non-finite has only finite values")


def _require_finite(*arrays: np.ndarray) -> None:
    # The boundary of every output: a NaN or an infinity reaching an encoder is a bug upstream, never an output.
    for values in arrays:
        if not np.isfinite(values).all():
            raise ValueError("an output value is NaN or infinite (JSON cannot carry it): refuse the row first "
                             "(non_finite_rows)")


def _literal(text: str) -> str:
    """Constant text inside a %-format template ('%' in a feature name must stay a '%')."""
    return text.replace("%", "%%")


_ENCODER = msgspec.json.Encoder()  # shortest round-trip floats, like repr; UTF-8 strings


def _json_tokens(values: Sequence) -> list[bytes]:
    """The JSON text of each scalar of ``values`` (null, a boolean, a string, an integer, a finite float).

    One C call for the column: the values are written as one JSON array and cut at its commas. A
    string holding a comma or a bracket (or a value that is no scalar) takes the per-value path,
    which refuses anything but a scalar; msgspec writes a NaN or an infinity as null (a silent change
    of value), so a null where no None was is refused too.
    """
    values = values if isinstance(values, list) else list(values)
    try:
        text = _ENCODER.encode(values)
    except TypeError:  # a type msgspec does not write (a numpy scalar): the per-value path decides
        text = b"[{"
    tokens = text[1:-1].split(b",")
    if len(tokens) != len(values) or text.count(b"[") != 1 or b"{" in text:
        return [_scalar_json(value) for value in values]
    if b"null" in text and tokens.count(b"null") != values.count(None):  # counted only where a null was written
        raise ValueError(f"a value of {values!r} is not a JSON scalar (null, string, boolean, integer or finite "
                         "number)")
    return tokens


def _scalar_json(value) -> bytes:
    """The JSON text of one scalar, byte for byte as :func:`_json_tokens` writes it in a column (an output does
    not depend on its batch); anything but a scalar raises."""
    if value is None or type(value) in (bool, int, str):
        return _ENCODER.encode(value)
    for kind in (int, str, float):  # a subclass (a numpy float) as its base type
        if isinstance(value, kind) and (kind is not float or math.isfinite(value)):
            return _ENCODER.encode(kind(value))
    raise ValueError(f"{value!r} is not a JSON scalar (null, string, boolean, integer or finite number)")


def _float_tokens(values: np.ndarray) -> list[bytes]:
    """The JSON text of every (finite) float of ``values``, row by row, in one C call: shortest round-trip form."""
    if not values.size:
        return []
    return _ENCODER.encode(values.ravel().tolist())[1:-1].split(b",")  # floats hold no comma


_S_IMPUTED = [b',"s_imputed":false', b',"s_imputed":true']


def encode_repaired(fields: RecordFields, X: np.ndarray, repaired: np.ndarray, config: PipelineConfig,
                    prov: dict, imputed: np.ndarray | None = None, added: dict | None = None) -> list[bytes]:
    """Repaired records as JSON bytes: one template for the batch, filled with every column's JSON text.

    Each column is written in one C call (:func:`_json_tokens`, :func:`_float_tokens`; floats in their
    shortest round-trip form, so a value read back equals the array's bit for bit) and the constant
    parts (field names, the provenance) are the template's bytes: the only Python per record is
    filling it. On an input that imputes a missing s, every record says whether its s was imputed
    (``s_imputed``); ``s`` itself stays as it arrived (null when missing). Every record carries the
    ``input_digest`` of the message it came from (see :func:`input_digest`). ``added`` holds the
    per-row columns the chain's modules add (:attr:`~fairstream.repair.protocol.Capabilities.adds`,
    e.g. {"score": floats, "decision": 0/1}): each record gets one field per column, named by it, in
    the order of :data:`~fairstream.repair.protocol.COLUMNS`. Every float written must be finite
    (:func:`non_finite_rows` finds the rows that are not).
    """
    added = _added_columns(added)
    written = (repaired, *((X,) if config.include_original else ()),
               *(values for values in added.values() if values.dtype.kind == "f"))
    _require_finite(*written)
    if not len(fields):
        return []
    d = len(config.features)
    new = _float_tokens(repaired)
    columns = [new[j::d] for j in range(d)]
    if config.include_original:
        old = _float_tokens(X)
        columns += [old[j::d] for j in range(d)]
    if config.imputes_s:
        marks = imputed if imputed is not None else np.zeros(len(fields), dtype=bool)
        columns.append([_S_IMPUTED[flag] for flag in marks.tolist()])
    columns += [_float_tokens(values) if values.dtype.kind == "f" else _json_tokens(values.tolist())
                for values in added.values()]
    template = _record_template(config, prov, tuple(added))
    return [template % row for row in zip(_json_tokens(fields.ids), _json_tokens(fields.ts), _json_tokens(fields.s),
                                          _json_tokens(fields.u), _json_tokens(fields.y), *columns,
                                          _json_tokens(fields.digests))]


def _added_columns(added: dict | None) -> dict[str, np.ndarray]:
    """The added columns as arrays, in the order of COLUMNS; a name that is not a column raises."""
    added = added or {}
    unknown = sorted(set(added) - set(COLUMNS))
    if unknown:
        raise ValueError(f"added columns must be of {COLUMNS}, got {unknown}")
    return {name: np.asarray(added[name]) for name in COLUMNS if name in added}


def _record_template(config: PipelineConfig, prov: dict, added: tuple[str, ...]) -> bytes:
    """The bytes of a repaired record with a ``%s`` for every field that varies (field order of the schema)."""
    features = ",".join(f"{_literal(json.dumps(name))}:%s" for name in config.features)
    template = '{"id":%s,"ts":%s,"s":%s,"u":%s,"y":%s,"features":{' + features + "}"
    if config.include_original:
        template += ',"original":{' + features + "}"
    if config.imputes_s:
        template += "%s"  # the s_imputed flag
    template += "".join(f",{json.dumps(name)}:%s" for name in added)  # the added columns (score, decision)
    template += ',"input_digest":%s,"provenance":' + _literal(json.dumps(prov, separators=(",", ":"))) + "}"
    return template.encode()  # json.dumps writes ASCII


_VECTOR_ENCODER = msgspec.json.Encoder()  # shortest round-trip floats, like repr, in one C call per vector


def encode_embeddings(records: list[dict], vectors: np.ndarray, prov: dict,
                      digests: Sequence[str] | None = None) -> list[bytes]:
    """``embeddings.repaired`` values: each record with its new vector, its ``input_digest`` and the provenance.

    Every vector must be finite (:func:`non_finite_rows` finds the rows that are not).
    """
    tail = ',"provenance":' + json.dumps(prov, separators=(",", ":")) + "}"
    digests = digests if digests is not None else [None] * len(records)
    _require_finite(vectors)
    return [
        ('{"id":%s,"group":%s,"vector":%s,"input_digest":%s' % (_scalar(r["id"]), _scalar(r.get("group")),
                                                                 _VECTOR_ENCODER.encode(v).decode(), _scalar(d))
         + ("" if r.get("identity") is None else ',"identity":' + _scalar(r["identity"])) + tail).encode()
        for r, v, d in zip(records, vectors.tolist(), digests)
    ]


@dataclass
class RepairedBatch:
    """Repaired records as arrays: original and repaired features, labels, keys, event times, versions."""

    before: np.ndarray
    after: np.ndarray
    s: np.ndarray
    u: np.ndarray
    y: np.ndarray | None
    keys: np.ndarray
    ts: np.ndarray
    versions: np.ndarray | None = None  # provenance version of each record (when decoded from the topic)
    out_of_range: np.ndarray | None = None  # rows with a value outside the plan's range (known in the worker)
    decision: np.ndarray | None = None  # the chain's final decision of each record (a chain that decides)
    unreadable: int = 0  # values of the topic left out as unreadable (when decoded from the topic)
    score: np.ndarray | None = None  # the chain's score of each record, as computed once by it (None: unknown)

    def __len__(self) -> int:
        return len(self.s)

    def take(self, rows: np.ndarray) -> "RepairedBatch":
        """The records at ``rows``."""
        pick = (lambda a: None if a is None else a[rows])
        return RepairedBatch(self.before[rows], self.after[rows], self.s[rows], self.u[rows], pick(self.y),
                             self.keys[rows], self.ts[rows], pick(self.versions), pick(self.out_of_range),
                             pick(self.decision), score=pick(self.score))


def decode_repaired(values: Sequence[bytes], config: PipelineConfig) -> RepairedBatch:
    """Arrays of ``records.repaired`` values that carry their original features (``include_original``).

    A reader of the topic meets whatever was written to it: a value that is not a readable repaired
    record (not JSON, a field missing or of the wrong type, a non-finite feature, a label not
    configured, a version beyond 64 bits) is left out and counted in ``unreadable``; it never raises.
    """
    records, unreadable = [], 0
    for value in values:
        try:
            records.append(json.loads(value))
        except Exception:  # malformed JSON, bad UTF-8, deep nesting (RecursionError)
            unreadable += 1
    return repaired_arrays(records, config, unreadable)


def repaired_arrays(records: Sequence, config: PipelineConfig, unreadable: int = 0) -> RepairedBatch:
    """Arrays of parsed ``records.repaired`` records that carry their original features and their true s.

    Records without their original features or with an imputed s are left out (nothing to measure);
    unusable ones too, counted in ``unreadable`` (see :func:`decode_repaired`).
    """
    groups, strata, now = frozenset(config.groups), frozenset(config.strata), time.time()
    rows = []
    for record in records:
        if isinstance(record, dict) and (record.get("original") is None or record.get("s_imputed") is True):
            continue
        try:
            rows.append(_repaired_row(record, config, groups, strata, now))
        except Exception:  # Invalid, or any other way a record is not what this codec writes
            unreadable += 1
    d = len(config.features)
    before, after, s, u, y, keys, ts, versions, decisions, scores = (list(c) for c in zip(*rows)) if rows else (
        [] for _ in range(10))
    return RepairedBatch(
        before=np.array(before, dtype=np.float64).reshape(-1, d),
        after=np.array(after, dtype=np.float64).reshape(-1, d),
        s=labels_array(s), u=labels_array(u),
        y=np.array(y, dtype=np.int64) if y and None not in y else None,
        keys=np.array(keys, dtype=object), ts=np.array(ts, dtype=np.float64),
        versions=np.array(versions, dtype=np.int64),
        decision=np.array(decisions, dtype=np.int64) if decisions and None not in decisions else None,
        unreadable=unreadable,
        score=np.array(scores, dtype=np.float64) if scores and None not in scores else None,
    )


def _repaired_row(record: dict, config: PipelineConfig, groups: frozenset, strata: frozenset, now: float) -> tuple:
    """(original, features, s, u, y, key, ts, version, decision, score) of one repaired record; raises if it has
    none (decision and score are None in a record without them)."""
    original, features = record["original"], record["features"]
    if not isinstance(original, dict) or not isinstance(features, dict):
        raise Invalid("original and features must be JSON objects")
    before = [_number(original[name], f"original {name!r}") for name in config.features]
    after = [_number(features[name], f"feature {name!r}") for name in config.features]
    _label(record["s"], groups, "s", config.groups)
    _label(record["u"], strata, "u", config.strata)
    version = record["provenance"]["version"]
    if isinstance(version, bool) or not isinstance(version, int) or not _INT64[0] <= version <= _INT64[1]:
        raise Invalid(f"provenance.version must be a 64-bit integer, got {_describe(version)}")
    y, decision = record.get("y"), record.get("decision")
    for name, value in (("y", y), ("decision", decision)):
        if value is not None and (isinstance(value, bool) or value not in (0, 1)):
            raise Invalid(f"{name} must be 0 or 1, got {_describe(value)}")
    ts, score = record.get("ts"), record.get("score")
    return (before, after, record["s"], record["u"], y, str(_key(record)), now if ts is None else _number(ts, "ts"),
            version, decision, None if score is None else _number(score, "score"))


# --------------------------------------------------------------------------- the output budget

MAX_OUTPUT_BYTES = 1024 * 1024
"""The producer's limit on one output record (its ``max_request_size``, and Apache Kafka's default message
limit): every output, repaired record or dead letter, fits under it with its Kafka key and the record overhead."""

RECORD_OVERHEAD_BYTES = 128
"""An upper bound on what the producer adds to a record's key and value when it checks the limit: the record
batch header (61 bytes), the record's own fields (at most 21) and the varint lengths of key, value and headers."""

MAX_DEAD_LETTER_ORIGINAL = 512 * 1024
"""Bytes of an original message a dead letter keeps (base64: 683 KiB): every message up to the largest
``max_message_bytes`` is kept whole; of a larger one (a 3 MB message is dead-lettered too) the first 512 KiB."""

MAX_DEAD_LETTER_KEY = 64 * 1024
"""Bytes of an original Kafka key a dead letter keeps (as its own key and in ``key_b64``)."""

MAX_REASON_CHARS = 2000
"""Characters of a dead-letter reason (a reason quotes the offending value, which may be long)."""

_MAX_TOPIC_CHARS = 249  # Kafka's limit on a topic name


def output_bytes(key: bytes | None, value: bytes) -> int:
    """What one output counts against :data:`MAX_OUTPUT_BYTES`: its key, its value and the record overhead."""
    return len(key or b"") + len(value) + RECORD_OVERHEAD_BYTES


def oversized(keys: Sequence[bytes | None], values: Sequence[bytes]) -> list[tuple[int, str]]:
    """(position, reason) of every output (``keys[i]``, ``values[i]``) that would not fit in :data:`MAX_OUTPUT_BYTES`.

    A repaired output is sent whole or not at all: the input of one that does not fit (a valid record with a
    900 KB Kafka key, a vector whose group is 100,000 emoji) is dead-lettered with this reason, and its dead
    letter fits by construction. This runs on every output: the largest key and value are checked first, in C.
    """
    if not values:
        return []
    room = MAX_OUTPUT_BYTES - RECORD_OVERHEAD_BYTES
    keys = [key or b"" for key in keys] if None in keys else keys
    if max(map(len, values)) + max(map(len, keys)) <= room:  # the common case: even the largest pair fits
        return []
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    sizes += np.fromiter(map(len, keys), dtype=np.int64, count=len(values))
    return [(i, f"the repaired output would be {output_bytes(keys[i], values[i])} bytes (a Kafka key of "
                f"{len(keys[i])} bytes, a value of {len(values[i])} bytes and the record overhead), over the "
                f"producer's limit of {MAX_OUTPUT_BYTES} bytes")
            for i in np.flatnonzero(sizes > room).tolist()]


def dead_letter_key(key: bytes | None) -> bytes | None:
    """A dead letter's Kafka key: its input's, cut to its first :data:`MAX_DEAD_LETTER_KEY` bytes (as ``key_b64``)."""
    return None if key is None else key[:MAX_DEAD_LETTER_KEY]


def dead_letter(value: bytes | None, reason: str, topic: str, partition: int, offset: int, agent: str,
                key: bytes | None = None) -> bytes:
    """The dead-letter envelope: the original bytes and key (base64), why, and whence; it fits by construction.

    With its Kafka key (:func:`dead_letter_key`) the envelope fits under :data:`MAX_OUTPUT_BYTES` whatever
    arrived: the reason is cut to :data:`MAX_REASON_CHARS` characters, the key to :data:`MAX_DEAD_LETTER_KEY`
    bytes, and the original to :data:`MAX_DEAD_LETTER_ORIGINAL` bytes (or to the room left, which no reason
    and topic name come near). Whatever was cut is named by its full size and sha256 (``original_size``,
    ``original_sha256``, ``original_truncated``; ``key_size``, ``key_sha256``, ``key_truncated``).
    """
    original = value or b""
    kept_key = dead_letter_key(key)
    fields = dict(reason=_clip(reason, MAX_REASON_CHARS), agent=agent, topic=topic[:_MAX_TOPIC_CHARS],
                  partition=partition, offset=offset, original_size=len(original),
                  original_sha256=hashlib.sha256(original).hexdigest(), input_digest=input_digest(value),
                  **_key_fields(key, kept_key))

    def envelope(kept: bytes, truncated: bool) -> bytes:
        letter = DeadLetter(**fields, original_b64=base64.b64encode(kept).decode(), original_truncated=truncated)
        return json.dumps(letter.asdict(), separators=(",", ":")).encode()

    # "false" is the longer flag: the room is measured with it, so the final envelope is never larger.
    room = MAX_OUTPUT_BYTES - RECORD_OVERHEAD_BYTES - len(kept_key or b"") - len(envelope(b"", False))
    kept = original[:max(0, min(MAX_DEAD_LETTER_ORIGINAL, room // 4 * 3))]  # base64: 4 bytes per 3
    return envelope(kept, len(kept) < len(original))


def _key_fields(key: bytes | None, kept: bytes | None) -> dict:
    if not key:
        return {}
    return dict(key_b64=base64.b64encode(kept).decode(), key_size=len(key), key_sha256=hashlib.sha256(key).hexdigest(),
                key_truncated=len(kept) < len(key))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def original_bytes(letter: dict) -> bytes:
    """The bytes a dead letter keeps of its original: all of them unless ``original_truncated``."""
    return base64.b64decode(letter["original_b64"])


# --------------------------------------------------------------------------- re-fit requests
# The ``refit.requests`` message (key = the artifact kind, value = UTF-8 JSON)::
#
#     {"request_id": "2b1f...",            # required, unique per request: re-deliveries are ignored
#      "kind": "plan",                     # required: the artifact kind to re-fit
#      "reason": "drift of dependence_e",  # required: why, for the logs
#      "ts": 1700000000.0,                 # required: seconds since the epoch, when it was asked
#      "statistic": "dependence_e",        # optional: the statistic that drifted
#      "value": 0.12,                      # optional: its value when the drift was confirmed
#      "source": "monitor@worker-1"}       # optional: who asked
#
# Unknown fields are ignored, so producers may add context without breaking older services.

_MAX_REQUEST_BYTES = 64 * 1024
_MAX_REQUEST_ID = 200


class RefitRequestError(ValueError):
    """A ``refit.requests`` message that cannot be used; the message says why."""


@dataclass(frozen=True)
class RefitRequest:
    """One message on ``refit.requests`` (format in the module docstring)."""

    request_id: str
    kind: str
    reason: str
    ts: float
    statistic: str | None = None
    value: float | None = None
    source: str | None = None

    @classmethod
    def new(cls, reason: str, kind: str = "plan", statistic: str | None = None, value: float | None = None,
            source: str | None = None, request_id: str | None = None, ts: float | None = None) -> "RefitRequest":
        """A request with a fresh id and the current time unless given; validated like a parsed one."""
        request = cls(request_id=request_id or uuid.uuid4().hex, kind=kind, reason=reason,
                      ts=time.time() if ts is None else ts, statistic=statistic, value=value, source=source)
        try:
            return parse_request(request.to_json())
        except (TypeError, ValueError) as exc:  # NaN, or a value json cannot write
            raise RefitRequestError(f"invalid refit request: {exc}") from None

    def to_json(self) -> bytes:
        """The message value (UTF-8 JSON)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return json.dumps(fields, sort_keys=True, allow_nan=False).encode("utf-8")


def parse_request(value: bytes | None) -> RefitRequest:
    """A validated :class:`RefitRequest`; :class:`RefitRequestError` says what is wrong."""
    if not value:
        raise RefitRequestError("empty refit request")
    if len(value) > _MAX_REQUEST_BYTES:
        raise RefitRequestError(f"refit request of {len(value)} bytes exceeds {_MAX_REQUEST_BYTES}")
    try:
        data = json.loads(bytes(value).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RefitRequestError(f"refit request is not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise RefitRequestError(f"a refit request must be a JSON object, got {type(data).__name__}")
    try:
        return _request_of(data)
    except RefitRequestError:
        raise
    except Exception as exc:  # whatever else a field makes a check raise: the request is refused, not the reader
        raise RefitRequestError(f"refit request could not be read ({type(exc).__name__}: {str(exc)[:200]})") from None


def _request_of(data: dict) -> RefitRequest:
    request_id = _text(data, "request_id", required=True)
    if len(request_id) > _MAX_REQUEST_ID:
        raise RefitRequestError(f"request_id is longer than {_MAX_REQUEST_ID} characters")
    return RefitRequest(request_id=request_id, kind=_text(data, "kind", required=True),
                        reason=_text(data, "reason", required=True), ts=_seconds(data, "ts", required=True),
                        statistic=_text(data, "statistic"), value=_seconds(data, "value"), source=_text(data, "source"))


def _text(data: dict, name: str, required: bool = False) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RefitRequestError(f"refit request field {name!r} must be a non-empty string, got {_describe(value)}")
    return value


def _seconds(data: dict, name: str, required: bool = False) -> float | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):  # 10**400 too
        raise RefitRequestError(f"refit request field {name!r} must be a finite number, got {_describe(value)}")
    return float(value)
