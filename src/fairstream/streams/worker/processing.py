"""What an agent does to one batch, without Faust: decode, repair with the active artifact, encode.

Keeping this apart from the agents means the exact code path of the stream can be called on a
list of messages in a test or a benchmark, and the agents stay a few lines of I/O. The messages are
those the consumer returns (confluent-kafka's ``Message``, read through its methods: see
:class:`MessageLike`; :class:`SimpleMessage` builds one in a test). Every input
message produces exactly one output: a repaired record or a dead letter with its reason, and every
output fits under the producer's limit (:data:`~fairstream.streams.codec.dead_letters.MAX_OUTPUT_BYTES`): a repaired
output that would not is dead-lettered instead, and dead letters fit by construction. Every output is
JSON: a record whose output holds a NaN or an infinity (which the chain refuses already) is dead-lettered
with the field it names, never written; the encoders refuse such a value outright.

On a pipeline with a ``[mapping]`` the records are a team's own (:mod:`~fairstream.streams.codec.mapped`): each
output is its input with every field it had plus what fairstream adds, and keeps its input's key, headers and
partition (:attr:`BatchOutcome.routes`).

While a kind of the record chain has a pending candidate (:class:`Served`), the candidate chain is applied in
shadow to the records the active chain delivered: its results are measured (``BatchOutcome.candidate_batch``),
never written; the outputs are the active chain's, bit for bit what they would be without a candidate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from fairstream.models.embedding import normalise
from fairstream.repair.protocol import Batch, apply_chain
from fairstream.streams.codec.avro import schema_id
from fairstream.streams.codec.dead_letters import dead_letter, dead_letter_key, oversized
from fairstream.streams.codec.embeddings import decode_embeddings
from fairstream.streams.codec.inputs import InputDecoder
from fairstream.streams.codec.records import DecodedRecords
from fairstream.streams.codec.repaired import (
    RepairedBatch,
    encode_embeddings,
    encode_repaired,
    non_finite_rows,
    provenance,
)
from fairstream.streams.config import PipelineConfig

log = logging.getLogger(__name__)


class MessageLike(Protocol):
    """The parts of a Kafka message the processing reads, through the methods of confluent-kafka's ``Message``.

    ``value()`` and ``key()`` are read for every message; ``topic()``, ``partition()``, ``offset()`` only for a
    dead letter (and, on a mapped pipeline, ``partition()`` and ``headers()`` for every output: they follow the
    input's), and ``timestamp()`` (Kafka's: ``(type, milliseconds since the epoch)``, type 0 when it has
    none) only for a record whose own ``ts`` is implausible: it is then the record's arrival time.
    """

    def value(self) -> bytes | None: ...

    def key(self) -> bytes | None: ...

    def topic(self) -> str: ...

    def partition(self) -> int: ...

    def offset(self) -> int: ...

    def timestamp(self) -> tuple[int, int]: ...

    def headers(self) -> list[tuple[str, bytes]] | None: ...


TIMESTAMP_NOT_AVAILABLE = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE: the message has no timestamp
TIMESTAMP_CREATE_TIME = 1  # confluent_kafka.TIMESTAMP_CREATE_TIME


class SimpleMessage:
    """A message built in a test or benchmark: what :class:`MessageLike` reads, as confluent-kafka's methods.

    ``timestamp`` is Kafka's, in milliseconds since the epoch, or None when the message has none.
    """

    __slots__ = ("_value", "_key", "_topic", "_partition", "_offset", "_timestamp", "_headers")

    def __init__(self, value: bytes | None, key: bytes | None = None, topic: str = "", partition: int = 0,
                 offset: int = 0, timestamp: int | None = None, headers: list[tuple[str, bytes]] | None = None):
        self._value, self._key, self._topic = value, key, topic
        self._partition, self._offset, self._timestamp, self._headers = partition, offset, timestamp, headers

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        if self._timestamp is None:
            return TIMESTAMP_NOT_AVAILABLE, 0
        return TIMESTAMP_CREATE_TIME, self._timestamp

    def __repr__(self) -> str:
        return (f"SimpleMessage(value={self._value!r:.60}, key={self._key!r:.60}, topic={self._topic!r}, "
                f"partition={self._partition}, offset={self._offset}, timestamp={self._timestamp})")


@dataclass
class BatchOutcome:
    """(key, value) pairs for the output topic and for the dead-letter topic, and what the batch saw."""

    repaired: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    dead: list[tuple[bytes | None, bytes]] = field(default_factory=list)
    version: int | None = None
    out_of_range: int = 0  # records with a value outside the plan's range (clamped or refused)
    imputed: int = 0  # repaired records whose missing s was imputed
    skewed: int = 0  # repaired records whose ts was implausible (the monitor filed them at their arrival time)
    event_times: list = field(default_factory=list)  # the ``ts`` of the repaired records, for latency
    monitor_batch: RepairedBatch | None = None  # the repaired records as arrays, for the fairness monitor
    candidate_batch: RepairedBatch | None = None  # the same records through the candidate chain (shadow), measured only
    candidate_refused: int = 0  # records of monitor_batch the candidate chain refused (not in candidate_batch)
    candidate_failed: str | None = None  # why the candidate chain failed on the batch (then it refused every record)
    labelled: tuple | None = None  # embeddings: (vectors, identities, groups, ids) of records with an identity
    # Mapped records: (headers, input partition) of each ``repaired`` output, in order; the consumer sends each
    # to its input's partition number when the output topic has as many partitions (else by key). None: by key.
    routes: list[tuple[list | None, int]] | None = None


def _dead_letters(messages: Sequence[MessageLike], failures: list[tuple[int, str]], agent: str) -> list:
    letters = []
    for i, reason in failures:
        m = messages[i]
        key = m.key()
        letters.append((dead_letter_key(key), dead_letter(m.value(), reason, m.topic(), m.partition(), m.offset(),
                                                          agent, key)))
    return letters


def _output_keys(messages: Sequence[MessageLike], positions: np.ndarray, record_keys: np.ndarray) -> list[bytes]:
    """The Kafka key of each output: its input's, or, for a message without one, its record key (the id's text)."""
    chosen = messages if len(positions) == len(messages) else [messages[i] for i in positions.tolist()]
    keys = [m.key() for m in chosen]
    if None in keys:  # rare: only then are the record keys read
        keys = [key if key is not None else text.encode() for key, text in zip(keys, record_keys.tolist())]
    return keys


def _fitting(keys: list, values: list, failures: list, positions: Sequence[int]) -> np.ndarray:
    """Which outputs (``keys``, ``values``) fit under the producer's limit; the inputs (``positions``) of the others
    join ``failures``."""
    fits = np.ones(len(values), dtype=bool)
    for j, reason in oversized(keys, values):
        fits[j] = False
        failures.append((int(positions[j]), reason))
    return fits


def _finite_rows(ok: np.ndarray, columns: dict, failures: list, positions: Sequence[int]) -> np.ndarray:
    """The rows of ``ok`` whose outputs (``columns``: name -> (values of every row, entry names)) are all finite.

    The inputs (``positions``) of the others join ``failures``: JSON cannot carry a NaN or an infinity, so such a
    row is dead-lettered, never written (the chain refuses non-finite outputs; this is the codec's boundary).
    """
    bad = non_finite_rows({name: (values[ok], names) for name, (values, names) in columns.items()})
    if not bad:
        return ok
    failures += [(int(positions[ok[j]]), reason) for j, reason in bad]
    keep = np.ones(len(ok), dtype=bool)
    keep[[j for j, _ in bad]] = False
    return ok[keep]


def _provenance(chain: Sequence) -> dict:
    return provenance([(a.kind, a.version, a.sha256, a.module.seed) for a in chain])


def chain_added(chain: Sequence, columns: dict) -> dict[str, np.ndarray]:
    """The per-row columns every output record carries: those the chain's modules declare they add
    (:attr:`~fairstream.repair.protocol.Capabilities.adds`), as the chain computed them (a later module's replace
    an earlier one's: a post module's decision, not the scorer's)."""
    adds = frozenset().union(*(a.module.capabilities.adds for a in chain))
    return {name: np.asarray(values) for name, values in columns.items() if name in adds}


@dataclass(frozen=True)
class Served:
    """The record chain to apply, read from one registry state: the active artifacts in chain order, and the chain
    with every pending candidate in place of its kind (None while no kind of the chain has a candidate)."""

    active: tuple
    candidate: tuple | None = None


def as_actives(active) -> tuple:
    """The registry's active artifacts of a chain as a tuple (one ``Active`` is a chain of one; of a
    :class:`Served`, its active chain)."""
    if isinstance(active, Served):
        return active.active
    return tuple(active) if isinstance(active, (list, tuple)) else (active,)


def candidate_of(served) -> tuple | None:
    """The candidate chain to apply in shadow, or None."""
    return served.candidate if isinstance(served, Served) else None


class RecordRepairer:
    """Batch logic of the record agent: tabular records through the pipeline's chain of frozen modules."""

    agent = "records"

    def __init__(self, config: PipelineConfig):
        self.config = config
        self.failed_candidates: set = set()  # candidate chains whose failure was logged (once each)
        # The envelope, a team's own JSON records or its Avro records: read as the re-fits read them.
        self.inputs = InputDecoder.for_config(config)
        # A pipeline with a [mapping] writes each record back whole; on Avro topics, serialized by its schema.
        self.mapped, self.avro = self.inputs.mapped, self.inputs.avro

    def process(self, messages: Sequence[MessageLike], active) -> BatchOutcome:
        """``active``: the registry's active artifacts of the configured chain, in order (or one of them), or a
        :class:`Served` (with a candidate chain, measured in shadow: ``candidate_batch``)."""
        chain = as_actives(active)
        inputs = [m.value() for m in messages]
        # The envelope carries its own id: only a mapped record's key is read (its id may be "$key").
        decoded = self.inputs.decode(inputs, [m.key() for m in messages] if self.mapped is not None else ())
        failures = list(decoded.errors)
        prov = _provenance(chain)  # an empty chain's says no module (a monitor-only pipeline)
        outcome = BatchOutcome(version=prov["version"])
        if len(decoded.index):
            batch = with_carried(decoded.batch(), decoded)
            result = apply_chain([a.module for a in chain], batch)
            failures += [(int(decoded.index[i]), result.reasons[i]) for i in np.flatnonzero(~result.ok)]
            added = chain_added(chain, result.columns)
            outputs = {"features": (result.X, self.config.features),
                       **{name: (values, None) for name, values in added.items() if values.dtype.kind == "f"}}
            ok = _finite_rows(np.flatnonzero(result.ok), outputs, failures, decoded.index)
            fields = decoded.fields if len(ok) == len(decoded.fields) else decoded.fields.take(ok)
            imputed = result.imputed[ok] if result.imputed is not None else None
            if self.mapped is not None:  # the records as they came, with what fairstream adds
                ok, fields, imputed, values = self._encode_mapped(decoded, ok, result.X[ok], prov, imputed,
                                                                  {name: column[ok] for name, column in added.items()},
                                                                  failures, inputs)
            else:
                values = encode_repaired(fields, batch.X[ok], result.X[ok], self.config, prov, imputed,
                                         {name: column[ok] for name, column in added.items()})
            keys = _output_keys(messages, decoded.index[ok], decoded.keys[ok])
            fits = _fitting(keys, values, failures, decoded.index[ok])
            if not fits.all():  # rare: only then are the rows copied
                ok, fields = ok[fits], fields.take(np.flatnonzero(fits))
                imputed = imputed[fits] if imputed is not None else None
                keys, values = ([item for item, fit in zip(column, fits.tolist()) if fit] for column in (keys, values))
            outcome.repaired = list(zip(keys, values))
            if self.mapped is not None:
                outcome.routes = _routes(messages, decoded.index[ok], self.mapped.headers(prov))
            outcome.out_of_range = int(result.out_of_range.sum())
            outcome.event_times = [ts for ts in fields.ts if ts is not None]
            outcome.imputed = 0 if imputed is None else int(imputed.sum())
            sent = decoded.index[ok]
            times, outcome.skewed = monitor_times(fields.ts, lambda rows: [_arrival(messages[i]) for i in sent[rows]],
                                                  self.config.monitor.max_event_time_skew, time.time())
            # Fairness is measured on records with their true s: imputed ones are only counted.
            mine = slice(None) if imputed is None else ~imputed
            measured = ok[mine]
            delivered = batch.take(measured)
            outcome.monitor_batch = _monitor_batch(delivered, result.X[measured], result.out_of_range[measured],
                                                   times[mine], added, measured)
            if candidate_of(active) is not None and len(measured):
                self._shadow_pass(outcome, candidate_of(active), delivered, times[mine])
        outcome.dead = _dead_letters(messages, failures, self.agent)
        return outcome

    def _encode_mapped(self, decoded, ok: np.ndarray, repaired: np.ndarray, prov: dict, imputed, added: dict,
                       failures: list, inputs: list) -> tuple:
        """(ok, fields, imputed, values) of the mapped records at ``ok``; a record whose output cannot be written
        joins ``failures`` (its reason) and leaves ``ok``."""
        if self.avro is not None:
            values, refused = self._serialize_avro(decoded, ok.tolist(), repaired, prov, imputed, added, inputs)
        else:
            values, refused = self.mapped.encode(decoded, ok.tolist(), repaired, prov, imputed, added)
        if refused:  # rare: only then are the rows copied
            failures += [(int(decoded.index[ok[k]]), reason) for k, reason in refused]
            keep = np.ones(len(ok), dtype=bool)
            keep[[k for k, _ in refused]] = False
            ok, imputed = ok[keep], (imputed[keep] if imputed is not None else None)
        return ok, decoded.fields.take(ok), imputed, values

    def _serialize_avro(self, decoded, rows: list, repaired: np.ndarray, prov: dict, imputed, added: dict,
                        inputs: list) -> tuple[list[bytes], list[tuple[int, str]]]:
        """(outputs, refused) as :meth:`~fairstream.streams.codec.mapped.MappedRecords.encode` gives them, in the
        Confluent wire format: each output under the output schema of its input message's writer schema."""
        placed, refused = self.mapped.repaired_objects(decoded, rows, repaired, prov, imputed, added)
        positions = [k for k, _ in placed]
        encoded = self.avro.serialize([obj for _, obj in placed],
                                      [schema_id(inputs[decoded.index[rows[k]]]) for k in positions])
        refused += [(k, str(value)) for k, value in zip(positions, encoded) if isinstance(value, Exception)]
        return [value for value in encoded if not isinstance(value, Exception)], sorted(refused)

    def _shadow_pass(self, outcome: BatchOutcome, candidate: tuple, delivered: Batch, ts: np.ndarray) -> None:
        """The candidate chain in shadow, which can never fail the batch: whatever it raises, the active outputs are
        delivered as they are, and every record counts as refused by the candidate (the shadow policy retires it)."""
        try:
            outcome.candidate_batch, outcome.candidate_refused = _shadow(candidate, delivered, ts)
        except Exception as exc:  # noqa: BLE001 - an unapproved artifact must not stop the serving chain
            outcome.candidate_batch, outcome.candidate_refused = None, len(delivered)
            outcome.candidate_failed = f"{type(exc).__name__}: {str(exc)[:300]}"
            ids = tuple((a.kind, a.version, a.sha256) for a in candidate)
            if ids not in self.failed_candidates:
                self.failed_candidates.add(ids)
                log.error("the candidate chain %s failed in shadow (%s): its records count as refused; the active "
                          "chain's outputs are delivered as they are", ", ".join(f"{k} version {v}" for k, v, _ in ids),
                          outcome.candidate_failed, exc_info=exc)


def _routes(messages: Sequence[MessageLike], positions: np.ndarray, added: list) -> list[tuple[list | None, int]]:
    """(headers, partition) of each output: its input's headers (with ``added``, the provenance headers) and
    partition."""
    routes = []
    for i in positions.tolist():
        message = messages[i]
        headers = message.headers()
        routes.append(((list(headers or ()) + added) if added or headers else None, message.partition()))
    return routes


def monitor_times(event_times: Sequence, arrivals: Callable[[np.ndarray], Sequence], max_skew: float,
                  now: float) -> tuple[np.ndarray, int]:
    """The time the monitor files each record under, and how many event times it did not believe.

    A record's ``ts`` within ``max_skew`` seconds of ``now`` (either way) is its time. A missing ``ts``, or an
    implausible one (counted: ``ts = 1e15`` would move the time window 30 million years ahead and freeze it),
    gives way to the record's arrival: its Kafka timestamp when that is plausible, else ``now``.
    ``arrivals(rows)`` gives the Kafka timestamps (seconds, None where unknown) of those rows only. The output
    record keeps its ``ts`` as sent: only the monitor's filing changes.

    >>> monitor_times([100.0, 1e15, None], lambda rows: [[99.0, 98.0, None][i] for i in rows], 60, now=110.0)
    (array([100.,  98., 110.]), 1)
    """
    ts = np.array(event_times, dtype=np.float64)  # None: NaN, never believed
    believed = np.abs(ts - now) <= max_skew
    if believed.all():
        return ts, 0
    skewed = int(np.count_nonzero(~(believed | np.isnan(ts))))
    rows = np.flatnonzero(~believed)
    arrival = np.array(arrivals(rows), dtype=np.float64)
    ts[rows] = np.where(np.abs(arrival - now) <= max_skew, arrival, now)
    return ts, skewed


def _arrival(message: MessageLike) -> float | None:
    """When the message reached Kafka (its timestamp, seconds), if it says; -1 (none) is implausible anyway."""
    kind, milliseconds = message.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else milliseconds / 1000


def _shadow(chain: Sequence, delivered: Batch, ts: np.ndarray) -> tuple[RepairedBatch, int]:
    """The candidate ``chain`` on the records the active chain delivered (and the monitor measures): what the monitor
    measures of its results, and how many of them it refused (left out). Nothing of it is written."""
    result = apply_chain([a.module for a in chain], delivered)
    kept = result.ok if result.imputed is None else result.ok & ~result.imputed
    rows = np.flatnonzero(kept)
    added = chain_added(chain, result.columns)
    return (_monitor_batch(delivered.take(rows), result.X[rows], result.out_of_range[rows], ts[rows], added, rows),
            len(delivered) - len(rows))


def with_carried(batch: Batch, decoded: DecodedRecords) -> Batch:
    """``batch`` with the score and decision its records carry of their own model (mapped fields) among its added
    columns: a module after them reads them (group thresholds decide on the records' own score), and where no module
    of the chain writes one, the monitor measures the records' own (:func:`_monitor_batch`). They are never written
    as the chain's columns: the records keep them where they were."""
    carried = {name: column for name, column in (("score", decoded.score), ("decision", decoded.decision))
               if column is not None}
    return replace(batch, added={**batch.added, **carried}) if carried else batch


def _monitor_batch(batch: Batch, repaired, out_of_range, ts: np.ndarray, added: dict, rows) -> RepairedBatch:
    """What the monitor measures of the records sent: the chain's score and final decision as the records carry; a
    column no module of the chain writes is the records' own (mapped: ``batch.added``, see :func:`with_carried`), so
    a monitor-only pipeline measures its records' own model, and group thresholds alone their decisions on its
    scores."""
    pick = (lambda name: added[name][rows] if name in added else batch.added.get(name))
    return RepairedBatch(before=batch.X, after=repaired, s=batch.s, u=batch.u, keys=batch.keys, ts=ts, y=batch.y,
                         out_of_range=out_of_range, decision=pick("decision"), score=pick("score"))


class EmbeddingRepairer:
    """Batch logic of the embedding agent: vectors through the frozen embedding module (or the identity)."""

    agent = "embeddings"

    def __init__(self, config: PipelineConfig):
        self.config = config

    def process(self, messages: Sequence[MessageLike], active=None) -> BatchOutcome:
        """``active`` is the registry's active ``embedding`` artifact, or None for the identity (normalisation)."""
        decoded = decode_embeddings([m.value() for m in messages], self.config)
        failures = list(decoded.errors)
        if active is None:  # the identity module: L2 normalisation, what a trained module starts from
            vectors, prov = normalise(decoded.vectors), provenance([("identity", 0, "", "")])
            ok = np.arange(len(vectors))
        else:  # the chain refuses rows one by one: only the others go on
            result, prov = apply_chain([active.module], decoded.batch()), _provenance([active])
            vectors, ok = result.X, np.flatnonzero(result.ok)
            failures += [(int(decoded.index[i]), result.reasons[i]) for i in np.flatnonzero(~result.ok)]
        ok = _finite_rows(ok, {"vector": (vectors, None)}, failures, decoded.index)
        records = [decoded.records[k] for k in ok]
        values = encode_embeddings(records, vectors[ok], prov, [decoded.digests[k] for k in ok])
        keys = _output_keys(messages, decoded.index[ok], decoded.keys[ok])
        fits = _fitting(keys, values, failures, decoded.index[ok]).tolist()
        repaired = list(zip(keys, values))
        labelled = [k for k, r in enumerate(records) if fits[k] and r.get("identity") is not None]
        return BatchOutcome(
            repaired=[pair for pair, fit in zip(repaired, fits) if fit],
            dead=_dead_letters(messages, failures, self.agent),
            version=prov["version"],
            labelled=(vectors[ok[labelled]], *zip(*[(records[k]["identity"], records[k].get("group"), records[k]["id"])
                                                    for k in labelled])) if labelled else None,
        )
