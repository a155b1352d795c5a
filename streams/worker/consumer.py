"""The worker's hot path: one input topic consumed a batch at a time in the worker's consumer group.

Faust's per-event stream machinery costs about 150 us a record here whatever the agent does, so
the record and embedding inputs do not go through Faust streams. A :class:`BatchConsumer` (a
``mode.Service`` inside the Faust app, next to the control-topic follower and the metrics
endpoint) runs this loop with aiokafka::

    fetch a batch (getmany) -> decode it in one pass -> apply the active module(s) -> encode
    -> send every output and dead letter, wait for the broker's acknowledgements
    -> commit the batch's offsets -> hand the delivered batch to the monitor

One batch is in flight at a time, and an offset is committed only after every output of its batch
is acknowledged: at-least-once. A failed send is retried; if it keeps failing the worker exits
non-zero with nothing committed past the undelivered records (a restart replays them, identically).

Rebalance: when partitions are revoked, the callback waits for the batch in flight to be delivered
and committed (it holds the same lock), so the next owner resumes exactly after it; newly assigned
partitions resume from their committed offset. A graceful stop (SIGTERM) finishes the batch in
flight, commits, and leaves the group, so a clean stop leaves no duplicates.

Liveness: a worker is consuming or it has exited non-zero. What the client recovers from by itself
is recovered in place: a commit refused because the group moved on (a pause longer than the session
timeout, a broker that restarted and forgot the group) leaves the batch delivered but uncommitted,
so it is replayed, by this worker on the partitions it still owns (it seeks back to the batch's
first offset) and by the new owner on the others; a broker that is away is waited for (fetches
return nothing, the client reconnects and rejoins). A position past the end of its partition's log
(the topic was re-created, as by the memory-only embedded broker restarted: the group's committed
offsets are the old log's) is Kafka's offset out of range, which Tansu does not report: the worker
resets that partition to the beginning itself (auto_offset_reset="earliest"), so the new log is
replayed rather than skipped up to the old offset. Anything else (a bug, a delivery that keeps
failing, an error the client does not retry, commits that keep failing) ends the loop with the
exception; mode then crashes the worker and the process exits with a non-zero status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import mode
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

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
FAILED_COMMITS_IN_A_ROW = 10  # a group that refuses this many commits in a row is not a rebalance: exit
RETRY_PAUSE_SECONDS = 1.0  # after a fetch error the client retries by itself: do not spin on it
FRESH_FETCH_SECONDS = 5.0  # an idle partition counts as caught up only if the broker answered a fetch this recently

GROUP_MOVED_ON = (CommitFailedError, IllegalGenerationError, UnknownMemberIdError, RebalanceInProgressError,
                  IllegalStateError)
"""Errors of a commit that the group refused because it rebalanced without us (the partitions may
have been given to another member, or not be assigned any more): the client rejoins by itself."""


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


@dataclass(frozen=True)
class Progress:
    """How one input is doing, for /readyz."""

    agent: str
    partitions: int  # assigned to this worker now
    seconds_since: float | None  # since a batch was committed or every partition was read to its end; None: never
    last_error: str | None  # the last error recovered from in place, if any


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
    return ", ".join(sorted(map(_name, partitions))) or "none"


def _short(exc: BaseException) -> str:
    """One line naming the error (Kafka errors' own text starts with their name)."""
    text = " ".join(str(exc).split())
    return (text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}")[:160]


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}[{tp.partition}]"


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
        self._looping = False  # the batch loop started: a stop waits for its batch in flight
        self._progress_at: float | None = None  # monotonic: last commit, or last read to the end of every partition
        self._failed_commits = 0  # in a row
        self._last_error: str | None = None
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
            if self._looping:
                await asyncio.wait_for(self._finished.wait(), timeout=30)
        except asyncio.TimeoutError:
            log.error("%s: the batch in flight did not settle within 30 s; stopping without its commit",
                      self.spec.agent)
        await self._consumer.stop()  # leaves the group: the others take the partitions at once
        log.info("%s: left group %s", self.spec.agent, self.group_id)

    @mode.Service.task
    async def _consume(self) -> None:
        self._looping = True
        try:
            while not self.should_stop:
                await self._one_batch()
        except Exception:
            # mode crashes the service and, through the service tree, the worker: the process exits
            # non-zero (a supervisor restarts it) rather than stay up without consuming. Nothing past
            # the batch in flight was committed, so the restart replays it.
            log.critical("%s: stopping the worker with a non-zero exit status: an error that cannot be recovered "
                         "in place; the batch in flight was not committed, so a restart replays it",
                         self.spec.agent, exc_info=True)
            raise
        finally:
            self._finished.set()

    async def _one_batch(self) -> None:
        # Waits (no fetch) while no artifact is loaded: backpressure; a stop ends the wait at once.
        waited = await self.wait(self.spec.active())
        if waited.stopped:
            return
        active = waited.result
        fetched = await self._fetch()
        await self._reset_partitions_past_their_end()
        messages = [m for records in fetched.values() for m in records]
        if not messages:
            await self._note_if_caught_up()
            return
        async with self._in_flight:
            RECORDS_IN.labels(self.spec.agent).inc(len(messages))
            started = time.perf_counter()
            outcome = self.spec.process(messages, active)
            await self._deliver(outcome)
            if not await self._commit(fetched):
                return  # delivered, not committed: replayed (the monitor sees it then)
            BATCH_SECONDS.labels(self.spec.agent).observe(time.perf_counter() - started)
            self._count(outcome)
            self._record_lag(fetched)
        await self.spec.delivered(outcome, active)

    async def _fetch(self) -> dict:
        """The next batch; nothing after an error the client retries by itself (a broker away, a leader moving)."""
        try:
            return await self._consumer.getmany(timeout_ms=int(self.spec.batching.batch_within * 1000),
                                                max_records=self.spec.batching.batch_size)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            self._last_error = _short(exc)
            log.warning("%s: fetch failed, retrying: %s", self.spec.agent, self._last_error)
            await self.sleep(RETRY_PAUSE_SECONDS)
            return {}

    async def _commit(self, fetched: dict) -> bool:
        """Commit a delivered batch; False if the group moved on without us (the batch is then replayed)."""
        try:
            offsets = self._offsets_the_broker_holds({tp: records[-1].offset + 1 for tp, records in fetched.items()})
            if offsets:
                await self._consumer.commit(offsets)
        except GROUP_MOVED_ON as exc:
            self._failed_commits += 1
            if self._failed_commits >= FAILED_COMMITS_IN_A_ROW:
                raise
            self._last_error = _short(exc)
            replayed = self._rewind(fetched)
            log.warning("%s: the group rebalanced without this worker (%s): the delivered batch of %d records was "
                        "not committed and is replayed (here from %s; elsewhere by the partitions' new owner); "
                        "rejoining", self.spec.agent, self._last_error, sum(map(len, fetched.values())),
                        _names(replayed))
            return False
        self._failed_commits = 0
        self._progress_at = time.monotonic()
        return True

    def _offsets_the_broker_holds(self, offsets: dict) -> dict:
        """The batch's offsets without those past their partition's highwater (a log that got shorter).

        Committing them would make the group skip the new log up to there. They are not committed, and
        not replayed either: the broker no longer holds those records, and their outputs were delivered
        (to the broker that answered the sends: the new one). The reset on the next fetch
        (:meth:`_reset_partitions_past_their_end`) then replays what the broker holds now.
        """
        kept = {}
        for tp, offset in offsets.items():
            try:
                highwater = self._consumer.highwater(tp)
            except (IllegalStateError, AssertionError):  # revoked: the commit is refused, the batch replayed
                highwater = None
            if highwater is None or offset <= highwater:
                kept[tp] = offset
            else:
                self._last_error = f"offsets lost by the broker: {_name(tp)} batch ends at {offset}, log at {highwater}"
                log.warning("%s: %s[%d]: the delivered batch ends at offset %d but the partition's log now ends at "
                            "%d (the topic was re-created or truncated): its offset is not committed", self.spec.agent,
                            tp.topic, tp.partition, offset, highwater)
        return kept

    async def _reset_partitions_past_their_end(self) -> None:
        """Reset to the beginning every owned partition whose position is past its log's end (its highwater).

        That is Kafka's offset out of range: the log is shorter than where the group is (the topic was
        re-created, e.g. by the memory-only embedded broker after a restart, or truncated). Kafka answers
        such a fetch with OFFSET_OUT_OF_RANGE and the client applies ``auto_offset_reset``; Tansu answers
        it with no records and no error, so the group would wait there and skip every record below its
        position in silence. The reset is the policy the consumer declares ("earliest"): replay what the
        broker holds (at-least-once; duplicates are identical). Cheap: highwater and a known position are
        local to the client.
        """
        for tp in self._consumer.assignment():
            try:
                highwater = self._consumer.highwater(tp)
                if highwater is None or (position := await self._consumer.position(tp)) <= highwater:
                    continue
                # Offset 0 is the beginning of a re-created log; on a log that starts later the fetch is
                # out of range and the client's "earliest" reset moves it to the log's start.
                self._consumer.seek(tp, 0)
            except (IllegalStateError, AssertionError):  # revoked meanwhile: its next owner checks it
                continue
            self._next_offset.pop(tp, None)
            self._last_error = f"offset out of range: {_name(tp)} at {position}, log ends at {highwater}"
            log.warning("%s: %s[%d] is at offset %d but its log ends at %d (the topic was re-created or truncated): "
                        "offset out of range, reset to the beginning (auto_offset_reset=earliest); what the broker "
                        "holds is replayed", self.spec.agent, tp.topic, tp.partition, position, highwater)

    def _rewind(self, fetched: dict) -> list[TopicPartition]:
        """Seek the partitions this worker still owns back to the batch's first offset: at-least-once."""
        owned = self._consumer.assignment()
        rewound = [tp for tp in fetched if tp in owned]
        for tp in rewound:
            self._consumer.seek(tp, fetched[tp][0].offset)
        return rewound

    async def _note_if_caught_up(self) -> None:
        """After an empty fetch: progress if the broker just said every owned partition has nothing more."""
        owned = self._consumer.assignment()
        if not owned:
            return
        now_ms = time.time() * 1000
        for tp in owned:
            polled, highwater = self._consumer.last_poll_timestamp(tp), self._consumer.highwater(tp)
            if polled is None or highwater is None or now_ms - polled > FRESH_FETCH_SECONDS * 1000:
                return  # not fetched lately: the broker may be away
            try:
                if highwater > await self._consumer.position(tp):
                    return
            except IllegalStateError:  # revoked meanwhile
                return
        self._progress_at = time.monotonic()
        CONSUMER_LAG.labels(self.spec.agent).set(0)

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

    def progress(self) -> Progress:
        """Partitions owned, and how long since this input last made progress (see :class:`Progress`)."""
        since = None if self._progress_at is None else time.monotonic() - self._progress_at
        return Progress(self.spec.agent, len(self.assignment()), since, self._last_error)
