"""The worker's hot path: one input topic consumed a batch at a time in the worker's consumer group.

Faust's per-event stream machinery costs about 150 us a record here whatever the agent does, so
the record and embedding inputs do not go through Faust streams. A :class:`BatchConsumer` (a
``mode.Service`` inside the Faust app, next to the control-topic follower and the metrics
endpoint) runs this loop on librdkafka (confluent-kafka), in one thread of its own: every call to
its consumer and producer happens there, the rebalance callbacks included (librdkafka serves them
from inside ``consume()``), and librdkafka's own threads do the network work without the GIL::

    consume batch N+1 -> decode, apply the active module(s), encode N+1
    -> settle N: wait for every delivery report of N, commit N's offsets, hand N to the monitor
    -> produce N+1 (its delivery reports come back while N+2 is decoded and applied)

At most one batch is produced but not settled, and batch N+1 is produced only after every output
of N is acknowledged, so the outputs of a partition come out in input order. An offset is committed
only after every output of its batch is acknowledged: at-least-once. A failed delivery report sends
the batch again whole (its duplicates are bit-identical: the repair is deterministic); a batch whose
delivery keeps failing stops the worker non-zero with nothing of it committed (a restart replays it).

Rebalance (eager, range assignor: the embedded broker and Kafka alike): a revocation first settles
the batch in flight (delivery reports, then a synchronous commit), so the next owner resumes exactly
after it; newly assigned partitions resume from their committed offset. A start ends once the group
assigned partitions (as aiokafka's did). A graceful stop (SIGTERM) finishes the batch it holds
(process, produce, settle) and closes the consumer, leaving the group, so a clean stop leaves no
duplicates.

A hold (``InputSpec.admitted`` False: the worker's config is not the pipeline's active one, or not checked yet)
keeps the consumer out of the group: it does not subscribe, and a consumer in the group finishes and commits its
batch in flight and leaves it (the others take its partitions at once); once admitted it subscribes again and
resumes from the group's committed offsets. A start that is held is over at once.

Liveness: a worker is consuming or it has exited non-zero. What the client recovers from by itself
is recovered in place: a commit refused because the group moved on (a pause longer than the session
timeout, a broker that restarted and forgot the group) leaves the batch delivered but uncommitted,
so it is replayed, by this worker on the partitions it still owns (it seeks back to the batch's
first offset) and by the new owner on the others; a broker that is away is waited for (consume
returns nothing, librdkafka reconnects and rejoins; its log lines go through Python logging, where
the worker's filter keeps one per cause every few seconds). A position past the end of its
partition's log (the topic was re-created, or retention removed records below it) is Kafka's
OFFSET_OUT_OF_RANGE: the fetch fails and librdkafka applies ``auto.offset.reset=earliest``, moving
to the log's start, only then. Anything else (a bug, a delivery that keeps failing, a fatal or
authorisation error, commits that keep failing) ends the loop with the exception; mode then crashes
the worker and the process exits with a non-zero status.

The embedded broker (Tansu, known by the cluster id it reports in metadata, asked once per consumer)
has quirks that Apache Kafka has not, and their handlers act there only: a fetch past the log's end
returns nothing and no error (the worker resets such a partition to offset 0 itself, and does not
commit offsets past the log's end); a member that leaves while its JoinGroup is held stays the
group's leader (a close first lets the join end). On Kafka the same code paths do what Kafka's
contract says: the cached fetch watermarks can be stale (a partition that comes back after another
member advanced it), so they never move a position.

Exactly-once (``[delivery] guarantee = "exactly_once"``, Apache Kafka only): the same loop, with one
Kafka transaction per batch on a producer with a ``transactional.id`` stable across the worker's
restarts (so a restart aborts what its predecessor left open at once)::

    produce N+1: begin the transaction, produce the outputs and dead letters
    settle N: every delivery report back, send N's offsets to the transaction (with the consumer's
              group metadata), commit the transaction, hand N to the monitor

The consumer reads with ``isolation.level=read_committed``. Fencing is by the group's generation
(KIP-447): a worker whose partitions moved while it was paused (a zombie) has its offsets refused,
and its transaction is aborted. An abortable error (that, a failed delivery, a transaction the
coordinator timed out) aborts the transaction: nothing of the batch counts, the partitions still
owned are rewound to the batch's first offsets and it is processed again; a fatal one (fenced by a
newer producer with the same id) ends the loop, and a supervisor's restart takes over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import mode
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from fairstream.streams.codec.dead_letters import MAX_OUTPUT_BYTES
from fairstream.streams.config import AgentConfig
from fairstream.streams.kafka import authorization_refusal, librdkafka_options

from .metrics import PipelineMetrics
from .processing import BatchOutcome

log = logging.getLogger(__name__)
CLIENT_LOG = log.getChild("librdkafka")  # librdkafka's own lines, rate-limited like every other

FETCH_MAX_WAIT_MS = 10
"""How long the broker may hold an empty fetch. Faust hard-codes 1.5 s, which put p99 latency at
0.95 s at 2k records/s offered; 10 ms brought it to 0.18 s (benchmarks/stream_throughput.py)."""

MAX_FETCH_BYTES = 4 * 1024 * 1024
SEND_ATTEMPTS = 5  # a batch whose delivery fails this many times stops the worker (nothing is committed)
SEND_BACKOFF_SECONDS = 0.2  # before the n-th re-send: this times 2**n, at most 5 s
DELIVERY_TIMEOUT_MS = 30_000  # a broker away shows up as a failed delivery report within this
SOCKET_TIMEOUT_MS = 10_000
"""How long a request may go unanswered before the client drops the connection and asks the cluster again.
librdkafka waits 60 s by default: a frozen broker (a GC pause, a stopped VM) keeps its connections open and
answers nothing, so the worker stalled for a minute while the cluster had moved its leaderships away within
the brokers' session (test_broker_failures.py, a leader under SIGSTOP). Below the transaction timeout."""
LATENCY_SAMPLES = 50  # record latencies observed per batch: keeps the histogram O(1) per batch
FAILED_COMMITS_IN_A_ROW = 10  # a group that refuses this many commits in a row is not a rebalance: exit
HOLD_SECONDS = 0.05  # while no artifact is loaded: how often to look again (records wait meanwhile: latency)
FRESH_FETCH_SECONDS = 5.0  # an idle partition counts as caught up only if its broker answered this recently
METADATA_REFRESH_MS = 10_000
_BY_KEY: dict = {}  # produce arguments of an output placed by its key (the partitioner's murmur2)
"""How often the worker's clients refresh topic metadata (librdkafka's default: 5 min). An operator's partition
expansion of the input is seen within this and taken at the rebalance it starts."""
TOPIC_GONE_MS = 5_000
"""How long the producer holds the outputs for a topic missing from the metadata (deleted) before failing their
delivery (librdkafka's topic.metadata.propagation.max.ms, 30 s by default)."""
STATS_INTERVAL_MS = 1000  # librdkafka's statistics (broker round trips) for the freshness above
COMMITTED_TIMEOUT_SECONDS = 10.0
JOIN_SETTLE_SECONDS = 12.0  # a close in the middle of a group join first waits this long for the join to end
STOP_SETTLE_SECONDS = 30.0  # a stop waits this long for the batch in flight (the pods' grace period allows it)
BROKER_LOST_SECONDS = 120.0  # no broker answered for this long while consuming: exit non-zero (a supervisor restarts)
START_JOIN_SECONDS = 60.0  # a start waits this long for the first assignment (the join takes ~5 s on Tansu)
EMBEDDED_CLUSTER_ID = "tansu_cluster"  # the cluster id the embedded broker reports: its quirk handlers act there only
BROKER_KIND_SECONDS = 5.0  # how long the open waits for the metadata that says which broker it is (else: at assignment)
TRANSACTION_TIMEOUT_MS = DELIVERY_TIMEOUT_MS  # a transaction left open this long is aborted by its coordinator
TRANSACTION_CALL_SECONDS = 30.0  # init, send offsets, commit, abort: retried while retriable, at most this long

_E = KafkaError
GROUP_MOVED_ON = frozenset({
    _E.REBALANCE_IN_PROGRESS, _E.ILLEGAL_GENERATION, _E.UNKNOWN_MEMBER_ID, _E._ASSIGNMENT_LOST, _E.FENCED_INSTANCE_ID,
    _E.NOT_COORDINATOR, _E.COORDINATOR_NOT_AVAILABLE, _E.COORDINATOR_LOAD_IN_PROGRESS, _E._WAIT_COORD, _E._STATE,
    _E._TRANSPORT, _E._ALL_BROKERS_DOWN, _E._TIMED_OUT, _E.REQUEST_TIMED_OUT, _E._UNKNOWN_PARTITION})
"""Errors of a commit that did not happen because the group moved on without us (the partitions may
have been given to another member, or not be assigned any more) or the coordinator is away: the
batch is replayed, and librdkafka rejoins by itself."""

FATAL = frozenset({_E._FATAL, _E.TOPIC_AUTHORIZATION_FAILED, _E.GROUP_AUTHORIZATION_FAILED,
                   _E.CLUSTER_AUTHORIZATION_FAILED, _E.SASL_AUTHENTICATION_FAILED, _E._AUTHENTICATION})
"""Errors that waiting does not cure (besides those librdkafka itself calls fatal): they end the loop."""

NOT_LOADED = object()
"""What ``InputSpec.active()`` returns while the artifact to apply is not loaded (the input is held)."""


class DeliveryError(RuntimeError):
    """A batch's outputs could not be delivered; its offsets were not committed."""


class NotAuthorised(PermissionError):
    """The broker refused this worker's principal what its input needs (an ACL is missing): one line says what."""


class BrokerLost(RuntimeError):
    """No Kafka broker answered for BROKER_LOST_SECONDS: the worker exits rather than stay up without consuming."""


class UnsupportedBroker(RuntimeError):
    """The broker cannot give what the configuration asks for (exactly-once on the embedded broker)."""


@dataclass(frozen=True)
class InputSpec:
    """One input of the worker: where it reads, what it does to a batch, where the outputs go.

    ``active``, ``delivered`` and ``admitted`` run on the consumer's thread.
    """

    agent: str  # metrics label: "records" or "embeddings"
    topic: str
    output_topic: str
    batching: AgentConfig
    process: Callable[[Sequence, object], BatchOutcome]  # (messages, active artifact) -> outcome
    active: Callable[[], object]  # the artifact to apply, or NOT_LOADED (the input is held)
    delivered: Callable[[BatchOutcome, object], None]  # after the commit: the monitor
    # Whether the worker may take partitions now (False: its config is not the pipeline's, or not known yet): while
    # it is False the consumer is not in the group at all, and it leaves once it turns False.
    admitted: Callable[[], bool] = lambda: True


@dataclass(frozen=True)
class Progress:
    """How one input is doing, for /readyz."""

    agent: str
    partitions: int  # assigned to this worker now
    seconds_since: float | None  # since a batch was committed or every partition was read to its end; None: never
    last_error: str | None  # the last error recovered from in place, if any


class _Reports:
    """The delivery reports of one send of a batch (a re-send counts afresh)."""

    def __init__(self, expected: int):
        self.expected, self.failed = expected, []

    def report(self, error, message) -> None:
        """librdkafka's delivery callback (served by ``flush`` on the consumer's thread)."""
        self.expected -= 1
        if error is not None:
            self.failed.append(error)


@dataclass
class _Batch:
    """A batch taken from the input: its messages, outcome, and the offsets to commit once it is delivered."""

    messages: list
    active: object
    next_offsets: dict  # (topic, partition) -> the next offset to read, after the batch
    started: float  # perf_counter when it was taken
    outcome: BatchOutcome | None = None
    reports: _Reports = field(default_factory=lambda: _Reports(0))

    @property
    def sends(self) -> int:
        return len(self.outcome.repaired) + len(self.outcome.dead)

    def first_offsets(self) -> dict:
        """(topic, partition) -> the batch's first offset there (only needed to replay it: rare)."""
        first: dict = {}
        for m in self.messages:
            first.setdefault((m.topic(), m.partition()), m.offset())
        return first


def _names(partitions) -> str:
    return ", ".join(sorted(_name(*p) if isinstance(p, tuple) else _name(p.topic, p.partition)
                            for p in partitions)) or "none"


def _name(topic: str, partition: int) -> str:
    return f"{topic}[{partition}]"


def _short(error) -> str:
    """One line naming a Kafka error (or any exception)."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        error = error.args[0]
    if isinstance(error, KafkaError):
        text = f"{error.name()}: {error.str()}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:160]


def _code(error) -> int | None:
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        error = error.args[0]
    return error.code() if isinstance(error, KafkaError) else None


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


class BatchConsumer(mode.Service):
    """Consume ``spec.topic`` in ``group_id`` a batch at a time; deliver, then commit (see the module docstring).

    Parameters
    ----------
    spec : InputSpec
        The input: its topic, its batch logic, where its outputs go.
    bootstrap : str
        The Kafka bootstrap servers.
    group_id : str
        The consumer group the workers of this input share.
    dlq_topic : str
        Where dead letters go.
    metrics : PipelineMetrics
        The pipeline's metric families.
    session_timeout_ms : int
        The group session: a worker silent this long loses its partitions.
    transactional_id : str or None
        None: at-least-once (the default). Else exactly-once, one Kafka transaction per batch on a producer with
        this ``transactional.id``; it must be unique among running workers and stable across a worker's restarts.
    """

    def __init__(self, spec: InputSpec, bootstrap: str, group_id: str, dlq_topic: str, metrics: PipelineMetrics,
                 session_timeout_ms: int = 10_000, transactional_id: str | None = None, **kwargs):
        self.spec, self.bootstrap, self.group_id, self.dlq_topic = spec, bootstrap, group_id, dlq_topic
        self.metrics = metrics  # the pipeline's view of the families (its label filled in)
        self.session_timeout_ms = session_timeout_ms
        self.transactional_id = transactional_id
        self._embedded: bool | None = None  # the broker is the embedded Tansu (its quirks' handlers act); None: unknown
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._stop = threading.Event()  # set by on_stop: the thread finishes its batch and leaves the group
        self._done: asyncio.Future | None = None  # the thread's end, on the event loop (a stop waits for it)
        self._up = threading.Event()  # the first assignment came (or the thread ended): the start is over
        self._early: list = []  # read while joining, before the loop: its first batch
        self._pending: _Batch | None = None  # produced, not settled yet (at most one)
        self._follow: tuple[bool, float] | None = None  # mapped outputs follow their input's partition (, since)
        self._owned: frozenset = frozenset()  # (topic, partition) assigned now
        self._joined = False  # an assignment (maybe empty) came since the last revocation: no join in flight
        self._rebalanced = False  # during the last consume(): drop messages of partitions no longer owned
        self._start_offsets: dict = {}  # (topic, partition) -> committed offset at assignment, if any
        self._next_offset: dict = {}  # (topic, partition) -> the next offset to process
        self._reset: set = set()  # reset to the beginning, no record read since: not reset again
        self._answered: dict = {}  # broker id -> monotonic time it last answered (librdkafka's statistics)
        self._contact_from = time.monotonic()  # the broker-contact clock starts here (opened, or out of a hold)
        self._leaders: dict = {}  # (topic, partition) -> its leader's broker id
        self._fatal: KafkaError | None = None  # from the error callbacks: raised by the loop
        self._gave_up = False  # a revocation after a crash settles nothing
        self._progress_at: float | None = None  # monotonic: last commit, or last read to the end of every partition
        self._failed_commits = 0  # in a row
        self._last_error: str | None = None
        super().__init__(**kwargs)

    # ------------------------------------------------------------------ the service, on the event loop

    async def on_start(self) -> None:
        """Start the loop's thread and wait (bounded) until it is in its group, as a started consumer is."""
        self._start_thread()
        await asyncio.get_running_loop().run_in_executor(None, self._up.wait, START_JOIN_SECONDS)

    def _start_thread(self) -> None:
        if self._done is not None:
            return
        loop = asyncio.get_running_loop()
        self._done = done = loop.create_future()

        def run() -> None:
            try:
                self._run()
            except BaseException as exc:  # noqa: BLE001 - handed to the event loop, raised there
                outcome = (done.set_exception, exc)
            else:
                outcome = (done.set_result, None)
            finally:
                self._up.set()
            try:
                loop.call_soon_threadsafe(lambda: done.done() or outcome[0](outcome[1]))
            except RuntimeError:  # the loop is closed: the process is on its way out
                pass

        threading.Thread(target=run, name=f"fairstream-{self.spec.agent}", daemon=True).start()

    @mode.Service.task
    async def _consume(self) -> None:
        """Await the batch loop's thread; its exception crashes the worker (mode), which exits non-zero."""
        self._start_thread()
        done = self._done
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            raise
        except Exception:
            # mode crashes the service and, through the service tree, the worker: the process exits
            # non-zero (a supervisor restarts it) rather than stay up without consuming. Nothing past
            # the batch in flight was committed, so the restart replays it.
            log.critical("%s: stopping the worker with a non-zero exit status: an error that cannot be recovered "
                         "in place; the batch in flight was not committed, so a restart replays it",
                         self.spec.agent, exc_info=True)
            raise

    async def on_stop(self) -> None:
        """Finish the batch in flight, commit it, and leave the group (no duplicates on a clean stop)."""
        self._stop.set()
        if self._done is None:
            return
        # The thread's own future, not the _consume task: a stop that comes while the start still waits for
        # the group join arrives before that task ever ran, and would wait out the whole timeout.
        finished, _ = await asyncio.wait({self._done}, timeout=STOP_SETTLE_SECONDS)
        if not finished:
            log.error("%s: the batch in flight did not settle within %g s; stopping without its commit",
                      self.spec.agent, STOP_SETTLE_SECONDS)

    # ------------------------------------------------------------------ the loop, on its thread

    def _run(self) -> None:
        """Until a stop: wait while the worker may not take partitions (nothing subscribed), then open the clients,
        join, run batches while it may, settle the last one and leave the group; again after each hold."""
        while self._wait_admitted():
            self._open()
            try:
                self._join()
                while not self._stop.is_set() and self.spec.admitted():
                    self._one_batch()
                if self._pending is not None:
                    self._settle(self._pending)
            except BaseException:
                self._gave_up, self._pending = True, None  # nothing more is committed: a restart replays it
                raise
            finally:
                self._close()

    def _wait_admitted(self) -> bool:
        """Wait (out of the group) while the spec does not admit this worker; False once stopped.

        A held start is over at once (``_up``): the start must not wait for a join that is not coming.
        """
        held = False
        while not self.spec.admitted():
            if not held:
                held = True
                self._up.set()
                log.info("%s: holding: this worker takes no partitions of %s (its config is not the pipeline's, or "
                         "not checked yet)", self.spec.agent, self.spec.topic)
            if self._stop.wait(HOLD_SECONDS):
                return False
        if held:
            log.info("%s: admitted: joining group %s", self.spec.agent, self.group_id)
        return not self._stop.is_set()

    def _open(self) -> None:
        """Create the consumer and producer (on this thread) and subscribe (again after a hold: nothing is owned)."""
        self._contact_from = time.monotonic()
        self._owned, self._joined, self._rebalanced, self._early = frozenset(), False, False, []
        self._start_offsets, self._next_offset, self._reset, self._progress_at = {}, {}, set(), None
        self._consumer = Consumer({
            "bootstrap.servers": self.bootstrap, **librdkafka_options(), "group.id": self.group_id,
            "client.id": f"fairstream-{self.group_id}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": FETCH_MAX_WAIT_MS, "max.partition.fetch.bytes": MAX_FETCH_BYTES,
            "fetch.max.bytes": 4 * MAX_FETCH_BYTES, "queued.max.messages.kbytes": 32 * 1024,
            # A short session lets survivors take over a dead worker's partitions within seconds.
            "session.timeout.ms": self.session_timeout_ms, "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": 300_000, "partition.assignment.strategy": "range",
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS, "socket.timeout.ms": SOCKET_TIMEOUT_MS,
            # librdkafka's default, stated: records of a transaction are read once it commits, never if it aborts.
            "isolation.level": "read_committed",
            "statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._on_stats,
            "error_cb": self._on_error, "logger": CLIENT_LOG})
        self._producer = Producer({
            "bootstrap.servers": self.bootstrap, **librdkafka_options(), "client.id": f"fairstream-{self.group_id}",
            # murmur2 as the Java clients and aiokafka: an output's partition follows from its key as before.
            "partitioner": "murmur2_random", "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": DELIVERY_TIMEOUT_MS, "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "socket.timeout.ms": SOCKET_TIMEOUT_MS,
            "topic.metadata.propagation.max.ms": TOPIC_GONE_MS,
            "message.max.bytes": MAX_OUTPUT_BYTES + 64 * 1024, "queue.buffering.max.messages": 250_000,
            **self._transactional_options(), "error_cb": self._on_error, "logger": CLIENT_LOG})
        self._detect_broker(BROKER_KIND_SECONDS)
        if self.transactional_id is not None:
            self._init_transactions()
        self._consumer.subscribe([self.spec.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _transactional_options(self) -> dict:
        if self.transactional_id is None:
            return {}
        return {"transactional.id": self.transactional_id, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}

    def _detect_broker(self, timeout: float) -> None:
        """Learn (once) whether the broker is the embedded Tansu, from the cluster id its metadata reports.

        Asked at the open and, while the broker has not answered, at each assignment (before any record is
        fetched). Until then the consumer behaves as on Kafka: no quirk handler acts.
        """
        if self._embedded is not None:
            return
        try:
            cluster_id = self._consumer.list_topics(self.spec.topic, timeout=timeout).cluster_id
        except KafkaException as exc:
            self._last_error = _short(exc)
            return
        self._embedded = cluster_id == EMBEDDED_CLUSTER_ID
        log.info("%s: the broker is %s (cluster id %s)", self.spec.agent,
                 "the embedded Tansu: its quirks are handled" if self._embedded else "Apache Kafka", cluster_id)
        if self._embedded and self.transactional_id is not None:
            raise UnsupportedBroker(f"{self.spec.agent}: delivery.guarantee = \"exactly_once\" needs Apache Kafka; "
                                    "the embedded broker returns the records of aborted transactions to read_committed "
                                    "readers (use \"at_least_once\" with it)")

    def _init_transactions(self) -> None:
        """Exactly-once: register the transactional id (aborting what a predecessor with the same id left open)."""
        self._transact(self._producer.init_transactions)
        log.info("%s: exactly-once delivery: one transaction per batch, transactional.id %s", self.spec.agent,
                 self.transactional_id)

    def _transact(self, call: Callable[[float], object]) -> None:
        """``call(timeout)`` (a transactional API call), again while librdkafka says its error is retriable (bounded)."""
        deadline = time.monotonic() + TRANSACTION_CALL_SECONDS
        while True:
            try:
                call(TRANSACTION_CALL_SECONDS)
                return
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable() or time.monotonic() > deadline:
                    raise
                self._last_error = _short(exc)

    def _close(self) -> None:
        """Leave the group (the others take the partitions at once) and drop the producer."""
        if self._consumer is not None:
            try:
                self._finish_join()
                self._consumer.close()
                log.info("%s: left group %s", self.spec.agent, self.group_id)
            except (KafkaException, RuntimeError) as exc:
                log.warning("%s: leaving group %s: %s", self.spec.agent, self.group_id, _short(exc))
        if self._producer is not None and not self._gave_up:
            self._producer.flush(5.0)  # nothing is pending after a settled batch: returns at once
        elif self._producer is not None and self.transactional_id is not None:
            # After a crash: readers need not wait for the coordinator's timeout to see past the open transaction.
            try:
                self._producer.abort_transaction(5.0)
            except KafkaException:  # none open, or the producer is fenced: the coordinator aborts it
                pass
        self._consumer = self._producer = None
        self._owned = frozenset()

    def _join(self) -> None:
        """Until the first assignment: the group join runs while the artifacts load (what is read meanwhile is the
        first batch)."""
        while not self._joined and not self._stop.is_set():
            self._early += self._fetch()
        self._up.set()

    def _finish_join(self) -> None:
        """Before leaving, let a group join in flight end (bounded): what is read meanwhile is neither processed
        nor committed.

        Tansu only: it keeps a member that leaves while its JoinGroup is held as the group's leader for good, so
        the group never completes another rebalance (every later worker waits for that leader's SyncGroup). Kafka
        completes the rebalance without a member that left, so there the consumer leaves at once. It costs a stop
        on Tansu at most one join (about 5 s).
        """
        if not self._embedded:
            return
        deadline = time.monotonic() + JOIN_SETTLE_SECONDS
        while not self._joined and time.monotonic() < deadline:
            self._consumer.consume(self.spec.batching.batch_size, 0.2)

    def _one_batch(self) -> None:
        """Take a batch, process it, settle the one in flight, produce this one (see the module docstring)."""
        active = self._active()
        if active is NOT_LOADED:
            return
        messages = self._fetch()
        # The version active when the batch was taken, not when the (possibly idle, batch_within long) fetch began:
        # records sent after a swap is visible are applied by the new version. A kind once loaded is never unloaded.
        active = self._latest(active) if messages else active
        taken_to = self._positions() if messages else {}  # before any reset: where this batch ends
        self._reset_partitions_past_their_end()
        if not messages:
            if self._pending is not None:
                self._settle(self._pending)
            self._producer.poll(0)  # idle: the producer's errors and log lines are served all the same
            self._note_if_caught_up()
            return
        self.metrics.records_in.labels(self.spec.agent).inc(len(messages))
        batch = _Batch(messages, active, taken_to, time.perf_counter())
        batch.outcome = self.spec.process(messages, active)  # while the batch in flight's reports come back
        if self._pending is not None and not self._settle(self._pending, taken=batch):
            return  # its commit was refused: both are replayed from the batch in flight's first offsets
        self._produce(batch)
        self._pending = batch

    def _active(self):
        """The artifact to apply; NOT_LOADED after a stop. Waits (nothing fetched: backpressure) while none is."""
        held = False
        while (active := self.spec.active()) is NOT_LOADED:
            held = True
            if self._pending is not None:
                self._settle(self._pending)
            if self._stop.wait(HOLD_SECONDS) or not self.spec.admitted():  # a stop, or a hold: the loop leaves
                return NOT_LOADED
        if held:  # nothing was polled meanwhile, so no statistics came: the contact clock starts again
            self._contact_from = time.monotonic()
        return active

    def _latest(self, active):
        """What to apply now: the artifact active at this moment (``active``, read before the fetch, if none is)."""
        latest = self.spec.active()
        return active if latest is NOT_LOADED else latest

    def _fetch(self) -> list:
        """The next batch: the messages without errors, of partitions this worker owns."""
        if self._early:
            early, self._early = self._early, []
            return early
        self._rebalanced = False
        messages = self._consumer.consume(self.spec.batching.batch_size, self.spec.batching.batch_within)
        self._raise_fatal()
        self._check_broker_contact()
        good = [m for m in messages if m.error() is None]
        if len(good) < len(messages):
            for m in messages:
                if m.error() is not None:
                    self._on_error(m.error())
            self._raise_fatal()
        if self._rebalanced:  # fetched before a revocation: the partitions' next owner reads them
            good = [m for m in good if (m.topic(), m.partition()) in self._owned]
        if self._reset and good:
            self._reset -= {(m.topic(), m.partition()) for m in good}
        return good

    def _positions(self) -> dict:
        """(topic, partition) -> the next offset to read, for each owned partition read from since its assignment."""
        owned = [TopicPartition(topic, partition) for topic, partition in self._owned]
        return {(tp.topic, tp.partition): tp.offset for tp in self._consumer.position(owned) if tp.offset >= 0}

    # ------------------------------------------------------------------ delivery

    def _produce(self, batch: _Batch) -> None:
        """Hand every output and dead letter to the producer (non-blocking); batch.reports counts their reports.

        Exactly-once: in a transaction of the batch's own, begun here (the previous batch's is settled).
        """
        if self.transactional_id is not None:
            self._producer.begin_transaction()
        batch.reports = reports = _Reports(batch.sends)
        produce, report = self._producer.produce, reports.report
        placed = self._placements(batch.outcome.routes)
        for topic, pairs, places in ((self.spec.output_topic, batch.outcome.repaired, placed),
                                     (self.dlq_topic, batch.outcome.dead, None)):
            for n, (key, value) in enumerate(pairs):
                where = _BY_KEY if places is None else places[n]
                try:
                    produce(topic, value, key, on_delivery=report, **where)
                except BufferError:  # the local queue is full: let it drain, then again
                    self._produce_when_room(topic, key, value, report, where)
                except KafkaException as exc:  # refused locally: counts as a failed delivery
                    report(exc.args[0] if exc.args else exc, None)

    def _produce_when_room(self, topic: str, key, value, report, where: dict = None) -> None:
        while True:
            self._producer.poll(0.05)
            try:
                return self._producer.produce(topic, value, key, on_delivery=report, **(where or _BY_KEY))
            except BufferError:
                continue

    def _placements(self, routes: list | None) -> list[dict] | None:
        """The produce arguments of each output of a mapped batch: its input's headers and, when the output topic
        has at least as many partitions as the input topic, its input's partition number (else by key)."""
        if routes is None:
            return None
        follow = self._partitions_follow()
        return [{**({"headers": headers} if headers else {}), **({"partition": partition} if follow else {})}
                for headers, partition in routes]

    def _partitions_follow(self) -> bool:
        """Whether the output topic has at least as many partitions as the input topic (asked once a metadata
        refresh interval: an operator may add partitions)."""
        now = time.monotonic()
        if self._follow is None or now - self._follow[1] > METADATA_REFRESH_MS / 1000:
            try:
                topics = self._producer.list_topics(timeout=5.0).topics
                counts = [len(topics[name].partitions) for name in (self.spec.topic, self.spec.output_topic)]
                follows = 0 < counts[0] <= counts[1]
            except (KafkaException, KeyError) as exc:  # not known yet: by key this time, asked again next batch
                log.info("%s: partition counts of %s and %s unknown (%s): outputs by key", self.spec.agent,
                         self.spec.topic, self.spec.output_topic, exc)
                return False
            if self._follow is None or self._follow[0] != follows:
                log.info("%s: outputs go to %s", self.spec.agent,
                         "their input's partition number" if follows else
                         f"the partition of their key ({self.spec.output_topic} has fewer partitions than "
                         f"{self.spec.topic})")
            self._follow = (follows, now)
        return self._follow[0]

    def _settle(self, batch: _Batch, taken: _Batch | None = None, rewind: bool = True) -> bool:
        """Wait for batch's delivery (re-sent whole on a failure), commit it, hand it to the monitor.

        False if the commit was refused: the partitions still owned are then rewound to the first
        offset of ``batch`` (or of ``taken``, the batch read meanwhile, on partitions ``batch`` lacks).
        """
        self._pending = None
        replay = [taken, batch] if rewind else None
        if self.transactional_id is not None:
            if not self._commit_transaction(batch, replay):
                return False
        else:
            self._deliver(batch)
            if not self._commit(batch, replay):
                return False
        self.metrics.batch_seconds.labels(self.spec.agent).observe(time.perf_counter() - batch.started)
        self._count(batch.outcome)
        self._record_lag(batch.next_offsets)
        self.spec.delivered(batch.outcome, batch.active)
        return True

    def _deliver(self, batch: _Batch) -> None:
        """Every delivery report of ``batch`` back and good; else re-sent whole, then :class:`DeliveryError`."""
        for attempt in range(1, SEND_ATTEMPTS + 1):
            self._await_reports(batch.reports)
            if not batch.reports.failed:
                return
            first = _short(batch.reports.failed[0])
            log.warning("%s: delivery of %d messages failed (attempt %d of %d): %s", self.spec.agent, batch.sends,
                        attempt, SEND_ATTEMPTS, first)
            if attempt == SEND_ATTEMPTS:
                raise DeliveryError(f"{batch.sends} outputs could not be delivered: {first}")
            time.sleep(min(SEND_BACKOFF_SECONDS * 2 ** attempt, 5.0))
            # Sent again whole: duplicates are bit-identical (deterministic repair), and nothing is committed yet.
            self._produce(batch)

    def _await_reports(self, reports: _Reports) -> None:
        deadline = time.monotonic() + DELIVERY_TIMEOUT_MS / 1000 + 10
        while reports.expected > 0:
            self._producer.flush(1.0)  # serves the delivery reports on this thread
            self._raise_fatal()
            if reports.expected > 0 and time.monotonic() > deadline:
                reports.failed.append(KafkaError(KafkaError._MSG_TIMED_OUT, "no delivery report in time"))
                return

    def _commit(self, batch: _Batch, replay: list | None) -> bool:
        """Commit a delivered batch; False if the group moved on without us (the batch is then replayed)."""
        try:
            offsets = self._offsets_the_broker_holds(batch.next_offsets)
            if offsets:
                committed = self._consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                                  asynchronous=False)
                refused = [tp.error for tp in committed or () if tp.error is not None]
                if refused:
                    raise KafkaException(refused[0])
        except KafkaException as exc:
            if _code(exc) not in GROUP_MOVED_ON:
                raise
            self._failed_commits += 1
            if self._failed_commits >= FAILED_COMMITS_IN_A_ROW:
                raise
            self._last_error = _short(exc)
            replayed = self._rewind([b for b in replay if b is not None]) if replay else []
            log.warning("%s: the group rebalanced without this worker (%s): the delivered batch of %d records was "
                        "not committed and is replayed (here from %s; elsewhere by the partitions' new owner); "
                        "rejoining", self.spec.agent, self._last_error, len(batch.messages), _names(replayed))
            return False
        self._failed_commits = 0
        self._progress_at = time.monotonic()
        return True

    def _commit_transaction(self, batch: _Batch, replay: list | None) -> bool:
        """Exactly-once: commit the batch's transaction (outputs, dead letters, offsets); False if it was aborted.

        An aborted batch counts nowhere: it is processed again from its first offsets (here, on the partitions
        still owned; elsewhere by their new owner, from the group's committed offsets). A fatal error (the
        producer fenced by a newer one with its id) is raised: the loop ends.
        """
        self._await_reports(batch.reports)  # librdkafka serves the delivery reports of the transaction here
        try:
            if batch.reports.failed:
                cause = f"delivery failed: {_short(batch.reports.failed[0])}"
            else:
                offsets = [TopicPartition(t, p, o) for (t, p), o in batch.next_offsets.items()]
                group = self._consumer.consumer_group_metadata()
                self._transact(lambda timeout: self._producer.send_offsets_to_transaction(offsets, group, timeout))
                self._transact(self._producer.commit_transaction)
                self._failed_commits = 0
                self._progress_at = time.monotonic()
                return True
        except KafkaException as exc:
            error = _kafka_error(exc)
            if error is None or error.fatal() or not error.txn_requires_abort():
                raise
            cause = _short(exc)
        self._abort(batch, replay, cause)
        return False

    def _abort(self, batch: _Batch, replay: list | None, cause: str) -> None:
        """Abort the batch's transaction and rewind to its first offsets; too many aborts in a row end the loop."""
        self._transact(self._producer.abort_transaction)
        self._failed_commits += 1
        if self._failed_commits >= FAILED_COMMITS_IN_A_ROW:
            raise DeliveryError(f"{self._failed_commits} transactions in a row were aborted, the last: {cause}")
        self._last_error = cause
        replayed = self._rewind([b for b in replay if b is not None]) if replay else []
        log.warning("%s: the transaction of a batch of %d records was aborted (%s): none of its outputs or offsets "
                    "count; it is processed again (here from %s; elsewhere by the partitions' new owner)",
                    self.spec.agent, len(batch.messages), cause, _names(replayed))

    def _offsets_the_broker_holds(self, offsets: dict) -> dict:
        """The batch's offsets without those past their partition's highwater (a log that got shorter).

        Tansu only (its fetch past the end is no error). Committing them would make the group skip the new
        log up to there. They are not committed, and not replayed either: the broker no longer holds those
        records, and their outputs were delivered (to the broker that answered the sends: the new one). The
        reset after the next fetch (:meth:`_reset_partitions_past_their_end`) then replays what the broker
        holds now. On Kafka the offsets of records just read are committed as they are: the cached highwater
        may be older than the records (a partition that came back), and a log that lost them answers the
        next fetch with OFFSET_OUT_OF_RANGE.
        """
        if not self._embedded:
            return offsets
        kept = {}
        for (topic, partition), offset in offsets.items():
            highwater = self._highwater(topic, partition)
            if highwater is None or offset <= highwater:
                kept[topic, partition] = offset
            else:
                self._last_error = (f"offsets lost by the broker: {_name(topic, partition)} batch ends at {offset}, "
                                    f"log at {highwater}")
                log.warning("%s: %s[%d]: the delivered batch ends at offset %d but the partition's log now ends at "
                            "%d (the topic was re-created or truncated): its offset is not committed", self.spec.agent,
                            topic, partition, offset, highwater)
        return kept

    def _watermarks(self, topic: str, partition: int) -> tuple[int | None, int | None]:
        """The partition's log start and end as the last fetch saw them (Tansu's ListOffsets are wrong: never ask it).

        Good for lag and for "read to the end" on both brokers: every fetch response refreshes them, and the
        caught-up check also wants the partition's leader to have answered lately. They may be stale (a
        partition that comes back to this worker keeps what its last fetch here saw), so on Kafka they never
        move a position.
        """
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return None, None
        return (low if low >= 0 else None), (high if high >= 0 else None)

    def _highwater(self, topic: str, partition: int) -> int | None:
        return self._watermarks(topic, partition)[1]

    def _rewind(self, batches: list[_Batch]) -> list:
        """Seek the partitions this worker still owns back to the batches' first offsets: at-least-once."""
        first: dict = {}
        for batch in batches:  # the earlier batch last: its offsets win
            first.update(batch.first_offsets())
        rewound = []
        for (topic, partition), offset in sorted(first.items()):
            if (topic, partition) not in self._owned:
                continue  # lost: its new owner resumes from the committed offset
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException:  # revoked meanwhile
                continue
            self._start_offsets[topic, partition] = offset  # where it stands until a record is read
            rewound.append((topic, partition))
        return rewound

    # ------------------------------------------------------------------ rebalance (inside consume())

    def _on_assign(self, consumer, partitions) -> None:
        self._rebalanced = self._joined = True
        self._detect_broker(BROKER_KIND_SECONDS)
        self._up.set()
        self._owned = frozenset((tp.topic, tp.partition) for tp in partitions)
        self._start_offsets = self._committed(partitions)
        self._reset.clear()
        log.info("%s: partitions assigned (resuming from committed offsets): %s", self.spec.agent, _names(partitions))

    def _on_revoke(self, consumer, partitions) -> None:
        self._rebalanced, self._joined = True, False
        if self._pending is not None and not self._gave_up:
            self._settle(self._pending, rewind=False)  # delivered and committed: the next owner resumes after it
        self._owned, self._next_offset, self._start_offsets = frozenset(), {}, {}
        log.info("%s: partitions revoked after the batch in flight settled: %s", self.spec.agent, _names(partitions))

    def _committed(self, partitions) -> dict:
        """(topic, partition) -> the group's committed offset, where it has one (where consuming starts)."""
        try:
            committed = self._consumer.committed(list(partitions), timeout=COMMITTED_TIMEOUT_SECONDS)
        except KafkaException as exc:
            self._last_error = _short(exc)
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in committed if tp.offset >= 0}

    # ------------------------------------------------------------------ errors and statistics (inside consume/flush)

    def _on_error(self, error: KafkaError) -> None:
        """A client error: a fatal one is raised by the loop; the others are waited out (librdkafka retries)."""
        if error.fatal() or error.code() in FATAL:
            self._fatal = self._fatal or error
            return
        if error.code() == KafkaError._PARTITION_EOF:
            return
        self._last_error = _short(error)
        # One template per error code: the worker's log filter keeps one line per cause every few seconds.
        log.warning(f"%s: Kafka client error {error.name()} (the client retries): %s", self.spec.agent, error.str())

    def _raise_fatal(self) -> None:
        if self._fatal is None:
            return
        refused = self._refused(self._fatal.code())
        if refused is not None:  # an ACL is missing: who may not do what, in one line (no retry cures it)
            line = authorization_refusal(*refused)
            log.critical("%s: %s", self.spec.agent, line)
            raise NotAuthorised(line)
        raise KafkaException(self._fatal)

    def _refused(self, code: int) -> tuple[str, ...] | None:
        """(operation, resource, name[, purpose]) the broker refused, for an authorisation error; else None."""
        return {_E.TOPIC_AUTHORIZATION_FAILED: ("read", "topic", self.spec.topic),
                _E.GROUP_AUTHORIZATION_FAILED: ("read", "group", self.group_id, f"read topic {self.spec.topic}"),
                }.get(code)

    def _check_broker_contact(self) -> None:
        """End the loop when no broker has answered for BROKER_LOST_SECONDS of polling.

        librdkafka retries a lost broker for ever, and so would the worker: up, healthy to a liveness
        probe, consuming nothing. Exiting non-zero hands it to its supervisor (Kubernetes, compose,
        ``--supervise``), whose restart reports the broker in one line; nothing past the batch in flight
        was committed, so the restart replays it.
        """
        last = max([self._contact_from, *self._answered.values()])
        if time.monotonic() - last > BROKER_LOST_SECONDS:
            raise BrokerLost(f"{self.spec.agent}: no Kafka broker at {self.bootstrap} has answered for "
                             f"{BROKER_LOST_SECONDS:g} s (last client error: {self._last_error or 'none'})")

    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (every STATS_INTERVAL_MS): when each broker last answered, who leads what."""
        stats, now = json.loads(text), time.monotonic()
        for broker in stats.get("brokers", {}).values():
            idle = broker.get("rxidle", -1)  # microseconds since the broker last answered; -1: never
            if broker.get("state") == "UP" and idle >= 0:
                self._answered[broker.get("nodeid")] = now - idle / 1e6
        self._leaders = {(topic, int(p)): partition.get("leader") for topic, parts in stats.get("topics", {}).items()
                         for p, partition in parts.get("partitions", {}).items() if int(p) >= 0}

    # ------------------------------------------------------------------ the log's end

    def _reset_partitions_past_their_end(self) -> None:
        """Tansu only: reset to the beginning every owned partition whose position is past its log's end.

        That is Kafka's offset out of range: the log is shorter than where the group is (the topic was
        re-created, e.g. by the memory-only embedded broker after a restart, or truncated). Kafka answers
        such a fetch with OFFSET_OUT_OF_RANGE and the client applies ``auto.offset.reset``; Tansu answers
        it with no records and no error, so the group would wait there and skip every record below its
        position in silence. The reset is the policy the consumer declares ("earliest"): replay what the
        broker holds (at-least-once; duplicates are identical). Cheap: highwater and position are local.

        Never on Kafka: there the highwater compared is the cached one of the last fetch, which is stale for a
        partition that comes back after another member advanced it, and a seek to 0 would replay the whole
        retained log; Kafka reports a real out-of-range itself.
        """
        if not self._embedded:
            return
        for (topic, partition), position in self._where().items():
            highwater = self._highwater(topic, partition)
            if highwater is None or position is None or position <= highwater or (topic, partition) in self._reset:
                continue
            # Offset 0 is the beginning of a re-created log; on a log that starts later the fetch is out of
            # range and the client's "earliest" reset moves it to the log's start.
            try:
                self._consumer.seek(TopicPartition(topic, partition, 0))
            except KafkaException:  # revoked meanwhile: its next owner checks it
                continue
            self._reset.add((topic, partition))
            self._start_offsets[topic, partition] = 0
            self._next_offset.pop((topic, partition), None)
            self._last_error = f"offset out of range: {_name(topic, partition)} at {position}, log ends at {highwater}"
            log.warning("%s: %s[%d] is at offset %d but its log ends at %d (the topic was re-created or truncated): "
                        "offset out of range, reset to the beginning (auto.offset.reset=earliest); what the broker "
                        "holds is replayed", self.spec.agent, topic, partition, position, highwater)

    def _where(self) -> dict:
        """(topic, partition) -> where consuming stands: the position, else the committed offset, else None."""
        read = self._positions() if self._owned else {}
        return {tp: read.get(tp, self._start_offsets.get(tp)) for tp in self._owned}

    def _note_if_caught_up(self) -> None:
        """After an empty fetch: progress if every owned partition is read to its end and its broker just answered."""
        if not self._owned:
            return
        now = time.monotonic()
        for (topic, partition), position in self._where().items():
            answered = self._answered.get(self._leaders.get((topic, partition)))
            if answered is None or now - answered > FRESH_FETCH_SECONDS:
                return  # not fetched lately: the broker may be away
            highwater = self._highwater(topic, partition)
            if position is None:  # nothing read nor committed: the log's start is where it stands
                position = self._low(topic, partition)
            if highwater is None or position is None or highwater > position:
                return
        self._progress_at = time.monotonic()
        self.metrics.consumer_lag.labels(self.spec.agent).set(0)

    def _low(self, topic: str, partition: int) -> int | None:
        return self._watermarks(topic, partition)[0]

    # ------------------------------------------------------------------ metrics and health

    def _count(self, outcome: BatchOutcome) -> None:
        agent, metrics = self.spec.agent, self.metrics
        metrics.records_repaired.labels(agent).inc(len(outcome.repaired))
        metrics.records_dead.labels(agent).inc(len(outcome.dead))
        metrics.records_out_of_range.labels(agent).inc(outcome.out_of_range)
        metrics.records_group_imputed.labels(agent).inc(outcome.imputed)
        metrics.event_time_skewed.labels(agent).inc(outcome.skewed)
        now = time.time()
        times = outcome.event_times
        for ts in times[:: max(1, len(times) // LATENCY_SAMPLES)]:
            if 0 <= now - ts < 86_400:  # only event times on the wall clock mean latency
                metrics.record_latency.labels(agent).observe(now - ts)

    def _record_lag(self, next_offsets: dict) -> None:
        # The fetch highwater, not end offsets: the embedded broker's ListOffsets under-reports them.
        self._next_offset.update(next_offsets)
        lag = 0
        for topic, partition in self._owned:
            highwater, position = self._highwater(topic, partition), self._next_offset.get((topic, partition))
            if highwater is not None and position is not None:
                lag += max(highwater - position, 0)
        self.metrics.consumer_lag.labels(self.spec.agent).set(lag)

    def assignment(self) -> set[tuple[str, int]]:
        """The partitions this worker owns now, as (topic, partition)."""
        return set(self._owned)

    def progress(self) -> Progress:
        """Partitions owned, and how long since this input last made progress (see :class:`Progress`)."""
        since = None if self._progress_at is None else time.monotonic() - self._progress_at
        return Progress(self.spec.agent, len(self._owned), since, self._last_error)
