"""Artifacts round-trip bit-exactly and refuse anything tampered with, truncated or pickled."""

from __future__ import annotations

import doctest
import hashlib
import io
import json
import struct
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair import artifacts
from fairstream.repair.artifacts import (
    PARAMETERS_ARRAY,
    SCHEMA_VERSION,
    Artifact,
    ArtifactError,
    decode,
    encode,
    fingerprint_arrays,
    load,
    pack,
    save,
    with_version,
)

CREATED = "2024-05-01T12:00:00.000Z"


def make_plan(**overrides) -> Artifact:
    options = dict(
        kind="plan",
        arrays={"coupling": np.eye(3) / 3, "support": np.linspace(0.0, 1.0, 3), "groups": np.array(["a", "b"])},
        parameters={"n_quantiles": 3, "theta": 0.5},
        metrics={"dp_before": 0.21, "dp_after": 0.02},
        data_fingerprint=fingerprint_arrays(np.arange(4.0)),
        created=CREATED,
    )
    options.update(overrides)
    return pack(**options)


def assert_bit_exact(expected: dict, actual) -> None:
    assert list(actual) == list(expected) + [PARAMETERS_ARRAY]
    for name, array in expected.items():
        array = np.asarray(array)
        assert actual[name].dtype == array.dtype, name
        assert actual[name].shape == array.shape, name
        assert actual[name].tobytes() == array.tobytes(), name


def manifest_dict(artifact: Artifact) -> dict:
    return json.loads(artifact.to_bytes()[0])


def rebuilt(manifest: dict, payload: bytes) -> tuple[bytes, bytes]:
    return json.dumps(manifest).encode(), payload


# --- round trips ------------------------------------------------------------------------------

dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(),
    hnp.unsigned_integer_dtypes(),
    hnp.floating_dtypes(),
    hnp.complex_number_dtypes(),
    hnp.unicode_string_dtypes(min_len=1, max_len=5),
    hnp.byte_string_dtypes(min_len=1, max_len=5),
)
any_array = hnp.arrays(dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,12}", fullmatch=True)
array_dicts = st.dictionaries(names, any_array, max_size=4)


@settings(max_examples=60, deadline=None)
@given(arrays=array_dicts, compress=st.booleans())
def test_arbitrary_arrays_round_trip_bit_exactly_through_files_and_blobs(arrays, compress):
    artifact = pack("embedding", arrays, {"dim": 3}, compress=compress)
    assert_bit_exact(arrays, artifact.arrays)
    with tempfile.TemporaryDirectory() as tmp:  # not tmp_path: hypothesis reruns the body
        loaded = load(save(artifact, Path(tmp) / "module"), kind="embedding")
    assert_bit_exact(arrays, loaded.arrays)
    assert loaded == artifact
    decoded = decode(encode(artifact), kind="embedding")
    assert_bit_exact(arrays, decoded.arrays)
    assert decoded == artifact


def test_special_floats_and_empty_arrays_keep_their_bits():
    nan_bits = np.array([0x7FF0000000000001, 0xFFF8000000000123, 0x7FF8DEADBEEF0000], dtype=np.uint64)
    arrays = {
        "nans": nan_bits.view(np.float64),  # signalling, negative and payload-carrying NaNs
        "nan32": np.array([0x7FC00001, 0xFF800001], dtype=np.uint32).view(np.float32),
        "signed_zero": np.array([-0.0, 0.0, np.inf, -np.inf]),
        "big_endian": np.array([1.5, -0.0, np.nan], dtype=">f8"),
        "empty": np.zeros((0, 3)),
        "empty_strings": np.zeros(0, dtype="<U4"),
        "scalar": np.array(7, dtype=np.int16),
        "flags": np.array([True, False]),
        "labels": np.array(["female", "male", ""]),
    }
    artifact = pack("plan", arrays, {})
    assert_bit_exact(arrays, decode(encode(artifact)).arrays)
    assert np.signbit(decode(encode(artifact)).arrays["signed_zero"][0])


def test_artifact_without_arrays_round_trips():
    artifact = pack("scorer", {}, {"threshold": 0.5})
    assert decode(encode(artifact)) == artifact
    assert list(artifact.arrays) == [PARAMETERS_ARRAY]


def test_payload_bytes_do_not_depend_on_the_clock(monkeypatch):
    first = make_plan()
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)  # np.savez would stamp this into the zip
    second = make_plan()
    assert first.to_bytes() == second.to_bytes()
    assert encode(first) == encode(second)


def test_fortran_ordered_input_gives_the_same_payload():
    x = np.arange(12.0).reshape(3, 4)
    assert pack("plan", {"x": x}, {}).sha256 == pack("plan", {"x": np.asfortranarray(x)}, {}).sha256


def test_arrays_are_private_read_only_copies():
    source = np.arange(3.0)
    artifact = pack("plan", {"x": source}, {})
    source[0] = 99.0
    assert artifact.arrays["x"][0] == 0.0
    with pytest.raises(ValueError):
        artifact.arrays["x"][0] = 1.0
    with pytest.raises(TypeError):
        artifact.arrays["y"] = np.zeros(1)


def test_manifest_records_what_was_packed():
    artifact = make_plan(version=4)
    manifest = manifest_dict(artifact)
    assert manifest["kind"] == "plan" and manifest["version"] == 4
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["created"] == CREATED
    assert manifest["payload_sha256"] == hashlib.sha256(artifact.payload).hexdigest() == artifact.sha256
    assert manifest["payload_size"] == len(artifact.payload)
    assert manifest["arrays"][:-1] == [
        {"name": "coupling", "dtype": "<f8", "shape": [3, 3]},
        {"name": "support", "dtype": "<f8", "shape": [3]},
        {"name": "groups", "dtype": "<U1", "shape": [2]},
    ]
    assert manifest["arrays"][-1]["name"] == PARAMETERS_ARRAY and manifest["arrays"][-1]["shape"] == []
    assert manifest["metrics"] == {"dp_before": 0.21, "dp_after": 0.02}


def test_parameters_are_sealed_in_the_payload():
    # Editing the manifest's parameters (which drive behaviour) must not pass verification.
    artifact = make_plan()
    manifest_json, payload = artifact.to_bytes()
    forged = json.loads(manifest_json)
    forged["parameters"] = {**forged["parameters"], "repair_amount": 0.0}
    with pytest.raises(ArtifactError, match="parameters sealed in the payload"):
        Artifact.from_bytes(json.dumps(forged).encode(), payload)
    with pytest.raises(ArtifactError, match="reserved"):
        pack("plan", {PARAMETERS_ARRAY: np.zeros(1)}, {})


def test_parameters_are_normalised_to_their_json_form():
    artifact = pack("plan", {}, {"k": np.int64(3), "grid": (0.0, 1.0), "w": np.array([1, 2])})
    assert artifact.parameters == {"k": 3, "grid": [0.0, 1.0], "w": [1, 2]}
    assert decode(encode(artifact)).parameters == artifact.parameters


@pytest.mark.parametrize("metrics", [{"E": float("nan")}, {"E": np.float64("inf")}, {"f": object()}])
def test_non_json_metrics_are_refused(metrics):
    with pytest.raises(ArtifactError, match="strict JSON"):
        pack("plan", {}, {}, metrics=metrics)


def test_created_defaults_to_now_in_utc_and_naive_datetimes_are_refused():
    stamp = pack("plan", {}, {}).manifest.created
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs(parsed - datetime.now(timezone.utc)) < timedelta(minutes=1)
    local = datetime(2024, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2)))
    assert pack("plan", {}, {}, created=local).manifest.created == "2024-01-01T00:00:00.000Z"
    with pytest.raises(ArtifactError, match="timezone-aware"):
        pack("plan", {}, {}, created=datetime(2024, 1, 1))
    with pytest.raises(ArtifactError, match="ISO-8601"):
        pack("plan", {}, {}, created="yesterday")


def test_unknown_manifest_keys_survive_a_round_trip(tmp_path):
    path = save(make_plan(), tmp_path)
    manifest = json.loads(path.read_bytes())
    manifest["signed_by"] = {"key": "ops-2024"}
    path.write_bytes(json.dumps(manifest).encode())
    loaded = load(path)
    assert loaded.manifest.extra == {"signed_by": {"key": "ops-2024"}}
    again = load(save(loaded, tmp_path / "copy"))
    assert json.loads(again.to_bytes()[0])["signed_by"] == {"key": "ops-2024"}
    assert pack("plan", {}, {}, extra={"note": "x"}).manifest.extra == {"note": "x"}
    with pytest.raises(ArtifactError, match="standard fields"):
        pack("plan", {}, {}, extra={"version": 9})


# --- files ------------------------------------------------------------------------------------


def test_save_into_a_directory_names_files_by_kind_and_version(tmp_path):
    path = save(make_plan(version=7), tmp_path)
    assert path == tmp_path / "plan-v7.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan-v7.json", "plan-v7.npz"]  # no temp files left
    for name in ("plan-v7", "plan-v7.json", "plan-v7.npz"):
        assert load(tmp_path / name) == make_plan(version=7)


def test_saved_payload_is_a_plain_npz(tmp_path):
    save(make_plan(), tmp_path / "p")
    with np.load(tmp_path / "p.npz", allow_pickle=False) as npz:
        assert npz.files == ["coupling", "support", "groups", PARAMETERS_ARRAY]


def test_overwriting_replaces_both_files(tmp_path):
    save(make_plan(), tmp_path / "current")
    newer = make_plan(arrays={"coupling": np.ones((2, 2)) / 4})
    save(newer, tmp_path / "current")
    assert load(tmp_path / "current") == newer


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(ArtifactError, match="manifest file not found"):
        load(tmp_path / "nothing")
    path = save(make_plan(), tmp_path)
    path.with_suffix(".npz").unlink()
    with pytest.raises(ArtifactError, match="payload file not found"):
        load(path)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [0, 100, -1])
def test_a_single_flipped_payload_byte_is_refused(tmp_path, position):
    artifact = make_plan()
    path = save(artifact, tmp_path)
    payload = bytearray(artifact.payload)
    payload[position] ^= 0x01
    path.with_suffix(".npz").write_bytes(bytes(payload))
    with pytest.raises(ArtifactError, match="payload sha256 mismatch: manifest says .*; refusing to load"):
        load(path)
    blob = bytearray(encode(artifact))
    blob[position if position < 0 else len(blob) - len(payload) + position] ^= 0x01
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        decode(bytes(blob))


def test_truncated_payload_is_refused(tmp_path):
    artifact = make_plan()
    path = save(artifact, tmp_path)
    path.with_suffix(".npz").write_bytes(artifact.payload[:-10])
    with pytest.raises(ArtifactError, match="payload size mismatch"):
        load(path)
    path.with_suffix(".npz").write_bytes(artifact.payload + b"\0")
    with pytest.raises(ArtifactError, match="payload size mismatch"):
        load(path)
    with pytest.raises(ArtifactError, match="payload size mismatch"):
        decode(encode(artifact)[:-1])
    with pytest.raises(ArtifactError, match="truncated artifact blob"):
        decode(encode(artifact)[:20])
    with pytest.raises(ArtifactError, match="truncated artifact blob"):
        decode(encode(artifact)[:10])


def test_manifest_claiming_another_hash_is_refused(tmp_path):
    artifact = make_plan()
    other = make_plan(arrays={"coupling": np.zeros((3, 3))})
    path = save(artifact, tmp_path)
    manifest = json.loads(path.read_bytes())
    manifest["payload_sha256"] = other.sha256
    path.write_bytes(json.dumps(manifest).encode())
    with pytest.raises(ArtifactError, match=f"manifest says {other.sha256}, payload is {artifact.sha256}"):
        load(path)


def test_manifest_listing_other_arrays_than_the_payload_is_refused():
    artifact = make_plan()
    manifest = manifest_dict(artifact)
    manifest["arrays"][0]["shape"] = [9]
    with pytest.raises(ArtifactError, match="'coupling' is <f8 \\(3, 3\\) in the payload"):
        Artifact.from_bytes(*rebuilt(manifest, artifact.payload))
    manifest = manifest_dict(artifact)
    manifest["arrays"].pop()
    with pytest.raises(ArtifactError, match="payload holds arrays"):
        Artifact.from_bytes(*rebuilt(manifest, artifact.payload))


def test_wrong_kind_is_refused(tmp_path):
    artifact = make_plan()
    path = save(artifact, tmp_path)
    message = "expected an artifact of kind 'scorer', got kind 'plan'"
    with pytest.raises(ArtifactError, match=message):
        load(path, kind="scorer")
    with pytest.raises(ArtifactError, match=message):
        decode(encode(artifact), kind="scorer")
    with pytest.raises(ArtifactError, match=message):
        Artifact.from_bytes(*artifact.to_bytes(), kind="scorer")


def test_schema_version_from_the_future_is_refused(tmp_path):
    artifact = make_plan()
    manifest = manifest_dict(artifact)
    manifest["schema_version"] = SCHEMA_VERSION + 1
    manifest["new_required_thing"] = True
    del manifest["metrics"]  # a future schema may drop fields: the version is reported, not this
    with pytest.raises(ArtifactError, match=f"schema_version {SCHEMA_VERSION + 1} is newer"):
        Artifact.from_bytes(*rebuilt(manifest, artifact.payload))
    for bad in (0, "1", True, None):
        manifest["schema_version"] = bad
        with pytest.raises(ArtifactError, match="schema_version"):
            Artifact.from_bytes(*rebuilt(manifest, artifact.payload))


def test_unreadable_or_incomplete_manifests_are_refused():
    artifact = make_plan()
    payload = artifact.payload
    with pytest.raises(ArtifactError, match="unreadable artifact manifest JSON"):
        Artifact.from_bytes(b"{not json", payload)
    with pytest.raises(ArtifactError, match="unreadable artifact manifest JSON"):
        Artifact.from_bytes(b"\xff\xfe", payload)
    with pytest.raises(ArtifactError, match="must be a JSON object"):
        Artifact.from_bytes(b"[1, 2]", payload)
    manifest = manifest_dict(artifact)
    del manifest["payload_sha256"], manifest["kind"]
    with pytest.raises(ArtifactError, match="missing required field\\(s\\): kind, payload_sha256"):
        Artifact.from_bytes(*rebuilt(manifest, payload))
    text = artifact.to_bytes()[0].decode()
    duplicated = text.replace('"kind": "plan"', '"kind": "plan", "payload_sha256": "' + "0" * 64 + '"')
    with pytest.raises(ArtifactError, match="duplicate key"):
        Artifact.from_bytes(duplicated.encode(), payload)
    with pytest.raises(ArtifactError, match="NaN is not valid JSON"):
        Artifact.from_bytes(text.replace('"dp_after": 0.02', '"dp_after": NaN').encode(), payload)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("version", 0, "version must be a positive integer"),
        ("version", 1.5, "version must be a positive integer"),
        ("kind", "Plan!", "kind must match"),
        ("created", "2024-01-01T00:00:00", "time zone"),
        ("payload_size", -1, "payload_size"),
        ("payload_sha256", "ABC", "payload_sha256"),
        ("data_fingerprint", "not-a-hash", "data_fingerprint"),
        ("parameters", [1], "'parameters' must be a JSON object"),
        ("arrays", {"x": 1}, "'arrays' must be a list"),
        ("arrays", [{"name": "../x", "dtype": "<f8", "shape": [1]}], "array name must match"),
        ("arrays", [{"name": "x", "dtype": "<f8", "shape": [-1]}], "invalid shape"),
        ("arrays", [{"name": "x", "dtype": "nope", "shape": [1]}], "unknown dtype"),
    ],
)
def test_malformed_manifest_fields_are_refused(field, value, message):
    artifact = make_plan()
    manifest = manifest_dict(artifact)
    manifest[field] = value
    with pytest.raises(ArtifactError, match=message):
        Artifact.from_bytes(*rebuilt(manifest, artifact.payload))


def test_blob_with_a_bad_magic_header_is_refused():
    blob = encode(make_plan())
    with pytest.raises(ArtifactError, match="bad magic"):
        decode(b"PK" + blob[2:])
    with pytest.raises(ArtifactError, match="bad magic"):
        decode(b"")
    huge = blob[:8] + struct.pack(">I", 2**31) + blob[12:]
    with pytest.raises(ArtifactError, match="over the"):
        decode(huge)


# --- pickle stays out -------------------------------------------------------------------------

UNPICKLED = []


def _record_unpickling():
    UNPICKLED.append(True)
    return "pwned"


class Canary:
    """Unpickling a Canary calls _record_unpickling, so any unpickle is visible."""

    def __reduce__(self):
        return (_record_unpickling, ())


def hostile_payload() -> bytes:
    buffer = io.BytesIO()
    # The one allowed use of pickle: crafting the hostile file the loader must refuse.
    np.savez(buffer, coupling=np.array([Canary(), Canary()], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def manifest_for(payload: bytes, dtype: str) -> dict:
    manifest = manifest_dict(make_plan(arrays={}))
    manifest.update(
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_size=len(payload),
        arrays=[{"name": "coupling", "dtype": dtype, "shape": [2]}],
    )
    return manifest


def test_packing_an_object_array_is_refused():
    with pytest.raises(ArtifactError, match="'x' has dtype object; it would need pickle"):
        pack("plan", {"x": np.array([{"a": 1}], dtype=object)}, {})
    with pytest.raises(ArtifactError, match="unsupported dtype kind 'V'"):
        pack("plan", {"x": np.zeros(2, dtype=[("a", "<f8"), ("b", "<i4")])}, {})
    with pytest.raises(ArtifactError, match="array name must match"):
        pack("plan", {"a/b": np.zeros(1)}, {})


def test_object_array_listed_honestly_is_refused_without_unpickling():
    UNPICKLED.clear()
    payload = hostile_payload()
    with pytest.raises(ArtifactError, match="dtype object"):
        Artifact.from_bytes(*rebuilt(manifest_for(payload, "|O"), payload))
    assert UNPICKLED == []


def test_object_array_behind_a_matching_hash_is_refused_without_unpickling(tmp_path):
    UNPICKLED.clear()
    payload = hostile_payload()
    manifest = manifest_for(payload, "<f8")  # lies about the dtype; the hash itself is right
    (tmp_path / "evil.json").write_text(json.dumps(manifest))
    (tmp_path / "evil.npz").write_bytes(payload)
    with pytest.raises(ArtifactError, match="Object arrays cannot be loaded when allow_pickle=False"):
        load(tmp_path / "evil")
    blob = artifacts._BLOB_MAGIC + struct.pack(">I", len(json.dumps(manifest))) + json.dumps(manifest).encode() + payload
    with pytest.raises(ArtifactError, match="allow_pickle=False"):
        decode(blob)
    assert UNPICKLED == []


def test_a_bare_pickle_or_npy_payload_is_refused():
    import pickle

    for payload in (pickle.dumps(Canary()), _npy_bytes(np.arange(3.0))):
        manifest = manifest_for(payload, "<f8")
        with pytest.raises(ArtifactError, match="refusing to load"):
            Artifact.from_bytes(*rebuilt(manifest, payload))
    assert UNPICKLED == []


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# --- versions ---------------------------------------------------------------------------------


def test_version_bump_keeps_the_payload_hash(tmp_path):
    artifact = make_plan()
    bumped = with_version(artifact, 2)
    assert bumped.version == 2 and artifact.version == 1
    assert bumped.sha256 == artifact.sha256 and bumped.payload == artifact.payload
    assert bumped.manifest.created == artifact.manifest.created
    assert bumped != artifact
    assert load(save(bumped, tmp_path)).version == 2
    for bad in (0, -3, 2.0, True, "3"):
        with pytest.raises(ArtifactError, match="version must be a positive integer"):
            with_version(artifact, bad)


def test_constructor_refuses_a_payload_that_does_not_match_the_manifest():
    artifact = make_plan()
    other = make_plan(arrays={"x": np.zeros(1)})
    with pytest.raises(ArtifactError, match="sha256 mismatch|size mismatch"):
        Artifact(artifact.manifest, artifact.arrays, other.payload)


def test_repr_is_short():
    text = repr(make_plan())
    assert text.startswith("Artifact(kind='plan', version=1, sha256=") and "coupling" in text and len(text) < 200


# --- fingerprints -----------------------------------------------------------------------------


def test_fingerprint_depends_on_values_dtype_shape_and_order():
    x = np.arange(6.0)
    base = fingerprint_arrays(x)
    assert len(base) == 64 and base == fingerprint_arrays(x.copy())
    assert base != fingerprint_arrays(x.astype(np.float32))
    assert base != fingerprint_arrays(x.reshape(2, 3))
    assert base != fingerprint_arrays(x + np.r_[0.0, 0, 0, 0, 0, 1e-12])
    y = np.ones(2)
    assert fingerprint_arrays(x, y) != fingerprint_arrays(y, x)
    assert fingerprint_arrays(x[:2], x[2:]) != fingerprint_arrays(x[:3], x[3:])  # framing is unambiguous
    assert fingerprint_arrays() != fingerprint_arrays(np.zeros(0))


def test_fingerprint_ignores_memory_layout_and_byte_order():
    x = np.arange(12.0).reshape(3, 4)
    assert fingerprint_arrays(x) == fingerprint_arrays(np.asfortranarray(x))
    assert fingerprint_arrays(x) == fingerprint_arrays(x.astype(">f8"))
    assert fingerprint_arrays(x[:, ::2]) == fingerprint_arrays(x[:, ::2].copy())
    assert fingerprint_arrays(np.array(["a", "bc"])) != fingerprint_arrays(np.array(["ab", "c"]))


def test_fingerprint_is_stable_across_runs():
    # Pinned: changing the hashing scheme silently would orphan every stored data fingerprint.
    assert fingerprint_arrays(np.arange(3, dtype=np.int64)) == hashlib.sha256(
        b"fairstream.fingerprint/1\n<i8|(3,)|24\n" + np.arange(3, dtype="<i8").tobytes()
    ).hexdigest()


def test_fingerprint_refuses_object_arrays():
    with pytest.raises(ArtifactError, match="dtype object"):
        fingerprint_arrays(np.array([None, 1], dtype=object))


def test_docstring_examples_run():
    assert doctest.testmod(artifacts).failed == 0
