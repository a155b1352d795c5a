"""The input decoder a worker and a re-fit share: the envelope, the mapping on JSON, the mapping on Avro (with the
session's real schema registry), each exactly what its own codec decodes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from fairstream.streams.codec.inputs import InputDecoder
from fairstream.streams.codec.mapped import MappedRecords
from fairstream.streams.codec.records import decode_records
from fairstream.streams.config import PipelineConfig, adult_config
from tests.streams.codec.test_avro import LOAN_SCHEMA
from tests.streams.codec.test_mapped import encoded, loan, loans_config


def same_decoding(ours, theirs) -> None:
    assert np.array_equal(ours.X, theirs.X) and np.array_equal(ours.index, theirs.index)
    assert ours.keys.tolist() == theirs.keys.tolist() and ours.errors == theirs.errors
    assert ours.fields.s == theirs.fields.s and ours.fields.u == theirs.fields.u


def test_a_pipeline_without_a_mapping_reads_the_envelope_and_ignores_the_keys():
    config = adult_config()
    values = [json.dumps({"id": "r-1", "features": {"age": 30, "hours-per-week": 40}, "s": 0, "u": 1}).encode(),
              b'{"id": "r-2"}', b"{not json"]
    decoder = InputDecoder.for_config(config)

    decoded = decoder.decode(values, [b"k-1", None, b"k-3"])

    assert decoder.mapped is None and decoder.avro is None
    same_decoding(decoded, decode_records(values, config))
    assert decoded.keys.tolist() == ["r-1"] and len(decoded.errors) == 2


def test_a_mapped_pipeline_reads_its_json_records_by_the_mapping_with_the_id_from_the_key():
    config = loans_config(id="$key", y="outcome")
    values = [encoded(loan(outcome=1)), encoded(loan(outcome=0, applicant={"age": "old", "income": 1, "sex": "M"})),
              encoded(loan(outcome=0))]
    keys = [b"A-1", b"A-2", None]
    decoder = InputDecoder.for_config(config)

    decoded = decoder.decode(values, keys)

    assert decoder.mapped is MappedRecords.for_config(config) and decoder.avro is None
    same_decoding(decoded, MappedRecords(config).decode(values, keys))
    assert decoded.keys.tolist() == ["A-1"] and decoded.batch().y.tolist() == [1]
    assert decoded.errors == [(1, 'mapping: applicant.age: expected a number, found "old"'),
                              (2, 'missing Kafka key (mapping.id = "$key")')]


def test_a_mapped_avro_pipeline_deserializes_each_message_by_its_schema_then_maps_it(schema_registry):
    config = PipelineConfig.from_dict({**_loans_table(), "topics": {"prefix": "inputs-avro", "input": "inputs-loans",
                                                                    "output": "inputs-loans.fair", "format": "avro"},
                                       "schema_registry": {"url": schema_registry.url}})
    serializer = AvroSerializer(SchemaRegistryClient({"url": schema_registry.url}), json.dumps(LOAN_SCHEMA))
    avro = serializer(loan(), SerializationContext("inputs-loans", MessageField.VALUE))
    values = [avro, encoded(loan())]

    decoded = InputDecoder.for_config(config).decode(values, [b"A-1", b"A-2"])

    assert decoded.X.tolist() == [[37.0, 52000.0, 12000.0]] and decoded.fields.s == ["female"]
    assert decoded.errors == [(1, "not Confluent Avro: first byte 0x7b, expected the magic byte 0x00")]
    # The same pipeline's records as JSON (a file of JSON lines) are read by the mapping alone.
    as_json = InputDecoder.for_config(config, format="json")
    assert as_json.avro is None and as_json.decode([encoded(loan())], [None]).X.tolist() == decoded.X.tolist()


def _loans_table() -> dict:
    return {"pipeline": {"name": "loans", "features": ["age", "income", "amount"], "groups": ["female", "male"],
                         "strata": ["north", "south"]},
            "mapping": {"id": "application_id", "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
                        "u": "branch",
                        "features": {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}}}


def test_a_decoder_is_built_consistently_with_its_pipeline():
    with pytest.raises(ValueError, match="format must be one of"):
        InputDecoder.for_config(adult_config(), format="csv")
    with pytest.raises(ValueError, match="exactly when its pipeline has a"):
        InputDecoder(loans_config())
    with pytest.raises(ValueError, match="exactly when its pipeline has a"):
        InputDecoder(adult_config(), mapped=MappedRecords(loans_config()))
