"""Every output of the worker's batch logic fits under the producer's limit, whatever arrived.

A repaired record or a dead letter that does not fit stops the partition: the producer refuses it,
the batch is never committed, and every restart meets it again. Here the inputs sit at the
documented maxima (``max_message_bytes = 524288``, Kafka keys up to the producer's 1 MiB, ids of
the characters whose JSON escapes are longest, every field at its longest) and every output is
measured the way the worker's producer (aiokafka) measures it.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.codec.dead_letters import MAX_DEAD_LETTER_KEY, MAX_OUTPUT_BYTES, output_bytes
from fairstream.streams.codec.records import MAX_ID_CHARS, input_digest
from fairstream.streams.config import EmbeddingConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.processing import EmbeddingRepairer, RecordRepairer, SimpleMessage

LARGEST = adult_config(max_message_bytes=524_288, embeddings=EmbeddingConfig(dimension=8))
# JSON text of one id character in the input (raw UTF-8, or the escape JSON requires) -> 1 to 6 bytes; in the
# output (UTF-8, or the escape JSON requires; a reference-path id may be written with ASCII escapes) -> 1 to 12
# bytes: an id of these can triple or grow sixfold on the way out.
ID_CHARS = ["a", '"', "\x01", "é", "\u20ac", "\u2028", "\U0001f600"]
LONGEST_FLOAT = 1.2345678901234567e-100  # 23 characters, inside the valid ranges of both features
LONGEST_TS = -1.7976931348623157e308  # 24 characters


@pytest.fixture(scope="module")
def plan():
    research, _ = datasets.load("adult").split(2_000, seed=0)
    fitted = DistributionalRepair(n_q=30, out_of_range="clamp").fit(research.X, research.s, research.u)
    return Active("plan", 2**62, "f" * 64, None, fitted)  # the longest version a record carries


def producer_bytes(key: bytes | None, value: bytes) -> int:
    """What the worker's producer counts against its max_request_size for one record."""
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])


def assert_every_output_fits(outcome, n_inputs: int) -> None:
    assert len(outcome.repaired) + len(outcome.dead) == n_inputs  # nothing lost on the way
    for key, value in outcome.repaired + outcome.dead:
        assert producer_bytes(key, value) <= output_bytes(key, value) <= MAX_OUTPUT_BYTES


def input_value(rid: str, valid: bool = True, size: int = 0) -> bytes:
    """A record with every field at its longest, padded with JSON whitespace to ``size`` bytes."""
    features = {"age": LONGEST_FLOAT, "hours-per-week": LONGEST_FLOAT if valid else "forty"}
    text = json.dumps({"id": rid, "ts": LONGEST_TS, "features": features, "s": 1, "u": 1, "y": 1}, ensure_ascii=False)
    return (text[:-1] + " " * (size - len(text.encode())) + "}").encode()


def repeated(pattern: bytes, size: int) -> bytes:
    return (pattern * (size // len(pattern) + 1))[:size]


@settings(max_examples=25, deadline=None)
@given(char=st.sampled_from(ID_CHARS), id_length=st.integers(1, MAX_ID_CHARS + 2), fill=st.floats(0.0, 1.02),
       key_size=st.sampled_from([None, 0, MAX_DEAD_LETTER_KEY + 1, 460_000, MAX_OUTPUT_BYTES - 600])
       | st.integers(0, MAX_OUTPUT_BYTES))
def test_every_record_output_fits_at_the_documented_maxima(plan, char, id_length, fill, key_size):
    rid, size = char * id_length, int(fill * LARGEST.max_message_bytes)
    key = None if key_size is None else repeated(bytes(range(256)), key_size)
    messages = [SimpleMessage(input_value(rid, size=size), key=key, offset=1),  # valid: repaired if it fits
                SimpleMessage(input_value(rid, valid=False, size=size), key=key, offset=2),  # dead-lettered
                SimpleMessage(input_value(rid, size=size), key=None, offset=3),  # keyless: its key is the id's text
                SimpleMessage(input_value("small"), key=b"small", offset=4)]
    outcome = RecordRepairer(LARGEST).process(messages, plan)
    assert_every_output_fits(outcome, len(messages))
    repaired = {json.loads(v)["input_digest"]: k for k, v in outcome.repaired}
    assert repaired[input_digest(messages[3].value())] == b"small"  # the record beside them is untouched


@settings(max_examples=15, deadline=None)
@given(char=st.sampled_from(ID_CHARS), fill=st.floats(0.0, 1.02), key_size=st.integers(0, MAX_OUTPUT_BYTES))
def test_every_embedding_output_fits_at_the_documented_maxima(char, fill, key_size):
    per_char = len(json.dumps(char, ensure_ascii=False).encode()) - 2
    text = char * max(1, int(fill * LARGEST.max_message_bytes / 2) // per_char)  # group and identity share it
    value = json.dumps({"id": "e", "vector": [LONGEST_FLOAT] * 8, "group": text, "identity": text},
                       ensure_ascii=False).encode()
    messages = [SimpleMessage(value, key=b"k" * key_size), SimpleMessage(value, key=None),
                SimpleMessage(value[:-1], key=b"k" * key_size)]
    assert_every_output_fits(EmbeddingRepairer(LARGEST).process(messages, None), len(messages))


def test_an_invalid_record_with_a_460_kb_key_gives_a_dead_letter_that_names_the_cut_key(plan):
    key = repeated(bytes(range(256)), 460_000)  # the dead letter of the issue was 1,073,799 bytes
    message = SimpleMessage(input_value("r-1", valid=False), key=key, topic="fairstream.records.in", offset=9)
    outcome = RecordRepairer(LARGEST).process([message], plan)
    ((kafka_key, value),) = outcome.dead
    assert producer_bytes(kafka_key, value) <= MAX_OUTPUT_BYTES
    letter = json.loads(value)
    assert kafka_key == base64.b64decode(letter["key_b64"]) == key[:MAX_DEAD_LETTER_KEY]
    assert (letter["key_size"], letter["key_sha256"], letter["key_truncated"]) == (
        len(key), hashlib.sha256(key).hexdigest(), True)
    assert base64.b64decode(letter["original_b64"]) == message.value() and not letter["original_truncated"]
    assert "non-numeric value 'forty'" in letter["reason"]


def test_a_valid_record_with_a_key_its_output_cannot_carry_is_dead_lettered_and_one_that_fits_keeps_its_key(plan):
    messages = [SimpleMessage(input_value("too-big", size=LARGEST.max_message_bytes),
                              key=repeated(b"0123456789", MAX_OUTPUT_BYTES - 500)),
                SimpleMessage(input_value("big", size=LARGEST.max_message_bytes), key=repeated(b"k", 460_000)),
                SimpleMessage(input_value("keyless"), key=None)]
    outcome = RecordRepairer(LARGEST).process(messages, plan)
    assert_every_output_fits(outcome, len(messages))
    ((kafka_key, value),) = outcome.dead
    letter = json.loads(value)
    assert "over the producer's limit of 1048576 bytes" in letter["reason"] and letter["key_truncated"]
    assert base64.b64decode(letter["original_b64"]) == messages[0].value()
    assert kafka_key == messages[0].key()[:MAX_DEAD_LETTER_KEY] and len(kafka_key) == MAX_DEAD_LETTER_KEY
    # The others keep their keys: the output key is the input's Kafka key, else the id (the record key) as text.
    assert {json.loads(v)["id"]: k for k, v in outcome.repaired} == {"big": messages[1].key(), "keyless": b"keyless"}
    assert sorted(outcome.monitor_batch.keys.tolist()) == ["big", "keyless"]  # only what was sent is measured


@pytest.mark.parametrize("rid", ["\u20ac" * (MAX_ID_CHARS + 1), "a" * 500_000, 10 ** MAX_ID_CHARS])
def test_an_id_longer_than_the_limit_is_dead_lettered_whole_and_the_batch_goes_on(plan, rid):
    # An id of 500,000 characters made the batch's key array 2 GB and its escaped output 1.5 MB.
    messages = [SimpleMessage(input_value(rid)), SimpleMessage(input_value("next"), key=b"next")]
    outcome = RecordRepairer(LARGEST).process(messages, plan)
    assert_every_output_fits(outcome, 2)
    ((_, value),) = outcome.dead
    letter = json.loads(value)
    assert letter["reason"] == f"id must be at most {MAX_ID_CHARS} characters long, got {len(str(rid))}"
    assert base64.b64decode(letter["original_b64"]) == messages[0].value()
    assert [k for k, _ in outcome.repaired] == [b"next"]


def test_an_embedding_whose_output_would_not_fit_is_dead_lettered_and_left_out_of_the_verification_sample():
    text = "\U0001f600" * 60_000  # 4 bytes in, 12 out: group and identity make about 1.4 MB
    big = json.dumps({"id": "big", "vector": [1.0] * 8, "group": text, "identity": text}, ensure_ascii=False)
    small = json.dumps({"id": "e", "vector": [1.0] * 8, "identity": 7})
    outcome = EmbeddingRepairer(LARGEST).process([SimpleMessage(big.encode()), SimpleMessage(small.encode())])
    assert_every_output_fits(outcome, 2)
    assert [json.loads(v)["id"] for _, v in outcome.repaired] == ["e"] and len(outcome.dead) == 1
    assert "over the producer's limit" in json.loads(outcome.dead[0][1])["reason"]
    assert outcome.labelled[1] == (7,)  # the identities of the verification sample: only the sent record's
