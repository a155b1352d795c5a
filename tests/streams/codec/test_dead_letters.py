"""Dead letters: each keeps its original's exact bytes and, with its key, fits under the producer's limit."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.codec.dead_letters import (
    MAX_DEAD_LETTER_KEY,
    MAX_DEAD_LETTER_ORIGINAL,
    MAX_OUTPUT_BYTES,
    MAX_REASON_CHARS,
    dead_letter,
    dead_letter_key,
    original_bytes,
    output_bytes,
)
from fairstream.streams.codec.records import decode_records, input_digest
from fairstream.streams.schemas import DeadLetter

from .messages import ADULT, BAD_RECORDS, GOOD, PROPERTY, strict_loads


@PROPERTY
@given(value=st.none() | st.binary(max_size=300), reason=st.text(max_size=MAX_REASON_CHARS),
       topic=st.text(min_size=1, max_size=249), partition=st.integers(0, 2**31 - 1), offset=st.integers(0, 2**63 - 1),
       agent=st.sampled_from(["records", "embeddings"]), key=st.none() | st.binary(min_size=1, max_size=40))
def test_dead_letter_keeps_the_exact_original_bytes(value, reason, topic, partition, offset, agent, key):
    envelope = dead_letter(value, reason, topic, partition, offset, agent, key=key)
    assert isinstance(envelope, bytes)
    letter = strict_loads(envelope)
    assert set(letter) == set(DeadLetter.field_names())
    assert (letter["reason"], letter["agent"], letter["topic"], letter["partition"], letter["offset"]) == (
        reason, agent, topic, partition, offset)
    assert original_bytes(letter) == (value or b"")
    assert letter["key_b64"] == (base64.b64encode(key).decode() if key else None)
    assert (letter["key_size"], letter["key_sha256"], letter["key_truncated"]) == (
        (len(key), hashlib.sha256(key).hexdigest(), False) if key else (None, None, False))
    assert dead_letter_key(key) == key  # a key that fits is the dead letter's own key, unchanged


@pytest.mark.parametrize("value", [b"", None, b"\xff\xfe\x00", b"\x00", GOOD, b"[" * 1000, bytes(range(256))])
def test_dead_letter_of_special_values(value):
    letter = json.loads(dead_letter(value, "why", "fairstream.records.in", 3, 42, "records"))
    assert original_bytes(letter) == (value or b"")
    assert letter["key_b64"] is None
    assert (letter["reason"], letter["topic"], letter["partition"], letter["offset"], letter["agent"]) == (
        "why", "fairstream.records.in", 3, 42, "records")


def test_dead_letter_of_every_refused_record():
    values = [value for value, _ in BAD_RECORDS.values()]
    batch = decode_records(values, ADULT)
    assert len(batch.errors) == len(values)
    for i, reason in batch.errors:
        letter = json.loads(dead_letter(values[i], reason, "fairstream.records.in", 0, i, "records", key=b"k"))
        assert letter["reason"] == reason and original_bytes(letter) == (values[i] or b"")
        assert base64.b64decode(letter["key_b64"]) == b"k"


# --------------------------------------------------------------------------- the output budget


# A character of each JSON escape length (1, 2, 6, 12 bytes), so reasons quoting them grow the most.
ESCAPED = ["a", '"', "\x01", "\u20ac", "\U0001f600"]


def producer_bytes(key: bytes | None, value: bytes) -> int:
    """What the worker's producer (aiokafka) counts against its max_request_size for one record."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])


@settings(max_examples=40, deadline=None)
@given(key_size=st.sampled_from([0, 1, MAX_DEAD_LETTER_KEY, MAX_DEAD_LETTER_KEY + 1, 460_000, MAX_OUTPUT_BYTES])
       | st.integers(0, MAX_OUTPUT_BYTES + 100),
       value_size=st.sampled_from([0, MAX_DEAD_LETTER_ORIGINAL, MAX_DEAD_LETTER_ORIGINAL + 1, 3_000_000])
       | st.integers(0, 2 * MAX_OUTPUT_BYTES),
       reason_char=st.sampled_from(ESCAPED), reason_length=st.integers(0, 3 * MAX_REASON_CHARS))
def test_a_dead_letter_with_its_key_fits_under_the_producer_limit_whatever_arrived(key_size, value_size, reason_char,
                                                                                  reason_length):
    key = (bytes(range(256)) * (key_size // 256 + 1))[:key_size] or None
    value = (b"v" * value_size) or None
    reason = "feature 'age' has a non-numeric value " + reason_char * reason_length
    letter_bytes = dead_letter(value, reason, "p" * 200 + ".records.in", 2**31 - 1, 2**63 - 1, "embeddings", key=key)
    kafka_key = dead_letter_key(key)
    assert output_bytes(kafka_key, letter_bytes) <= MAX_OUTPUT_BYTES
    assert producer_bytes(kafka_key, letter_bytes) <= MAX_OUTPUT_BYTES
    letter = strict_loads(letter_bytes)
    # What was cut is named by its full size and sha256; what was kept is the start of it.
    assert original_bytes(letter) == (value or b"")[:MAX_DEAD_LETTER_ORIGINAL]
    assert letter["original_truncated"] == (value_size > MAX_DEAD_LETTER_ORIGINAL)
    assert letter["original_size"] == value_size
    assert letter["original_sha256"] == hashlib.sha256(value or b"").hexdigest()
    if key:
        assert base64.b64decode(letter["key_b64"]) == kafka_key == key[:MAX_DEAD_LETTER_KEY]
        assert (letter["key_size"], letter["key_sha256"]) == (key_size, hashlib.sha256(key).hexdigest())
        assert letter["key_truncated"] == (key_size > MAX_DEAD_LETTER_KEY)
    else:
        assert letter["key_b64"] is None and kafka_key is None
    assert len(letter["reason"]) == min(len(reason), MAX_REASON_CHARS) and letter["reason"][:30] == reason[:30]


def test_the_460_kb_key_of_the_issue_gives_a_dead_letter_under_the_limit():
    key = b"k" * 460_000  # with its base64 copy, the dead letter was 1,073,799 bytes
    letter_bytes = dead_letter(b'{"id": "x"}', "missing field(s) ['features']", "fairstream.records.in", 0, 7,
                               "records", key=key)
    assert producer_bytes(dead_letter_key(key), letter_bytes) <= MAX_OUTPUT_BYTES
    letter = json.loads(letter_bytes)
    assert letter["key_truncated"] and letter["key_size"] == 460_000 and not letter["original_truncated"]


@pytest.mark.parametrize("size", [500_000, 800_000, 1_500_000, 3_000_000])
def test_a_dead_letter_fits_under_the_message_limit_whatever_arrived(size):
    value = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    letter_bytes = dead_letter(value, "oversized", "fs.records.in", 3, 17, "records", key=b"k")
    assert len(letter_bytes) < 1024 * 1024
    letter = json.loads(letter_bytes)
    kept = original_bytes(letter)
    assert letter["original_size"] == size and letter["original_sha256"] == hashlib.sha256(value).hexdigest()
    assert letter["original_truncated"] == (size > MAX_DEAD_LETTER_ORIGINAL)
    assert kept == value[:MAX_DEAD_LETTER_ORIGINAL]


# --------------------------------------------------------------------------- the input digest


def test_a_dead_letter_carries_the_digest_a_repaired_record_of_the_same_bytes_would():
    for value in (GOOD, b"{", None, b"x" * (MAX_DEAD_LETTER_ORIGINAL + 10)):
        letter = strict_loads(dead_letter(value, "why", "t", 0, 1, "records"))
        assert letter["input_digest"] == input_digest(value) == letter["original_sha256"][:32]
    assert decode_records([GOOD], ADULT).fields.digests == [input_digest(GOOD)]
