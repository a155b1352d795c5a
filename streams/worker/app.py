"""The Faust app: agents over explicit topics, a control-topic follower, and at-least-once delivery.

Agents read raw bytes in batches (``stream.take_events``), hand the batch to the Faust-free logic
of :mod:`fairstream.streams.worker.processing`, and send every output before returning to the stream.
Faust acknowledges a batch's events only when the agent asks for the next batch, and commits only
acknowledged offsets, so an offset is committed after its output is on the broker: at-least-once.
A crash between send and commit replays the batch; the repair is a deterministic function of
(artifact version, record key), so the replayed outputs are identical and consumers de-duplicate
by (id, provenance.version).

The active artifact is read once per batch, so every output record of a batch carries exactly one
version, and a swap published on the control topic takes effect between two batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Iterable

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from fairstream.streams.codec import RefitRequest
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.registry import (
    ArtifactRegistry,
    follow_control,
    module_loaders,
)
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.broker import parse_broker_url

from .metrics import (
    ARTIFACT_REFUSED,
    ARTIFACT_VERSION,
    BATCH_SECONDS,
    CONSUMER_LAG,
    DRIFT_EVENTS,
    FAIRNESS,
    RECORD_LATENCY,
    RECORDS_DEAD,
    RECORDS_IN,
    RECORDS_OUT_OF_RANGE,
    RECORDS_REPAIRED,
    REFIT_REQUESTS,
    WINDOW_RECORDS,
    serve,
)
from .monitor import DriftEvent, FairnessMonitor
from .processing import BatchOutcome, EmbeddingRepairer, RecordRepairer

log = logging.getLogger(__name__)




# Faust hard-codes the consumer's fetch_max_wait_ms to 1500 and has no setting for it. The broker
# holds an empty fetch that long, so records on a quiet partition waited up to 1.5 s: p99 latency
# 0.95 s at 2k records/s offered, against 0.18 s with 10 ms (benchmarks/stream_throughput.py).
FETCH_MAX_WAIT_MS = 10


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self):
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _App(faust.App):
    """faust.App with a consumer whose fetch wait suits a low-latency stream (see FETCH_MAX_WAIT_MS)."""

    def _new_transport(self):
        return _Transport(self.conf.broker_consumer, self)


def app_settings(config: PipelineConfig, bootstrap: str, datadir: str | None = None) -> dict:
    """Faust settings tuned for batch agents on raw bytes (see benchmarks/stream_throughput.py)."""
    return dict(
        broker=parse_broker_url(bootstrap).url,
        datadir=datadir or "runs/faust-data",
        # A group join waits about half the session timeout (measured on Tansu: 60 s -> 30 s join,
        # 10 s -> 5 s); a short session also lets a surviving worker take over a dead one's partitions sooner.
        broker_session_timeout=10,
        broker_heartbeat_interval=1,
        value_serializer="raw",
        key_serializer="raw",
        topic_disable_leader=True,  # no leader-election topic: agents here keep no shared state
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        stream_buffer_maxsize=4 * config.records.batch_size,
        broker_max_poll_records=config.records.batch_size,
        producer_linger_ms=5,
        producer_max_batch_size=512 * 1024,
        consumer_max_fetch_size=4 * 1024 * 1024,
    )


def create_app(config: PipelineConfig, bootstrap: str, app_id: str | None = None, datadir: str | None = None) -> faust.App:
    """The worker app for one pipeline; several worker processes with the same id share partitions."""
    app = _App(app_id or f"{config.topics.prefix}-{config.name}", **app_settings(config, bootstrap, datadir))
    topics = config.topics
    raw = dict(value_type=bytes, key_type=bytes, value_serializer="raw", key_serializer="raw", partitions=topics.partitions)
    records_in = app.topic(topics.records_in, **raw)
    embeddings_in = app.topic(topics.embeddings_in, **raw)
    registry = ArtifactRegistry(module_loaders(config.schema()), ArtifactStore(config.artifact_dir), on_change=_on_artifact_change,
                                on_refuse=lambda kind, reason: ARTIFACT_REFUSED.labels(kind).inc())
    ready = asyncio.Event()
    app.fairstream_registry = registry  # for tests and the CLI's status line

    @app.task
    async def control() -> None:
        serve(config.monitor.metrics_port)
        await follow_control(registry, bootstrap, topics.control, ready=ready)

    async def send_all(outcome: BatchOutcome, output_topic: str, agent: str) -> None:
        futures = [await app.producer.send(output_topic, k, v, None, None, None) for k, v in outcome.repaired]
        futures += [await app.producer.send(topics.dlq, k, v, None, None, None) for k, v in outcome.dead]
        await asyncio.gather(*futures)  # delivered before the batch is acknowledged
        RECORDS_REPAIRED.labels(agent).inc(len(outcome.repaired))
        RECORDS_DEAD.labels(agent).inc(len(outcome.dead))
        RECORDS_OUT_OF_RANGE.labels(agent).inc(outcome.out_of_range)
        now = time.time()
        for ts in outcome.event_times[:: max(1, len(outcome.event_times) // 50)]:  # a sample keeps this O(1) per batch
            if 0 <= now - ts < 86_400:  # only event times on the wall clock mean latency
                RECORD_LATENCY.labels(agent).observe(now - ts)

    def record_lag(events, agent: str) -> None:
        last = {}
        for event in events:
            last[event.message.tp] = event.message.offset
        CONSUMER_LAG.labels(agent).set(sum(max(app.consumer.highwater(tp) - offset - 1, 0) for tp, offset in last.items()))

    async def active(kind: str):
        """The artifact to apply; waits (backpressure, nothing dead-lettered) until one is loaded."""
        await ready.wait()
        while (current := registry.current(kind)) is None:
            log.warning("no %s artifact loaded yet: holding input until one is published", kind)
            await asyncio.sleep(1.0)
        return current

    async def batches(stream, agent: str, batching):
        """(events, messages) of each batch an agent takes, counted as they come in."""
        async for events in stream.take_events(batching.batch_size, within=batching.batch_within):
            messages = [event.message for event in events]
            RECORDS_IN.labels(agent).inc(len(messages))
            yield events, messages

    records_logic = RecordRepairer(config)

    @app.agent(records_in)
    async def repair_records(stream) -> None:
        async for events, messages in batches(stream, "records", config.records):
            plan = await active(config.records.artifact)
            with BATCH_SECONDS.labels("records").time():
                outcome = records_logic.process(messages, plan)
                await send_all(outcome, topics.records_repaired, "records")
            record_lag(events, "records")
            if outcome.monitor_batch is not None:  # what was just delivered to records.repaired
                await monitor_delivered(outcome.monitor_batch, plan)

    embedding_logic = EmbeddingRepairer(config)

    @app.agent(embeddings_in)
    async def repair_embeddings(stream) -> None:
        async for events, messages in batches(stream, "embeddings", config.embeddings):
            module = None if config.embeddings.artifact == "identity" else await active("embedding")
            with BATCH_SECONDS.labels("embeddings").time():
                await send_all(embedding_logic.process(messages, module), topics.embeddings_repaired, "embeddings")
            record_lag(events, "embeddings")

    monitor = FairnessMonitor(config)
    app.fairstream_monitor = monitor
    # Created at 0 so that Prometheus' increase() sees the first drift event as an increase.
    DRIFT_EVENTS.labels(config.monitor.statistic, config.monitor.detector).inc(0)

    async def on_drift(event: DriftEvent) -> None:
        DRIFT_EVENTS.labels(event.statistic, event.detector).inc()
        reason = f"drift of {event.statistic} (after repair) to {event.value:.4f} under plan version {event.version}"
        request = RefitRequest.new(reason, kind="plan", statistic=event.statistic, value=event.value,
                                   source=f"monitor@{app.conf.id}")
        await app.producer.send(topics.refit_requests, b"plan", request.to_json(), None, None, None)
        REFIT_REQUESTS.labels("plan", "drift").inc()
        log.warning("fairness drift confirmed: %s; re-fit requested (%s)", reason, request.request_id)

    last_export = [0.0]

    async def monitor_delivered(batch, plan) -> None:
        for event in monitor.observe_batch(batch, plan, registry.current("scorer")):
            await on_drift(event)
        if time.monotonic() - last_export[0] >= 1.0:  # gauges are scraped every few seconds at most
            export_fairness(monitor)
            last_export[0] = time.monotonic()

    return app


def export_fairness(monitor: FairnessMonitor) -> None:
    """Set the fairness gauges from both windows (a window below min_records exports nothing)."""
    for window in ("count", "time"):
        WINDOW_RECORDS.labels(window).set(monitor.windows[window].n_records if monitor.version is not None else 0)
        for statistic, stage, stratum, feature, pair, value in monitor.rows(window):
            FAIRNESS.labels(statistic, stage, stratum, feature, pair, window).set(float(value))


def _on_artifact_change(current) -> None:
    if current.kind == "plan":
        # The monitor starts empty windows for the new plan: the old plan's statistics are removed
        # at the swap, so Prometheus never reads them as the new version's.
        FAIRNESS.clear()
    ARTIFACT_VERSION.labels(current.kind).set(current.version)
    log.info("now serving %s artifact version %s (sha256 %s)", current.kind, current.version, current.sha256[:12])


def run_worker(app: faust.App, loglevel: str = "info", argv: Iterable[str] = ()) -> None:
    """Run a worker in this process until it is stopped (SIGINT/SIGTERM stop it cleanly)."""
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
