"""Repaired outputs (``records.repaired``, ``embeddings.repaired``) with their provenance, and their reader.

Wire format: one UTF-8 JSON object per record, the fields of :class:`~fairstream.streams.schemas.RepairedRecord`
(the input's fields with the repaired ``features``, the ``original`` ones when ``include_original``, the
columns the chain adds, the ``input_digest`` and the ``provenance``); a repaired embedding is its ``id``,
``group``, new ``vector``, ``input_digest``, ``identity`` (when known) and ``provenance``
(:func:`encode_embeddings` lives here: it shares this output machinery). Encoding writes each output
column in one C call and fills one template per batch whose constant parts (field names, provenance) are
precomputed bytes; floats are written in their shortest round-trip form, so a repaired value read back
equals the batch ``transform`` bit for bit, and a record's bytes do not depend on its batch. Only JSON is
written: a NaN or an infinity never reaches an output (:func:`non_finite_rows` finds the rows that hold
one, and the encoders refuse them). :class:`RepairedBatch` is what the monitor reads back
(:func:`decode_repaired`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Sequence

import msgspec
import numpy as np

from fairstream.repair.protocol import COLUMNS
from fairstream.streams.config import PipelineConfig

from .json_text import describe
from .records import INT64_RANGE, Invalid, RecordFields, check_label, finite_number, labels_array, record_key


NO_MODULE = 0
"""``provenance.version`` of an output no module produced: the empty chain of a monitor-only pipeline (published
artifact versions start at 1)."""


def provenance(stages: Sequence[tuple[str, int, str, str]]) -> dict:
    """What every output record says about the artifacts that produced it: (kind, version, sha256, seed) per stage.

    The top-level fields name the first stage (the repair, for readers that follow one version);
    ``chain`` lists every stage in the order applied, so a record names one version of each. No stage (a
    monitor-only pipeline) says so: no kind, version :data:`NO_MODULE`, an empty chain.

    >>> provenance([("flow", 3, "ab", ""), ("scorer", 1, "cd", "")])["chain"][1]
    {'kind': 'scorer', 'version': 1, 'sha256': 'cd', 'seed': ''}
    >>> provenance([])
    {'kind': None, 'version': 0, 'sha256': '', 'seed': '', 'chain': []}
    """
    chain = [{"kind": kind, "version": int(version), "sha256": sha256, "seed": seed}
             for kind, version, sha256, seed in stages]
    first = chain[0] if chain else {"kind": None, "version": NO_MODULE, "sha256": "", "seed": ""}
    return {**first, "chain": chain}


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


def template_literal(text: str) -> str:
    """Constant text inside a %-format template ('%' in a feature name must stay a '%')."""
    return text.replace("%", "%%")


_ENCODER = msgspec.json.Encoder()  # shortest round-trip floats, like repr; UTF-8 strings


def json_tokens(values: Sequence) -> list[bytes]:
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
    """The JSON text of one scalar, byte for byte as :func:`json_tokens` writes it in a column (an output does
    not depend on its batch); anything but a scalar raises."""
    if value is None or type(value) in (bool, int, str):
        return _ENCODER.encode(value)
    for kind in (int, str, float):  # a subclass (a numpy float) as its base type
        if isinstance(value, kind) and (kind is not float or math.isfinite(value)):
            return _ENCODER.encode(kind(value))
    raise ValueError(f"{value!r} is not a JSON scalar (null, string, boolean, integer or finite number)")


def float_tokens(values: np.ndarray) -> list[bytes]:
    """The JSON text of every (finite) float of ``values``, row by row, in one C call: shortest round-trip form."""
    if not values.size:
        return []
    return _ENCODER.encode(values.ravel().tolist())[1:-1].split(b",")  # floats hold no comma


_S_IMPUTED = [b',"s_imputed":false', b',"s_imputed":true']


def encode_repaired(fields: RecordFields, X: np.ndarray, repaired: np.ndarray, config: PipelineConfig,
                    prov: dict, imputed: np.ndarray | None = None, added: dict | None = None) -> list[bytes]:
    """Repaired records as JSON bytes: one template for the batch, filled with every column's JSON text.

    Each column is written in one C call (:func:`json_tokens`, :func:`float_tokens`; floats in their
    shortest round-trip form, so a value read back equals the array's bit for bit) and the constant
    parts (field names, the provenance) are the template's bytes: the only Python per record is
    filling it. On an input that imputes a missing s, every record says whether its s was imputed
    (``s_imputed``); ``s`` itself stays as it arrived (null when missing). Every record carries the
    ``input_digest`` of the message it came from (see
    :func:`~fairstream.streams.codec.records.input_digest`). ``added`` holds the
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
    new = float_tokens(repaired)
    columns = [new[j::d] for j in range(d)]
    if config.include_original:
        old = float_tokens(X)
        columns += [old[j::d] for j in range(d)]
    if config.imputes_s:
        marks = imputed if imputed is not None else np.zeros(len(fields), dtype=bool)
        columns.append([_S_IMPUTED[flag] for flag in marks.tolist()])
    columns += [float_tokens(values) if values.dtype.kind == "f" else json_tokens(values.tolist())
                for values in added.values()]
    template = _record_template(config, prov, tuple(added))
    return [template % row for row in zip(json_tokens(fields.ids), json_tokens(fields.ts), json_tokens(fields.s),
                                          json_tokens(fields.u), json_tokens(fields.y), *columns,
                                          json_tokens(fields.digests))]


def _added_columns(added: dict | None) -> dict[str, np.ndarray]:
    """The added columns as arrays, in the order of COLUMNS; a name that is not a column raises."""
    added = added or {}
    unknown = sorted(set(added) - set(COLUMNS))
    if unknown:
        raise ValueError(f"added columns must be of {COLUMNS}, got {unknown}")
    return {name: np.asarray(added[name]) for name in COLUMNS if name in added}


def _record_template(config: PipelineConfig, prov: dict, added: tuple[str, ...]) -> bytes:
    """The bytes of a repaired record with a ``%s`` for every field that varies (field order of the schema)."""
    features = ",".join(f"{template_literal(json.dumps(name))}:%s" for name in config.features)
    template = '{"id":%s,"ts":%s,"s":%s,"u":%s,"y":%s,"features":{' + features + "}"
    if config.include_original:
        template += ',"original":{' + features + "}"
    if config.imputes_s:
        template += "%s"  # the s_imputed flag
    template += "".join(f",{json.dumps(name)}:%s" for name in added)  # the added columns (score, decision)
    template += ',"input_digest":%s,"provenance":' + template_literal(json.dumps(prov, separators=(",", ":"))) + "}"
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
    before = [finite_number(original[name], f"original {name!r}") for name in config.features]
    after = [finite_number(features[name], f"feature {name!r}") for name in config.features]
    check_label(record["s"], groups, "s", config.groups)
    check_label(record["u"], strata, "u", config.strata)
    version = record["provenance"]["version"]
    if isinstance(version, bool) or not isinstance(version, int) or not INT64_RANGE[0] <= version <= INT64_RANGE[1]:
        raise Invalid(f"provenance.version must be a 64-bit integer, got {describe(version)}")
    y, decision = record.get("y"), record.get("decision")
    for name, value in (("y", y), ("decision", decision)):
        if value is not None and (isinstance(value, bool) or value not in (0, 1)):
            raise Invalid(f"{name} must be 0 or 1, got {describe(value)}")
    ts, score = record.get("ts"), record.get("score")
    return (before, after, record["s"], record["u"], y, str(record_key(record)),
            now if ts is None else finite_number(ts, "ts"), version, decision,
            None if score is None else finite_number(score, "score"))
