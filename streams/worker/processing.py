"""What an agent does to one batch, without Faust: decode, repair with the active artifact, encode.

Keeping this apart from the agents means the exact code path of the stream can be called on a
list of messages in a test or a benchmark, and the agents stay a few lines of I/O. Every input
message produces exactly one output: a repaired record or a dead letter with its reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from fairstream.models.embedding import normalise
from fairstream.repair.protocol import Batch, apply_chain
from fairstream.streams.codec import (
    RepairedBatch,
    dead_letter,
    decode_embeddings,
    decode_records,
    encode_embeddings,
    encode_repaired,
    provenance,
)
from fairstream.streams.config import PipelineConfig


class MessageLike(Protocol):
    """The parts of a Kafka message the processing needs (Faust's ``Message`` has them)."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class SimpleMessage:
    """A message built in a test or benchmark (the fields of a Kafka message the processing reads)."""
    value: bytes | None
    key: bytes | None = None
    topic: str = ""
    partition: int = 0
    offset: int = 0


@dataclass
class BatchOutcome:
    """(key, value) pairs for the output topic and for the dead-letter topic, and what the batch saw."""

    repaired: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    dead: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    version: int | None = None
    out_of_range: int = 0  # records with a value outside the plan's range (clamped or refused)
    imputed: int = 0  # repaired records whose missing s was imputed
    event_times: list = field(default_factory=list)  # the ``ts`` of the repaired records, for latency
    monitor_batch: RepairedBatch | None = None  # the repaired records as arrays, for the fairness monitor
    labelled: tuple | None = None  # embeddings: (vectors, identities, groups, ids) of records with an identity


def _dead_letters(messages: Sequence[MessageLike], failures: list[tuple[int, str]], agent: str) -> list:
    return [(messages[i].key, dead_letter(messages[i].value, reason, messages[i].topic, messages[i].partition,
                                          messages[i].offset, agent, messages[i].key))
            for i, reason in failures]


def _output_key(message: MessageLike, record_id) -> bytes:
    return message.key if message.key is not None else str(record_id).encode()


def _provenance(chain: Sequence) -> dict:
    return provenance([(a.kind, a.version, a.sha256, a.module.seed) for a in chain])


def as_actives(active) -> tuple:
    """The registry's active artifacts of a chain as a tuple (one ``Active`` is a chain of one)."""
    return tuple(active) if isinstance(active, (list, tuple)) else (active,)


class RecordRepairer:
    """Batch logic of the record agent: tabular records through the pipeline's chain of frozen modules."""

    agent = "records"

    def __init__(self, config: PipelineConfig):
        self.config = config

    def process(self, messages: Sequence[MessageLike], active) -> BatchOutcome:
        """``active``: the registry's active artifacts of the configured chain, in order (or one of them)."""
        chain = as_actives(active)
        decoded = decode_records([m.value for m in messages], self.config)
        failures = list(decoded.errors)
        outcome = BatchOutcome(version=chain[0].version)
        if len(decoded.index):
            batch = decoded.batch()
            result = apply_chain([a.module for a in chain], batch)
            ok = np.flatnonzero(result.ok)
            failures += [(int(decoded.index[i]), result.reasons[i]) for i in np.flatnonzero(~result.ok)]
            fields = decoded.fields.take(ok)
            imputed = result.imputed[ok] if result.imputed is not None else None
            scored = {name: result.columns[name][ok] for name in ("score", "decision")} \
                if "decision" in result.columns else None
            values = encode_repaired(fields, batch.X[ok], result.X[ok], self.config, _provenance(chain), imputed,
                                     scored)
            outcome.repaired = [(_output_key(messages[decoded.index[i]], rid), v)
                                for i, rid, v in zip(ok, fields.ids, values)]
            outcome.out_of_range = int(result.out_of_range.sum())
            outcome.event_times = [ts for ts in fields.ts if ts is not None]
            outcome.imputed = 0 if imputed is None else int(imputed.sum())
            # Fairness is measured on records with their true s: imputed ones are only counted.
            measured = ok if imputed is None else ok[~imputed]
            times = [fields.ts[i] for i in (np.arange(len(ok)) if imputed is None else np.flatnonzero(~imputed))]
            outcome.monitor_batch = _monitor_batch(batch.take(measured), result.X[measured],
                                                   result.out_of_range[measured], [ts for ts in times if ts is not None],
                                                   result.columns.get("decision"), measured)
        outcome.dead = _dead_letters(messages, failures, self.agent)
        return outcome


def _monitor_batch(batch: Batch, repaired, out_of_range, event_times, decision, rows) -> RepairedBatch:
    n = len(batch)
    ts = np.array(event_times, dtype=np.float64) if len(event_times) == n else np.full(n, time.time())
    return RepairedBatch(before=batch.X, after=repaired, s=batch.s, u=batch.u, keys=batch.keys, ts=ts, y=batch.y,
                         out_of_range=out_of_range, decision=None if decision is None else decision[rows])


class EmbeddingRepairer:
    """Batch logic of the embedding agent: vectors through the frozen embedding module (or the identity)."""

    agent = "embeddings"

    def __init__(self, config: PipelineConfig):
        self.config = config

    def process(self, messages: Sequence[MessageLike], active=None) -> BatchOutcome:
        """``active`` is the registry's active ``embedding`` artifact, or None for the identity (normalisation)."""
        decoded = decode_embeddings([m.value for m in messages], self.config)
        if active is None:  # the identity module: L2 normalisation, what a trained module starts from
            vectors, prov = normalise(decoded.vectors), provenance([("identity", 0, "", "")])
        else:
            vectors, prov = apply_chain([active.module], decoded.batch()).X, _provenance([active])
        values = encode_embeddings(decoded.records, vectors, prov, decoded.digests)
        labelled = [k for k, r in enumerate(decoded.records) if r.get("identity") is not None]
        return BatchOutcome(
            repaired=[(_output_key(messages[i], r["id"]), v) for i, r, v in zip(decoded.index, decoded.records, values)],
            dead=_dead_letters(messages, decoded.errors, self.agent),
            version=prov["version"],
            labelled=(vectors[labelled], *zip(*[(decoded.records[k]["identity"], decoded.records[k].get("group"),
                                                 decoded.records[k]["id"]) for k in labelled])) if labelled else None,
        )
