"""Avro records with a real schema registry (Apicurio Registry, the session's): the Confluent wire format read and
written, the output schema derived and registered BACKWARD, a producer's schema change, and every unreadable
message one reason."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from fairstream.streams.codec.avro import (ADDED_RECORD, AvroError, AvroFormat, RegistryUnavailable, framing_problem,
                                           output_schema, schema_id)
from fairstream.streams.codec.dead_letters import dead_letter, original_bytes
from fairstream.streams.config import PipelineConfig
from fairstream.streams.ops.processes import free_port
from tests.streams.test_schema_registry_config import LOANS

LOAN = {"application_id": "A-1", "submitted_at": "2026-11-28T10:00:00Z",
        "applicant": {"age": 37, "income": 52000, "sex": "F"}, "amount": 12000, "channel": "web", "branch": "north"}
LOAN_SCHEMA = {"type": "record", "name": "LoanApplication", "namespace": "com.example.lending", "fields": [
    {"name": "application_id", "type": "string"},
    {"name": "submitted_at", "type": "string"},
    {"name": "applicant", "type": {"type": "record", "name": "Applicant", "fields": [
        {"name": "age", "type": "int"}, {"name": "income", "type": "int"}, {"name": "sex", "type": "string"}]}},
    {"name": "amount", "type": "int"},
    {"name": "channel", "type": "string"},
    {"name": "branch", "type": "string"},
]}
# Next quarter's schema: one optional field more (a BACKWARD-compatible change, as producers make them).
LOAN_SCHEMA_V2 = {**LOAN_SCHEMA, "fields": [*LOAN_SCHEMA["fields"],
                                            {"name": "campaign", "type": ["null", "string"], "default": None}]}
REPAIRED = (("applicant", "age"), ("applicant", "income"))
PROVENANCE = [{"kind": "plan", "version": 3, "sha256": "ab" * 32, "seed": 7}]


def repaired(record: dict) -> dict:
    """What the mapped codec makes of a loan record (repaired in place, the originals and provenance kept)."""
    applicant = {**record["applicant"], "age": 38.25, "income": 51000.5}
    return {**record, "applicant": applicant, "fairstream": {
        "original": {"age": record["applicant"]["age"], "income": record["applicant"]["income"]},
        "score": 0.62, "decision": 1, "input_digest": "cd" * 32, "provenance": PROVENANCE}}


@pytest.fixture
def client(schema_registry):
    return SchemaRegistryClient({"url": schema_registry.url})


def producer(client, topic: str, schema: dict):
    """A team's producer: confluent-kafka's serializer, registering its schema under ``<topic>-value``."""
    serializer = AvroSerializer(client, json.dumps(schema))
    return lambda record: serializer(record, SerializationContext(topic, MessageField.VALUE))


def consumer(client, topic: str):
    deserializer = AvroDeserializer(client)
    return lambda value: deserializer(value, SerializationContext(topic, MessageField.VALUE))


# --------------------------------------------------------------------------- without a registry


def test_a_value_outside_the_confluent_framing_has_a_one_line_reason():
    assert framing_problem(json.dumps(LOAN).encode()) == \
        "not Confluent Avro: first byte 0x7b, expected the magic byte 0x00"
    assert framing_problem(b"\x00\x00\x00") == \
        "not Confluent Avro: 3 bytes, fewer than the 6 of a magic byte, a schema id and a body"
    assert framing_problem(None) == "not Confluent Avro: the message has no value (a tombstone)"
    assert framing_problem(b"\x00\x00\x00\x00\x07\x02") is None and schema_id(b"\x00\x00\x00\x00\x07\x02") == 7


def test_the_output_schema_keeps_every_input_field_widens_the_repaired_and_adds_one_optional_record():
    out = output_schema(LOAN_SCHEMA, ("fairstream",), REPAIRED)
    assert [field["name"] for field in out["fields"]] == [*(f["name"] for f in LOAN_SCHEMA["fields"]), "fairstream"]
    assert [field["type"] for field in out["fields"][2]["type"]["fields"]] == ["double", "double", "string"]
    added = out["fields"][-1]
    assert added["default"] is None and added["type"][0] == "null" and added["type"][1]["name"] == ADDED_RECORD
    assert all(field["type"][0] == "null" and field["default"] is None for field in added["type"][1]["fields"])
    assert LOAN_SCHEMA["fields"][3]["type"] == "int"  # the input schema is not changed


def test_the_output_field_may_be_nested_and_replaces_an_input_field_of_its_name():
    out = output_schema(LOAN_SCHEMA, ("meta", "fairstream"))
    meta = out["fields"][-1]
    assert meta["name"] == "meta" and meta["default"] is None
    assert meta["type"][1]["fields"][0]["name"] == "fairstream"
    again = output_schema(output_schema(LOAN_SCHEMA), ("fairstream",))
    assert [f["name"] for f in again["fields"]].count("fairstream") == 1
    with pytest.raises(AvroError, match="the input field channel is not a record"):
        output_schema(LOAN_SCHEMA, ("channel", "fairstream"))
    with pytest.raises(AvroError, match="must be an Avro record"):
        output_schema({"type": "string"})


def test_a_nullable_repaired_field_keeps_its_null_branch():
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": ["null", "int"], "default": None}]}
    assert output_schema(schema, repaired_paths=[("x",)])["fields"][0] == \
        {"name": "x", "type": ["null", "double"], "default": None}


# --------------------------------------------------------------------------- with the session's registry


def test_the_loan_record_round_trips_and_its_output_schema_is_registered_backward(client, schema_registry):
    value = producer(client, "avro-loans", LOAN_SCHEMA)(LOAN)
    avro = AvroFormat(schema_registry.url, "avro-loans", "avro-loans.repaired", repaired_paths=REPAIRED)
    assert avro.deserialize([value]) == [LOAN]
    [out] = avro.serialize([repaired(LOAN)], [schema_id(value)])
    assert out[0] == 0 and schema_id(out) != schema_id(value)
    read = consumer(client, "avro-loans.repaired")(out)
    assert read == {**repaired(LOAN), "fairstream": {**repaired(LOAN)["fairstream"], "features": None,
                                                     "s_imputed": None, "provenance": json.dumps(
                                                         PROVENANCE, separators=(",", ":"), sort_keys=True)}}
    assert client.get_compatibility("avro-loans.repaired-value") == "BACKWARD"
    latest = client.get_latest_version("avro-loans.repaired-value")
    assert latest.schema_id == schema_id(out)
    assert json.loads(latest.schema.schema_str) == output_schema(LOAN_SCHEMA, ("fairstream",), REPAIRED)


def test_a_producer_adding_an_optional_field_mid_stream_loses_nothing(client, schema_registry):
    old, new = producer(client, "avro-evolving", LOAN_SCHEMA), producer(client, "avro-evolving", LOAN_SCHEMA_V2)
    later = {**LOAN, "application_id": "A-2", "campaign": "spring"}
    values = [old(LOAN), new(later), old({**LOAN, "application_id": "A-3"})]
    avro = AvroFormat(schema_registry.url, "avro-evolving", "avro-evolving.repaired", repaired_paths=REPAIRED)
    objects = avro.deserialize(values)
    assert objects[1] == later
    outputs = avro.serialize([repaired(obj) for obj in objects], [schema_id(value) for value in values])
    read = [consumer(client, "avro-evolving.repaired")(out) for out in outputs]
    assert [record["application_id"] for record in read] == ["A-1", "A-2", "A-3"]
    assert read[1]["campaign"] == "spring" and "campaign" not in read[0]  # each output has its input's fields
    assert client.get_versions("avro-evolving.repaired-value") == [1, 2]  # v2 registered as BACKWARD-compatible


def test_every_unreadable_message_is_one_reason_and_the_rest_of_the_batch_reads(client, schema_registry):
    good = producer(client, "avro-mixed", LOAN_SCHEMA)(LOAN)
    unknown_id = b"\x00\x7f\xff\xff\xf0" + good[5:]
    truncated = good[:12]
    avro = AvroFormat(schema_registry.url, "avro-mixed", "avro-mixed.repaired")
    results = avro.deserialize([json.dumps(LOAN).encode(), good, unknown_id, truncated, None])
    assert results[1] == LOAN
    reasons = [str(result) for result in results if isinstance(result, Exception)]
    assert reasons[:2] == ["not Confluent Avro: first byte 0x7b, expected the magic byte 0x00",
                           f"schema id {0x7ffffff0} is unknown to the schema registry"]
    assert reasons[2].startswith(f"Avro body does not decode with schema id {schema_id(good)}: ")
    assert reasons[3] == "not Confluent Avro: the message has no value (a tombstone)"
    assert all("\n" not in reason for reason in reasons)


def test_an_output_schema_the_registry_refuses_is_that_outputs_reason(client, schema_registry):
    # The producer's subject allows anything; a required field added there is not BACKWARD on the output subject.
    required = {**LOAN_SCHEMA, "fields": [*LOAN_SCHEMA["fields"], {"name": "score_band", "type": "string"}]}
    first = producer(client, "avro-breaking", LOAN_SCHEMA)(LOAN)
    client.set_compatibility("avro-breaking-value", "NONE")
    second = producer(client, "avro-breaking", required)({**LOAN, "score_band": "B"})
    avro = AvroFormat(schema_registry.url, "avro-breaking", "avro-breaking.repaired")
    objects = avro.deserialize([first, second, second])
    ids = [schema_id(first), schema_id(second), schema_id(second)]
    kept, refused, again = avro.serialize([repaired(obj) for obj in objects], ids)
    assert consumer(client, "avro-breaking.repaired")(kept)["application_id"] == "A-1"
    assert isinstance(refused, AvroError) and str(refused).startswith(
        f"the output schema of input schema id {schema_id(second)} was refused under subject "
        "avro-breaking.repaired-value (BACKWARD)")
    assert str(again) == str(refused)  # kept: the registry is not asked again for every record


def test_an_input_schema_no_output_can_be_derived_from_is_that_outputs_reason(client, schema_registry):
    value = producer(client, "avro-clash", LOAN_SCHEMA)(LOAN)
    avro = AvroFormat(schema_registry.url, "avro-clash", "avro-clash.repaired", output_field=("channel", "fs"))
    [out] = avro.serialize([LOAN], [schema_id(value)])
    assert str(out) == (f"no output schema for input schema id {schema_id(value)}: output field channel.fs: the input "
                        "field channel is not a record, so nothing can be written under it")


def test_a_key_the_output_schema_has_no_field_for_is_refused_not_dropped(client, schema_registry):
    value = producer(client, "avro-strict", LOAN_SCHEMA)(LOAN)
    avro = AvroFormat(schema_registry.url, "avro-strict", "avro-strict.repaired")
    [out] = avro.serialize([{**LOAN, "fairstream": {"score": 0.5, "unknown": 1}}], [schema_id(value)])
    assert isinstance(out, AvroError) and "does not fit the output schema" in str(out)


def test_an_unreachable_registry_raises_instead_of_dead_lettering_the_batch(client, schema_registry):
    value = producer(client, "avro-outage", LOAN_SCHEMA)(LOAN)
    gone = SchemaRegistryClient({"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0})
    with pytest.raises(RegistryUnavailable, match="cannot be reached"):
        AvroFormat("unused", "avro-outage", "avro-outage.repaired", client=gone).deserialize([value])


def test_a_dead_letter_keeps_the_original_avro_bytes(client):
    value = producer(client, "avro-dead", LOAN_SCHEMA)(LOAN)
    letter = json.loads(dead_letter(value, "applicant.age: not a number", "avro-dead", 0, 5, "records"))
    assert original_bytes(letter) == value


def test_a_pipeline_config_gives_the_topics_the_output_field_and_the_paths_repaired_in_place(schema_registry):
    config = PipelineConfig.from_dict({**LOANS, "topics": {**LOANS["topics"], "output": "loans.out"},
                                       "output": {"field": "meta.fs"}, "schema_registry": {"url": schema_registry.url}})
    avro = AvroFormat.for_config(config)
    assert (avro.input_topic, avro.output_topic, avro.subject) == ("loan-applications", "loans.out", "loans.out-value")
    assert avro.output_field == ("meta", "fs") and avro.repaired_paths == (("applicant", "age"),)
    under = PipelineConfig.from_dict({**LOANS, "output": {"repaired": "under"}})
    assert AvroFormat.for_config(under).repaired_paths == ()
