"""The batch codec: every raw value ends as a usable row or as an error with a reason, never a crash.

The properties are the contract of the record and embedding agents: the positions in ``index`` and
in ``errors`` partition the batch, the arrays have the configured shape and are finite, the keys are
the ids' text, and whatever is encoded reads back exactly (floats bit for bit).
"""

from __future__ import annotations

import base64
import doctest
import hashlib
import itertools
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.streams import codec
from fairstream.streams.codec import (
    MAX_DEAD_LETTER_KEY,
    MAX_DEAD_LETTER_ORIGINAL,
    MAX_OUTPUT_BYTES,
    MAX_REASON_CHARS,
    RecordFields,
    dead_letter,
    dead_letter_key,
    decode_embeddings,
    decode_records,
    encode_embeddings,
    encode_repaired,
    input_digest,
    non_finite_rows,
    original_bytes,
    output_bytes,
    provenance,
)
from fairstream.streams.config import AgentConfig, EmbeddingConfig, adult_config
from fairstream.streams.schemas import DeadLetter, EmbeddingRecord, InputRecord, RepairedRecord

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ADULT = adult_config()
STRING_GROUPS = adult_config(groups=("f", "m"), strata=("lo", "hi"))
DIM = 4
EMB = adult_config(embeddings=EmbeddingConfig(dimension=DIM))
PROV = provenance([("plan", 3, "ab" * 32, "0123456789abcdef")])


# --------------------------------------------------------------------------- helpers


def record(config=ADULT, drop=(), **changes) -> dict:
    """A valid input record for ``config``, with fields changed or dropped."""
    obj = {"id": 1, "features": {name: 10.0 * (j + 1) for j, name in enumerate(config.features)},
           "s": config.groups[0], "u": config.strata[-1]}
    obj.update(changes)
    for name in drop:
        del obj[name]
    return obj


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


def with_features(**values) -> dict:
    """A valid adult record whose features are replaced by ``values`` (keys with '_' for '-')."""
    return record(features={k.replace("_", "-"): v for k, v in values.items()})


def one_error(value, config=ADULT, decode=decode_records) -> str:
    """The reason a single value is refused (and that it is refused, not accepted or crashed on)."""
    batch = decode([value], config)
    assert batch.index.tolist() == [], f"{value!r} was accepted"
    assert len(batch.errors) == 1 and batch.errors[0][0] == 0
    reason = batch.errors[0][1]
    assert isinstance(reason, str) and reason
    return reason


def accepted(value, config=ADULT):
    batch = decode_records([value], config)
    assert batch.errors == [], batch.errors
    assert batch.index.tolist() == [0]
    return batch


def same_float(a, b) -> bool:
    """Bit-for-bit equality of two finite floats (== plus the sign of zero)."""
    return isinstance(a, float) and struct.pack("<d", a) == struct.pack("<d", float(b))


def strict_loads(data: bytes):
    """json.loads that refuses NaN/Infinity, as a non-Python consumer would."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    assert isinstance(data, bytes)
    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def check_batch(batch, values, config) -> None:
    """The invariants of a decoded record batch."""
    n = len(values)
    positions = batch.index.tolist() + [i for i, _ in batch.errors]
    assert sorted(positions) == list(range(n)), "index and errors must partition the batch"
    assert batch.index.tolist() == sorted(batch.index.tolist())
    assert all(isinstance(reason, str) and reason for _, reason in batch.errors)
    assert batch.X.dtype == np.float64
    assert batch.X.shape == (len(batch.index), len(config.features))
    assert np.isfinite(batch.X).all()
    assert len(batch.fields) == len(batch.keys) == len(batch.s) == len(batch.u) == len(batch.index)
    for i in range(len(batch.index)):
        rec = json.loads(values[batch.index[i]])
        assert batch.keys[i] == str(rec["id"])
        got = [column[i] for column in (batch.fields.ids, batch.fields.ts, batch.fields.s, batch.fields.u, batch.fields.y)]
        expected = [rec["id"], rec.get("ts"), rec["s"], rec["u"], rec.get("y")]
        assert got == expected and [type(v) for v in got] == [type(v) for v in expected]  # re-encoded unchanged
        assert batch.X[i].tolist() == [float(rec["features"][name]) for name in config.features]
        assert batch.s[i] == rec["s"] and batch.u[i] == rec["u"]
    # Every refused value can be dead-lettered and recovered exactly.
    for i, reason in batch.errors:
        letter = json.loads(dead_letter(values[i], reason, "t", 0, i, "records"))
        assert letter["reason"] == reason
        assert original_bytes(letter) == (values[i] or b"")


def check_embeddings(batch, values, dim) -> None:
    n = len(values)
    positions = batch.index.tolist() + [i for i, _ in batch.errors]
    assert sorted(positions) == list(range(n))
    assert all(isinstance(reason, str) and reason for _, reason in batch.errors)
    assert batch.vectors.dtype == np.float64
    assert batch.vectors.shape == (len(batch.index), dim)
    assert np.isfinite(batch.vectors).all()
    assert len(batch.records) == len(batch.keys) == len(batch.index)
    sent = [json.loads(values[i]) for i in batch.index]
    for i, (rec, original) in enumerate(zip(batch.records, sent)):
        assert batch.keys[i] == str(rec["id"]) and rec == {"id": original["id"], "group": original.get("group"),
                                                            "identity": original.get("identity")}
        assert batch.vectors[i].tolist() == [float(v) for v in original["vector"]]


# --------------------------------------------------------------------------- strategies

# Integers beyond the float range and beyond Python's int-from-text digit limit are valid JSON.
HUGE_INTS = st.sampled_from([10**400, -(10**400), 2**1024])
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
ANY_VALUE = JSON_VALUES | HUGE_INTS
FINITE = st.floats(allow_nan=False, allow_infinity=False)
NUMBERS = st.integers(-(10**9), 10**9) | FINITE
TRICKY_FLOATS = [0.1 + 0.2, 1e-300, 5e-324, -0.0, 0.0, 1.7976931348623157e308, -1.7976931348623157e308,
                 1e16, 2.0**53 + 2, 1 / 3, 123456789.12345678, -2.5e-10]
REPAIRED_FLOATS = FINITE | st.sampled_from(TRICKY_FLOATS)
IDS = st.integers() | st.text(min_size=1, max_size=12)
RECORD_FIELDS = ("id", "features", "s", "u", "ts", "y", "extra")


@st.composite
def near_valid_records(draw, config):
    """Records with up to two fields corrupted (arbitrary JSON, dropped, or added); often all valid."""
    names = list(config.features)
    corrupt = draw(st.sets(st.sampled_from(RECORD_FIELDS), max_size=2))
    good = {
        "id": IDS,
        "features": st.fixed_dictionaries({name: NUMBERS for name in names}),
        "s": st.sampled_from(config.groups),
        "u": st.sampled_from(config.strata),
        "ts": st.none() | NUMBERS,
        "y": st.sampled_from([None, 0, 1]),
    }
    bad_features = st.one_of(
        st.fixed_dictionaries({name: ANY_VALUE for name in names}),
        st.dictionaries(st.sampled_from(names + ["extra"]), NUMBERS | ANY_VALUE, max_size=len(names) + 1),
        ANY_VALUE,
    )
    obj = {}
    for name, strategy in good.items():
        if name not in corrupt:
            if name in ("ts", "y") and not draw(st.booleans()):
                continue  # optional fields may be absent
            obj[name] = draw(strategy)
        elif draw(st.booleans()):
            obj[name] = draw(bad_features if name == "features" else ANY_VALUE)
        # else: a corrupted field is dropped
    if "extra" in corrupt:
        obj[draw(st.text(min_size=1, max_size=6).filter(lambda k: k not in good))] = draw(ANY_VALUE)
    return obj


def json_bytes(strategy):
    return strategy.map(lambda v: json.dumps(v).encode())


RAW_VALUES = st.none() | st.binary(max_size=200)


@st.composite
def near_valid_embeddings(draw, dim=DIM):
    corrupt = draw(st.sets(st.sampled_from(("id", "vector", "group", "extra")), max_size=2))
    obj = {}
    good = {"id": IDS, "vector": st.lists(NUMBERS, min_size=dim, max_size=dim),
            "group": st.none() | st.integers() | st.text(max_size=5)}
    for name, strategy in good.items():
        if name not in corrupt:
            if name == "group" and not draw(st.booleans()):
                continue
            obj[name] = draw(strategy)
        elif draw(st.booleans()):
            if name == "vector":
                obj[name] = draw(st.lists(NUMBERS | ANY_VALUE, max_size=dim + 2) | ANY_VALUE)
            else:
                obj[name] = draw(ANY_VALUE)
    if "extra" in corrupt:
        obj[draw(st.text(min_size=1, max_size=6).filter(lambda k: k not in good))] = draw(ANY_VALUE)
    return obj


# --------------------------------------------------------------------------- fuzzing decode_records


@PROPERTY
@given(st.lists(RAW_VALUES, max_size=20))
def test_arbitrary_bytes_never_raise_and_partition_the_batch(values):
    check_batch(decode_records(values, ADULT), values, ADULT)


@PROPERTY
@given(st.lists(json_bytes(JSON_VALUES | HUGE_INTS), max_size=20))
def test_arbitrary_json_values_never_raise_and_partition_the_batch(values):
    check_batch(decode_records(values, ADULT), values, ADULT)


@PROPERTY
@given(st.sampled_from([ADULT, STRING_GROUPS]).flatmap(
    lambda config: st.tuples(st.just(config), st.lists(
        json_bytes(near_valid_records(config)) | RAW_VALUES | json_bytes(JSON_VALUES), max_size=20))))
def test_near_valid_records_never_raise_and_partition_the_batch(config_and_values):
    config, values = config_and_values
    check_batch(decode_records(values, config), values, config)


@PROPERTY
@given(st.lists(json_bytes(near_valid_records(ADULT)), min_size=1, max_size=10))
def test_every_record_is_either_used_or_refused_consistently_with_a_batch_of_one(values):
    # Validation is per record: a value's fate does not depend on its neighbours.
    batch = decode_records(values, ADULT)
    for i, value in enumerate(values):
        alone = decode_records([value], ADULT)
        assert (i in batch.index.tolist()) == (alone.index.tolist() == [0])
        if alone.errors:
            assert (i, alone.errors[0][1]) in batch.errors


def reference_decode(value, config):
    """The reference path alone: (fields, row) of an accepted value, or the reason it is refused."""
    try:
        obj = codec._parse(value, config.max_message_bytes)
        row = codec._check_record(obj, config, frozenset(config.groups), frozenset(config.strata))
    except codec.Invalid as exc:
        return str(exc)
    outside = codec.range_errors(np.array([row]), config)  # checked on the decoded rows of both paths
    if outside:
        return outside[0][1]
    return [obj["id"], obj.get("ts"), obj.get("s"), obj["u"], obj.get("y")], row


TRICKY_VALUES = [
    b'\xef\xbb\xbf{"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1}',  # UTF-8 BOM
    b'{"id":1,"id":"2","features":{"age":3,"hours-per-week":4},"s":0,"u":1}',  # duplicate keys: the last wins
    b'{"id":1,"features":{"age":3,"age":true,"hours-per-week":4},"s":0,"u":1}',
    b'{"id":1,"features":{"age":1e400,"hours-per-week":4},"s":0,"u":1}',
    b'{"id":1,"features":{"age":NaN,"hours-per-week":4},"s":0,"u":1}',
    b'{"id":"a\\u0000b","features":{"age":3,"hours-per-week":4},"s":0,"u":1}',
    b'{"id":"\\ud800","features":{"age":3,"hours-per-week":4},"s":0,"u":1}',  # a lone surrogate
    b'{"id":' + b"9" * 5000 + b',"features":{"age":3,"hours-per-week":4},"s":0,"u":1}',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1,"ts":1e400}',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1,"ts":17}',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1,"y":2}',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":1.0,"u":1}',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":"0","u":1}',
    b' {"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1} ',
    b'{"id":1,"features":{"age":3,"hours-per-week":4},"s":0,"u":1}x',
    b'{"id":-0,"features":{"age":-0.0,"hours-per-week":4E2},"s":0,"u":1}',
]


@PROPERTY
@given(st.lists(json_bytes(near_valid_records(ADULT)) | RAW_VALUES | json_bytes(JSON_VALUES | HUGE_INTS), max_size=10))
def test_the_typed_decoder_accepts_exactly_what_the_reference_path_accepts(values):
    for value, config in itertools.product(values + TRICKY_VALUES, (ADULT, IMPUTING, UNBOUNDED)):
        expected = reference_decode(value, config)
        batch = decode_records([value], config)
        if isinstance(expected, str):
            assert batch.errors == [(0, expected)]
        else:
            fields, row = expected
            got = [column[0] for column in (batch.fields.ids, batch.fields.ts, batch.fields.s, batch.fields.u,
                                            batch.fields.y)]
            assert got == fields and [type(v) for v in got] == [type(v) for v in fields]
            assert batch.X[0].tolist() == row


IMPUTING = adult_config(records=AgentConfig(artifact="plan", missing_s="impute"))
UNBOUNDED = adult_config(valid_ranges={})  # every finite value is valid: the decoder's own edge cases


@st.composite
def valid_input_records(draw, config):
    """Records the one-pass path accepts: ids (64-bit integers, strings), labels, event times, features."""
    ids = st.integers(-(2**63), 2**63 - 1) | st.text(min_size=1, max_size=12).filter(lambda rid: "\x00" not in rid)
    obj = {"id": draw(ids),
           "features": {name: draw(st.integers(0, 100) | st.floats(0.0, 100.0)) for name in config.features},
           "s": draw(st.sampled_from(config.groups)), "u": draw(st.sampled_from(config.strata))}
    for name, values in (("ts", st.none() | NUMBERS), ("y", st.sampled_from([None, 0, 1]))):
        if draw(st.booleans()):
            obj[name] = draw(values)
    return obj


def decoded_rows(batch) -> list:
    """Each usable record of a decoded batch as (position, fields with their types, features, key, digest)."""
    fields = batch.fields
    columns = (fields.ids, fields.ts, fields.s, fields.u, fields.y)
    return [(int(batch.index[k]), [(c[k], type(c[k])) for c in columns], batch.X[k].tolist(), str(batch.keys[k]),
             fields.digests[k]) for k in range(len(batch.index))]


def reference_rows(values, config) -> tuple[list, list]:
    """What the reference path alone gives every value: the rows of the accepted ones, the reasons of the others."""
    rows, errors = [], []
    for i, value in enumerate(values):
        expected = reference_decode(value, config)
        if isinstance(expected, str):
            errors.append((i, expected))
        else:
            fields, row = expected
            rows.append((i, [(v, type(v)) for v in fields], row, str(fields[0]), codec.input_digest(value)))
    return rows, errors


@PROPERTY
@given(st.sampled_from([ADULT, STRING_GROUPS, IMPUTING]).flatmap(lambda config: st.tuples(
    st.just(config), st.lists(json_bytes(valid_input_records(config)), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 12), json_bytes(near_valid_records(config)) | RAW_VALUES
                       | st.sampled_from(TRICKY_VALUES)), max_size=3))))
def test_a_batch_is_decoded_in_one_pass_exactly_as_the_reference_path_decodes_each_message(batch):
    # A batch of valid records takes the one-pass path; one refused value sends it message by message. Either
    # way, every value comes out as the reference path alone decides: the same fields of the same types, the
    # same features, key and digest, or the same reason.
    config, values, inserted = batch
    assert codec._FastRecords.for_config(config).decode_all(values) is not None
    mixed = list(values)
    for position, value in inserted:
        mixed.insert(position, value)
    for candidate in (values, mixed):
        decoded = decode_records(candidate, config)
        rows, errors = reference_rows(candidate, config)
        assert decoded_rows(decoded) == rows and decoded.errors == errors


JSON_SCALAR_VALUES = (st.none() | st.booleans() | st.integers() | HUGE_INTS | FINITE | st.sampled_from(TRICKY_FLOATS)
                      | st.text(max_size=8) | st.sampled_from([",", "[", "]", "{", "a,b", '"', "null", "\\", "\u2028"]))


@PROPERTY
@given(st.lists(JSON_SCALAR_VALUES, max_size=12))
def test_a_column_of_scalars_is_written_as_the_json_text_of_each_value(values):
    tokens = codec._json_tokens(values)
    assert len(tokens) == len(values)
    assert tokens == [codec._scalar_json(value) for value in values]  # a value's text ignores its neighbours
    for token, value in zip(tokens, values):
        back = strict_loads(token)
        assert back == value and type(back) is type(value)
        if isinstance(value, float):
            assert same_float(back, value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1], {"a": 1}, [], {}])
def test_a_column_with_a_value_that_is_not_a_json_scalar_is_refused(value):
    for column in ([value], ["a", value, 1], [None, value]):
        with pytest.raises(ValueError, match="not a JSON scalar"):
            codec._json_tokens(column)


def test_an_imputing_input_accepts_a_record_without_s_and_nothing_else_new():
    base = {"id": 1, "features": {"age": 30, "hours-per-week": 40}, "u": 1}
    for value in (raw(base), raw({**base, "s": None})):
        assert decode_records([value], IMPUTING).fields.s == [None]
        assert decode_records([value], ADULT).errors
    for bad in ({**base, "s": 7}, {**base, "s": True}, {**base, "s": "0"}):
        assert "not a configured group" in decode_records([raw(bad)], IMPUTING).errors[0][1]


def test_empty_batch():
    batch = decode_records([], ADULT)
    assert batch.index.shape == (0,) and batch.errors == [] and len(batch.fields) == 0
    assert batch.X.shape == (0, 2) and batch.keys.shape == (0,)
    assert len(batch.s) == 0 and len(batch.u) == 0


def test_mixed_batch_keeps_positions_and_order():
    values = [raw(record(id="a")), b"", raw(record(id=2, s=1, u=0)), b"{", None,
              raw(record(id="c", features={"age": 1, "hours-per-week": 2}))]
    batch = decode_records(values, ADULT)
    check_batch(batch, values, ADULT)
    assert batch.index.tolist() == [0, 2, 5]
    assert [i for i, _ in batch.errors] == [1, 3, 4]
    assert batch.keys.tolist() == ["a", "2", "c"]
    assert batch.X.tolist() == [[10.0, 20.0], [10.0, 20.0], [1.0, 2.0]]
    assert batch.s.dtype == np.int64 and batch.s.tolist() == [0, 1, 0]
    assert batch.u.dtype == np.int64 and batch.u.tolist() == [1, 0, 1]


# --------------------------------------------------------------------------- reasons, one per kind of bad input


GOOD = raw(record())

BAD_RECORDS = {
    # name: (value, the reason, or a prefix of it when it carries the parser's message)
    "empty bytes": (b"", "empty message"),
    "None": (None, "empty message"),
    "malformed JSON": (b'{"id": 1, "features": ', "malformed JSON"),
    "trailing garbage": (GOOD + b"x", "malformed JSON"),
    "two objects": (GOOD + GOOD, "malformed JSON"),
    "non-UTF8 bytes": (b'{"id": "\xff\xfe\xfd", "features": {}, "s": 0, "u": 1}', "message is not UTF-8"),
    "lone continuation byte": (b"\x80", "message is not UTF-8"),
    "whitespace only": (b"   ", "malformed JSON"),
    "JSON array": (b"[1, 2]", "a record must be a JSON object, got list"),
    "JSON string": (b'"hello"', "a record must be a JSON object, got str"),
    "JSON number": (b"42", "a record must be a JSON object, got int"),
    "JSON null": (b"null", "a record must be a JSON object, got NoneType"),
    "JSON true": (b"true", "a record must be a JSON object, got bool"),
    "missing id": (raw(record(drop=["id"])), "missing field(s) ['id']"),
    "missing features": (raw(record(drop=["features"])), "missing field(s) ['features']"),
    "missing s": (raw(record(drop=["s"])), "missing field(s) ['s']"),
    "missing u": (raw(record(drop=["u"])), "missing field(s) ['u']"),
    "missing s and u": (raw(record(drop=["s", "u"])), "missing field(s) ['s', 'u']"),
    "empty object": (b"{}", "missing field(s) ['features', 'id', 's', 'u']"),
    "extra field": (raw(record(extra=1)), "unexpected field(s) ['extra']"),
    "output field on input": (raw(record(original={})), "unexpected field(s) ['original']"),
    "features a list": (raw(record(features=[30, 40])), "features must be a JSON object, got list"),
    "features a string": (raw(record(features="30,40")), "features must be a JSON object, got str"),
    "features null": (raw(record(features=None)), "features must be a JSON object, got NoneType"),
    "missing feature": (raw(record(features={"hours-per-week": 40})), "missing feature(s) ['age']"),
    "no features": (raw(record(features={})), "missing feature(s) ['age', 'hours-per-week']"),
    "extra feature": (raw(record(features={"age": 1, "hours-per-week": 2, "weight": 3})),
                      "unexpected feature(s) ['weight']"),
    "renamed feature": (raw(record(features={"age": 1, "hours_per_week": 2})), "missing feature(s) ['hours-per-week']"),
    "string feature": (raw(with_features(age="30", hours_per_week=40)), "feature 'age' has a non-numeric value '30'"),
    "bool feature": (raw(with_features(age=30, hours_per_week=True)),
                     "feature 'hours-per-week' has a non-numeric value True"),
    "null feature": (raw(with_features(age=None, hours_per_week=40)), "feature 'age' has a non-numeric value None"),
    "list feature": (raw(with_features(age=[30], hours_per_week=40)), "feature 'age' has a non-numeric value [30]"),
    "object feature": (raw(with_features(age={}, hours_per_week=40)), "feature 'age' has a non-numeric value {}"),
    "NaN feature": (b'{"id": 1, "features": {"age": NaN, "hours-per-week": 40}, "s": 0, "u": 1}',
                    "feature 'age' has a non-finite value nan"),
    "Infinity feature": (b'{"id": 1, "features": {"age": 30, "hours-per-week": Infinity}, "s": 0, "u": 1}',
                         "feature 'hours-per-week' has a non-finite value inf"),
    "-Infinity feature": (b'{"id": 1, "features": {"age": -Infinity, "hours-per-week": 40}, "s": 0, "u": 1}',
                          "feature 'age' has a non-finite value -inf"),
    "overflowing float literal": (b'{"id": 1, "features": {"age": 1e400, "hours-per-week": 40}, "s": 0, "u": 1}',
                                  "feature 'age' has a non-finite value inf"),
    "bool id": (raw(record(id=True)), "id must be a non-empty string or an integer, got True"),
    "false id": (raw(record(id=False)), "id must be a non-empty string or an integer, got False"),
    "float id": (raw(record(id=1.0)), "id must be a non-empty string or an integer, got 1.0"),
    "empty-string id": (raw(record(id="")), "id must be a non-empty string or an integer, got ''"),
    "list id": (raw(record(id=[1])), "id must be a non-empty string or an integer, got [1]"),
    "object id": (raw(record(id={"a": 1})), "id must be a non-empty string or an integer, got {'a': 1}"),
    "null id": (raw(record(id=None)), "id must be a non-empty string or an integer, got None"),
    "NaN id": (b'{"id": NaN, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}',
               "id must be a non-empty string or an integer, got nan"),
    "unseen s": (raw(record(s=2)), "s value 2 is not a configured group [0, 1]"),
    "string s for int groups": (raw(record(s="1")), "s value '1' is not a configured group [0, 1]"),
    "null s": (raw(record(s=None)), "s value None is not a configured group [0, 1]"),
    "true s": (raw(record(s=True)), "s value True is not a configured group [0, 1]"),
    "false s": (raw(record(s=False)), "s value False is not a configured group [0, 1]"),
    "NaN s": (b'{"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": NaN, "u": 1}',
              "s value nan is not a configured group [0, 1]"),
    "unseen u": (raw(record(u=7)), "u value 7 is not a configured stratum [0, 1]"),
    "string u for int strata": (raw(record(u="0")), "u value '0' is not a configured stratum [0, 1]"),
    "true u": (raw(record(u=True)), "u value True is not a configured stratum [0, 1]"),
    "y = 2": (raw(record(y=2)), "y must be 0 or 1, got 2"),
    "y = -1": (raw(record(y=-1)), "y must be 0 or 1, got -1"),
    "y = '1'": (raw(record(y="1")), "y must be 0 or 1, got '1'"),
    "y = 0.5": (raw(record(y=0.5)), "y must be 0 or 1, got 0.5"),
    "y = 1.0": (raw(record(y=1.0)), "y must be 0 or 1, got 1.0"),
    "y = [1]": (raw(record(y=[1])), "y must be 0 or 1, got [1]"),
    "string ts": (raw(record(ts="2024-01-01T00:00:00Z")), "ts has a non-numeric value '2024-01-01T00:00:00Z'"),
    "bool ts": (raw(record(ts=True)), "ts has a non-numeric value True"),
    "list ts": (raw(record(ts=[1])), "ts has a non-numeric value [1]"),
    "NaN ts": (b'{"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1, "ts": NaN}',
               "ts has a non-finite value nan"),
    "Infinity ts": (b'{"id": 1, "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1, "ts": Infinity}',
                    "ts has a non-finite value inf"),
}


@pytest.mark.parametrize("value, reason", list(BAD_RECORDS.values()), ids=list(BAD_RECORDS))
def test_bad_record_gets_its_reason(value, reason):
    got = one_error(value)
    if reason in ("malformed JSON", "message is not UTF-8"):
        assert got.startswith(reason + ": ")
    else:
        assert got == reason


def test_bad_records_in_one_batch_keep_their_own_reasons():
    values = [value for value, _ in BAD_RECORDS.values()] + [GOOD]
    batch = decode_records(values, ADULT)
    check_batch(batch, values, ADULT)
    assert batch.index.tolist() == [len(values) - 1]
    for (i, got), (_, reason) in zip(batch.errors, BAD_RECORDS.values()):
        assert got.startswith(reason)


def test_oversized_message_is_refused_and_the_limit_itself_is_allowed():
    limit = 120
    config = adult_config(max_message_bytes=limit)
    stub = raw(record(id=""))
    at_limit = raw(record(id="x" * (limit - len(stub))))
    assert len(at_limit) == limit
    accepted(at_limit, config)
    over = raw(record(id="x" * (limit - len(stub) + 1)))
    assert one_error(over, config) == f"message of {limit + 1} bytes exceeds the limit of {limit} bytes"


def test_oversized_garbage_is_refused_as_oversized_before_parsing():
    value = b"\xff" * (ADULT.max_message_bytes + 1)
    assert one_error(value) == (f"message of {ADULT.max_message_bytes + 1} bytes exceeds the limit of "
                                f"{ADULT.max_message_bytes} bytes")


def both_inputs() -> list:
    """(config, decoder, record maker) of records.in and of embeddings.in."""
    return [(ADULT, decode_records, record), (EMB, decode_embeddings, emb)]


@pytest.mark.parametrize("longest, too_long", [
    ("\U0001f600" * codec.MAX_ID_CHARS, "x" * (codec.MAX_ID_CHARS + 1)),
    (10 ** (codec.MAX_ID_CHARS - 1), -(10 ** codec.MAX_ID_CHARS)),
    (2**3300, 10**codec.MAX_ID_CHARS),  # the fast path's longest integer, and the reference path's first refusal
], ids=["text", "integer", "fast path's last integer"])
def test_an_id_is_a_record_key_of_at_most_max_id_chars_characters_on_both_inputs(longest, too_long):
    for config, decode, make in both_inputs():
        assert decode([raw(make(id=longest))], config).keys.tolist() == [str(longest)]
        assert one_error(raw(make(id=too_long)), config, decode) == (
            f"id must be at most {codec.MAX_ID_CHARS} characters long, got {len(str(too_long))}")


def test_an_id_with_a_lone_surrogate_is_refused_and_an_escaped_pair_is_one_character():
    # json.loads keeps a lone surrogate, which has no UTF-8 bytes: the output key of a keyless message crashed.
    for config, decode, make in both_inputs():
        assert one_error(raw(make(id="\ud800x")), config, decode) == (
            "id must be Unicode text without lone surrogates, got '\\ud800x'")
    pair = raw(record(id="x")).replace(b'"x"', b'"\\ud83d\\ude00"')
    assert accepted(pair).keys.tolist() == ["\U0001f600"]


# Inputs on which Python's json.loads raises something other than JSONDecodeError, or which it turns
# into values the validation then fails on with an exception rather than Invalid. Each must be
# dead-lettered with a reason (naming the field where there is one) and never raise.
PARSER_CRASHERS = {
    "deeply nested arrays": b"[" * 30_000 + b"]" * 30_000,
    "deeply nested objects": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "integer with more than 4300 digits": b'{"id": ' + b"7" * 5000 + b"}",
}
FIELD_CRASHERS = {
    "feature beyond the float range": (with_features(age=10**400, hours_per_week=40), "feature 'age'"),
    "negative feature beyond the float range": (with_features(age=30, hours_per_week=-(10**400)),
                                                "feature 'hours-per-week'"),
    "ts beyond the float range": (record(ts=10**400), "ts"),
    "list s": (record(s=[0]), "s value"),
    "object s": (record(s={"g": 0}), "s value"),
    "list u": (record(u=[1]), "u value"),
    "object u": (record(u={}), "u value"),
}
CRASHERS = [*PARSER_CRASHERS.values(), *(raw(obj) for obj, _ in FIELD_CRASHERS.values())]


@pytest.mark.parametrize("value", list(PARSER_CRASHERS.values()), ids=list(PARSER_CRASHERS))
def test_inputs_the_json_parser_raises_on_are_dead_lettered(value):
    assert len(value) <= ADULT.max_message_bytes
    one_error(value)


@pytest.mark.parametrize("value, field", list(FIELD_CRASHERS.values()), ids=list(FIELD_CRASHERS))
def test_values_validation_raises_on_are_dead_lettered_naming_the_field(value, field):
    assert field in one_error(raw(value))


def test_crashers_do_not_take_the_rest_of_the_batch_with_them():
    values = [GOOD, *CRASHERS, GOOD]
    batch = decode_records(values, ADULT)
    check_batch(batch, values, ADULT)
    assert batch.index.tolist() == [0, len(values) - 1]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_records_not_encoded_as_utf8_are_refused(encoding):
    # Kafka JSON is UTF-8 (RFC 8259 section 8.1); json.loads(bytes) silently guesses UTF-16/32.
    one_error(json.dumps(record()).encode(encoding))


def test_float_s_or_u_is_not_an_integer_group():
    # Groups are ints or strings (the config refuses floats); 1.0 must not pass as group 1,
    # just as True must not.
    assert one_error(raw(record(s=1.0))) == "s value 1.0 is not a configured group [0, 1]"
    assert one_error(raw(record(u=0.0))) == "u value 0.0 is not a configured stratum [0, 1]"


@pytest.mark.parametrize("y", [True, False])
def test_bool_y_is_not_a_label(y):
    # y = 1.0 is refused; true/false are not 0/1 either (the schema says Optional[int]).
    assert one_error(raw(record(y=y))) == f"y must be 0 or 1, got {y!r}"


@pytest.mark.parametrize("rid", ["a\x00", "\x00", "id\x00\x00"])
def test_ids_with_nul_are_refused(rid):
    # numpy's fixed-width str arrays drop trailing NULs, so "a\x00" and "a" would share a repair key.
    assert one_error(raw(record(id=rid))) == f"id must not contain NUL characters, got {rid!r}"


# --------------------------------------------------------------------------- valid edge cases


@pytest.mark.parametrize("rid, key", [
    (1, "1"), (0, "0"), (-3, "-3"), (10**30, str(10**30)), ("abc", "abc"), ("0", "0"), ("ü-é", "ü-é"),
    (" ", " "), ("a b\tc", "a b\tc"), ("x" * 200, "x" * 200),
])
def test_valid_ids(rid, key):
    assert accepted(raw(record(id=rid))).keys.tolist() == [key]


@pytest.mark.parametrize("features, row", [
    ({"age": 30, "hours-per-week": 40}, [30.0, 40.0]),
    ({"hours-per-week": 40, "age": 30}, [30.0, 40.0]),  # order in the message does not matter
    ({"age": 30.5, "hours-per-week": -0.25}, [30.5, -0.25]),
    ({"age": 0, "hours-per-week": -0.0}, [0.0, -0.0]),
    ({"age": 1e-300, "hours-per-week": 1.7976931348623157e308}, [1e-300, 1.7976931348623157e308]),
    ({"age": 2**60, "hours-per-week": -(2**60)}, [float(2**60), float(-(2**60))]),
])
def test_numeric_features(features, row):
    batch = accepted(raw(record(features=features)), UNBOUNDED)
    assert batch.X.tolist() == [row]
    assert all(same_float(a, b) for a, b in zip(batch.X[0].tolist(), row))


@pytest.mark.parametrize("changes", [
    {},  # neither ts nor y
    {"ts": None},
    {"y": None},
    {"ts": None, "y": None},
    {"ts": 1700000000},
    {"ts": 1700000000.123},
    {"ts": -1.5},
    {"y": 0},
    {"y": 1},
    {"ts": 0, "y": 0},
])
def test_optional_fields(changes):
    obj = record(**changes)
    batch = accepted(raw(obj))
    assert batch.fields == RecordFields.of([obj], [raw(obj)])


def test_json_with_whitespace_and_unicode_escapes_is_accepted():
    value = b' \n{ "id" : "\\u00fc" ,\n "features": {"age": 3e1, "hours-per-week": 4E1}, "s": 1, "u": 0 }\n '
    batch = accepted(value)
    assert batch.keys.tolist() == ["ü"] and batch.X.tolist() == [[30.0, 40.0]]


# --------------------------------------------------------------------------- string groups and strata


def test_string_groups_and_strata():
    values = [raw(record(STRING_GROUPS, id=1, s="f", u="lo")), raw(record(STRING_GROUPS, id=2, s="m", u="hi"))]
    batch = decode_records(values, STRING_GROUPS)
    check_batch(batch, values, STRING_GROUPS)
    assert batch.errors == []
    assert batch.s.tolist() == ["f", "m"] and batch.u.tolist() == ["lo", "hi"]
    assert list(batch.s == "f") == [True, False]


@pytest.mark.parametrize("changes, reason", [
    ({"s": 1}, "s value 1 is not a configured group ['f', 'm']"),
    ({"s": "F"}, "s value 'F' is not a configured group ['f', 'm']"),
    ({"s": "x"}, "s value 'x' is not a configured group ['f', 'm']"),
    ({"s": True}, "s value True is not a configured group ['f', 'm']"),
    ({"u": 0}, "u value 0 is not a configured stratum ['lo', 'hi']"),
    ({"u": "lo "}, "u value 'lo ' is not a configured stratum ['lo', 'hi']"),
])
def test_string_groups_refuse_other_values(changes, reason):
    assert one_error(raw(record(STRING_GROUPS, **changes)), STRING_GROUPS) == reason


def test_digit_string_groups_are_not_integers():
    config = adult_config(groups=("0", "1"), strata=("0", "1"))
    accepted(raw(record(config, s="1", u="0")), config)
    assert one_error(raw(record(config, s=1, u="0")), config) == "s value 1 is not a configured group ['0', '1']"
    assert one_error(raw(record(config, s="1", u=0)), config) == "u value 0 is not a configured stratum ['0', '1']"


def test_int_groups_refuse_their_text():
    assert one_error(raw(record(s="0"))) == "s value '0' is not a configured group [0, 1]"


# --------------------------------------------------------------------------- encode_repaired


@st.composite
def valid_records(draw, config):
    obj = {"id": draw(IDS), "features": {}, "s": draw(st.sampled_from(config.groups)),
           "u": draw(st.sampled_from(config.strata))}
    if draw(st.booleans()):
        obj["ts"] = draw(st.none() | st.integers(-(10**12), 10**12) | FINITE)
    if draw(st.booleans()):
        obj["y"] = draw(st.sampled_from([None, 0, 1]))
    return obj


@st.composite
def repaired_batches(draw, config):
    n = draw(st.integers(0, 6))
    d = len(config.features)
    X = draw(arrays(np.float64, (n, d), elements=REPAIRED_FLOATS))
    repaired = draw(arrays(np.float64, (n, d), elements=REPAIRED_FLOATS))
    records = [draw(valid_records(config)) for _ in range(n)]
    return records, X, repaired


def check_encoded(encoded, records, X, repaired, config, prov) -> None:
    assert len(encoded) == len(records)
    for rec, x, r, value in zip(records, X.tolist(), repaired.tolist(), encoded):
        obj = strict_loads(value)
        assert list(obj["features"]) == list(config.features)
        assert all(same_float(obj["features"][name], r[j]) for j, name in enumerate(config.features))
        if config.include_original:
            assert list(obj["original"]) == list(config.features)
            assert all(same_float(obj["original"][name], x[j]) for j, name in enumerate(config.features))
        else:
            assert "original" not in obj
        for name in ("id", "s", "u"):
            assert obj[name] == rec[name] and type(obj[name]) is type(rec[name])
        for name in ("ts", "y"):
            assert obj[name] == rec.get(name) and type(obj[name]) is type(rec.get(name))
            if isinstance(rec.get(name), float):
                assert same_float(obj[name], rec[name])
        assert obj["provenance"] == prov
        assert set(RepairedRecord.required_fields()) <= set(obj) <= set(RepairedRecord.field_names())


@PROPERTY
@given(st.sampled_from([ADULT, STRING_GROUPS]).flatmap(lambda c: st.tuples(st.just(c), repaired_batches(c))),
       st.booleans())
def test_encode_repaired_round_trips_exactly(config_and_batch, include_original):
    config, (records, X, repaired) = config_and_batch
    config = adult_config(groups=config.groups, strata=config.strata, include_original=include_original)
    encoded = encode_repaired(RecordFields.of(records), X, repaired, config, PROV)
    check_encoded(encoded, records, X, repaired, config, PROV)


def test_encode_repaired_tricky_floats():
    X = np.array([[0.1 + 0.2, 1e-300], [-0.0, 5e-324], [1.7976931348623157e308, 2.0**53 + 2]])
    repaired = X[::-1] * -1.0
    records = [record(id=i) for i in range(3)]
    encoded = encode_repaired(RecordFields.of(records), X, repaired, ADULT, PROV)
    check_encoded(encoded, records, X, repaired, ADULT, PROV)
    assert json.loads(encoded[0])["original"]["age"] == 0.30000000000000004
    assert math.copysign(1.0, json.loads(encoded[1])["original"]["age"]) == -1.0


def test_include_original_false_omits_original():
    config = adult_config(include_original=False)
    records = [record(id="a", ts=5, y=1)]
    X = np.array([[30.0, 40.0]])
    obj = json.loads(encode_repaired(RecordFields.of(records), X, X + 1, config, PROV)[0])
    assert "original" not in obj
    assert obj == {"id": "a", "ts": 5, "s": 0, "u": 1, "y": 1, "features": {"age": 31.0, "hours-per-week": 41.0},
                   "input_digest": None, "provenance": PROV}


def test_encode_repaired_of_an_empty_batch():
    assert encode_repaired(RecordFields.of([]), np.empty((0, 2)), np.empty((0, 2)), ADULT, PROV) == []


ESCAPED_NAMES = ('a"b', "ü", "back\\slash", "new\nline", "€ and 😀", "tab\there", "{}", "'quoted'")


def test_feature_names_needing_json_escaping_round_trip():
    config = adult_config(features=ESCAPED_NAMES)
    features = {name: float(j) + 0.5 for j, name in enumerate(ESCAPED_NAMES)}
    values = [raw(record(config, id="e", features=features))]
    batch = decode_records(values, config)
    check_batch(batch, values, config)
    assert batch.errors == []
    encoded = encode_repaired(batch.fields, batch.X, batch.X * 2, config, PROV)
    obj = strict_loads(encoded[0])
    assert obj["original"] == features
    assert obj["features"] == {name: 2 * v for name, v in features.items()}


@pytest.mark.parametrize("names", [("100%", "age"), ("a%sb", "c"), ("%r", "%%"), ("a%b", "x"), ("a%%b", "c")])
def test_feature_names_with_percent_signs_round_trip(names):
    # The names are spliced into a %-format template; a literal '%' must stay a literal.
    config = adult_config(features=names)
    X = np.array([[1.0, 2.0]])
    obj = strict_loads(encode_repaired(RecordFields.of([record(config)]), X, X + 1, config, PROV)[0])
    assert obj["features"] == {names[0]: 2.0, names[1]: 3.0}
    assert obj["original"] == {names[0]: 1.0, names[1]: 2.0}


def test_a_scored_batch_carries_each_record_s_score_and_decision_and_the_whole_chain():
    X = np.array([[1.0, 2.0], [3.0, 4.0]])
    prov = provenance([("flow", 4, "ab", ""), ("scorer", 2, "cd", "")])
    scored = {"score": np.array([0.25, 0.75]), "decision": np.array([0, 1])}
    records = [record(id=1), record(id=2)]
    encoded = encode_repaired(RecordFields.of(records), X, X + 1, ADULT, prov, added=scored)
    check_encoded(encoded, records, X, X + 1, ADULT, prov)
    objs = [strict_loads(v) for v in encoded]
    assert [(o["score"], o["decision"]) for o in objs] == [(0.25, 0), (0.75, 1)]
    assert [stage["version"] for stage in objs[0]["provenance"]["chain"]] == [4, 2]
    assert codec.decode_repaired(encoded, ADULT).decision.tolist() == [0, 1]
    assert codec.decode_repaired(encoded, ADULT).score.tolist() == [0.25, 0.75]  # what the records carry, exactly


def test_each_added_column_is_a_field_of_its_own_and_a_record_without_a_score_reads_back_without_one():
    X = np.array([[1.0, 2.0]])
    encoded = encode_repaired(RecordFields.of([record(id=1)]), X, X, ADULT, PROV, added={"decision": np.array([1])})
    obj = strict_loads(encoded[0])
    assert obj["decision"] == 1 and "score" not in obj
    back = codec.decode_repaired(encoded, ADULT)
    assert back.decision.tolist() == [1] and back.score is None
    with pytest.raises(ValueError, match="added columns must be of"):
        encode_repaired(RecordFields.of([record(id=1)]), X, X, ADULT, PROV, added={"margin": np.array([0.1])})


@pytest.mark.parametrize("seed", ["50%", "%s", "%(x)s", "%%"])
def test_provenance_with_percent_signs_round_trips(seed):
    prov = provenance([("plan", 1, "%d" * 4, seed)])
    X = np.array([[1.0, 2.0]])
    obj = strict_loads(encode_repaired(RecordFields.of([record()]), X, X, ADULT, prov)[0])
    assert obj["provenance"] == prov


@PROPERTY
@given(st.fixed_dictionaries({"kind": st.text(), "version": st.integers(0, 2**31), "sha256": st.text(),
                              "seed": st.text()}))
def test_any_provenance_round_trips(prov_fields):
    first = tuple(prov_fields[name] for name in ("kind", "version", "sha256", "seed"))
    prov = provenance([first, ("scorer", 1, "", "")])
    X = np.array([[1.0, 2.0]])
    check_encoded(encode_repaired(RecordFields.of([record()]), X, X, ADULT, prov), [record()], X, X, ADULT, prov)


def test_decode_then_encode_preserves_every_valid_record():
    values = [raw(record(id=i, ts=1.5 * i, y=i % 2, s=i % 2, u=(i // 2) % 2,
                         features={"age": 17 + i, "hours-per-week": 0.1 * i})) for i in range(10)]
    batch = decode_records(values, ADULT)
    assert batch.errors == []
    for value, out in zip(values, encode_repaired(batch.fields, batch.X, batch.X, ADULT, PROV)):
        obj, original = strict_loads(out), json.loads(value)
        assert obj["features"] == obj["original"] == {k: float(v) for k, v in original["features"].items()}
        assert {k: obj[k] for k in ("id", "ts", "s", "u", "y")} == {k: original[k] for k in ("id", "ts", "s", "u", "y")}


# --------------------------------------------------------------------------- embeddings


def emb(drop=(), **changes) -> dict:
    obj = {"id": "v1", "vector": [0.5, -1.0, 2.0, 0.0], "group": "a", "identity": 3}
    obj.update(changes)
    for name in drop:
        del obj[name]
    return obj


@PROPERTY
@given(st.lists(RAW_VALUES | json_bytes(JSON_VALUES) | json_bytes(near_valid_embeddings()), max_size=20))
def test_decode_embeddings_never_raises_and_partitions_the_batch(values):
    check_embeddings(decode_embeddings(values, EMB), values, DIM)


BAD_EMBEDDINGS = {
    "empty": (b"", "empty message"),
    "None": (None, "empty message"),
    "malformed": (b'{"id": ', "malformed JSON"),
    "non-UTF8": (b'{"id": "\xff", "vector": [1, 2, 3, 4]}', "message is not UTF-8"),
    "not an object": (b"[1, 2, 3, 4]", "a record must be a JSON object, got list"),
    "missing vector": (raw(emb(drop=["vector"])), "missing field(s) ['vector']"),
    "missing id": (raw(emb(drop=["id"])), "missing field(s) ['id']"),
    "extra field": (raw(emb(features={})), "unexpected field(s) ['features']"),
    "short vector": (raw(emb(vector=[1, 2, 3])), "vector has 3 values, expected 4"),
    "long vector": (raw(emb(vector=[1, 2, 3, 4, 5])), "vector has 5 values, expected 4"),
    "empty vector": (raw(emb(vector=[])), "vector has 0 values, expected 4"),
    "vector an object": (raw(emb(vector={"0": 1})), "vector must be a JSON array, got dict"),
    "vector a string": (raw(emb(vector="1,2,3,4")), "vector must be a JSON array, got str"),
    "vector null": (raw(emb(vector=None)), "vector must be a JSON array, got NoneType"),
    "string entry": (raw(emb(vector=[1, "2", 3, 4])), "vector[1] has a non-numeric value '2'"),
    "bool entry": (raw(emb(vector=[1, 2, 3, False])), "vector[3] has a non-numeric value False"),
    "null entry": (raw(emb(vector=[None, 2, 3, 4])), "vector[0] has a non-numeric value None"),
    "nested entry": (raw(emb(vector=[1, [2], 3, 4])), "vector[1] has a non-numeric value [2]"),
    "NaN entry": (b'{"id": 1, "vector": [1, NaN, 3, 4]}', "vector[1] has a non-finite value nan"),
    "-Infinity entry": (b'{"id": 1, "vector": [1, 2, 3, -Infinity]}', "vector[3] has a non-finite value -inf"),
    "bool id": (raw(emb(id=True)), "id must be a non-empty string or an integer, got True"),
    "float id": (raw(emb(id=2.5)), "id must be a non-empty string or an integer, got 2.5"),
    "empty id": (raw(emb(id="")), "id must be a non-empty string or an integer, got ''"),
}


@pytest.mark.parametrize("value, reason", list(BAD_EMBEDDINGS.values()), ids=list(BAD_EMBEDDINGS))
def test_bad_embedding_gets_its_reason(value, reason):
    got = one_error(value, EMB, decode_embeddings)
    if reason in ("malformed JSON", "message is not UTF-8"):
        assert got.startswith(reason + ": ")
    else:
        assert got == reason


@pytest.mark.parametrize("value", [
    raw(emb(vector=[1, 2, 3, 10**400])),
    b'{"id": 1, "vector": [' + b"[" * 30_000 + b"]" * 30_000 + b"]}",
], ids=["entry beyond the float range", "deeply nested vector"])
def test_embedding_inputs_that_make_python_raise_are_dead_lettered(value):
    assert len(value) <= EMB.max_message_bytes
    one_error(value, EMB, decode_embeddings)


@pytest.mark.parametrize("changes, drop", [({}, []), ({}, ["group"]), ({"group": None}, []), ({"group": 3}, []),
                                           ({"id": 7}, []), ({"vector": [1, 2, 3, 4]}, [])])
def test_valid_embeddings(changes, drop):
    obj = emb(drop=drop, **changes)
    batch = decode_embeddings([raw(obj)], EMB)
    assert batch.errors == [] and batch.records == [{"id": obj["id"], "group": obj.get("group"), "identity": 3}]
    assert batch.keys.tolist() == [str(obj["id"])]
    assert batch.vectors.tolist() == [[float(v) for v in obj["vector"]]]


@st.composite
def embedding_batches(draw):
    n = draw(st.integers(0, 6))
    vectors = draw(arrays(np.float64, (n, DIM), elements=REPAIRED_FLOATS))
    records = []
    for _ in range(n):
        obj = {"id": draw(IDS), "vector": []}
        if draw(st.booleans()):
            obj["group"] = draw(st.none() | st.integers() | st.text(max_size=8))  # a label, as decoded
        records.append(obj)
    return records, vectors


@PROPERTY
@given(embedding_batches())
def test_encode_embeddings_round_trips_exactly(batch):
    records, vectors = batch
    encoded = encode_embeddings(records, vectors, PROV)
    assert len(encoded) == len(records)
    for rec, v, value in zip(records, vectors.tolist(), encoded):
        obj = strict_loads(value)
        assert set(obj) == {"id", "group", "vector", "input_digest", "provenance"} and obj["input_digest"] is None
        assert obj["id"] == rec["id"] and type(obj["id"]) is type(rec["id"])
        assert obj["group"] == rec.get("group")
        assert len(obj["vector"]) == DIM and all(same_float(a, b) for a, b in zip(obj["vector"], v))
        assert obj["provenance"] == PROV


def test_decode_then_encode_embeddings():
    values = [raw(emb(id=i, vector=[0.1 * i, 0.1 + 0.2, -0.0, 1e-300], group=["a", "b"][i % 2])) for i in range(5)]
    batch = decode_embeddings(values, EMB)
    check_embeddings(batch, values, DIM)
    for value, out in zip(values, encode_embeddings(batch.records, batch.vectors, PROV, batch.digests)):
        obj, original = strict_loads(out), json.loads(value)
        assert obj["input_digest"] == input_digest(value)
        assert obj["vector"] == original["vector"] and obj["group"] == original["group"] and obj["id"] == original["id"]
        assert math.copysign(1.0, obj["vector"][2]) == -1.0


# --------------------------------------------------------------------------- dead letters


@PROPERTY
@given(value=st.none() | st.binary(max_size=300), reason=st.text(max_size=MAX_REASON_CHARS),
       topic=st.text(min_size=1, max_size=249), partition=st.integers(0, 2**31 - 1), offset=st.integers(0, 2**63 - 1),
       agent=st.sampled_from(["records", "embeddings"]), key=st.none() | st.binary(min_size=1, max_size=40))
def test_dead_letter_keeps_the_exact_original_bytes(value, reason, topic, partition, offset, agent, key):
    envelope = dead_letter(value, reason, topic, partition, offset, agent, key=key)
    assert isinstance(envelope, bytes)
    letter = strict_loads(envelope)
    assert set(letter) == set(DeadLetter.field_names())
    assert (letter["reason"], letter["agent"], letter["topic"], letter["partition"], letter["offset"]) == (
        reason, agent, topic, partition, offset)
    assert original_bytes(letter) == (value or b"")
    assert letter["key_b64"] == (base64.b64encode(key).decode() if key else None)
    assert (letter["key_size"], letter["key_sha256"], letter["key_truncated"]) == (
        (len(key), hashlib.sha256(key).hexdigest(), False) if key else (None, None, False))
    assert dead_letter_key(key) == key  # a key that fits is the dead letter's own key, unchanged


@pytest.mark.parametrize("value", [b"", None, b"\xff\xfe\x00", b"\x00", GOOD, b"[" * 1000, bytes(range(256))])
def test_dead_letter_of_special_values(value):
    letter = json.loads(dead_letter(value, "why", "fairstream.records.in", 3, 42, "records"))
    assert original_bytes(letter) == (value or b"")
    assert letter["key_b64"] is None
    assert (letter["reason"], letter["topic"], letter["partition"], letter["offset"], letter["agent"]) == (
        "why", "fairstream.records.in", 3, 42, "records")


def test_dead_letter_of_every_refused_record():
    values = [value for value, _ in BAD_RECORDS.values()]
    batch = decode_records(values, ADULT)
    assert len(batch.errors) == len(values)
    for i, reason in batch.errors:
        letter = json.loads(dead_letter(values[i], reason, "fairstream.records.in", 0, i, "records", key=b"k"))
        assert letter["reason"] == reason and original_bytes(letter) == (values[i] or b"")
        assert base64.b64decode(letter["key_b64"]) == b"k"


# --------------------------------------------------------------------------- schema classes


def test_input_schema_fields():
    assert set(InputRecord.required_fields()) == {"id", "features", "s", "u"}
    assert set(InputRecord.field_names()) == {"id", "features", "s", "u", "ts", "y"}
    assert set(EmbeddingRecord.required_fields()) == {"id", "vector"}
    assert set(EmbeddingRecord.field_names()) == {"id", "vector", "group", "identity"}


@pytest.mark.parametrize("name", InputRecord.required_fields())
def test_every_required_input_field_is_enforced(name):
    assert one_error(raw(record(drop=[name]))) == f"missing field(s) [{name!r}]"


@pytest.mark.parametrize("name", sorted(set(InputRecord.field_names()) - set(InputRecord.required_fields())))
def test_every_optional_input_field_may_be_absent_or_present(name):
    full = record(ts=1.0, y=1)
    assert set(full) == set(InputRecord.field_names())
    accepted(raw(full))
    accepted(raw({k: v for k, v in full.items() if k != name}))


def test_only_schema_fields_are_allowed_on_input():
    minimal = {k: v for k, v in record().items() if k in InputRecord.required_fields()}
    accepted(raw(minimal))
    for name in set(RepairedRecord.field_names()) - set(InputRecord.field_names()):
        assert one_error(raw(record(**{name: {}}))) == f"unexpected field(s) [{name!r}]"


@pytest.mark.parametrize("name", EmbeddingRecord.required_fields())
def test_every_required_embedding_field_is_enforced(name):
    assert one_error(raw(emb(drop=[name])), EMB, decode_embeddings) == f"missing field(s) [{name!r}]"


def test_only_schema_fields_are_allowed_on_embeddings():
    optional = set(EmbeddingRecord.field_names()) - set(EmbeddingRecord.required_fields())
    for name in optional:
        assert decode_embeddings([raw(emb(drop=[name]))], EMB).errors == []
    assert one_error(raw(emb(s=0)), EMB, decode_embeddings) == "unexpected field(s) ['s']"


def test_repaired_output_matches_its_schema():
    X = np.array([[30.0, 40.0]])
    for include_original in (True, False):
        config = adult_config(include_original=include_original)
        obj = json.loads(encode_repaired(RecordFields.of([record(ts=1, y=0)]), X, X, config, PROV)[0])
        assert set(RepairedRecord.required_fields()) <= set(obj) <= set(RepairedRecord.field_names())
        assert ("original" in obj) == include_original


# --------------------------------------------------------------------------- poison inputs, non-JSON outputs

DEPTH = 2_000  # deeper than msgspec's and json's recursion limits, 4 KB: a message of the red team's kind


@pytest.mark.parametrize("field", ["id", "vector", "group", "identity", "extra"])
def test_deep_nesting_in_any_embedding_field_is_dead_lettered_not_raised(field):
    # msgspec raises RecursionError (not DecodeError) on a deep `group`: every batch holding it raised.
    deep = "[" * DEPTH + "]" * DEPTH
    obj = {"id": '"e"', "vector": "[" + ",".join(["0.5"] * DIM) + "]", field: deep}
    value = ("{" + ",".join(f'"{k}":{v}' for k, v in obj.items()) + "}").encode()
    batch = decode_embeddings([value, raw(emb(id="next"))], EMB)
    assert batch.keys.tolist() == ["next"] and [i for i, _ in batch.errors] == [0]


@pytest.mark.parametrize("field", ["group", "identity"])
@pytest.mark.parametrize("text, shown", [
    ("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e999", "inf"), ("1.5", "1.5"), ("1.0", "1.0"),
    ("true", "true"), ("[1]", "a JSON array"), ('{"x": [NaN]}', "a JSON object"),
    ("[" * 900 + "]" * 900, "a JSON array"),
])
def test_an_embedding_group_or_identity_that_is_not_a_label_is_dead_lettered_naming_the_field(field, text, shown):
    # A group of NaN, Infinity or 1e999 was repaired and written as {"group":NaN}: not JSON.
    value = ('{"id": "e", "vector": [1, 2, 3, 4], "%s": %s}' % (field, text)).encode()
    assert one_error(value, EMB, decode_embeddings) == f"{field} must be an integer or a string, got {shown}"


@pytest.mark.parametrize("group", [0, -3, 10**300, "a", "\u00e9t\u00e9", ""])
def test_an_embedding_group_that_is_a_label_comes_out_unchanged(group):
    value = raw(emb(group=group))
    batch = decode_embeddings([value], EMB)
    assert batch.errors == [] and batch.records[0]["group"] == group
    assert strict_loads(encode_embeddings(batch.records, batch.vectors, PROV)[0])["group"] == group


@pytest.mark.parametrize("decode, value", [(decode_records, GOOD), (decode_embeddings, raw(emb()))],
                         ids=["records", "embeddings"])
def test_no_exception_of_one_message_escapes_the_decoder_of_a_batch(monkeypatch, decode, value, caplog):
    # Whatever a decoder raises on one message (here: the reference path raising MemoryError on it), that
    # message is dead-lettered with a reason naming the error, the others are decoded, the batch goes on.
    real = codec._parse

    def failing(raw_value, limit):
        if raw_value == b"{poison":
            raise MemoryError("out of memory on this message")
        return real(raw_value, limit)

    monkeypatch.setattr(codec, "_parse", failing)
    config = EMB if decode is decode_embeddings else ADULT
    batch = decode([value, b"{poison", value], config)
    assert batch.index.tolist() == [0, 2]
    assert batch.errors == [(1, "the record could not be decoded (MemoryError: out of memory on this message)")]
    assert [r.levelname for r in caplog.records if "made the decoder raise" in r.getMessage()] == ["ERROR"]


NON_FINITE = [math.nan, math.inf, -math.inf]


@PROPERTY
@given(arrays(np.float64, st.tuples(st.integers(0, 8), st.just(2)),
              elements=REPAIRED_FLOATS | st.sampled_from(NON_FINITE)),
       st.lists(st.sampled_from([0.5, *NON_FINITE]), min_size=8, max_size=8))
def test_rows_with_a_non_finite_output_are_found_and_the_others_encode_as_strict_json(repaired, scores):
    score = np.array(scores[:len(repaired)])
    bad = non_finite_rows({"features": (repaired, ADULT.features), "score": (score, None)})
    finite = np.isfinite(repaired).all(axis=1) & np.isfinite(score)
    assert [row for row, _ in bad] == np.flatnonzero(~finite).tolist()
    for row, reason in bad:
        assert "which JSON cannot carry" in reason
        assert ("features['" in reason) == (not np.isfinite(repaired[row]).all())
    ok = np.flatnonzero(finite)
    records = [record(id=int(i)) for i in ok]
    scored = {"score": score[ok], "decision": np.zeros(len(ok), dtype=np.int64)}
    for value in encode_repaired(RecordFields.of(records), repaired[ok], repaired[ok], ADULT, PROV, added=scored):
        strict_loads(value)


def test_a_non_finite_reason_names_the_field_and_the_value():
    repaired = np.array([[1.0, 2.0], [3.0, math.inf]])
    assert non_finite_rows({"features": (repaired, ADULT.features)}) == [
        (1, "the output's features['hours-per-week'] would be inf, which JSON cannot carry (no NaN or infinity is "
            "written): the record is not sent")]
    vectors = np.array([[0.0, math.nan, 1.0]])
    assert non_finite_rows({"vector": (vectors, None)})[0][1].startswith("the output's vector[1] would be nan")
    assert non_finite_rows({"score": (np.array([0.5, -math.inf]), None)})[0][1].startswith(
        "the output's score would be -inf")


@pytest.mark.parametrize("where", ["repaired", "original", "score"])
def test_the_record_encoder_never_writes_a_nan_or_an_infinity(where):
    # Floats are written with %r: an inf reaching the encoder was written as `inf`, which is not JSON.
    X, repaired, score = np.array([[30.0, 40.0]]), np.array([[31.0, 41.0]]), np.array([0.5])
    {"repaired": repaired, "original": X, "score": score}[where][0, ...] = math.inf
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode_repaired(RecordFields.of([record()]), X, repaired, ADULT, PROV,
                        added={"score": score, "decision": np.array([1])})


def test_the_embedding_encoder_never_writes_a_nan_or_an_infinity():
    # msgspec writes NaN as null: a vector of nulls is JSON, but silently not the vector.
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode_embeddings([{"id": "e"}], np.array([[0.5, math.nan, 0.0, 0.0]]), PROV)
    for group in (math.nan, math.inf, -math.inf, [1], {"a": 1}):
        with pytest.raises(ValueError, match="not a JSON scalar"):
            encode_embeddings([{"id": "e", "group": group}], np.zeros((1, DIM)), PROV)


def test_a_reader_of_records_repaired_leaves_out_what_it_cannot_read_and_never_raises():
    X = np.array([[30.0, 40.0]])
    good = encode_repaired(RecordFields.of([record(id="ok")]), X, X + 1, ADULT, PROV)[0]
    obj = json.loads(good)

    def changed(**fields) -> bytes:
        return json.dumps({**obj, **fields}).encode()

    unreadable = [
        b"{", b"[" * DEPTH + b"]" * DEPTH, b'"a string"', b"\xff",
        changed(provenance={**PROV, "version": 2**63}),  # a squatted version: OverflowError in the array
        changed(provenance={**PROV, "version": "7"}), changed(provenance=None),
        changed(features={"age": float("nan"), "hours-per-week": 1.0}), changed(original={"age": 1.0}),
        changed(s=7), changed(u=[1]), changed(y=2), changed(decision=True), changed(ts="now"), changed(id=[1]),
    ]
    not_measured = [changed(original=None), changed(s=None, s_imputed=True)]
    batch = codec.decode_repaired([good, *unreadable, *not_measured, good], ADULT)
    assert batch.unreadable == len(unreadable) and batch.keys.tolist() == ["ok", "ok"]
    assert batch.after.tolist() == [[31.0, 41.0]] * 2 and batch.versions.tolist() == [3, 3]


@pytest.mark.parametrize("ts", ["1" + "0" * 400, "-" + "9" * 400])
def test_a_refit_request_with_an_integer_beyond_the_float_range_is_refused_not_raised(ts):
    value = ('{"request_id": "r", "kind": "plan", "reason": "drift", "ts": %s}' % ts).encode()
    with pytest.raises(codec.RefitRequestError, match="'ts' must be a finite number"):
        codec.parse_request(value)



# --------------------------------------------------------------------------- docstring


def test_docstring_example():
    result = doctest.testmod(codec, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2 and result.failed == 0


# A character of each JSON escape length (1, 2, 6, 12 bytes), so reasons quoting them grow the most.
ESCAPED = ["a", '"', "\x01", "\u20ac", "\U0001f600"]


def producer_bytes(key: bytes | None, value: bytes) -> int:
    """What the worker's producer (aiokafka) counts against its max_request_size for one record."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])


@settings(max_examples=40, deadline=None)
@given(key_size=st.sampled_from([0, 1, MAX_DEAD_LETTER_KEY, MAX_DEAD_LETTER_KEY + 1, 460_000, MAX_OUTPUT_BYTES])
       | st.integers(0, MAX_OUTPUT_BYTES + 100),
       value_size=st.sampled_from([0, MAX_DEAD_LETTER_ORIGINAL, MAX_DEAD_LETTER_ORIGINAL + 1, 3_000_000])
       | st.integers(0, 2 * MAX_OUTPUT_BYTES),
       reason_char=st.sampled_from(ESCAPED), reason_length=st.integers(0, 3 * MAX_REASON_CHARS))
def test_a_dead_letter_with_its_key_fits_under_the_producer_limit_whatever_arrived(key_size, value_size, reason_char,
                                                                                  reason_length):
    key = (bytes(range(256)) * (key_size // 256 + 1))[:key_size] or None
    value = (b"v" * value_size) or None
    reason = "feature 'age' has a non-numeric value " + reason_char * reason_length
    letter_bytes = dead_letter(value, reason, "p" * 200 + ".records.in", 2**31 - 1, 2**63 - 1, "embeddings", key=key)
    kafka_key = dead_letter_key(key)
    assert output_bytes(kafka_key, letter_bytes) <= MAX_OUTPUT_BYTES
    assert producer_bytes(kafka_key, letter_bytes) <= MAX_OUTPUT_BYTES
    letter = strict_loads(letter_bytes)
    # What was cut is named by its full size and sha256; what was kept is the start of it.
    assert original_bytes(letter) == (value or b"")[:MAX_DEAD_LETTER_ORIGINAL]
    assert letter["original_truncated"] == (value_size > MAX_DEAD_LETTER_ORIGINAL)
    assert letter["original_size"] == value_size
    assert letter["original_sha256"] == hashlib.sha256(value or b"").hexdigest()
    if key:
        assert base64.b64decode(letter["key_b64"]) == kafka_key == key[:MAX_DEAD_LETTER_KEY]
        assert (letter["key_size"], letter["key_sha256"]) == (key_size, hashlib.sha256(key).hexdigest())
        assert letter["key_truncated"] == (key_size > MAX_DEAD_LETTER_KEY)
    else:
        assert letter["key_b64"] is None and kafka_key is None
    assert len(letter["reason"]) == min(len(reason), MAX_REASON_CHARS) and letter["reason"][:30] == reason[:30]


def test_the_460_kb_key_of_the_issue_gives_a_dead_letter_under_the_limit():
    key = b"k" * 460_000  # with its base64 copy, the dead letter was 1,073,799 bytes
    letter_bytes = dead_letter(b'{"id": "x"}', "missing field(s) ['features']", "fairstream.records.in", 0, 7,
                               "records", key=key)
    assert producer_bytes(dead_letter_key(key), letter_bytes) <= MAX_OUTPUT_BYTES
    letter = json.loads(letter_bytes)
    assert letter["key_truncated"] and letter["key_size"] == 460_000 and not letter["original_truncated"]


@pytest.mark.parametrize("size", [500_000, 800_000, 1_500_000, 3_000_000])
def test_a_dead_letter_fits_under_the_message_limit_whatever_arrived(size):
    value = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    letter_bytes = dead_letter(value, "oversized", "fs.records.in", 3, 17, "records", key=b"k")
    assert len(letter_bytes) < 1024 * 1024
    letter = json.loads(letter_bytes)
    kept = original_bytes(letter)
    assert letter["original_size"] == size and letter["original_sha256"] == hashlib.sha256(value).hexdigest()
    assert letter["original_truncated"] == (size > MAX_DEAD_LETTER_ORIGINAL)
    assert kept == value[:MAX_DEAD_LETTER_ORIGINAL]


# --------------------------------------------------------------------------- valid ranges (pipeline.valid_ranges)


@pytest.mark.parametrize("features, reason", [
    ({"age": 1e308, "hours-per-week": 40},
     "feature 'age' value 1e+308 is outside its valid range [0, 120] (pipeline.valid_ranges)"),
    ({"age": 30, "hours-per-week": -1},
     "feature 'hours-per-week' value -1.0 is outside its valid range [0, 168] (pipeline.valid_ranges)"),
    ({"age": -1e308, "hours-per-week": 1e9},  # both outside: the first feature is named
     "feature 'age' value -1e+308 is outside its valid range [0, 120] (pipeline.valid_ranges)"),
    ({"age": 120.00000000000001, "hours-per-week": 40},
     "feature 'age' value 120.00000000000001 is outside its valid range [0, 120] (pipeline.valid_ranges)"),
], ids=["huge", "negative hours", "both", "just above"])
def test_values_outside_the_valid_range_are_refused_with_the_range(features, reason):
    assert one_error(raw(record(features=features))) == reason


def test_the_valid_range_is_inclusive_and_bounds_only_the_features_it_names():
    accepted(raw(with_features(age=0, hours_per_week=168)))
    accepted(raw(with_features(age=120, hours_per_week=0)))
    only_age = adult_config(valid_ranges={"age": (0, 120)})
    accepted(raw(with_features(age=30, hours_per_week=1e308)), only_age)
    assert "'age'" in one_error(raw(with_features(age=121, hours_per_week=40)), only_age)
    one_sided = adult_config(valid_ranges={"hours-per-week": (0, math.inf)})
    accepted(raw(with_features(age=-5, hours_per_week=1e300)), one_sided)
    assert "[0, inf]" in one_error(raw(with_features(age=1, hours_per_week=-0.5)), one_sided)


def test_out_of_range_rows_leave_the_rest_of_the_batch_in_order():
    values = [raw(record(id="a")), raw(record(id="b", features={"age": 1e308, "hours-per-week": 40})), b"{",
              raw(record(id="c", s=1, u=0, ts=7, y=1)), raw(record(id="d", features={"age": -3, "hours-per-week": 40}))]
    batch = decode_records(values, ADULT)
    check_batch(batch, values, ADULT)
    assert batch.index.tolist() == [0, 3] and batch.keys.tolist() == ["a", "c"]
    assert [i for i, _ in batch.errors] == [1, 2, 4]
    assert batch.fields.ts == [None, 7] and batch.fields.y == [None, 1] and batch.s.tolist() == [0, 1]
    assert batch.fields.digests == [codec.input_digest(values[0]), codec.input_digest(values[3])]


# --------------------------------------------------------------------------- the input digest


def test_every_output_carries_the_digest_of_its_input_so_conflicts_differ_from_replays():
    first = raw(record(id="dup"))
    conflicting = raw(record(id="dup", features={"age": 31, "hours-per-week": 20}))  # the same id, other content
    values = [first, conflicting, first]  # the third is a replay of the first
    batch = decode_records(values, ADULT)
    out = [strict_loads(v) for v in encode_repaired(batch.fields, batch.X, batch.X, ADULT, PROV)]
    digests = [o["input_digest"] for o in out]
    assert digests == [hashlib.sha256(v).hexdigest()[:32] for v in values]
    assert digests[0] == digests[2] != digests[1]
    assert {o["id"] for o in out} == {"dup"} and {o["provenance"]["version"] for o in out} == {3}


def test_a_dead_letter_carries_the_digest_a_repaired_record_of_the_same_bytes_would():
    for value in (GOOD, b"{", None, b"x" * (MAX_DEAD_LETTER_ORIGINAL + 10)):
        letter = strict_loads(dead_letter(value, "why", "t", 0, 1, "records"))
        assert letter["input_digest"] == codec.input_digest(value) == letter["original_sha256"][:32]
    assert decode_records([GOOD], ADULT).fields.digests == [codec.input_digest(GOOD)]


@pytest.mark.parametrize("identity, ok", [(7, True), ("anna", True), (None, True), (True, False), (1.5, False),
                                          ([1], False)])
def test_an_embedding_identity_is_an_integer_or_a_string_and_comes_out_with_the_vector(identity, ok):
    config = adult_config()
    record = {"id": "e1", "vector": [0.0] * 8, "group": 0, **({} if identity is None else {"identity": identity})}
    decoded = codec.decode_embeddings([json.dumps(record).encode()], config)
    if not ok:
        assert decoded.errors and decoded.errors[0][1].startswith("identity must be an integer or a string")
        return
    out = strict_loads(codec.encode_embeddings(decoded.records, decoded.vectors, codec.provenance(
        [("identity", 0, "", "")]), decoded.digests)[0])
    assert out.get("identity") == identity
