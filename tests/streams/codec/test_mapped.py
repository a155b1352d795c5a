"""A team's own records through the mapped codec: every field kept, the repaired values where configured, reasons
that name the path."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pytest

from fairstream.streams.codec.mapped import PROVENANCE_HEADER, MappedRecords
from fairstream.streams.config import PipelineConfig
from fairstream.streams.mapping import OutputLayout

LOAN = {"application_id": "A-1", "submitted_at": "2026-11-28T10:00:00Z",
        "applicant": {"age": 37, "income": 52000, "sex": "F"}, "amount": 12000, "channel": "web", "branch": "north"}
PROV = {"kind": "plan", "version": 3, "sha256": "ab", "seed": "", "chain": []}


def loans_config(output: dict | None = None, **mapping) -> PipelineConfig:
    table = {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
             "s": {"path": "applicant.sex", "values": {"F": "female", "M": "male"}},
             "u": {"path": "branch", "default": "north"},
             "features": {"age": "applicant.age", "income": "applicant.income", "amount": "amount"}, **mapping}
    return PipelineConfig.from_dict({
        "pipeline": {"name": "loans", "features": ["age", "income", "amount"], "groups": ["female", "male"],
                     "strata": ["north", "south"], "label": True},
        "mapping": table, "output": output or {}})


def loan(**changes) -> dict:
    record = json.loads(json.dumps(LOAN))
    record.update(changes)
    return record


def encoded(record: dict) -> bytes:
    return json.dumps(record).encode()


def through(config: PipelineConfig, values: list[bytes], keys=None, shift: float = 0.5, added=None):
    """(decoded, outputs as objects, refused) of ``values`` with every feature moved by ``shift``."""
    codec = MappedRecords(config)
    decoded = codec.decode(values, keys or [None] * len(values))
    rows = list(range(len(decoded.index)))
    outputs, refused = codec.encode(decoded, rows, decoded.X + shift, PROV, added=added)
    return decoded, [json.loads(value) for value in outputs], refused


def without(record: dict, field: str = "fairstream") -> dict:
    return {key: value for key, value in record.items() if key != field}


def test_in_place_writes_the_repaired_values_at_their_paths_and_keeps_everything_else():
    decoded, (out,), refused = through(loans_config(), [encoded(LOAN)])
    assert refused == [] and decoded.errors == []
    assert list(out) == [*LOAN, "fairstream"]  # key order kept, the field appended
    assert list(out["applicant"]) == ["age", "income", "sex"]
    assert out["applicant"] == {"age": 37.5, "income": 52000.5, "sex": "F"} and out["amount"] == 12000.5
    assert {k: v for k, v in without(out).items() if k not in ("applicant", "amount")} == \
        {k: v for k, v in LOAN.items() if k not in ("applicant", "amount")}
    assert out["fairstream"]["original"] == {"age": 37, "income": 52000, "amount": 12000}
    assert out["fairstream"]["provenance"] == PROV and len(out["fairstream"]["input_digest"]) == 32
    assert decoded.fields.ts == [1795860000.0] and decoded.fields.s == ["female"] and decoded.fields.u == ["north"]


def test_under_leaves_the_record_untouched_byte_for_byte():
    value = encoded(LOAN)
    decoded, (out,), _ = through(loans_config({"repaired": "under"}), [value], added={"score": np.array([0.25])})
    assert without(out) == LOAN and list(out) == [*LOAN, "fairstream"]
    assert out["fairstream"]["features"] == {"age": 37.5, "income": 52000.5, "amount": 12000.5}
    assert out["fairstream"]["score"] == 0.25 and out["fairstream"]["provenance"] == PROV
    codec = MappedRecords(loans_config({"repaired": "under"}))
    (raw,), _ = codec.encode(decoded, [0], decoded.X, PROV)
    assert raw.startswith(value[:-1])  # the input's own text, up to its closing brace


def test_a_nested_output_field_and_provenance_in_headers():
    config = loans_config({"repaired": "under", "field": "meta.fairstream", "provenance": "headers"})
    _, (out,), _ = through(config, [encoded(loan(meta={"source": "crm"}))])
    assert out["meta"]["source"] == "crm" and list(out["meta"]) == ["source", "fairstream"]
    assert "provenance" not in out["meta"]["fairstream"]
    assert MappedRecords(config).headers(PROV) == [(PROVENANCE_HEADER, json.dumps(PROV, separators=(",", ":"))
                                                    .encode())]
    assert MappedRecords(loans_config()).headers(PROV) == []


@pytest.mark.parametrize("repaired", ["in_place", "under"])
def test_a_field_a_producer_adds_mid_stream_is_passed_through(repaired):
    grown = loan(channel={"kind": "web", "campaign": [1, 2.5, None, True]}, risk_band="B")
    _, outs, _ = through(loans_config({"repaired": repaired}), [encoded(LOAN), encoded(grown)])
    assert outs[1]["channel"] == grown["channel"] and outs[1]["risk_band"] == "B"
    assert list(outs[1]) == [*grown, "fairstream"]


def test_an_input_already_holding_the_field_has_it_replaced_in_place():
    value = encoded(loan(fairstream={"old": 1}))
    _, (out,), _ = through(loans_config({"repaired": "under"}), [value])
    assert list(out) == [*LOAN, "fairstream"] and "old" not in out["fairstream"]


def test_strict_refuses_unknown_fields_naming_their_paths():
    config = loans_config(strict=True)
    decoded, _, _ = through(config, [encoded(LOAN)])
    assert decoded.errors == [(0, "unexpected field(s) ['channel'] (mapping.strict)")]
    nested = without(loan(applicant={"age": 1, "income": 2, "sex": "M", "zip": "N1"}), "channel")
    decoded, _, _ = through(config, [encoded(without(LOAN, "channel")), encoded(nested)])
    assert decoded.errors == [(1, "unexpected field(s) ['applicant.zip'] (mapping.strict)")]


@pytest.mark.parametrize("record, reason", [
    (loan(applicant={"age": "old", "income": 1, "sex": "F"}), 'mapping: applicant.age: expected a number, found "old"'),
    (loan(applicant={"age": 30, "income": 1}), "missing field applicant.sex (mapping.s)"),
    (without(loan(), "amount"), "missing field amount (mapping.features.amount)"),
    (loan(applicant={"age": 30, "income": 1, "sex": "X"}),
     'mapping: applicant.sex: "X" is not a configured group [\'female\', \'male\']'),
    (loan(branch="east"), 'mapping: branch: "east" is not a configured stratum'),
    (loan(submitted_at="yesterday"), 'mapping: submitted_at: expected an ISO-8601 time, found "yesterday"'),
    (loan(application_id=""), "mapping: application_id: id must be a non-empty string or an integer"),
    (loan(applicant=[1]), "mapping: applicant.sex: applicant holds a JSON array, not an object (mapping.s)"),
    (loan(amount=True), "mapping: amount: expected a number, found true"),
])
def test_every_bad_value_or_missing_field_is_dead_lettered_naming_its_path(record, reason):
    decoded, _, _ = through(loans_config(), [encoded(LOAN), encoded(record)])
    assert len(decoded.index) == 1 and decoded.errors[0][0] == 1
    assert decoded.errors[0][1].startswith(reason), decoded.errors


def test_a_message_that_is_no_record_is_dead_lettered_not_raised():
    decoded, _, _ = through(loans_config(), [b"{not json", None, b"[1]", encoded(LOAN), b'{"a":' * 5000])
    assert list(decoded.index) == [3] and [i for i, _ in decoded.errors] == [0, 1, 2, 4]


def test_times_with_offsets_naive_times_and_epoch_milliseconds():
    iso = [loan(submitted_at=t) for t in ("2026-11-28T12:00:00+02:00", "2026-11-28T10:00:00", "2026-11-28T10:00:00Z")]
    decoded, _, _ = through(loans_config(), [encoded(r) for r in iso])
    assert decoded.fields.ts == [1795860000.0] * 3
    millis = loans_config(time={"path": "submitted_at", "format": "epoch_ms"})
    decoded, _, _ = through(millis, [encoded(loan(submitted_at=1795860000500)), encoded(without(LOAN, "submitted_at"))])
    assert decoded.fields.ts == [1795860000.5, None]  # a record without its time is filed at its arrival


def test_value_maps_read_strings_integers_and_booleans_and_defaults_fill_missing_fields():
    config = loans_config(s={"path": "applicant.female", "values": {"true": "female", "false": "male"}},
                          u={"path": "region", "values": {"1": "north", "2": "south"}, "default": "south"})
    records = [loan(applicant={"age": 1, "income": 2, "female": True}, region=1),
               loan(applicant={"age": 1, "income": 2, "female": False}),
               loan(applicant={"age": 1, "income": 2, "female": 1}, region=2)]
    decoded, _, _ = through(config, [encoded(r) for r in records])
    assert decoded.fields.s == ["female", "male"] and decoded.fields.u == ["north", "south"]
    assert decoded.errors[0][0] == 2 and "mapping: applicant.female: 1 is not a configured group" in decoded.errors[0][1]


def test_the_id_from_the_kafka_key():
    config = loans_config(id="$key")
    decoded, _, _ = through(config, [encoded(LOAN), encoded(LOAN), encoded(LOAN)], keys=[b"A-9", None, b"\xff"])
    assert decoded.fields.ids == ["A-9"] and list(decoded.keys) == ["A-9"]
    assert [reason for _, reason in decoded.errors] == ['missing Kafka key (mapping.id = "$key")',
                                                         'the Kafka key is not UTF-8 text (mapping.id = "$key")']


def test_an_existing_score_and_decision_are_read_as_columns():
    config = loans_config(score="model.score", decision="model.decision")
    records = [loan(model={"score": 0.8, "decision": True}), loan(model={"score": 0.1, "decision": 0}),
               loan(model={"score": 1.5, "decision": 0})]
    decoded, _, _ = through(config, [encoded(r) for r in records])
    assert decoded.score.tolist() == [0.8, 0.1] and decoded.decision.tolist() == [1, 0]
    assert decoded.errors == [(2, "mapping: model.score: expected a number in [0, 1], found 1.5")]


def test_objects_decoded_by_another_format_come_out_as_objects_and_are_not_changed():
    config = loans_config()
    codec = MappedRecords(config)
    objects = [loan(), loan(applicant={"age": "x", "income": 1, "sex": "F"})]
    decoded = codec.decode_objects(objects, [None, None], [encoded(o) for o in objects])
    assert list(decoded.index) == [0] and "applicant.age" in decoded.errors[0][1]
    ((_, out),), refused = codec.repaired_objects(decoded, [0], decoded.X + 1, PROV)
    assert refused == []
    assert objects[0] == LOAN and out["applicant"]["age"] == 38.0 and out["fairstream"]["original"]["age"] == 37
    json_codec_out, _ = codec.encode(codec.decode([encoded(LOAN)], [None]), [0], decoded.X + 1, PROV)
    assert json.loads(json_codec_out[0]) == out  # the two formats' outputs hold the same values


@pytest.mark.parametrize("strict", [False, True])
def test_the_loan_mapping_has_a_typed_decoder_reading_every_role_in_one_call(strict):
    codec = MappedRecords(loans_config(strict=strict, y="outcome", score="model.score"))
    record = without(loan(outcome=1, model={"score": 0.5}), "channel")
    assert codec.typed.rows([encoded(record)]) == [("A-1", datetime(2026, 11, 28, 10, tzinfo=timezone.utc), "F",
                                                    "north", 1, 0.5, 37.0, 52000.0, 12000.0)]
    assert codec.typed.rows([encoded(without(record, "branch"))])[0][3] == "north"  # the default, in C


def test_the_typed_decoder_and_the_reference_path_agree():
    # A batch with one bad message goes message by message: the good ones decode as in a clean batch.
    good = [encoded(loan(application_id=f"A-{i}", amount=1000 + i)) for i in range(5)]
    clean, _, _ = through(loans_config(), good)
    mixed, _, _ = through(loans_config(), good + [b"{}"])
    assert np.array_equal(clean.X, mixed.X) and clean.fields.ids == mixed.fields.ids
    codec = MappedRecords(loans_config())
    by_reference = codec.decode_objects([json.loads(v) for v in good], [None] * 5, good)
    assert np.array_equal(by_reference.X, clean.X) and by_reference.fields == clean.fields


def test_an_output_field_under_a_value_is_refused_for_that_record_only():
    config = loans_config({"field": "meta.fairstream"})
    codec = MappedRecords(config)
    decoded = codec.decode([encoded(loan(meta="plain")), encoded(LOAN)], [None, None])
    outputs, refused = codec.encode(decoded, [0, 1], decoded.X, PROV)
    assert len(outputs) == 1 and refused[0][0] == 0 and "meta holds str, not an object" in refused[0][1]


def test_a_layout_is_checked():
    with pytest.raises(ValueError, match="output.provenance"):
        OutputLayout(provenance="kafka")
    with pytest.raises(ValueError, match="needs a pipeline with a \\[mapping\\]"):
        MappedRecords(replace(loans_config(), mapping=None))


@pytest.mark.parametrize("fmt", ["epoch_s", "epoch_ms", "iso8601"])
def test_a_time_another_format_decoded_as_a_datetime_is_read_whatever_the_configured_format(fmt):
    # Avro's timestamp-millis and timestamp-micros logical types come out of fastavro as aware datetimes.
    moment = datetime(2026, 11, 28, 10, 0, tzinfo=timezone.utc)
    config = loans_config(time={"path": "submitted_at", "format": fmt})
    decoded = MappedRecords(config).decode_objects([loan(submitted_at=moment)], [None])
    assert decoded.errors == [] and decoded.fields.ts == [moment.timestamp()]


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_pass_through_value_that_is_not_json_is_refused_at_decode(constant):
    # The typed decoder refuses it and Python's parser would accept it: the record would go out as invalid JSON.
    value = encoded(LOAN).replace(b'"web"', constant)
    decoded = MappedRecords(loans_config()).decode([value], [None])
    assert decoded.errors == [(0, f"malformed JSON: {constant.decode()} is not a JSON value")]


def test_a_pass_through_string_that_is_not_utf8_is_refused_at_decode():
    value = encoded(LOAN).replace(b'"web"', b'"\xff"')
    decoded = MappedRecords(loans_config()).decode([value, encoded(LOAN)], [None, None])
    assert len(decoded.errors) == 1 and decoded.errors[0][1].startswith("message is not UTF-8")
    assert decoded.index.tolist() == [1]


def test_a_pass_through_number_beyond_the_float_range_stays_under_and_is_refused_in_place():
    value = encoded(LOAN).replace(b'"web"', b"1e400")
    under = loans_config(output={"repaired": "under"})
    decoded, _, refused = through(under, [value])
    codec = MappedRecords(under)
    outputs, refused = codec.encode(decoded, [0], decoded.X, PROV)
    assert refused == [] and outputs[0].startswith(value[:-1]) and b'"channel": 1e400' in outputs[0]
    decoded, outputs, refused = through(loans_config(), [value])
    assert outputs == [] and refused[0][1].startswith("the output could not be written") and "1e400" in refused[0][1]


def test_objects_whose_output_field_cannot_be_placed_are_refused_one_by_one():
    # An optional Avro record is None when absent: a nested output field under it cannot be written for that record.
    config = loans_config(output={"field": "meta.fairstream"})
    codec = MappedRecords(config)
    objects = [loan(meta=None), loan(meta={"x": 1})]
    decoded = codec.decode_objects(objects, [None, None], [encoded(o) for o in objects])
    placed, refused = codec.repaired_objects(decoded, [0, 1], decoded.X, PROV)
    assert [k for k, _ in placed] == [1] and placed[0][1]["meta"]["x"] == 1
    assert refused == [(0, "the output could not be written: meta holds NoneType, not an object: cannot write "
                           "meta.fairstream")]
