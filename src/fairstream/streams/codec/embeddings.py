"""Input embeddings (``embeddings.in``): a batch of raw values becomes one array of vectors and the reasons.

Wire format: one UTF-8 JSON object per message, the fields of :class:`~fairstream.streams.schemas.EmbeddingRecord`
(``id``, ``vector`` of ``dimension`` numbers, optional ``group`` and ``identity`` labels). A typed fast path
decodes a vector in one C call; a value it doubts takes the reference path, which decides and words the
reason (the record rules of :mod:`~fairstream.streams.codec.records`). The repaired vectors
(``embeddings.repaired``) are written by :func:`~fairstream.streams.codec.repaired.encode_embeddings`,
beside the repaired records, whose output machinery they share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import msgspec
import numpy as np

from fairstream.repair.protocol import Batch
from fairstream.streams.config import PipelineConfig
from fairstream.streams.schemas import EmbeddingRecord

from .json_text import describe
from .records import (
    MAX_ID_CHARS,
    Invalid,
    check_fields,
    decode_each_message,
    finite_number,
    input_digest,
    parse_json_object,
    record_key,
)

_EMBEDDING_REQUIRED = frozenset(EmbeddingRecord.required_fields())
_EMBEDDING_ALLOWED = frozenset(EmbeddingRecord.field_names())


@dataclass
class DecodedEmbeddings:
    """The usable embedding records of a batch as arrays, and why the others are not usable."""
    index: np.ndarray
    records: list[dict]  # {"id", "group", "identity"} of each record (None where absent); vectors are in ``vectors``
    keys: np.ndarray
    vectors: np.ndarray  # (n, dimension)
    errors: list[tuple[int, str]] = field(default_factory=list)
    digests: list = field(default_factory=list)  # each record's input_digest

    def batch(self) -> Batch:
        """The usable vectors as the modules' :class:`~fairstream.repair.protocol.Batch`."""
        return Batch(X=self.vectors, keys=self.keys)


def _check_embedding(obj: dict, dimension: int) -> list[float]:
    check_fields(obj, _EMBEDDING_REQUIRED, _EMBEDDING_ALLOWED)
    record_key(obj)
    for name in ("group", "identity"):
        _optional_label(obj.get(name), name)
    vector = obj["vector"]
    if not isinstance(vector, list):
        raise Invalid(f"vector must be a JSON array, got {type(vector).__name__}")
    if len(vector) != dimension:
        raise Invalid(f"vector has {len(vector)} values, expected {dimension}")
    return [finite_number(v, f"vector[{j}]") for j, v in enumerate(vector)]


def _optional_label(value, name: str) -> None:
    # A label, like the configured groups: an integer or a string (NaN, 1.5, true or an array are not), or absent.
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
        raise Invalid(f"{name} must be an integer or a string, got {describe(value)}")


_EMBEDDING_DECODER = msgspec.json.Decoder(msgspec.defstruct(
    "Embedding", [("id", Union[int, str]), ("vector", list[float]), ("group", Union[int, str, None], None),
                  ("identity", Union[int, str, None], None)], forbid_unknown_fields=True))
"""The typed fast path of ``embeddings.in``: accepts a subset of what the reference path accepts (512 floats
are one C call here, 512 Python checks there)."""


def _fast_embedding(value: bytes | None, dimension: int, limit: int):
    """The record, or None when the reference path must decide (and explain)."""
    if not value or len(value) > limit:
        return None
    try:
        record = _EMBEDDING_DECODER.decode(value)
    except Exception:  # DecodeError, ValidationError, bad UTF-8, RecursionError (deep nesting): the reference
        return None  # path decides and words the reason
    rid = record.id
    if not _plain_id(rid):
        return None
    return record if len(record.vector) == dimension else None


def _plain_id(rid: int | str) -> bool:
    """An id the embedding fast path accepts as it is (msgspec refuses lone surrogates); others take the reference."""
    if isinstance(rid, str):
        return bool(rid) and len(rid) <= MAX_ID_CHARS and "\x00" not in rid
    return rid.bit_length() <= _MAX_ID_BITS


_MAX_ID_BITS = 3_300  # fewer than 1,000 digits: within MAX_ID_CHARS (and Python's 4,300-digit limit on int parsing)


def _decode_embedding(value: bytes | None, dim: int, limit: int) -> tuple[dict, list[float]]:
    """One record's {"id", "group", "identity"} and its vector; :class:`Invalid` says why not."""
    fast = _fast_embedding(value, dim, limit)
    if fast is not None:  # msgspec refuses NaN, Infinity and out-of-range numbers: every float is finite
        return {"id": fast.id, "group": fast.group, "identity": fast.identity}, fast.vector
    parsed = parse_json_object(value, limit)
    row = _check_embedding(parsed, dim)
    return {"id": parsed["id"], "group": parsed.get("group"), "identity": parsed.get("identity")}, row


def decode_embeddings(values: Sequence[bytes | None], config: PipelineConfig) -> DecodedEmbeddings:
    """Parse and validate a batch of raw values from ``embeddings.in`` (typed fast path, reference path on doubt).

    ``group`` and ``identity`` are labels (an integer or a string) or absent; no message can make the batch raise.
    """
    dim, limit = config.embeddings.dimension, config.max_message_bytes
    index, decoded, errors = decode_each_message(values, lambda value: _decode_embedding(value, dim, limit),
                                                 "embeddings")
    records, rows = [obj for obj, _ in decoded], [row for _, row in decoded]
    digests = [input_digest(values[i]) for i in index]
    return DecodedEmbeddings(index=np.array(index, dtype=np.intp), records=records,
                             keys=np.array([str(r["id"]) for r in records], dtype=str),
                             vectors=np.array(rows, dtype=np.float64).reshape(len(rows), dim), errors=errors,
                             digests=digests)

