"""``fairstream monitor``: the pipeline's monitoring agent, a process of its own.

It reads the stats topic (``<prefix>.stats``, one partition) in the consumer group ``<app id>.monitor``: one agent
per pipeline reads it, a second one started beside it waits as a standby and takes over if the first goes (its
windows are rebuilt from the topic: on taking the partition it reads back ``window_seconds`` of partials). Every
worker's partial aggregates go into the pipeline's windows (:class:`~.pipeline.PipelineStatistics`), and every half
second the agent:

- closes the slices due and exports the pipeline's gauges (``scope="pipeline"``: what the alert rules, the
  dashboard and the runbook read), the records of each group per window, and why a statistic is not reported when
  a group lacks records (``fairstream_fairness_unmeasurable``);
- runs the drift detectors once, on the pipeline's slices: one drift gives one re-fit request, carrying the
  pipeline's figure and the version it is about (:data:`RefitRequest.version`);
- under ``promotion = "shadow"``, applies the promotion rule (:func:`~.promotion.verdict`) to the pending candidate's
  paired evidence pooled over every worker, and writes its decision (promote or retire) to the control topic once;
  under any policy it announces the verdict and the figures on the control topic (the approval report reads them).

When the agent is down the workers keep serving and keep sending their counts (the topic keeps them for a day);
the pipeline's gauges go stale and ``FairstreamMonitorAgentDown`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from typing import Callable

import numpy as np
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from fairstream.streams.codec.partials import AGENT_SUFFIX, PartialError, decode_partial
from fairstream.streams.codec.refit_requests import RefitRequest
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.records import (
    MAX_ACTOR,
    MAX_REASON,
    MAX_STATISTIC_NAME,
    MAX_STATISTICS,
    ControlError,
    decision_record,
)
from fairstream.streams.control.gate import GENESIS, Authority, seal, unsigned_warning
from fairstream.streams.control.registry import ArtifactRegistry, WorkerIdentity, follow_control, module_loaders
from fairstream.streams.control.signing import Signer
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.kafka import librdkafka_options
from fairstream.streams.worker.app import NoticeNotSent, NoticeProducer, served_chain
from fairstream.streams.worker.drift import DriftEvent
from fairstream.streams.worker.metrics import PipelineMetrics, serve
from fairstream.streams.worker.monitor import export_fairness

from .pipeline import PairedComparison, PipelineStatistics
from .promotion import PROMOTE, RATE_STATISTICS, RETIRE, WAIT, ShadowEvidence, Verdict, verdict

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
"""How often the agent closes slices, exports, detects and decides."""
DECISION_RETRY_SECONDS = 15.0
"""How long after its decision the shadow policy decides again on a candidate that still waits (its record lost a race
in the trail to another writer's, and every reader refused it)."""
VERDICT_CODES = {PROMOTE: 1.0, WAIT: 0.0, RETIRE: -1.0}


class MonitoringAgent:
    """The agent's state and decisions, without the Kafka loop (:func:`run_agent` drives it; tests drive it directly).

    Parameters
    ----------
    config : PipelineConfig
        The pipeline.
    app_id : str or None, default=None
        The pipeline's app id (the workers'); the agent's is it with :data:`AGENT_SUFFIX`.
    metrics : PipelineMetrics or None, default=None
        Where the pipeline's gauges go (None: a new view of the pipeline's families).
    clock, monotonic : callable
        Wall-clock and monotonic time.
    signer : Signer or None, default=None
        The agent's key: it signs the shadow policy's decisions (policy role) and the re-fit requests (requester
        role); None writes them unsigned.

    Attributes
    ----------
    statistics : PipelineStatistics
        Every worker's partials merged.
    outbox : list of (topic, key, value, what)
        Re-fit requests and decisions not sent yet, oldest first.
    figures : dict or None
        The pending candidate's pipeline-wide figures as last computed (None without a candidate): announced.
    """

    def __init__(self, config: PipelineConfig, app_id: str | None = None, metrics: PipelineMetrics | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 signer: Signer | None = None):
        self.config, self.clock, self.monotonic = config, clock, monotonic
        self.signer = signer  # signs the policy's decisions (policy role) and the re-fit requests (requester role)
        self.app_id = (app_id or config.app_id) + AGENT_SUFFIX
        self.name = f"{self.app_id}@{socket.gethostname()}:{os.getpid()}"
        self.statistics = PipelineStatistics(config, clock, monotonic)
        self.metrics = metrics or PipelineMetrics(config.name, process="agent")
        self.registry: ArtifactRegistry | None = None
        self.outbox: list[tuple[str, bytes, bytes, str]] = []
        # (kind, version, sha256) -> monotonic time of the decision sent: decided again if, long after, the candidate
        # still waits (the decision lost a race in the trail to another writer's record, and every reader refused it).
        self.decided: dict[tuple[str, int, str], float] = {}
        self.requested: dict[tuple[str, int | None], float] = {}  # (kind, version) -> when its re-fit was asked
        self.figures: dict | None = None
        self.verdict: Verdict | None = None
        self.prototypes: dict = {}  # the decoder's accumulators per settings: later ones share them
        self.metrics_port: int | None = None
        self.lock = threading.Lock()
        for statistic in config.monitor.statistics:  # at 0 from the start: Prometheus' increase() sees the first
            self.metrics.drift_events.labels(statistic, config.monitor.detector).inc(0)

    # ------------------------------------------------------------------------------------------- partials in

    def take(self, value: bytes) -> bool:
        """Add one stats message; one that cannot be added is logged in one line and counted.

        Parameters
        ----------
        value : bytes
            The stats topic's message.

        Returns
        -------
        bool
            Whether it was merged.
        """
        with self.lock:
            try:
                partial = decode_partial(value, self.config.groups, self.config.strata, self.prototypes)
                self.statistics.add(partial)
            except PartialError as exc:
                log.error("stats message refused: %s", exc)
                self.metrics.agent_partials.labels("refused").inc()
                return False
            except Exception as exc:  # noqa: BLE001 - no single message may stop the agent's reader
                log.error("stats message refused: adding it raised %s: %s", type(exc).__name__, str(exc)[:300],
                          exc_info=exc)
                self.metrics.agent_partials.labels("refused").inc()
                return False
            self.metrics.agent_partials.labels("merged").inc()
            self.metrics.agent_last_partial.set(self.clock())
            return True

    # ------------------------------------------------------------------------------------------- the tick

    def tick(self, everything: bool = False) -> list[DriftEvent]:
        """Close the slices due, export the pipeline's gauges, ask a re-fit for each drift, judge the candidate.

        Parameters
        ----------
        everything : bool, default=False
            Close every open slice (at a stop).

        Returns
        -------
        list of DriftEvent
            The drift events of the serving chain this tick confirmed.
        """
        with self.lock:
            events = []
            for step in (self._follow_registry, lambda: events.extend(self.statistics.tick(everything)), self._export,
                         lambda: [self._drifted(event) for event in events], self._judge):
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - the agent only watches: one step failing stops nothing
                    self.metrics.monitor_errors.labels("agent").inc()
                    log.error("the monitoring agent's tick failed (%s: %s); it goes on", type(exc).__name__,
                              str(exc)[:300], exc_info=exc)
            return events

    def _follow_registry(self) -> None:
        """The serving chain's versions, from the control topic (the agent exports that chain's statistics)."""
        if self.registry is None or not self.config.records.chain:
            return
        served = self.registry.served()
        if all(kind in served.active for kind in self.config.records.chain):
            chain = served_chain(served, self.config.records.chain)
            self.statistics.serving = tuple((a.kind, a.version) for a in chain.active)

    def _export(self) -> None:
        active = self.statistics.active
        if active is None or active.monitor.refused is not None or active.monitor.version is None:
            # Nothing measured of the serving chain yet (just swapped, or not started): no old version's figures
            self.metrics.clear_fairness("active")
        else:
            export_fairness(active.monitor, self.metrics, role="active", scope="pipeline",
                            left_out=tuple(key[0] for key in active.mixed))
            if active.slices.closed_through is not None:
                self.metrics.agent_slice_end.set((active.slices.closed_through + 1) * self.config.monitor.slice_seconds)
            self.metrics.agent_late_records.set(active.late)
        candidate = self._candidate_key()
        chain = self.statistics.candidate(candidate) if candidate is not None else None
        if chain is not None and chain.monitor.refused is None and chain.monitor.version is not None:
            export_fairness(chain.monitor, self.metrics, role="candidate", scope="pipeline")

    def _drifted(self, event: DriftEvent) -> None:
        """One confirmed drift of the pipeline: counted, and one re-fit request about the serving version."""
        self.metrics.drift_events.labels(event.statistic, event.detector).inc()
        kind = self.config.refit_kind
        if kind is None:
            log.warning("fairness drift confirmed: %s (after the chain) to %.4f over the pipeline; it only monitors, "
                        "no re-fit is requested", event.statistic, event.value)
            return
        version = self._serving_version(kind)
        asked = self.requested.get((kind, version))
        if asked is not None and self.clock() - asked < self.config.monitor.cooldown_seconds:
            log.warning("fairness drift confirmed: %s (after the chain) to %.4f; a re-fit of %s version %s was asked "
                        "%.0f s ago for this drift: no second request", event.statistic, event.value, kind, version,
                        self.clock() - asked)
            return
        self.requested[kind, version] = self.clock()
        reason = (f"drift of {event.statistic} (after the chain) to {event.value:.4f} over the pipeline's records "
                  f"under {kind} version {version}")
        request = RefitRequest.new(reason, kind=kind, statistic=event.statistic, value=event.value, source=self.name,
                                   version=version)
        topic = self.config.topics.refit_requests  # signed for it: another pipeline refuses a copy
        value = request.to_json() if self.signer is None else self.signer.sign_json(request.to_json(), pipeline=topic)
        self.outbox.append((topic, kind.encode(), value,
                            f"re-fit request {request.request_id} ({reason})"))

    def _serving_version(self, kind: str) -> int | None:
        active = self.statistics.active
        key = active.key if active is not None else ()
        return next((version for k, version in key if k == kind), None)

    # ------------------------------------------------------------------------------------------- shadow

    def _candidate_key(self) -> tuple | None:
        pending = self._pending()
        return None if pending is None else pending[1]

    def _pending(self):
        """(the pending candidates, the candidate chain's versions, the serving chain's versions), or None."""
        if self.registry is None or not self.config.records.chain:
            return None
        served = self.registry.served()
        if not all(kind in served.active for kind in self.config.records.chain):
            return None
        chain = served_chain(served, self.config.records.chain)
        if chain.candidate is None:
            return None
        pending = [c for a, c in zip(chain.active, chain.candidate) if (c.version, c.sha256) != (a.version, a.sha256)]
        return (pending, tuple((c.kind, c.version) for c in chain.candidate),
                tuple((a.kind, a.version) for a in chain.active))

    def _judge(self) -> None:
        """The promotion rule on the pending candidate's pooled evidence: announced always, acted on under the shadow
        policy (one decision per candidate)."""
        pending = self._pending()
        if pending is None:
            self.figures = self.verdict = None
            return
        candidates, candidate_key, active_key = pending
        comparison = self.statistics.comparisons.get((candidate_key, active_key))
        evidence = comparison.evidence() if comparison is not None else ShadowEvidence(0, {}, {})
        compared = self.config.shadow_statistics
        self.verdict = verdict(evidence, self.config.shadow, compared)
        self.figures = pipeline_figures(self.verdict, evidence, comparison, compared)
        if self.config.promotion != "shadow" or self.verdict.action == WAIT:
            return
        now = self.monotonic()
        for candidate in candidates:
            decided = self.decided.get((candidate.kind, candidate.version, candidate.sha256))
            if decided is not None and now - decided < DECISION_RETRY_SECONDS:
                continue
            self.decided[(candidate.kind, candidate.version, candidate.sha256)] = now
            self._decide(candidate, self.verdict)

    def _decide(self, candidate, result: Verdict) -> None:
        actor = f"shadow-policy@{self.name}"[:MAX_ACTOR]
        reason = result.reason if len(result.reason) <= MAX_REASON else result.reason[:MAX_REASON - 3] + "..."
        try:
            record = decision_record(candidate.kind, candidate.version, candidate.sha256, result.action, actor, reason,
                                     recordable(self.figures or {}))
        except ControlError as exc:  # never written: every reader would refuse it
            log.error("the shadow policy's decision on %s version %s cannot be written: %s", candidate.kind,
                      candidate.version, exc)
            return
        head = self.registry.gate.head if self.registry is not None else GENESIS  # the trail's last record, now
        _, key, value = seal(record, head, self.config.topics.control, self.signer)
        self.outbox.append((self.config.topics.control, key, value,
                            f"shadow policy: {result.action} {candidate.kind} version {candidate.version} "
                            f"({result.reason})"))


def pipeline_figures(result: Verdict, evidence: ShadowEvidence, comparison: PairedComparison | None,
                     compared: tuple[str, ...]) -> dict[str, float]:
    """What the agent announces of a pending candidate: the verdict's figures, the verdict itself (1 promote, 0 wait,
    -1 retire), records decided differently (overall and per group), and each chain's value of the compared
    statistics, decision rate and accuracy over the compared records."""
    figures = {**result.figures(), "verdict": VERDICT_CODES[result.action]}
    decisions = evidence.decisions
    if decisions is not None:
        figures["changed"] = float(decisions.change_sq.sum())  # a 0/1 decision changed: d = +-1, d^2 = 1
        figures["active.decision_rate"] = _ratio(decisions.active.sum(), decisions.n.sum())
        figures["candidate.decision_rate"] = _ratio(decisions.active.sum() + decisions.change.sum(), decisions.n.sum())
    if evidence.accuracy is not None:
        accuracy = evidence.accuracy
        figures["active.accuracy"] = _ratio(accuracy.active.sum(), accuracy.n.sum())
        figures["candidate.accuracy"] = _ratio(accuracy.active.sum() + accuracy.change.sum(), accuracy.n.sum())
    for name in compared:
        if name in evidence.rates:
            sums = evidence.rates[name]
            figures[f"active.{name}"] = _gap(sums.active, sums.n)
            figures[f"candidate.{name}"] = _gap(sums.active + sums.change, sums.n)
        elif name in evidence.chunks:
            figures[f"active.{name}"] = evidence.chunks[name].active
            figures[f"candidate.{name}"] = evidence.chunks[name].candidate
    groups = evidence.rates.get("dp_difference")
    if groups is not None:
        for cell, n, changed in zip(groups.cells, groups.n, groups.change_sq):
            figures[f"records.{cell}"], figures[f"changed.{cell}"] = float(n), float(changed)
    return {name: value for name, value in figures.items() if math.isfinite(value)}


def _gap(positives: np.ndarray, totals: np.ndarray) -> float:
    """Highest minus lowest rate over the cells with records (NaN with none)."""
    rates = positives[totals > 0] / totals[totals > 0]
    return float(rates.max() - rates.min()) if len(rates) else math.nan


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator > 0 else math.nan


def recordable(figures: dict) -> dict[str, float]:
    """The figures a control record's statistics can carry: finite numbers under short names, at most 64."""
    kept = {name: float(value) for name, value in figures.items()
            if 0 < len(name) <= MAX_STATISTIC_NAME and math.isfinite(value)}
    return dict(list(kept.items())[:MAX_STATISTICS])


# ----------------------------------------------------------------------------------------------- the process


class StatsReader:
    """The stats topic in the agent's consumer group, read in a thread into the agent.

    One partition: the group's first agent reads it, the others wait (standby). On taking the partition the agent
    reads back ``window_seconds`` (and the lateness and a sending interval) of partials, so a standby that takes over
    rebuilds the pipeline's windows from the topic.
    """

    def __init__(self, agent: MonitoringAgent, bootstrap: str):
        self.agent, self.config = agent, agent.config
        self.topic = self.config.topics.stats
        monitor = self.config.monitor
        self.rewind = monitor.window_seconds + monitor.lateness_seconds + monitor.stats_seconds + 5.0
        self.consumer = Consumer({"bootstrap.servers": bootstrap, **librdkafka_options(), "group.id": agent.app_id,
                                  "enable.auto.commit": False, "auto.offset.reset": "latest",
                                  "session.timeout.ms": 10_000, "client.id": agent.app_id})

    def run(self, stop: threading.Event) -> None:
        """Read until ``stop`` is set (the consumer is closed on the way out)."""
        self.consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked)
        log.info("monitoring agent %s: waiting for the stats topic %s (a standby waits here while another agent of "
                 "the pipeline reads it)", self.agent.name, self.topic)
        try:
            while not stop.is_set():
                message = self.consumer.poll(0.2)
                if message is None:
                    continue
                if message.error():
                    log.warning("stats topic: %s", message.error())
                    continue
                self.agent.take(message.value())
        finally:
            self.consumer.close()

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        since = int((time.time() - self.rewind) * 1000)
        try:
            found = consumer.offsets_for_times([TopicPartition(p.topic, p.partition, since) for p in partitions], 10.0)
        except KafkaException as exc:
            log.warning("could not find the stats of the last %.0f s (%s): reading from the end", self.rewind, exc)
            found = [TopicPartition(p.topic, p.partition, OFFSET_END) for p in partitions]
        consumer.assign([TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END)
                         for p in found])
        self.agent.metrics.agent_state.set(1.0 if partitions else 0.0)
        log.info("monitoring agent %s: reading %s (the last %.0f s read back to rebuild the windows)",
                 self.agent.name, self.topic, self.rewind)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.agent.metrics.agent_state.set(0.0)
        with self.agent.lock:  # another agent reads now: this one's windows and gauges would go stale
            self.agent.statistics = PipelineStatistics(self.config, self.agent.clock, self.agent.statistics.monotonic)
            self.agent.metrics.clear_fairness()
        log.info("monitoring agent %s: %s was taken by another agent: standing by", self.agent.name, self.topic)


async def _serve(agent: MonitoringAgent, bootstrap: str, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    notices = NoticeProducer(bootstrap)
    await notices.start()
    authority = Authority.of(agent.config)
    warning = unsigned_warning(authority)
    if warning is not None:
        log.warning(warning)
    agent.registry = ArtifactRegistry(module_loaders(agent.config.schema()), ArtifactStore(agent.config.artifact_dir),
                                      authority=authority)
    control = asyncio.ensure_future(follow_control(agent.registry, bootstrap, agent.config.topics.control,
                                                   # the chain's kinds: the announcer files the shadow figures of
                                                   # the candidates of these kinds (what the report reads)
                                                   worker=WorkerIdentity(agent.app_id, agent.config.records.chain),
                                                   shadow_figures=lambda: agent.figures))
    halt = threading.Event()
    reader = StatsReader(agent, bootstrap)
    reading = loop.run_in_executor(None, reader.run, halt)
    try:
        while not stop.is_set() and not control.done() and not reading.done():
            await loop.run_in_executor(None, agent.tick)
            await loop.run_in_executor(None, send_outbox, agent, notices)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_SECONDS)
    finally:
        halt.set()
        await reading
        await loop.run_in_executor(None, agent.tick, True)  # what is open closes: the last figures are exported
        await loop.run_in_executor(None, send_outbox, agent, notices)
        control.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await control
        await notices.stop()
    for task in (control, reading):
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()


def send_outbox(agent: MonitoringAgent, notices: NoticeProducer) -> None:
    """Send the re-fit requests and decisions waiting, in order; one the broker does not take waits for the next
    tick (never fatal)."""
    while agent.outbox:
        topic, key, value, what = agent.outbox[0]
        try:
            notices.send(topic, key, value)
        except (KafkaException, NoticeNotSent, BufferError) as exc:
            log.error("could not send yet: %s (%r)", what, exc)
            return
        agent.outbox.pop(0)
        if topic == agent.config.topics.refit_requests:
            agent.metrics.refit_requests.labels(key.decode(), "drift").inc()
        log.warning("sent %s", what)


def run_agent(config: PipelineConfig, bootstrap: str, app_id: str | None = None, metrics_port: int | str | None = None,
              signer: Signer | None = None) -> None:
    """Run the pipeline's monitoring agent until SIGINT or SIGTERM (exit 0), or until it cannot go on (raises).

    Parameters
    ----------
    config : PipelineConfig
        The pipeline.
    bootstrap : str
        Kafka bootstrap servers.
    app_id : str or None, default=None
        The pipeline's app id (the workers'); None is ``<prefix>-<name>``.
    metrics_port : int, "off" or None, default=None
        The agent's /metrics port (None: ``monitor.metrics_port``; 0: any free port, logged).
    signer : Signer or None, default=None
        The agent's key: it signs the shadow policy's decisions (policy role) and the re-fit requests (requester).
    """
    agent = MonitoringAgent(config, app_id, signer=signer)
    port = serve(config.monitor.metrics_port if metrics_port is None else metrics_port)
    if port is not None:
        log.info("monitoring agent %s: Prometheus /metrics on port %d", agent.name, port)
    agent.metrics_port = port

    async def main() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await _serve(agent, bootstrap, stop)

    asyncio.run(main())
