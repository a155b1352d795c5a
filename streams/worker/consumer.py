"""The worker's hot path: one input topic consumed a batch at a time in the worker's consumer group.

Faust's per-event stream machinery costs about 150 us a record here whatever the agent does, so
the record and embedding inputs do not go through Faust streams. A :class:`BatchConsumer` (a
``mode.Service`` inside the Faust app, next to the control-topic follower and the metrics
endpoint) runs this loop with aiokafka::

    fetch a batch (getmany) -> decode it in one pass -> apply the active module(s) -> encode
    -> send every output and dead letter, wait for the broker's acknowledgements
    -> commit the batch's offsets -> hand the delivered batch to the monitor

One batch is in flight at a time, and an offset is committed only after every output of its batch
is acknowledged: at-least-once. A failed send is retried; if it keeps failing the worker stops
loudly with nothing committed past the undelivered records (a restart replays them, identically).

Rebalance: when partitions are revoked, the callback waits for the batch in flight to be delivered
and committed (it holds the same lock), so the next owner resumes exactly after it; newly assigned
partitions resume from their committed offset. A graceful stop (SIGTERM) finishes the batch in
flight, commits, and leaves the group, so a clean stop leaves no duplicates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import mode
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from fairstream.streams.config import AgentConfig
from fairstream.streams.kafka import aiokafka_options

from .metrics import (
    BATCH_SECONDS,
    CONSUMER_LAG,
    RECORD_LATENCY,
    RECORDS_DEAD,
    RECORDS_IN,
    RECORDS_OUT_OF_RANGE,
    RECORDS_REPAIRED,
    RECORDS_S_IMPUTED,
)
from .processing import BatchOutcome

log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 10
"""How long the broker may hold an empty fetch. Faust hard-codes 1.5 s, which put p99 latency at
0.95 s at 2k records/s offered; 10 ms brought it to 0.18 s (benchmarks/stream_throughput.py)."""

MAX_FETCH_BYTES = 4 * 1024 * 1024
SEND_ATTEMPTS = 5  # a batch whose delivery fails this many times stops the worker (nothing is committed)
LATENCY_SAMPLES = 50  # record latencies observed per batch: keeps the histogram O(1) per batch


class DeliveryError(RuntimeError):
    """A batch's outputs could not be delivered; its offsets were not committed."""


@dataclass(frozen=True)
class InputSpec:
    """One input of the worker: where it reads, what it does to a batch, where the outputs go."""

    agent: str  # metrics label: "records" or "embeddings"
    topic: str
    output_topic: str
    batching: AgentConfig
    process: Callable[[Sequence, object], BatchOutcome]  # (messages, active artifact) -> outcome
    active: Callable[[], Awaitable[object]]  # the artifact to apply; may wait (backpressure)
    delivered: Callable[[BatchOutcome, object], Awaitable[None]]  # after commit: the monitor


class _SettleOnRevoke(ConsumerRebalanceListener):
    """Revocation waits for the batch in flight: nothing is committed past what was delivered."""

    def __init__(self, lock: asyncio.Lock, agent: str):
        self.lock, self.agent = lock, agent

    async def on_partitions_revoked(self, revoked) -> None:
        async with self.lock:  # the loop holds it from fetch to commit
            log.info("%s: partitions revoked after the batch in flight settled: %s", self.agent, _names(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        log.info("%s: partitions assigned (resuming from committed offsets): %s", self.agent, _names(assigned))


def _names(partitions) -> str:
    return ", ".join(sorted(f"{tp.topic}[{tp.partition}]" for tp in partitions)) or "none"


class BatchConsumer(mode.Service):
    """Consume ``spec.topic`` in ``group_id`` a batch at a time; deliver, then commit (see the module docstring)."""

    def __init__(self, spec: InputSpec, bootstrap: str, group_id: str, output, dlq_topic: str,
                 session_timeout_ms: int = 10_000, **kwargs):
        self.spec, self.bootstrap, self.group_id = spec, bootstrap, group_id
        self.output, self.dlq_topic = output, dlq_topic  # output.producer: the started AIOKafkaProducer
        self.session_timeout_ms = session_timeout_ms
        self._in_flight = asyncio.Lock()
        self._next_offset: dict[TopicPartition, int] = {}  # per partition: the next offset to process
        self._consumer: AIOKafkaConsumer | None = None
        self._finished = asyncio.Event()
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        """Join the group (partitions come with the first fetch)."""
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, **aiokafka_options(), group_id=self.group_id, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=MAX_FETCH_BYTES, fetch_max_bytes=4 * MAX_FETCH_BYTES,
            # A short session lets survivors take over a dead worker's partitions within seconds.
            session_timeout_ms=self.session_timeout_ms, heartbeat_interval_ms=1000,
            max_poll_interval_ms=300_000)
        self._consumer.subscribe([self.spec.topic], listener=_SettleOnRevoke(self._in_flight, self.spec.agent))
        await self._consumer.start()

    async def on_stop(self) -> None:
        """Finish the batch in flight, commit it, and leave the group (no duplicates on a clean stop)."""
        if self._consumer is None:
            return
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=30)
        except asyncio.TimeoutError:
            log.error("%s: the batch in flight did not settle within 30 s; stopping without its commit",
                      self.spec.agent)
        await self._consumer.stop()  # leaves the group: the others take the partitions at once
        log.info("%s: left group %s", self.spec.agent, self.group_id)

    @mode.Service.task
    async def _consume(self) -> None:
        try:
            while not self.should_stop:
                await self._one_batch()
        except Exception:
            # mode crashes the service and its parents with this exception: the worker exits non-zero
            # rather than drop records; nothing past the undelivered batch was committed.
            log.critical("%s: stopping the worker: a batch could not be processed and delivered; its offsets "
                         "were not committed, so a restart replays it", self.spec.agent, exc_info=True)
            raise
        finally:
            self._finished.set()

    async def _one_batch(self) -> None:
        # Waits (no fetch) while no artifact is loaded: backpressure; a stop ends the wait at once.
        waited = await self.wait(self.spec.active())
        if waited.stopped:
            return
        active = waited.result
        fetched = await self._consumer.getmany(timeout_ms=int(self.spec.batching.batch_within * 1000),
                                               max_records=self.spec.batching.batch_size)
        messages = [m for records in fetched.values() for m in records]
        if not messages:
            return
        async with self._in_flight:
            RECORDS_IN.labels(self.spec.agent).inc(len(messages))
            started = time.perf_counter()
            outcome = self.spec.process(messages, active)
            await self._deliver(outcome)
            await self._consumer.commit({tp: records[-1].offset + 1 for tp, records in fetched.items()})
            BATCH_SECONDS.labels(self.spec.agent).observe(time.perf_counter() - started)
            self._count(outcome)
            self._record_lag(fetched)
        await self.spec.delivered(outcome, active)

    async def _deliver(self, outcome: BatchOutcome) -> None:
        """Send every output and dead letter and wait for the acks; retried, then :class:`DeliveryError`."""
        sends = [(self.spec.output_topic, k, v) for k, v in outcome.repaired] + \
                [(self.dlq_topic, k, v) for k, v in outcome.dead]
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                futures = [await self.output.producer.send(topic, value, key=key) for topic, key, value in sends]
                await asyncio.gather(*futures)
                return
            except KafkaError as exc:
                # A partial send is sent again whole: duplicates are bit-identical (deterministic repair).
                log.warning("%s: delivery of %d messages failed (attempt %d of %d): %r", self.spec.agent,
                            len(sends), attempt, SEND_ATTEMPTS, exc)
                if attempt == SEND_ATTEMPTS:
                    raise DeliveryError(f"{len(sends)} outputs could not be delivered: {exc!r}") from exc
                await asyncio.sleep(min(0.2 * 2 ** attempt, 5.0))

    def _count(self, outcome: BatchOutcome) -> None:
        agent = self.spec.agent
        RECORDS_REPAIRED.labels(agent).inc(len(outcome.repaired))
        RECORDS_DEAD.labels(agent).inc(len(outcome.dead))
        RECORDS_OUT_OF_RANGE.labels(agent).inc(outcome.out_of_range)
        RECORDS_S_IMPUTED.labels(agent).inc(outcome.imputed)
        now = time.time()
        times = outcome.event_times
        for ts in times[:: max(1, len(times) // LATENCY_SAMPLES)]:
            if 0 <= now - ts < 86_400:  # only event times on the wall clock mean latency
                RECORD_LATENCY.labels(agent).observe(now - ts)

    def _record_lag(self, fetched: dict) -> None:
        # The fetch highwater, not end offsets: the embedded broker's ListOffsets under-reports them.
        for tp, records in fetched.items():
            self._next_offset[tp] = records[-1].offset + 1
        lag = 0
        for tp in self._consumer.assignment():
            highwater, position = self._consumer.highwater(tp), self._next_offset.get(tp)
            if highwater is not None and position is not None:
                lag += max(highwater - position, 0)
        CONSUMER_LAG.labels(self.spec.agent).set(lag)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this worker owns now."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()
