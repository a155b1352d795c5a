"""One config per pipeline: the settings workers share, their fingerprint, the keys where two configs differ, and
what a worker makes of the pipeline's active config (issue 33)."""

from __future__ import annotations

import base64
import logging
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.config import AgentConfig, KafkaConfig, SchemaRegistryConfig, adult_config
from fairstream.streams.control.pipeline_config import (
    check_config,
    decode_settings,
    differing_keys,
    encode_settings,
    fingerprint,
    settings_of,
    shown_keys,
)
from fairstream.streams.control.records import CONFIG_KIND, CONFIGURE, ControlError
from fairstream.streams.control.signing import generate_key, public_key_text
from fairstream.streams.schemas import ControlRecord

BASE = adult_config()


def digest(config) -> str:
    return fingerprint(encode_settings(settings_of(config)))


def configure_record(settings: dict, version: int = 1, **changes) -> ControlRecord:
    raw = encode_settings(settings)
    fields = {"kind": CONFIG_KIND, "version": version, "sha256": fingerprint(raw), "action": CONFIGURE,
              "blob_b64": base64.b64encode(raw).decode(), **changes}
    return ControlRecord(**fields)


# Each: a change of one setting every worker must share, as a function of a drawn value, and the keys it changes.
INCLUDED = {
    "name": (st.from_regex(r"[a-z][a-z0-9_-]{0,12}", fullmatch=True).filter(lambda n: n != "adult"),
             lambda c, v: replace(c, name=v), ["name"]),
    "valid_ranges.age": (st.tuples(st.floats(-1e6, 17.0), st.floats(121.0, 1e6)),
                         lambda c, v: replace(c, valid_ranges={**dict(c.valid_ranges), "age": v}), ["valid_ranges.age"]),
    "records.artifact": (st.sampled_from([("plan", "scorer"), ("scorer",), ("plan", "scorer", "thresholds")]),
                         lambda c, v: replace(c, records=AgentConfig(artifact=v)), ["records.artifact"]),
    "records.batch_size": (st.integers(1, 100_000).filter(lambda n: n != 1000),
                           lambda c, v: replace(c, records=replace(c.records, batch_size=v)), ["records.batch_size"]),
    "max_message_bytes": (st.integers(64, 512 * 1024).filter(lambda n: n != 64 * 1024),
                          lambda c, v: replace(c, max_message_bytes=v), ["max_message_bytes"]),
    "monitor.threshold": (st.floats(0.001, 1e6).filter(lambda t: t != 0.1),
                          lambda c, v: c.with_monitor(threshold=v), ["monitor.threshold.dependence_e"]),
    "topics.prefix": (st.from_regex(r"[a-z]{1,10}", fullmatch=True).filter(lambda p: p != "fairstream"),
                      lambda c, v: c.with_topics(prefix=v), ["topics.prefix"]),
    "delivery.guarantee": (st.just("exactly_once"), lambda c, v: c.with_delivery(guarantee=v),
                           ["delivery.guarantee"]),
    "include_original": (st.just(False), lambda c, v: replace(c, include_original=v), ["include_original"]),
}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), which=st.sampled_from(sorted(INCLUDED)))
def test_any_change_of_a_shared_key_changes_the_fingerprint_and_is_named(data, which):
    values, change, keys = INCLUDED[which]
    changed = change(BASE, data.draw(values))
    assert digest(changed) != digest(BASE)
    assert differing_keys(settings_of(BASE), settings_of(changed)) == keys


@settings(max_examples=60, deadline=None)
@given(port=st.one_of(st.integers(0, 65535), st.just("off")),
       store=st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=20),
       user=st.text(st.characters(codec="ascii", categories=("L", "N")), max_size=20),
       host=st.from_regex(r"[a-z]{1,10}(\.[a-z]{1,5}){0,2}", fullmatch=True))
def test_a_workers_own_settings_do_not_change_the_fingerprint(port, store, user, host):
    own = replace(BASE.with_monitor(metrics_port=port), artifact_dir=store,
                  kafka=KafkaConfig(security_protocol="SASL_SSL", sasl_username=user, ssl_cafile=f"/etc/{store}/ca"),
                  schema_registry=SchemaRegistryConfig(url=f"https://{host}:8081"))
    assert digest(own) == digest(BASE)
    assert differing_keys(settings_of(own), settings_of(BASE)) == []


def test_the_trust_file_counts_by_its_keys_not_by_its_path(tmp_path):
    text = f'[keys.alice]\npublic_key = "{public_key_text(generate_key())}"\nroles = ["operator"]\n'
    (tmp_path / "a.toml").write_text(text)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trust.toml").write_text(text)
    here, there = replace(BASE, trust=str(tmp_path / "a.toml")), replace(BASE, trust=str(tmp_path / "b" / "trust.toml"))
    assert digest(here) == digest(there) != digest(BASE)
    (tmp_path / "b" / "trust.toml").write_text(text.replace("operator", "publisher"))
    assert differing_keys(settings_of(here), settings_of(there)) == ["trust"]


def test_encoding_is_canonical_and_decoding_gives_the_settings_back():
    mine = settings_of(BASE)
    assert encode_settings(dict(reversed(list(mine.items())))) == encode_settings(mine)
    assert b" " not in encode_settings({"a": [1, 2], "b": {"c": None}})
    unbounded = settings_of(replace(BASE, valid_ranges={"age": (float("-inf"), float("inf"))}))
    assert unbounded["valid_ranges.age"] == ["-inf", "inf"]
    record = configure_record(unbounded, version=3)
    assert decode_settings(record) == unbounded
    assert differing_keys(decode_settings(record), unbounded) == []


def test_missing_keys_differ_too():
    mapped = {"mapping.s.path": "sex", "name": "x"}
    assert differing_keys({"mapping": None, "name": "x"}, mapped) == ["mapping", "mapping.s.path"]
    assert differing_keys({"a": [1, 2]}, {"a": (1, 2)}) == []  # values compare as JSON
    assert differing_keys({"a": 1}, {"a": True}) == ["a"]


@pytest.mark.parametrize("changes, refusal", [
    ({"blob_b64": "not base64!"}, "not base64"),
    ({"blob_b64": base64.b64encode(b"\xff\xfe").decode()}, "do not match its fingerprint"),
    ({"blob_b64": base64.b64encode(b"[1, 2]").decode(), "sha256": fingerprint(b"[1, 2]")}, "not a JSON object"),
    ({"blob_b64": base64.b64encode(b"{nope").decode(), "sha256": fingerprint(b"{nope")}, "not UTF-8 JSON"),
    ({"blob_b64": base64.b64encode(b"\xff").decode(), "sha256": fingerprint(b"\xff")}, "not UTF-8 JSON"),
    ({"blob_b64": None}, "carries no settings"),
    ({"kind": "plan", "action": "publish"}, "not a pipeline config"),
])
def test_decoding_refuses_garbage_in_one_line(changes, refusal):
    record = configure_record(settings_of(BASE), **changes)
    with pytest.raises(ControlError, match=refusal) as refused:
        decode_settings(record)
    assert "\n" not in str(refused.value)


def test_a_worker_takes_partitions_only_with_the_active_config():
    mine = settings_of(BASE)
    other = settings_of(replace(BASE, records=AgentConfig(artifact=("plan", "scorer")),
                                valid_ranges={"age": (18.0, 99.0), "hours-per-week": (0.0, 168.0)}))
    same = check_config(mine, configure_record(mine, version=2), signed=True)
    assert same.admitted and same.version == 2 and same.blocker() is None
    held = check_config(mine, configure_record(other, version=2), signed=False)
    assert not held.admitted and held.differing == ("records.artifact", "valid_ranges.age")
    assert held.level == logging.ERROR and held.line == (
        "this worker's config differs from the pipeline's active config version 2 in records.artifact, "
        "valid_ranges.age: it takes no partitions until the pipeline's config is published with its settings "
        "(fairstream config publish) or it runs the active one")
    assert held.blocker() == ("config: differs from the pipeline's active config version 2 in records.artifact, "
                              "valid_ranges.age (it takes no partitions)")
    unsigned = check_config(mine, None, signed=False)
    assert unsigned.admitted and unsigned.level == logging.WARNING and "fairstream config publish" in unsigned.line
    signed = check_config(mine, None, signed=True)
    assert not signed.admitted and "no config is published" in signed.blocker()
    garbled = check_config(mine, configure_record(other, blob_b64="@@"), signed=False)
    assert not garbled.admitted and "cannot be read" in garbled.line


def test_a_long_list_of_keys_is_cut_short():
    keys = [f"k{i:02d}" for i in range(14)]
    assert shown_keys(keys) == ", ".join(keys[:10]) + " and 4 more"
    assert shown_keys(["a"]) == "a"
