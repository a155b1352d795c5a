"""Repaired outputs: whatever is encoded is strict JSON and reads back exactly (floats bit for bit)."""

from __future__ import annotations

import doctest
import hashlib
import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.streams.codec.records import RecordFields, decode_records
from fairstream.streams.codec.repaired import (
    json_tokens,
    _scalar_json,
    decode_repaired,
    encode_embeddings,
    encode_repaired,
    non_finite_rows,
    provenance,
)
from fairstream.streams.config import adult_config
from fairstream.streams.schemas import RepairedRecord

from .messages import (
    ADULT,
    DEPTH,
    DIM,
    FINITE,
    HUGE_INTS,
    IDS,
    PROPERTY,
    PROV,
    REPAIRED_FLOATS,
    STRING_GROUPS,
    TRICKY_FLOATS,
    check_batch,
    raw,
    record,
    same_float,
    strict_loads,
)


# --------------------------------------------------------------------------- JSON tokens


JSON_SCALAR_VALUES = (st.none() | st.booleans() | st.integers() | HUGE_INTS | FINITE | st.sampled_from(TRICKY_FLOATS)
                      | st.text(max_size=8) | st.sampled_from([",", "[", "]", "{", "a,b", '"', "null", "\\", "\u2028"]))


@PROPERTY
@given(st.lists(JSON_SCALAR_VALUES, max_size=12))
def test_a_column_of_scalars_is_written_as_the_json_text_of_each_value(values):
    tokens = json_tokens(values)
    assert len(tokens) == len(values)
    assert tokens == [_scalar_json(value) for value in values]  # a value's text ignores its neighbours
    for token, value in zip(tokens, values):
        back = strict_loads(token)
        assert back == value and type(back) is type(value)
        if isinstance(value, float):
            assert same_float(back, value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, [1], {"a": 1}, [], {}])
def test_a_column_with_a_value_that_is_not_a_json_scalar_is_refused(value):
    for column in ([value], ["a", value, 1], [None, value]):
        with pytest.raises(ValueError, match="not a JSON scalar"):
            json_tokens(column)


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
    assert decode_repaired(encoded, ADULT).decision.tolist() == [0, 1]
    assert decode_repaired(encoded, ADULT).score.tolist() == [0.25, 0.75]  # what the records carry, exactly


def test_each_added_column_is_a_field_of_its_own_and_a_record_without_a_score_reads_back_without_one():
    X = np.array([[1.0, 2.0]])
    encoded = encode_repaired(RecordFields.of([record(id=1)]), X, X, ADULT, PROV, added={"decision": np.array([1])})
    obj = strict_loads(encoded[0])
    assert obj["decision"] == 1 and "score" not in obj
    back = decode_repaired(encoded, ADULT)
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


def test_repaired_output_matches_its_schema():
    X = np.array([[30.0, 40.0]])
    for include_original in (True, False):
        config = adult_config(include_original=include_original)
        obj = json.loads(encode_repaired(RecordFields.of([record(ts=1, y=0)]), X, X, config, PROV)[0])
        assert set(RepairedRecord.required_fields()) <= set(obj) <= set(RepairedRecord.field_names())
        assert ("original" in obj) == include_original


# --------------------------------------------------------------------------- encode_embeddings


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


# --------------------------------------------------------------------------- non-JSON outputs


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


# --------------------------------------------------------------------------- the reader of records.repaired


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
    batch = decode_repaired([good, *unreadable, *not_measured, good], ADULT)
    assert batch.unreadable == len(unreadable) and batch.keys.tolist() == ["ok", "ok"]
    assert batch.after.tolist() == [[31.0, 41.0]] * 2 and batch.versions.tolist() == [3, 3]


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


# --------------------------------------------------------------------------- docstring


def test_docstring_example():
    module = sys.modules[provenance.__module__]
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 1 and result.failed == 0
