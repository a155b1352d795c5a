"""The loop the product exists for: drift -> detection -> alert -> re-fit -> hot swap -> recovery.

:func:`run_fairness_loop` runs it for real: a worker (with its monitor and /metrics), a re-fit
service answering ``refit.requests``, optionally a Prometheus server with the production alert
rules, and a stream whose distribution shifts half way while the labelling process keeps feeding
the ``research`` topic. It polls the worker's /metrics and records a timeline of what happened
when, and the monitored statistic over time (for the demo's plot and for the end-to-end test).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from fairstream.models.kinds import DEFAULT_KIND, capabilities
from fairstream.models.scorer import LogisticScorer
from fairstream.repair.datasets import Dataset
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import ControlError
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.processes import free_port
from fairstream.streams.ops.prometheus import (
    ALERTS_YML,
    PrometheusServer,
    rules_with_short_for,
)
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.service import RefitService
from fairstream.streams.refit.sources import TopicSource
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.metrics import fairness_family

from .replay import interleave, record_messages, replay


def shift_group(data: Dataset, feature: int, group, stratum, amount: float, lo: float, hi: float) -> Dataset:
    """Drift: ``feature`` of one group in one stratum (None: every stratum) moves by ``amount`` (clipped to [lo, hi])."""
    X = data.X.copy()
    rows = (data.s == group) & ((data.u == stratum) if stratum is not None else True)
    X[rows, feature] = np.clip(X[rows, feature] + amount, lo, hi)
    return replace(data, X=X)


def scrape(url: str) -> dict[tuple, float]:
    """A worker's /metrics as {(name, sorted label items): value}."""
    with urllib.request.urlopen(url, timeout=2) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metric(samples: dict, name: str, **labels) -> float | None:
    """The value of metric ``name`` with ``labels`` in a scrape, or None."""
    return samples.get((name, tuple(sorted(labels.items()))))


@dataclass
class LoopReport:
    """What the fairness loop saw: events with their times, the statistic's series, re-fit outcomes."""
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (seconds since start, event, detail)
    series: list[tuple[float, float, int]] = field(default_factory=list)  # (seconds, statistic, version)
    candidate_series: list[tuple[float, float, int]] = field(default_factory=list)  # the same, of a shadow candidate
    threshold: float = 0.0
    statistic: str = "dependence_e"
    kind: str = DEFAULT_KIND  # the kind the loop re-fits
    refit_outcomes: list[str] = field(default_factory=list)
    sent: int = 0  # messages sent to records.in (valid and invalid)

    def first(self, event: str) -> float | None:
        """When ``event`` first happened (seconds from the start), or None."""
        return next((t for t, e, _ in self.events if e == event), None)


class MetricsPoller(threading.Thread):
    """Polls a worker's /metrics and turns what changes into timeline events."""

    def __init__(self, url: str, report: LoopReport, start: float, config: PipelineConfig, interval: float = 0.5,
                 say: Callable[[str], None] | None = None):
        super().__init__(daemon=True)
        self.url, self.report, self.start_time, self.interval, self.say = url, report, start, interval, say
        self.last_line, self.last_done = 0.0, (0.0, 0.0)
        self.processed = 0.0  # records the worker has repaired or dead-lettered
        self.monitor, self.kind, self.pipeline = config.monitor, config.refit_kind, config.name
        self.statistic = config.monitor.statistics[0]
        self.threshold = config.monitor.thresholds[self.statistic]
        self.stop_event = threading.Event()
        self.version, self.drifts, self.recovered_version = None, 0.0, None
        self.candidate, self.candidate_value = None, None  # the shadow candidate's version and statistic, if any

    def run(self) -> None:
        """Scrape the worker's /metrics until stopped."""
        while not self.stop_event.wait(self.interval):
            try:
                samples = scrape(self.url)
            except OSError:
                continue
            self._observe(samples, time.monotonic() - self.start_time)

    def _metric(self, samples: dict, name: str, **labels) -> float | None:
        """The value of ``name`` with ``labels`` for this pipeline, or None."""
        return metric(samples, name, pipeline=self.pipeline, **labels)

    def _observe(self, samples: dict, t: float) -> None:
        self.processed = sum(self._metric(samples, name, agent="records") or 0.0
                             for name in ("fairstream_records_repaired_total", "fairstream_records_dead_lettered_total"))
        version = self._metric(samples, "fairstream_artifact_version", kind=self.kind)
        value = self._statistic(samples, "active")
        self._observe_candidate(samples, t)
        drifts = self._metric(samples, "fairstream_drift_events_total", statistic=self.statistic,
                              detector=self.monitor.detector) or 0.0
        if version is not None and version != self.version:
            self.report.events.append((t, f"{self.kind} version in use", f"version {int(version)}"))
            self.version = version
        if drifts > self.drifts:
            self.report.events.append((t, "drift detected by the monitor", f"{self.statistic} = {value:.3f}"))
            self.drifts = drifts
        if self.say is not None and t - self.last_line >= 2.0:
            self._live_line(samples, t, version, value)
        if value is not None and version is not None:
            self.report.series.append((t, value, int(version)))
            if version > 1 and value < self.threshold and self.recovered_version != version:
                self.report.events.append((t, "statistic back below threshold", f"{value:.3f} < {self.threshold}"))
                self.recovered_version = version


    def _statistic(self, samples: dict, role: str) -> float | None:
        """The monitored statistic after the chain over the count window, of the serving chain or the candidate's."""
        return self._metric(samples, fairness_family(self.statistic), statistic=self.statistic, stage="after",
                            stratum="all", feature="all", group_pair="all", window="count", role=role)

    def _observe_candidate(self, samples: dict, t: float) -> None:
        candidate = self._metric(samples, "fairstream_candidate_version", kind=self.kind)
        if candidate is not None and candidate != self.candidate:
            self.report.events.append((t, "candidate in shadow", f"{self.kind} version {int(candidate)}"))
        value = None if candidate is None else self._statistic(samples, "candidate")
        self.candidate, self.candidate_value = candidate, value
        if value is not None:
            self.report.candidate_series.append((t, value, int(candidate)))

    def _live_line(self, samples: dict, t: float, version, value) -> None:
        taken = self._metric(samples, "fairstream_records_in_total", agent="records") or 0.0
        repaired = self._metric(samples, "fairstream_records_repaired_total", agent="records") or 0.0
        dead = self._metric(samples, "fairstream_records_dead_lettered_total", agent="records") or 0.0
        rate = (repaired + dead - self.last_done[1]) / max(t - self.last_done[0], 1e-9)
        self.say(f"[{t:6.1f}s] in {taken:.0f}  repaired {repaired:.0f}  dead-lettered {dead:.0f}  {rate:,.0f} rec/s  "
                 f"{self.kind} v{int(version) if version else '-'}  {self.statistic} after "
                 f"{value if value is None else round(value, 3)}")
        self.last_line, self.last_done = t, (t, repaired + dead)


OPERATOR = "Dana Okafor (fairness officer, demo)"
"""The named person the approval act approves candidates as (``fairstream artifacts approve --by``)."""


def balanced_scorer(data: Dataset, columns: list[str], seed: int = 0) -> LogisticScorer:
    """A logistic scorer fitted on as many positives as negatives (Adult's 24% base rate would make few positives)."""
    rng = np.random.default_rng(seed)
    positive, negative = np.flatnonzero(data.y == 1), np.flatnonzero(data.y == 0)
    rows = np.concatenate([positive, rng.choice(negative, min(len(positive), len(negative)), replace=False)])
    return LogisticScorer().fit(data.X[rows], data.y[rows], columns=columns)


def publish_initial(config: PipelineConfig, bootstrap: str, research: Dataset, job: RefitJob) -> None:
    """Version 1 of the re-fitted kind comes from the research topic, like every later one; plus a scorer.

    A kind trained on labels (a flow) is trained in front of the scorer, so the scorer goes first; a plan's
    scorer only serves the monitor.
    """
    control = ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    trained = capabilities(job.kind)
    scorer_first = trained.needs_labels and "score" not in trained.writes  # trained through the scorer's scores
    demo = dict(actor=f"demo@{socket.gethostname()}", reason="the demo's initial scorer")
    if scorer_first:
        control.publish_sync(balanced_scorer(research, list(config.features)).to_artifact(), **demo)
    replay(bootstrap, config.topics.research, record_messages(research, config, id_prefix="research"), progress=False)
    outcome = job.run_once(TopicSource(bootstrap, config, last_n=len(research)))
    if not outcome.published:
        raise RuntimeError(f"the initial {job.kind} was not published: {outcome.reason}")
    if outcome.candidate:  # under "approve" (or "shadow") even the first version serves only once a person approves it
        control.decide_sync(job.kind, outcome.version, "approve", actor=OPERATOR,
                            reason=f"the initial {job.kind}, reviewed on its holdout before the stream starts")
    if not scorer_first:
        control.publish_sync(LogisticScorer().fit(research.X, research.y, columns=list(config.features)).to_artifact(),
                             **demo)


def run_fairness_loop(config: PipelineConfig, bootstrap: str, run_dir: Path, research: Dataset, stable: Dataset,
                      drifted: Dataset, drifted_research: Dataset, rate: float = 2000.0, recovery_timeout: float = 120.0,
                      prometheus: bool = True, short_for: bool = False, extra: list = (), live: bool = False,
                      say: Callable[[str], None] = print, refit_params: dict | None = None) -> LoopReport:
    """Run the whole loop; returns the timeline and the statistic over time."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = config.with_monitor(metrics_port=port)
    ensure_topics(bootstrap, config.topics)
    statistic = config.monitor.statistics[0]
    report = LoopReport(threshold=config.monitor.thresholds[statistic], statistic=statistic, kind=config.refit_kind)
    start = time.monotonic()
    note = lambda event, detail="": (report.events.append((time.monotonic() - start, event, detail)),  # noqa: E731
                                     say(f"[{time.monotonic() - start:6.1f}s] {event} {detail}".rstrip()))
    job = RefitJob(config, bootstrap, ArtifactStore(config.artifact_dir), kind=config.refit_kind, **(refit_params or {}))
    with WorkerProcess(config, bootstrap, run_dir) as worker, OptionalPrometheus(prometheus, run_dir, port, short_for) as prom:
        publish_initial(config, bootstrap, research, job)
        note(f"initial {job.kind} and scorer published", f"research rows {len(research)}")
        poller = MetricsPoller(f"http://127.0.0.1:{port}/metrics", report, start, config, say=say if live else None)
        poller.start()
        _wait(lambda: poller.version is not None, 120.0, worker)  # the worker has joined and serves v1
        if poller.version is None:
            raise RuntimeError(f"the worker serves no {job.kind} after 120 s; last lines of its log:\n"
                               f"{worker.log_tail()}")
        stop_refits = threading.Event()
        service = RefitService(job, TopicSource(bootstrap, config, last_n=len(drifted_research)), min_interval_seconds=30.0)
        refits = threading.Thread(target=service.serve, args=(stop_refits,), daemon=True)
        refits.start()
        try:
            first = interleave(record_messages(stable, config, "stable"), list(extra)) if extra else \
                record_messages(stable, config, "stable")
            report.sent += replay(bootstrap, config.topics.records_in, first, rate=rate, progress=False)
            note("drift injected", f"{len(drifted)} records from a shifted distribution follow")
            replay(bootstrap, config.topics.research, record_messages(drifted_research, config, "research-drifted"),
                   progress=False)
            # Data keeps arriving from the shifted distribution until the repair has caught up with it.
            stop_sending = threading.Event()
            sender = threading.Thread(target=_keep_sending, args=(bootstrap, config, drifted, rate, stop_sending, report),
                                      daemon=True)
            sender.start()
            if prom is not None:
                alert = prom.wait_for_alert("FairstreamFairnessDrift", "firing", timeout=recovery_timeout)
                note("Prometheus alert firing", f"{alert['labels']['alertname']} ({alert['labels'].get('statistic', '')})")
            if config.promotion == "approve":
                approve_when_shadow_closes_gap(config, bootstrap, poller, note, worker, recovery_timeout)
            _wait(lambda: report.first("statistic back below threshold") is not None, recovery_timeout, worker)
            stop_sending.set()
            sender.join()
            # Nothing lost: the worker finishes what was sent before it is stopped.
            _wait(lambda: poller.processed >= report.sent, recovery_timeout, worker)
        finally:
            stop_refits.set()
            refits.join(timeout=30)
            service.close()
            poller.stop_event.set()
            poller.join()
    epoch = time.time() - (time.monotonic() - start)  # wall-clock time of the loop's start
    for record in ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir)).history_sync():
        if record.kind == job.kind and record.version > 1 and record.published_at and record.action == "publish":
            report.events.append((record.published_at - epoch, "re-fit published",
                                  f"{job.kind} version {record.version}{' (a candidate)' if record.candidate else ''}"))
    report.events.sort()
    report.refit_outcomes = [o.reason for o in service.outcomes]
    return report


def approve_when_shadow_closes_gap(config: PipelineConfig, bootstrap: str, poller: MetricsPoller, note: Callable,
                                   worker: WorkerProcess, timeout: float) -> int:
    """Wait until the shadow candidate's live statistic is under the threshold, approve it as :data:`OPERATOR`, and
    wait until the worker serves it; returns its version.

    What a person does under ``promotion = "approve"``, with the figures the worker exports for the candidate
    (``role="candidate"``). A candidate superseded by a newer re-fit between the look and the approval is refused
    by the control topic's rule; the operator then looks at the newer one.
    """
    control = ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    kind, statistic, threshold = poller.kind, poller.statistic, poller.threshold
    deadline = time.monotonic() + timeout
    while True:
        _wait(lambda: poller.candidate_value is not None and poller.candidate_value < threshold,
              deadline - time.monotonic(), worker)
        if poller.candidate_value is None or poller.candidate_value >= threshold:
            raise RuntimeError(f"no shadow candidate brought {statistic} under {threshold} within {timeout:.0f}s")
        version, value = int(poller.candidate), poller.candidate_value
        reason = (f"the shadow statistics show {statistic} {value:.3f} under candidate version {version} on live "
                  f"records, below the threshold {threshold}")
        try:
            control.decide_sync(kind, version, "approve", actor=OPERATOR, reason=reason,
                                statistics={f"candidate.{statistic}": value})
        except ControlError as exc:  # superseded (or decided) meanwhile: look at the candidate now in shadow
            note("approval refused", str(exc))
            time.sleep(1.0)
            continue
        note("approved by a named operator", f"{kind} version {version} by {OPERATOR}")
        _wait(lambda: poller.version == version, deadline - time.monotonic(), worker)
        note("candidate promoted", f"the worker serves {kind} version {version}")
        return version


def _keep_sending(bootstrap: str, config: PipelineConfig, data: Dataset, rate: float, stop: threading.Event,
                  report: LoopReport, chunk: int = 2000) -> None:
    """Replay ``data`` in chunks, round after round with fresh ids, until ``stop`` is set."""
    for round_ in itertools.count():
        for start in range(0, len(data), chunk):
            if stop.is_set():
                return
            part = data.subset(slice(start, start + chunk))
            report.sent += replay(bootstrap, config.topics.records_in,
                                  record_messages(part, config, f"drifted-{round_}-{start}"), rate=rate, progress=False)


def _wait(condition: Callable[[], bool], timeout: float, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        if not worker.running:
            raise RuntimeError(f"the worker exited; last lines of its log:\n{worker.log_tail()}")
        time.sleep(0.5)


class OptionalPrometheus:
    """A Prometheus server scraping the worker with the production rules (or nothing, if disabled)."""

    def __init__(self, enabled: bool, run_dir: Path, port: int, short_for: bool):
        self.enabled, self.run_dir, self.port, self.short_for = enabled, run_dir, port, short_for
        self.server = None

    def __enter__(self):
        if not self.enabled:
            return None
        rules = rules_with_short_for(ALERTS_YML, self.run_dir) if self.short_for else ALERTS_YML
        self.server = PrometheusServer(self.run_dir / "prometheus", [f"127.0.0.1:{self.port}"], [rules]).start()
        return self.server

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()
