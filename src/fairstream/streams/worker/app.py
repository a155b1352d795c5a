"""The worker: a Faust app framing batch consumers, the control-topic follower and the metrics endpoint.

Faust provides the worker's frame: its service tree, signal handling and clean shutdown, the CLI
and logging. The hot path is not a Faust stream: each input topic (``records.in``,
``embeddings.in``) is read by a :class:`~fairstream.streams.worker.consumer.BatchConsumer` in the
worker's consumer group, which delivers a batch's outputs before committing its offsets
(at-least-once; see that module). The same consumer serves both inputs; only the batch logic
(:mod:`~fairstream.streams.worker.processing`) and the artifact kind differ, and every artifact
kind is applied through the module protocol. Each batch consumer runs on librdkafka (confluent-kafka)
in a thread of its own, with its own producer; the worker's notices (re-embed events, re-fit
requests) go through one small producer of the app's (:class:`NoticeProducer`).

A crash between send and commit replays the batch; the repair is a deterministic function of
(artifact version, record key), so the replayed outputs are identical and consumers de-duplicate
by (id, input_digest) (the de-duplication rule of docs/concepts/worker.md). The active artifact is read once per
batch, so every output record of a batch carries exactly one version, and a swap published on the
control topic takes effect between two batches.

Under ``[delivery] guarantee = "exactly_once"`` each batch is one Kafka transaction instead (outputs,
dead letters and offsets), and readers with ``isolation.level=read_committed`` see every output once;
each batch consumer's ``transactional.id`` is ``<group>.<host>-<slot>`` (:func:`worker_instance`),
stable across the worker's restarts, so that a restart aborts what the crashed worker left open.

A worker is consuming or it has exited non-zero: every service hangs in the worker's service tree,
so an error a batch consumer or a task cannot recover from crashes the Faust worker, which stops
its services and exits with status 1 (within :data:`FATAL_EXIT_SECONDS`, or it is ended hard).
``/healthz`` and ``/readyz`` answer beside ``/metrics`` (:mod:`.health`).

One config per pipeline: once the control topic is replayed, the worker compares its own settings
(:func:`~fairstream.streams.control.pipeline_config.settings_of`) with the pipeline's active config version (a
``configure`` record, ``fairstream config publish``). Until then, and while they differ (or a signed pipeline has
none published), its batch consumers take no partitions: they are not in their groups (one that is finishes its
batch in flight, commits it and leaves), ``/readyz`` names the differing keys, one line says what to do, and
``fairstream_config_differs{key}`` is 1 for each. An unsigned pipeline with no config published serves as before,
with one warning that it should publish one.

Shadow candidates: while a kind of the record chain has a pending candidate, each batch also goes through the
candidate chain (:class:`~fairstream.streams.worker.processing.Served`, read from one registry state); the
outputs stay the active chain's. The worker's :class:`~fairstream.streams.worker.shadow.ShadowTrial` measures the
candidate and compares the two chains on the same records; its figures are announced on the control topic.

Fairness is measured for the pipeline, not per worker: the worker's monitors count every delivered record into
mergeable accumulators and the worker sends them as partial aggregates to the stats topic (:mod:`.partials`), at
most every ``monitor.stats_seconds`` and when it stops; the pipeline's monitoring agent (``fairstream monitor``,
:mod:`fairstream.streams.agent`) merges every worker's, runs the drift detectors, asks for re-fits and applies the
shadow policy, once per pipeline. The worker's own gauges (``scope="worker"``) are diagnostics of its partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import math
import os
import socket
import sys
import threading
import time
from typing import Callable, Iterable

import faust
import mode
from confluent_kafka import KafkaException, Producer
from faust.app.base import BootStrategy

from fairstream.models.kinds import capabilities
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.gate import Authority, unsigned_warning
from fairstream.streams.control.pipeline_config import ConfigCheck, check_config, settings_of
from fairstream.streams.control.records import reembed_event
from fairstream.streams.control.registry import ArtifactRegistry, follow_control, module_loaders
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.kafka import librdkafka_options
from fairstream.streams.parsing import parse_broker_url

from .consumer import CLIENT_LOG, NOT_LOADED, BatchConsumer, InputSpec
from .embedding_monitor import EmbeddingMonitor
from .health import HEALTHZ, READYZ, WorkerHealth, quiet_repeats
from .metrics import PipelineMetrics, serve
from .monitor import FairnessMonitor, export_fairness
from .partials import PartialAggregates
from .processing import BatchOutcome, EmbeddingRepairer, RecordRepairer, Served, as_actives, candidate_of
from .shadow import ShadowTrial

log = logging.getLogger(__name__)

MAX_WORKER_SLOTS = 1024  # workers of one app id on one host (slots of their transactional ids)
FATAL_EXIT_SECONDS = 45.0  # after a crash, a stop that hangs (a flush to a broker that is away) is cut short
NOTICE_SECONDS = 10.0  # a notice (re-embed event, stats) not acknowledged within this is sent again later
MAX_UNSENT_STATS = 3600  # stats messages kept while the broker is away (an hour of them); past that the oldest go
HELD_LOG_SECONDS = 30.0  # while an input is held for a missing artifact: say why this often
MAX_LABELLED_KEYS = 20  # differing config keys labelled in fairstream_config_differs (the line and /readyz name more)
EXPORT_SECONDS = 1.0  # the monitors' gauges are exported at most once a second, and at least once after a lull


class _Boot(BootStrategy):
    # No Faust consumer, producer, agents or tables: the batch consumers and their producer replace
    # them, and Faust's consumer refuses to run with nothing to subscribe to.
    enable_kafka = False


class _App(faust.App):
    """faust.App that also starts (and stops first) the worker's own services."""

    BootStrategy = _Boot
    fairstream_services: tuple = ()

    def on_init_dependencies(self) -> Iterable:
        """Faust's services, then ours (so ours stop first and finish their batches)."""
        return [*super().on_init_dependencies(), *self.fairstream_services]


class NoticeNotSent(RuntimeError):
    """A notice was not acknowledged in time (it may still arrive: a resend carries the same id)."""


class NoticeProducer(mode.Service):
    """A small librdkafka producer for the worker's notices (re-embed events, re-fit requests): not the hot path.

    :meth:`send` blocks until the broker acknowledges, from any thread (the records consumer's thread sends
    re-fit requests, the event loop re-embed events through an executor): each send has its own report.
    """

    def __init__(self, bootstrap: str, **kwargs):
        self.bootstrap = bootstrap
        self.producer: Producer | None = None
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        """Create the producer (it connects on its first send)."""
        self.producer = Producer({"bootstrap.servers": self.bootstrap, **librdkafka_options(), "acks": "all",
                                  "partitioner": "murmur2_random", "enable.idempotence": True, "linger.ms": 0,
                                  "message.timeout.ms": int(NOTICE_SECONDS * 3000), "logger": CLIENT_LOG})

    def send(self, topic: str, key: bytes, value: bytes, timeout: float = NOTICE_SECONDS) -> None:
        """Send one message and wait for its acknowledgement; KafkaException or NoticeNotSent if there is none."""
        reports: list = []
        self.producer.produce(topic, value, key, on_delivery=lambda error, message: reports.append(error))
        deadline = time.monotonic() + timeout
        while not reports and time.monotonic() < deadline:
            self.producer.flush(min(1.0, max(deadline - time.monotonic(), 0.0)))
        if not reports:
            raise NoticeNotSent(f"no acknowledgement from the broker within {timeout:g} s")
        if reports[0] is not None:
            raise KafkaException(reports[0])

    @mode.Service.timer(1.0)
    async def _serve(self) -> None:
        """Serve the producer's callbacks and log lines even while no notice is sent (they queue until then)."""
        if self.producer is not None:
            self.producer.poll(0)

    async def on_stop(self) -> None:
        """Flush what is pending (bounded)."""
        if self.producer is not None:  # None when the worker stops before it started
            await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, NOTICE_SECONDS)


class WorkerServices(mode.Service):
    """The notice producer and one batch consumer per input, stopped in order: consumers, then notices."""

    def __init__(self, notices: NoticeProducer, consumers: list[BatchConsumer], health: WorkerHealth,
                 drained: Callable[[], None] = lambda: None, **kwargs):
        self.notices, self.consumers, self.health, self.drained = notices, consumers, health, drained
        super().__init__(**kwargs)
        for service in (notices, *consumers):
            # In the tree (started here, in order, not as children): a crash of one reaches the worker.
            service.beacon.reattach(self.beacon)

    async def on_start(self) -> None:
        """Start the notice producer, then the consumers."""
        self.health.attach(asyncio.get_running_loop())
        await self.notices.start()
        # Together: each group join waits about half the session timeout, and they need not queue.
        await asyncio.gather(*(consumer.start() for consumer in self.consumers))

    async def on_stop(self) -> None:
        """Each consumer finishes its batch, commits and leaves the group; the last counts are sent (``drained``);
        then the notices are flushed."""
        await asyncio.gather(*(consumer.stop() for consumer in self.consumers))
        await asyncio.get_running_loop().run_in_executor(None, self.drained)
        await self.notices.stop()


def app_settings(config: PipelineConfig, bootstrap: str, datadir: str | None = None) -> dict:
    """Faust settings for a frame without Faust streams (no agents, no tables, no web server)."""
    return dict(
        broker=parse_broker_url(bootstrap).url,
        datadir=datadir or "runs/faust-data",
        value_serializer="raw",
        key_serializer="raw",
        topic_disable_leader=True,  # no leader-election topic: the worker keeps no shared state
        web_enabled=False,
    )


def create_app(config: PipelineConfig, bootstrap: str, app_id: str | None = None, datadir: str | None = None) -> faust.App:
    """The worker app for one pipeline; several worker processes with the same id share partitions.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline.
    bootstrap : str
        Kafka bootstrap servers, ``host:port[,host:port...]``.
    app_id : str or None, default=None
        The consumer group and app id; None is ``<prefix>-<name>``.
    datadir : str or None, default=None
        Faust's data directory; None uses Faust's default.

    Returns
    -------
    faust.App
        The app; start it with :func:`run_worker`.
    """
    app_id = app_id or config.app_id
    app = _App(app_id, **app_settings(config, bootstrap, datadir))
    worker = WorkerHooks(config, bootstrap, app_id)
    app.task(worker.follow_control)
    app.task(worker.send_reembed_notices)
    app.task(worker.export_trailing)
    # For tests and the CLI (its status line reads the registry):
    app.fairstream_metrics, app.fairstream_registry = worker.metrics, worker.registry
    app.fairstream_monitor, app.fairstream_verification = worker.monitor, worker.verification
    app.fairstream_health, app.fairstream_metrics_port = worker.health, worker.metrics_port
    app.fairstream_consumers, app.fairstream_hooks = worker.consumers, worker
    app.fairstream_services = (WorkerServices(worker.notices, worker.consumers, worker.health,
                                              drained=worker.send_last_partials),)
    return app


_held_slots: list[socket.socket] = []  # the claims of the slots this process holds: open until it exits


def worker_instance(app_id: str, bootstrap: str) -> str:
    """This worker's name among the running workers of ``app_id`` on this host, stable across restarts.

    ``<host>-<slot>``: the slot is the lowest number no live process of this host holds for ``app_id`` on the
    Kafka cluster at ``bootstrap``, each claimed by binding an abstract Unix socket (Linux), which the kernel
    releases when the process dies, however it dies. A worker restarted after a crash (by a supervisor,
    compose or a pod's restart policy) so takes its predecessor's slot, and with it its ``transactional.id``:
    its ``init_transactions`` aborts what the crashed worker left open at once, rather than after the
    transaction timeout, during which read_committed readers of its outputs and the group's next owner of
    its partitions wait. Without abstract sockets (not Linux) it is ``<host>-p<pid>``: unique, not stable.
    """
    scope = hashlib.sha256(f"{bootstrap}\0{app_id}".encode()).hexdigest()[:32]
    for slot in range(MAX_WORKER_SLOTS):
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0fairstream-worker-{scope}-{slot}")
        except OSError as exc:
            claim.close()
            if exc.errno == errno.EADDRINUSE:
                continue
            log.warning("no abstract Unix sockets here (%s): this worker's transactional ids end in its pid, so a "
                        "restart leaves its predecessor's open transaction to the coordinator's timeout", exc)
            return f"{socket.gethostname()}-p{os.getpid()}"
        _held_slots.append(claim)
        return f"{socket.gethostname()}-{slot}"
    raise RuntimeError(f"{MAX_WORKER_SLOTS} workers of {app_id} already run on this host")


class Throttle:
    """``due(key)`` is True at most once per ``seconds`` for each key (the first time always)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds, self.clock, self.last = seconds, clock, {}

    def due(self, key=None) -> bool:
        """Whether ``seconds`` have passed since the last time it was due for ``key`` (then it counts from now)."""
        now = self.clock()
        if now - self.last.get(key, -math.inf) < self.seconds:
            return False
        self.last[key] = now
        return True


class WorkerHooks:
    """What one worker does at each hook of its services: the registry's artifact changes and refusals, the
    consumers' artifact lookups and delivered batches, the control-topic and re-embed tasks, the health check.

    Consumers call :meth:`active`, :meth:`active_chain` and the ``*_delivered`` hooks on their own threads;
    the registry calls :meth:`artifact_changed` on its thread (its snapshots are immutable).
    """

    def __init__(self, config: PipelineConfig, bootstrap: str, app_id: str):
        self.config, self.bootstrap, self.app_id, self.topics = config, bootstrap, app_id, config.topics
        self.metrics = PipelineMetrics(config.name)  # every series this app exports carries its pipeline's name
        self.ready = asyncio.Event()
        self.swaps = SwapNotices(self.ready)
        self.authority = Authority.of(config)  # the pipeline's trust (its file read now) and promotion policy
        # One config per pipeline: what this worker must share with every other worker of it, and whether it may take
        # partitions (set once the control topic is replayed and its config is the pipeline's active one).
        self.settings = settings_of(config)
        self.config_check: ConfigCheck | None = None  # None until the control topic is replayed
        self.admitted = threading.Event()
        self.config_lock = threading.Lock()
        self.registry = ArtifactRegistry(module_loaders(config.schema()), ArtifactStore(config.artifact_dir),
                                         on_change=self.artifact_changed, on_refuse=self.artifact_refused,
                                         on_candidate=self.candidate_changed, authority=self.authority,
                                         on_config=self.config_published)
        self.partials = PartialAggregates(config, f"{app_id}@{socket.gethostname()}:{os.getpid()}")
        self.unsent: list[bytes] = []  # stats messages the broker did not take yet, oldest first
        # Detectors run in the monitoring agent, on the pipeline's records: the worker's monitor only counts.
        self.monitor = FairnessMonitor(config, detect=False, sink=self.partials.add,
                                       windows=config.monitor.worker_statistics)
        self.verification = EmbeddingMonitor(config)
        self.shadow = ShadowTrial(config, self.metrics, self.partials)  # pending candidates, measured beside
        self.notices, self.health = NoticeProducer(bootstrap), WorkerHealth()
        # Bound now, not in a task: a taken port stops the start with MetricsPortError before anything joins.
        self.metrics_port = serve(config.monitor.metrics_port,
                                  routes={HEALTHZ: self.health.healthz, READYZ: self.health.readyz})
        self.held_logs = Throttle(HELD_LOG_SECONDS)  # per kind: why its input is held, loud but not a flood
        self.fairness_exports = Throttle(EXPORT_SECONDS)  # gauges are scraped every few seconds at most
        self.verification_exports = Throttle(EXPORT_SECONDS)
        # Monitors observed since their last (throttled) export, exported by `export_trailing`; the lock keeps that
        # task off a monitor while a consumer's thread observes a batch with it.
        self.unexported: set[str] = set()
        self.export_lock = threading.Lock()
        # Created at 0 so that Prometheus' increase() sees the first monitor error as an increase.
        for observer in ("fairness", "candidate", "verification"):
            self.metrics.monitor_errors.labels(observer).inc(0)
        identity = not config.embeddings.chain
        self.applied = config.records.chain + config.embeddings.chain
        records = InputSpec(agent="records", topic=self.topics.records_in, output_topic=self.topics.records_repaired,
                            batching=config.records, process=RecordRepairer(config).process,
                            active=self.active_chain, delivered=self.records_delivered,
                            admitted=self.admitted.is_set)
        embeddings = InputSpec(agent="embeddings", topic=self.topics.embeddings_in,
                               output_topic=self.topics.embeddings_repaired, batching=config.embeddings,
                               process=EmbeddingRepairer(config).process,
                               active=self.no_artifact if identity else self.active_embedding,
                               delivered=self.embeddings_delivered, admitted=self.admitted.is_set)
        # One group per input, so a worker joining or leaving rebalances each input on its own.
        # Exactly-once: a transactional id per group and worker, the same after the worker's restart.
        instance = worker_instance(app_id, bootstrap) if config.delivery.guarantee == "exactly_once" else None
        self.consumers = [BatchConsumer(spec, bootstrap, group_id=f"{app_id}.{spec.agent}", dlq_topic=self.topics.dlq,
                                        metrics=self.metrics, transactional_id=None if instance is None
                                        else f"{app_id}.{spec.agent}.{instance}")
                          for spec in (records, embeddings)]
        self.health.watch(self.consumers, self.blockers)

    # ----------------------------------------------------------------------------------- the registry's hooks

    def artifact_changed(self, current) -> None:
        """After each swap (on the registry's thread): gauges and the log follow, an embedding swap is noticed."""
        if current.kind in self.config.records.chain:
            # The monitor starts empty windows for the new chain: the old version's statistics are
            # removed at the swap, so Prometheus never reads them as the new version's.
            self.metrics.clear_fairness()
        self.metrics.artifact_version.labels(current.kind).set(current.version)
        log.info("now serving %s artifact version %s (sha256 %s)", current.kind, current.version, current.sha256[:12])
        self.swaps.seen(current)

    def candidate_changed(self, kind: str, candidate) -> None:
        """A pending candidate arrived (an ``Active``) or left (None), on the registry's thread: the shadow trial
        measures afresh, the candidate's gauges go."""
        if kind not in self.config.records.chain:
            return  # only the record chain is measured in shadow
        with self.export_lock:
            self.shadow.candidate_changed(kind, candidate)
            self.unexported.discard("candidate")

    def config_published(self, record) -> None:
        """A version of the pipeline's config took effect (on the registry's thread): once the topic is replayed, the
        worker compares its own with it (during the replay only the last one counts)."""
        if self.ready.is_set():
            self.check_config()

    def check_config(self) -> ConfigCheck:
        """Compare this worker's settings with the pipeline's active config: admit it (the consumers join) or hold it
        (they stay out of the group, or leave it after their batch in flight); gauges, ``/readyz`` and one line
        follow each change of verdict."""
        with self.config_lock:
            record = self.registry.config_record
            check = check_config(self.settings, record, self.authority.trust.signed)
            previous, self.config_check = self.config_check, check
            labelled = check.differing[:MAX_LABELLED_KEYS]  # a config of 50,000 keys must not make 50,000 series
            for key in labelled:
                self.metrics.config_differs.labels(key).set(1)
            self.metrics.config_differs.keep(lambda key: True, {(key,) for key in labelled})
            if record is not None:
                self.metrics.config_version.labels().set(record.version)
            self.metrics.config_held.set(0 if check.admitted else 1)
            if check.admitted:
                self.admitted.set()
            else:
                self.admitted.clear()
            if check != previous and check.line is not None:
                log.log(check.level, check.line)
        return check

    async def check_config_once_replayed(self) -> None:
        """The first comparison, once the control topic is replayed (later ones come with each config published)."""
        await self.ready.wait()
        self.check_config()

    def artifact_refused(self, kind: str, reason: str, category: str) -> None:
        """A control record the registry refused (it logged why): counted by kind and by why (``category``)."""
        self.metrics.artifact_refused.labels(kind, category).inc()

    # ----------------------------------------------------------------------------------- the app's tasks

    async def follow_control(self) -> None:
        """Replay then follow the control topic into the registry (``ready`` once replayed)."""
        if self.metrics_port is None:
            log.info("no /metrics endpoint ([monitor] metrics_port = \"off\")")
        else:
            log.info("serving Prometheus /metrics on port %d", self.metrics_port)
        warning = unsigned_warning(self.authority)
        if warning is not None:
            log.warning(warning)
        checked = asyncio.ensure_future(self.check_config_once_replayed())
        self.swaps.loop = asyncio.get_running_loop()
        from fairstream.streams.control.registry import WorkerIdentity  # announces what this worker serves

        try:
            await follow_control(self.registry, self.bootstrap, self.topics.control, ready=self.ready,
                                 worker=WorkerIdentity.of(self.app_id, self.config), shadow_figures=self.shadow_figures)
        finally:
            checked.cancel()

    def shadow_figures(self) -> dict | None:
        """The shadow trial's figures as last exported (None without a candidate): read by the announcer."""
        return self.shadow.announced

    async def export_trailing(self) -> None:
        """Every second, the statistics of batches observed since the last export: exports are throttled to one a
        second after a batch, so without this the last batches before a lull would not reach /metrics (the gauges
        would show the window as it was a second before the traffic stopped, for as long as it stays stopped)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(EXPORT_SECONDS)
            if self.unexported:
                await loop.run_in_executor(None, self.export_unexported)
            if self.partials.due() or self.unsent:
                await loop.run_in_executor(None, self.send_partials)

    def export_unexported(self) -> None:
        """Export the monitors observed since their last export (a monitor that cannot measure exports nothing)."""
        exports = {"fairness": lambda: self.monitor.refused is None and export_fairness(self.monitor, self.metrics),
                   "candidate": self.shadow.export,
                   "verification": lambda: export_verification(self.verification, self.metrics)}
        with self.export_lock:
            for name in sorted(self.unexported):
                with observing(name, self.metrics):
                    exports[name]()
            self.unexported.clear()

    async def send_reembed_notices(self) -> None:
        """After a live swap of the embedding module: tell users that stored templates must be re-embedded."""
        while True:
            previous, current = await self.swaps.queue.get()
            while self.notices.producer is None:  # a swap right at start: the producer is still starting
                await asyncio.sleep(0.1)
            key, value = reembed_event(previous, current)
            await asyncio.get_running_loop().run_in_executor(None, self.notices.send, self.topics.control, key, value)
            self.metrics.reembed_events.inc()
            log.warning("embedding module swapped from version %s to %s: templates embedded under version %s must "
                        "be re-embedded (event %s on %s)", previous.version, current.version, previous.version,
                        key.decode(), self.topics.control)

    # ----------------------------------------------------------------------------------- the consumers' hooks

    def active(self, kind: str, agent: str):
        """The artifact to apply, or NOT_LOADED: the consumer holds its input (backpressure, nothing dead-lettered).

        Called on the consumer's thread (the registry's snapshots are immutable).
        """
        if not self.ready.is_set():
            return NOT_LOADED
        if (current := self.registry.current(kind)) is None:
            self.metrics.input_held.labels(agent).set(1)
            if self.held_logs.due(kind):
                # An error when the config disagrees with the published artifact, a warning when none exists.
                log.log(*self.registry.explain_missing(kind))
            return NOT_LOADED
        self.metrics.input_held.labels(agent).set(0)
        return current

    def active_chain(self):
        """The record chain to apply (:class:`Served`: every active artifact in order, and the chain with the pending
        candidates in place), read from one registry state (one version each)."""
        if any(self.active(kind, "records") is NOT_LOADED for kind in self.config.records.chain):
            return NOT_LOADED
        return served_chain(self.registry.served(), self.config.records.chain)

    def active_embedding(self):
        """The embedding module to apply, or NOT_LOADED."""
        return self.active(self.config.embeddings.chain[0], "embeddings")

    @staticmethod
    def no_artifact():
        """The identity module (``embeddings.artifact = "identity"``)."""
        return None

    def records_delivered(self, outcome: BatchOutcome, served) -> None:
        """A record batch was delivered to records.repaired: the fairness monitor observes it, drift asks a re-fit;
        a candidate chain applied in shadow is measured and compared (and, under the shadow policy, decided)."""
        chain = as_actives(served)
        if outcome.monitor_batch is not None:
            started = time.thread_time()  # CPU, not wall time: the share of the worker it costs
            with self.export_lock, observing("fairness", self.metrics):
                self.monitor.observe_batch(outcome.monitor_batch, *chain)  # no detectors: they run in the agent
                if self.monitor.refused is not None:  # this chain version cannot be measured: no stale numbers
                    self.metrics.monitor_errors.labels("fairness").inc()
                    self.metrics.clear_fairness("active")
                elif self.fairness_exports.due("active"):
                    export_fairness(self.monitor, self.metrics)
                    self.unexported.discard("fairness")
                else:
                    self.unexported.add("fairness")
            if candidate_of(served) is not None and (outcome.candidate_batch is not None or outcome.candidate_refused):
                with self.export_lock, observing("candidate", self.metrics):
                    self.observe_candidate(outcome, chain, candidate_of(served))
            self.metrics.monitor_cpu.inc(time.thread_time() - started)
        if self.partials.due():
            self.send_partials()

    def observe_candidate(self, outcome: BatchOutcome, chain: tuple, candidate: tuple) -> None:
        """The shadow trial observes a batch (under the export lock), if the candidate is still pending (a batch taken
        before it left must not start its statistics again); its gauges are exported as the monitor's, throttled."""
        if chain_ids(candidate) != chain_ids(candidate_of(self.active_now())):
            return
        self.shadow.observe(outcome, chain, candidate)
        if self.fairness_exports.due("candidate"):
            self.shadow.export()
            self.unexported.discard("candidate")
        else:
            self.unexported.add("candidate")

    def active_now(self) -> Served:
        """The record chain the registry serves now (no hold, no metrics: for checks)."""
        return served_chain(self.registry.served(), self.config.records.chain)

    def send_partials(self, everything: bool = False) -> None:
        """Send the partial aggregates due (``everything``: whatever is counted) to the stats topic; a message the
        broker does not take now is kept and sent first next time (never fatal: serving matters more)."""
        if self.notices.producer is None:  # not started yet (or a test without a broker): they wait
            return
        with self.export_lock:
            if everything or self.partials.due():
                started = time.thread_time()  # matching MDP's samples and encoding are the monitor's work
                self.unsent += self.partials.take()
                self.metrics.monitor_cpu.inc(time.thread_time() - started)
            if len(self.unsent) > MAX_UNSENT_STATS:
                log.error("%d stats messages could not be sent: the oldest %d are dropped (the pipeline's statistics "
                          "miss their records)", len(self.unsent), len(self.unsent) - MAX_UNSENT_STATS)
                del self.unsent[:len(self.unsent) - MAX_UNSENT_STATS]
            unsent, self.unsent = self.unsent, []
        for i, value in enumerate(unsent):
            try:
                self.notices.send(self.topics.stats, self.partials.worker.encode(), value)
            except (KafkaException, NoticeNotSent, BufferError) as exc:  # kept: sent first next time
                log.error("%d stats messages could not be sent to %s yet: %r", len(unsent) - i, self.topics.stats, exc)
                with self.export_lock:
                    self.unsent[:0] = unsent[i:]
                return
        self.metrics.stats_messages.inc(len(unsent))

    def send_last_partials(self) -> None:
        """At a stop, once the consumers delivered their last batch: send every count (bounded by the notices'
        timeout)."""
        if self.notices.producer is not None:
            self.send_partials(everything=True)

    def embeddings_delivered(self, outcome: BatchOutcome, active) -> None:
        """An embedding batch was delivered: the verification monitor observes its labelled pairs."""
        if outcome.labelled is None:
            return
        started = time.thread_time()
        vectors, identities, groups, ids = outcome.labelled
        with self.export_lock, observing("verification", self.metrics):
            self.verification.observe(vectors, list(identities), list(groups), list(ids), outcome.version)
            if self.verification_exports.due():
                export_verification(self.verification, self.metrics)
                self.unexported.discard("verification")
            else:
                self.unexported.add("verification")
        self.metrics.monitor_cpu.inc(time.thread_time() - started)

    # ----------------------------------------------------------------------------------- the health check

    def blockers(self) -> list[str]:
        """Why the worker is not ready (``/readyz``), or []."""
        if not self.ready.is_set():
            return [f"replaying {self.topics.control}"]
        check = self.config_check  # None between the replay and the first check: nothing joined yet
        config = ["config: not checked yet"] if check is None else [] if check.admitted else [check.blocker()]
        return config + [f"no {kind} artifact loaded (input held)" for kind in self.applied
                         if self.registry.current(kind) is None]


@contextlib.contextmanager
def observing(monitor: str, metrics: PipelineMetrics):
    """A monitor observes batches already delivered and committed: its failure is logged and counted, never fatal.

    The data path must not stop because a statistic cannot be computed (one control record or one batch
    would otherwise stop every worker on every restart); ``fairstream_monitor_errors_total`` and the log
    say that the numbers are missing.
    """
    try:
        yield
    except Exception:  # noqa: BLE001 - any failure of the observer, whatever its cause
        metrics.monitor_errors.labels(monitor).inc()
        log.exception("the %s monitor could not observe a delivered batch (the records were delivered; the worker "
                      "keeps consuming)", monitor)


def served_chain(served, chain: tuple[str, ...]) -> Served:
    """The record ``chain`` of the registry's ``served`` state: its active artifacts in order, and, while a kind of
    it has a pending candidate, the chain with every candidate in its kind's place."""
    active = tuple(served.active[kind] for kind in chain)  # the caller checked that every kind is active
    if not any(kind in served.candidates for kind in chain):
        return Served(active, None)
    return Served(active, tuple(served.candidates.get(kind, current) for kind, current in zip(chain, active)))


def chain_ids(chain) -> tuple | None:
    """What identifies a chain's artifacts (kind, version, sha256 each), or None."""
    return None if chain is None else tuple((a.kind, a.version, a.sha256) for a in chain)


def export_verification(monitor: EmbeddingMonitor, metrics: PipelineMetrics) -> None:
    """Set the verification gauges from both windows (nothing before the first labelled pair)."""
    metrics.verification.clear()  # a group without pairs in the window must not keep an old value
    for window in ("count", "time"):
        for rate, group, value in monitor.rows(window):
            metrics.verification.labels(rate, group, window).set(value)


class SwapNotices:
    """Live swaps of the embedding module (not the replay at start), handed from the registry's thread to the loop."""

    def __init__(self, ready: asyncio.Event):
        self.ready, self.queue = ready, asyncio.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last = None

    def seen(self, current) -> None:
        """Called by the registry (in a thread) after each swap."""
        if capabilities(current.kind).agent != "embeddings":
            return
        previous, self.last = self.last, current
        if previous is not None and self.ready.is_set() and self.loop is not None \
                and previous.sha256 != current.sha256:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (previous, current))


class _Worker(faust.Worker):
    """Faust's worker, with quiet repeats in its logs and a bounded exit after a crash."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        """Once Faust has set up logging: one line per cause every few seconds (a broker away floods them)."""
        super().on_setup_root_logger(logger, level)
        quiet_repeats(logger)

    def on_worker_shutdown(self) -> None:
        """After a crash (or a failed start), the stop that follows must not hang the exit with status 1."""
        super().on_worker_shutdown()
        failed = sys.exc_info()[1]  # a start that failed: its error is on its way out of Faust's start
        if self.crashed or failed is not None:
            _exit_after(FATAL_EXIT_SECONDS, self.crash_reason or failed)


def _exit_after(seconds: float, reason: BaseException | None) -> None:
    def exit_now() -> None:
        log.critical("the worker did not stop within %.0f s of a crash (%r): exiting now", seconds, reason)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True  # a clean exit before it fires ends it
    timer.start()


def run_worker(app: faust.App, loglevel: str = "info", argv: Iterable[str] = ()) -> None:
    """Run a worker in this process until it is stopped (SIGINT/SIGTERM stop it cleanly, exit status 0).

    An error it cannot recover from exits with status 1. ``FAIRSTREAM_EVENT_LOOP=uvloop`` runs it on
    uvloop (measured in benchmarks/stream_throughput.py).

    Parameters
    ----------
    app : faust.App
        An app made by :func:`create_app`.
    loglevel : str, default="info"
        Log level of the worker.
    argv : iterable of str, default=()
        Extra Faust worker command-line arguments.
    """
    loop = None
    if os.environ.get("FAIRSTREAM_EVENT_LOOP", "asyncio") == "uvloop":
        import uvloop  # only where asked for: an optional dependency

        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
    worker = _Worker(app, loglevel=loglevel, quiet=True, loop=loop)
    worker.execute_from_commandline()
