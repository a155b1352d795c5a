"""What the codec's tests share: sample messages, the strategies that draw them, and the checks of a batch.

The properties are the contract of the record and embedding agents: the positions in ``index`` and
in ``errors`` partition the batch, the arrays have the configured shape and are finite, the keys are
the ids' text, and whatever is encoded reads back exactly (floats bit for bit).
"""

from __future__ import annotations

import json
import struct

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fairstream.streams.codec.dead_letters import dead_letter, original_bytes
from fairstream.streams.codec.records import decode_records
from fairstream.streams.codec.repaired import provenance
from fairstream.streams.config import EmbeddingConfig, adult_config

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ADULT = adult_config()
STRING_GROUPS = adult_config(groups=("f", "m"), strata=("lo", "hi"))
DIM = 4
EMB = adult_config(embeddings=EmbeddingConfig(dimension=DIM))
PROV = provenance([("plan", 3, "ab" * 32, "0123456789abcdef")])


# --------------------------------------------------------------------------- messages


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


def emb(drop=(), **changes) -> dict:
    obj = {"id": "v1", "vector": [0.5, -1.0, 2.0, 0.0], "group": "a", "identity": 3}
    obj.update(changes)
    for name in drop:
        del obj[name]
    return obj


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


DEPTH = 2_000  # deeper than msgspec's and json's recursion limits, 4 KB: a message of the red team's kind


# --------------------------------------------------------------------------- checks


def one_error(value, config=ADULT, decode=decode_records) -> str:
    """The reason a single value is refused (and that it is refused, not accepted or crashed on)."""
    batch = decode([value], config)
    assert batch.index.tolist() == [], f"{value!r} was accepted"
    assert len(batch.errors) == 1 and batch.errors[0][0] == 0
    reason = batch.errors[0][1]
    assert isinstance(reason, str) and reason
    return reason


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


def json_bytes(strategy):
    return strategy.map(lambda v: json.dumps(v).encode())


RAW_VALUES = st.none() | st.binary(max_size=200)
