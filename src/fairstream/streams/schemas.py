"""The wire format of every topic, as Faust records.

These classes are the single statement of which fields a message has: the batch codec derives its
required and allowed field sets from them, producers build messages with them, and tests read
messages back with them. The hot path does not instantiate them per message (the agents decode
batches of raw bytes into numpy arrays), which is why the agents' topics use raw bytes.
"""

from __future__ import annotations

from typing import Any, Optional

import faust


class _Schema(faust.Record, serializer="json"):
    @classmethod
    def field_names(cls) -> list[str]:
        return list(cls._options.fields)

    @classmethod
    def required_fields(cls) -> list[str]:
        return [name for name in cls._options.fields if name not in cls._options.defaults]


class InputRecord(_Schema):
    """A record on ``records.in``: features of one person, protected group s, stratum u, label y."""

    id: Any  # str or int; its text is the record key of the deterministic repair
    features: dict
    s: Any
    u: Any
    ts: Optional[float] = None
    y: Optional[int] = None


class RepairedRecord(_Schema):
    """A record on ``records.repaired``: repaired features plus the artifacts that produced them.

    ``provenance`` names the first module of the record chain (``kind``, ``version``, ``sha256``,
    ``seed``) and lists every module applied (``chain``). The per-row columns its modules declare they add
    (``Capabilities.adds``, of :data:`~fairstream.repair.protocol.COLUMNS`) are fields of their own: a
    ``score`` (Pr[y = 1], a scorer's) and a ``decision`` (0 or 1: the chain's last, a module placed after
    the scorer, e.g. group thresholds, replacing the scorer's).

    ``input_digest`` identifies the input message (the first 128 bits of its sha256, hex): outputs
    with the same ``(id, input_digest)`` come from one message (a replay); the same ``id`` with
    another digest is a different record that reused the id (a conflict, never to be merged).
    """

    id: Any
    s: Any
    u: Any
    features: dict
    provenance: dict
    input_digest: Optional[str]  # null only for records encoded without their input bytes (tests, notebooks)
    ts: Optional[float] = None
    y: Optional[int] = None
    original: Optional[dict] = None
    s_imputed: Optional[bool] = None  # only from inputs that impute a missing s: was this record's s drawn?
    score: Optional[float] = None  # only from a chain that writes a score
    decision: Optional[int] = None  # only from a chain that writes a decision: its last module's


class EmbeddingRecord(_Schema):
    """A vector on ``embeddings.in``; ``identity`` (on a labelled sample) feeds the verification monitor."""

    id: Any
    vector: list
    group: Any = None  # a label (an int or a string), when known; anything else is dead-lettered
    identity: Any = None  # who the vector shows (an int or a string), when known


class DeadLetter(_Schema):
    """A message on ``dlq``: the original bytes and key, why it was refused, and where it came from.

    A dead letter fits under the producer's message limit whatever arrived (see :func:`~fairstream.streams.codec.dead_letters.dead_letter`):
    an original of more than 512 KiB is kept as its first 512 KiB (``original_truncated``), a Kafka key
    of more than 64 KiB as its first 64 KiB (``key_truncated``; the dead letter's own Kafka key is the
    same prefix), and a reason as its first 2,000 characters; the full size and sha256 of the original
    and of the key identify what was cut.
    """

    reason: str
    agent: str
    topic: str
    partition: int
    offset: int
    original_b64: str
    original_size: int
    original_sha256: str
    input_digest: str  # original_sha256's first 32 hex digits: the same digest a repaired record carries
    original_truncated: bool = False
    key_b64: Optional[str] = None  # null: the message had no key
    key_size: Optional[int] = None
    key_sha256: Optional[str] = None
    key_truncated: bool = False


class ControlRecord(_Schema):
    """A message on ``control``: which artifact version is active (key: ``control_key`` in ``control/records.py``).

    The artifact travels inline (``blob_b64``, the single-blob encoding of
    :func:`fairstream.repair.artifacts.encode`) while small, otherwise as a path in the
    content-addressed artifact store; ``sha256`` is always checked against the payload.

    The audit trail: ``actor`` is who acted (a person's ``--by``, else ``user@host``; a service's own
    name, e.g. ``refit@host``), ``reason`` why, and ``statistics`` the figures that decided it (names to
    finite numbers). All three are optional: records written before them still parse.

    Who wrote it, checked: ``signer`` names the key whose Ed25519 ``signature`` covers the record, ``previous``
    is the sha256 of the value of the record before it in the pipeline's trail and ``pipeline`` the control
    topic it was written for (see :mod:`fairstream.streams.control.gate`). All four are optional on the wire:
    a pipeline whose trust is ``"none"`` reads records without them.

    ``candidate`` (a publish only, encoded only when true): the version is claimed but does not serve;
    it is the kind's pending candidate until a decision names it (``promote`` or ``approve``: it
    serves; ``reject`` or ``retire``: it never does). The four decisions carry no artifact (neither
    ``blob_b64`` nor ``path``): they name the candidate by ``kind``, ``version`` and ``sha256``.
    """

    kind: str
    version: int
    sha256: str
    action: str = "publish"  # "publish", "rollback", "configure", or a decision (promote, approve, reject, retire)
    blob_b64: Optional[str] = None
    path: Optional[str] = None
    published_at: Optional[float] = None
    actor: Optional[str] = None
    reason: Optional[str] = None
    statistics: Optional[dict] = None  # flat: str -> finite float
    candidate: Optional[bool] = None  # only True (a candidate publish) or None (left out of the message)
    pipeline: Optional[str] = None  # the control topic the record was written for: a copy elsewhere is refused
    previous: Optional[str] = None  # sha256 of the value of the record before it in the trail (the hash chain)
    signer: Optional[str] = None  # the name of the key that signed it, as the pipeline's trust file lists it
    signature: Optional[str] = None  # Ed25519 over the record's canonical bytes (control/signing.py)
