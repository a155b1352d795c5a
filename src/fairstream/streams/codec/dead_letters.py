"""Dead letters (``dlq``) and the output budget: every output fits under the producer's limit.

Wire format: one UTF-8 JSON object per refused message, the fields of
:class:`~fairstream.streams.schemas.DeadLetter`: the original bytes and Kafka key (base64), why it was
refused, and where it came from (topic, partition, offset, agent). Every output, a repaired record or a
dead letter, fits under :data:`MAX_OUTPUT_BYTES` with its Kafka key and the record overhead: a repaired
output that would not (:func:`oversized`) is dead-lettered instead, and a dead letter fits by construction.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Sequence

import numpy as np

from fairstream.streams.schemas import DeadLetter

from .records import input_digest

MAX_OUTPUT_BYTES = 1024 * 1024
"""The producer's limit on one output record (its ``max_request_size``, and Apache Kafka's default message
limit): every output, repaired record or dead letter, fits under it with its Kafka key and the record overhead."""

RECORD_OVERHEAD_BYTES = 128
"""An upper bound on what the producer adds to a record's key and value when it checks the limit: the record
batch header (61 bytes), the record's own fields (at most 21) and the varint lengths of key, value and headers."""

MAX_DEAD_LETTER_ORIGINAL = 512 * 1024
"""Bytes of an original message a dead letter keeps (base64: 683 KiB): every message up to the largest
``max_message_bytes`` is kept whole; of a larger one (a 3 MB message is dead-lettered too) the first 512 KiB."""

MAX_DEAD_LETTER_KEY = 64 * 1024
"""Bytes of an original Kafka key a dead letter keeps (as its own key and in ``key_b64``)."""

MAX_REASON_CHARS = 2000
"""Characters of a dead-letter reason (a reason quotes the offending value, which may be long)."""

_MAX_TOPIC_CHARS = 249  # Kafka's limit on a topic name


def output_bytes(key: bytes | None, value: bytes) -> int:
    """What one output counts against :data:`MAX_OUTPUT_BYTES`: its key, its value and the record overhead."""
    return len(key or b"") + len(value) + RECORD_OVERHEAD_BYTES


def oversized(keys: Sequence[bytes | None], values: Sequence[bytes]) -> list[tuple[int, str]]:
    """(position, reason) of every output (``keys[i]``, ``values[i]``) that would not fit in :data:`MAX_OUTPUT_BYTES`.

    A repaired output is sent whole or not at all: the input of one that does not fit (a valid record with a
    900 KB Kafka key, a vector whose group is 100,000 emoji) is dead-lettered with this reason, and its dead
    letter fits by construction. This runs on every output: the largest key and value are checked first, in C.
    """
    if not values:
        return []
    room = MAX_OUTPUT_BYTES - RECORD_OVERHEAD_BYTES
    keys = [key or b"" for key in keys] if None in keys else keys
    if max(map(len, values)) + max(map(len, keys)) <= room:  # the common case: even the largest pair fits
        return []
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    sizes += np.fromiter(map(len, keys), dtype=np.int64, count=len(values))
    return [(i, f"the repaired output would be {output_bytes(keys[i], values[i])} bytes (a Kafka key of "
                f"{len(keys[i])} bytes, a value of {len(values[i])} bytes and the record overhead), over the "
                f"producer's limit of {MAX_OUTPUT_BYTES} bytes")
            for i in np.flatnonzero(sizes > room).tolist()]


def dead_letter_key(key: bytes | None) -> bytes | None:
    """A dead letter's Kafka key: its input's, cut to its first :data:`MAX_DEAD_LETTER_KEY` bytes (as ``key_b64``)."""
    return None if key is None else key[:MAX_DEAD_LETTER_KEY]


def dead_letter(value: bytes | None, reason: str, topic: str, partition: int, offset: int, agent: str,
                key: bytes | None = None) -> bytes:
    """The dead-letter envelope: the original bytes and key (base64), why, and whence; it fits by construction.

    With its Kafka key (:func:`dead_letter_key`) the envelope fits under :data:`MAX_OUTPUT_BYTES` whatever
    arrived: the reason is cut to :data:`MAX_REASON_CHARS` characters, the key to :data:`MAX_DEAD_LETTER_KEY`
    bytes, and the original to :data:`MAX_DEAD_LETTER_ORIGINAL` bytes (or to the room left, which no reason
    and topic name come near). Whatever was cut is named by its full size and sha256 (``original_size``,
    ``original_sha256``, ``original_truncated``; ``key_size``, ``key_sha256``, ``key_truncated``).
    """
    original = value or b""
    kept_key = dead_letter_key(key)
    fields = dict(reason=_clip(reason, MAX_REASON_CHARS), agent=agent, topic=topic[:_MAX_TOPIC_CHARS],
                  partition=partition, offset=offset, original_size=len(original),
                  original_sha256=hashlib.sha256(original).hexdigest(), input_digest=input_digest(value),
                  **_key_fields(key, kept_key))

    def envelope(kept: bytes, truncated: bool) -> bytes:
        letter = DeadLetter(**fields, original_b64=base64.b64encode(kept).decode(), original_truncated=truncated)
        return json.dumps(letter.asdict(), separators=(",", ":")).encode()

    # "false" is the longer flag: the room is measured with it, so the final envelope is never larger.
    room = MAX_OUTPUT_BYTES - RECORD_OVERHEAD_BYTES - len(kept_key or b"") - len(envelope(b"", False))
    kept = original[:max(0, min(MAX_DEAD_LETTER_ORIGINAL, room // 4 * 3))]  # base64: 4 bytes per 3
    return envelope(kept, len(kept) < len(original))


def _key_fields(key: bytes | None, kept: bytes | None) -> dict:
    if not key:
        return {}
    return dict(key_b64=base64.b64encode(kept).decode(), key_size=len(key), key_sha256=hashlib.sha256(key).hexdigest(),
                key_truncated=len(kept) < len(key))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def original_bytes(letter: dict) -> bytes:
    """The bytes a dead letter keeps of its original: all of them unless ``original_truncated``."""
    return base64.b64decode(letter["original_b64"])
