"""Input embeddings: every raw value ends as a usable vector or as an error with a reason, never a crash."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairstream.streams.codec.embeddings import decode_embeddings
from fairstream.streams.codec.records import input_digest
from fairstream.streams.codec.repaired import encode_embeddings, provenance
from fairstream.streams.config import adult_config
from fairstream.streams.schemas import EmbeddingRecord

from .messages import (
    ANY_VALUE,
    DEPTH,
    DIM,
    EMB,
    IDS,
    JSON_VALUES,
    NUMBERS,
    PROPERTY,
    PROV,
    RAW_VALUES,
    emb,
    json_bytes,
    one_error,
    raw,
    strict_loads,
)


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


# --------------------------------------------------------------------------- decode_embeddings


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


def test_decode_then_encode_embeddings():
    values = [raw(emb(id=i, vector=[0.1 * i, 0.1 + 0.2, -0.0, 1e-300], group=["a", "b"][i % 2])) for i in range(5)]
    batch = decode_embeddings(values, EMB)
    check_embeddings(batch, values, DIM)
    for value, out in zip(values, encode_embeddings(batch.records, batch.vectors, PROV, batch.digests)):
        obj, original = strict_loads(out), json.loads(value)
        assert obj["input_digest"] == input_digest(value)
        assert obj["vector"] == original["vector"] and obj["group"] == original["group"] and obj["id"] == original["id"]
        assert math.copysign(1.0, obj["vector"][2]) == -1.0


# --------------------------------------------------------------------------- schema classes


@pytest.mark.parametrize("name", EmbeddingRecord.required_fields())
def test_every_required_embedding_field_is_enforced(name):
    assert one_error(raw(emb(drop=[name])), EMB, decode_embeddings) == f"missing field(s) [{name!r}]"


def test_only_schema_fields_are_allowed_on_embeddings():
    optional = set(EmbeddingRecord.field_names()) - set(EmbeddingRecord.required_fields())
    for name in optional:
        assert decode_embeddings([raw(emb(drop=[name]))], EMB).errors == []
    assert one_error(raw(emb(s=0)), EMB, decode_embeddings) == "unexpected field(s) ['s']"


# --------------------------------------------------------------------------- poison inputs


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


@pytest.mark.parametrize("identity, ok", [(7, True), ("anna", True), (None, True), (True, False), (1.5, False),
                                          ([1], False)])
def test_an_embedding_identity_is_an_integer_or_a_string_and_comes_out_with_the_vector(identity, ok):
    config = adult_config()
    record = {"id": "e1", "vector": [0.0] * 8, "group": 0, **({} if identity is None else {"identity": identity})}
    decoded = decode_embeddings([json.dumps(record).encode()], config)
    if not ok:
        assert decoded.errors and decoded.errors[0][1].startswith("identity must be an integer or a string")
        return
    out = strict_loads(encode_embeddings(decoded.records, decoded.vectors, provenance(
        [("identity", 0, "", "")]), decoded.digests)[0])
    assert out.get("identity") == identity
