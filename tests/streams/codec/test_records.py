"""Input records: every raw value ends as a usable row or as an error with a reason, never a crash."""

from __future__ import annotations

import doctest
import itertools
import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairstream.streams.codec import records
from fairstream.streams.codec.embeddings import decode_embeddings
from fairstream.streams.codec.records import RecordFields, decode_records
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.schemas import EmbeddingRecord, InputRecord, RepairedRecord

from .messages import (
    ADULT,
    ANY_VALUE,
    BAD_RECORDS,
    EMB,
    GOOD,
    HUGE_INTS,
    IDS,
    JSON_VALUES,
    NUMBERS,
    PROPERTY,
    RAW_VALUES,
    STRING_GROUPS,
    check_batch,
    emb,
    json_bytes,
    one_error,
    raw,
    record,
    same_float,
    with_features,
)


def accepted(value, config=ADULT):
    batch = decode_records([value], config)
    assert batch.errors == [], batch.errors
    assert batch.index.tolist() == [0]
    return batch


# --------------------------------------------------------------------------- strategies


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
        obj = records.parse_json_object(value, config.max_message_bytes)
        row = records._check_record(obj, config, frozenset(config.groups), frozenset(config.strata))
    except records.Invalid as exc:
        return str(exc)
    outside = records.range_errors(np.array([row]), config)  # checked on the decoded rows of both paths
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
            rows.append((i, [(v, type(v)) for v in fields], row, str(fields[0]), records.input_digest(value)))
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
    assert records._FastRecords.for_config(config).decode_all(values) is not None
    mixed = list(values)
    for position, value in inserted:
        mixed.insert(position, value)
    for candidate in (values, mixed):
        decoded = decode_records(candidate, config)
        rows, errors = reference_rows(candidate, config)
        assert decoded_rows(decoded) == rows and decoded.errors == errors


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
    ("\U0001f600" * records.MAX_ID_CHARS, "x" * (records.MAX_ID_CHARS + 1)),
    (10 ** (records.MAX_ID_CHARS - 1), -(10 ** records.MAX_ID_CHARS)),
    (2**3300, 10**records.MAX_ID_CHARS),  # the fast path's longest integer, and the reference path's first refusal
], ids=["text", "integer", "fast path's last integer"])
def test_an_id_is_a_record_key_of_at_most_max_id_chars_characters_on_both_inputs(longest, too_long):
    for config, decode, make in both_inputs():
        assert decode([raw(make(id=longest))], config).keys.tolist() == [str(longest)]
        assert one_error(raw(make(id=too_long)), config, decode) == (
            f"id must be at most {records.MAX_ID_CHARS} characters long, got {len(str(too_long))}")


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


# --------------------------------------------------------------------------- poison inputs


@pytest.mark.parametrize("decode, value", [(decode_records, GOOD), (decode_embeddings, raw(emb()))],
                         ids=["records", "embeddings"])
def test_no_exception_of_one_message_escapes_the_decoder_of_a_batch(monkeypatch, decode, value, caplog):
    # Whatever a decoder raises on one message (here: the reference path raising MemoryError on it), that
    # message is dead-lettered with a reason naming the error, the others are decoded, the batch goes on.
    real = records.parse_json_object

    def failing(raw_value, limit):
        if raw_value == b"{poison":
            raise MemoryError("out of memory on this message")
        return real(raw_value, limit)

    monkeypatch.setattr(sys.modules[decode.__module__], "parse_json_object", failing)
    config = EMB if decode is decode_embeddings else ADULT
    batch = decode([value, b"{poison", value], config)
    assert batch.index.tolist() == [0, 2]
    assert batch.errors == [(1, "the record could not be decoded (MemoryError: out of memory on this message)")]
    assert [r.levelname for r in caplog.records if "made the decoder raise" in r.getMessage()] == ["ERROR"]


# --------------------------------------------------------------------------- docstring


def test_docstring_example():
    result = doctest.testmod(records, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 1 and result.failed == 0


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
    assert batch.fields.digests == [records.input_digest(values[0]), records.input_digest(values[3])]
