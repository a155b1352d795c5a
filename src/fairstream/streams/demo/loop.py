"""The loop the product exists for: drift -> detection -> alert -> re-fit -> hot swap -> recovery.

:func:`run_fairness_loop` runs it for real: ``workers`` worker processes (each with its record agent and /metrics)
and the pipeline's monitoring agent (``fairstream monitor``, which merges the workers' partial aggregates, exports
the pipeline's statistics with ``scope="pipeline"``, detects drift once and asks one re-fit per drift), a re-fit
service answering ``refit.requests``, optionally a Prometheus server with the production alert rules scraping every
worker and the agent, and a stream whose distribution shifts half way while the labelling process keeps feeding the
``research`` topic. It polls the agent's /metrics (the pipeline's statistic, its drift counter and a shadow
candidate's figures) and every worker's (the version each serves, the records each processed), and records a
timeline of what happened when, and the monitored statistic over time (for the demo's plot and for the end-to-end
test).
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
from fairstream.streams.codec.refit_requests import RefitRequest, RefitRequestError, parse_request
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import ControlError
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.processes import LOOPBACK, free_port
from fairstream.streams.ops.prometheus import (
    AGENT_JOB,
    ALERTS_YML,
    PrometheusServer,
    rules_with_short_for,
)
from fairstream.streams.ops.supervise import AgentProcess, WorkerProcess
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.service import RefitService
from fairstream.streams.refit.sources import TopicSource
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.drift import Chunker
from fairstream.streams.worker.metrics import fairness_family

from .collect import TopicReader
from .replay import interleave, record_messages, replay


def shift_group(data: Dataset, feature: int, group, stratum, amount: float, lo: float, hi: float) -> Dataset:
    """Drift: ``feature`` of one group in one stratum (None: every stratum) moves by ``amount`` (clipped to [lo, hi])."""
    X = data.X.copy()
    rows = (data.s == group) & ((data.u == stratum) if stratum is not None else True)
    X[rows, feature] = np.clip(X[rows, feature] + amount, lo, hi)
    return replace(data, X=X)


def scrape(url: str) -> dict[tuple, float]:
    """A /metrics endpoint (a worker's or the agent's) as {(name, sorted label items): value}."""
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
    refit_requests: list[str] = field(default_factory=list)  # what the re-fit service did with each request it read
    sent: int = 0  # messages sent to records.in (valid and invalid)
    workers: int = 1  # worker processes that ran (beside the one monitoring agent)

    def first(self, event: str) -> float | None:
        """When ``event`` first happened (seconds from the start), or None."""
        return next((t for t, e, _ in self.events if e == event), None)


class DemoPipeline:
    """``workers`` ``fairstream worker`` processes and the pipeline's one ``fairstream monitor``, each with its own
    /metrics port on loopback; started together, stopped together (the workers first, all at once, then the agent,
    so their last partial aggregates reach it).

    One worker's log is ``worker.log`` in ``run_dir``, several are ``worker-1.log``, ...; the agent's is
    ``monitor.log``.
    """

    def __init__(self, config: PipelineConfig, bootstrap: str, run_dir: Path, workers: int = 1):
        if workers < 1:
            raise ValueError(f"a pipeline needs at least one worker, got {workers}")
        ports = distinct_free_ports(workers + 1)
        self.agent_port, self.worker_ports = ports[0], ports[1:]
        names = ["worker"] if workers == 1 else [f"worker-{i}" for i in range(1, workers + 1)]
        self.workers = [WorkerProcess(config.with_monitor(metrics_port=port), bootstrap, run_dir, name=name)
                        for name, port in zip(names, self.worker_ports)]
        self.agent = AgentProcess(config.with_monitor(metrics_port=self.agent_port), bootstrap, run_dir,
                                  metrics_port=self.agent_port)

    @property
    def agent_url(self) -> str:
        return f"http://{LOOPBACK}:{self.agent_port}/metrics"

    @property
    def worker_urls(self) -> list[str]:
        return [f"http://{LOOPBACK}:{port}/metrics" for port in self.worker_ports]

    @property
    def worker_targets(self) -> list[str]:
        """Every worker's /metrics as Prometheus scrapes it (``host:port``)."""
        return [f"{LOOPBACK}:{port}" for port in self.worker_ports]

    @property
    def agent_target(self) -> str:
        """The agent's /metrics as Prometheus scrapes it (``host:port``)."""
        return f"{LOOPBACK}:{self.agent_port}"

    def failure(self) -> str | None:
        """Why the pipeline cannot go on (a process exited, with its log's last lines), or None."""
        for process in (*self.workers, self.agent):
            if not process.running:
                return f"{process.log_path.stem} exited; last lines of its log:\n{process.log_tail()}"
        return None

    def __enter__(self) -> "DemoPipeline":
        try:
            self.agent.start()
            for worker in self.workers:
                worker.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to every worker at once (each finishes its batch and commits), then to the agent."""
        stopping = [threading.Thread(target=worker.stop, daemon=True) for worker in self.workers]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        self.agent.stop()


def demo_slices(config: PipelineConfig, rate: float) -> PipelineConfig:
    """The config with slices short enough that one holds at most a detector chunk of records at ``rate``.

    The monitoring agent feeds each closed slice to the drift detectors whole, so a slice holding more records than
    a chunk (``window_records / 16``: 500 of the demo's 8,000) makes fewer, larger chunks than the window was sized
    for: at the demo's 2,000 records/s and 1 s slices the detector sees 5 chunks before the drift instead of 20,
    and took a minute instead of seconds to confirm it. A deployment's record rate per slice is far lower; the
    demo replays a day's traffic in seconds, so its slices are shortened to match (0.25 s at 2,000 records/s).
    """
    chunk = Chunker(config.monitor.window_records).size
    if config.monitor.slice_seconds * rate <= chunk:
        return config
    return config.with_monitor(slice_seconds=round(chunk / rate, 3))


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports free right now on loopback."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class MetricsPoller(threading.Thread):
    """Polls the monitoring agent's /metrics and every worker's, and turns what changes into timeline events.

    The pipeline's figures are the agent's (``scope="pipeline"``): the monitored statistic of the serving chain and
    of a shadow candidate, and the drift counter. What serves is the workers': :attr:`version` is the version every
    worker serves (the lowest while a swap is under way), :attr:`candidate` the candidate a worker shadows;
    :attr:`processed` sums the records every worker repaired or dead-lettered.
    """

    def __init__(self, agent_url: str, worker_urls: list[str], report: LoopReport, start: float,
                 config: PipelineConfig, interval: float = 0.5, say: Callable[[str], None] | None = None):
        super().__init__(daemon=True)
        self.agent_url, self.worker_urls = agent_url, list(worker_urls)
        self.report, self.start_time, self.interval, self.say = report, start, interval, say
        self.last_line, self.last_done = 0.0, (0.0, 0.0)
        self.processed = 0.0  # records the workers have repaired or dead-lettered
        self.monitor, self.kind, self.pipeline = config.monitor, config.refit_kind, config.name
        self.statistic = config.monitor.statistics[0]
        self.threshold = config.monitor.thresholds[self.statistic]
        self.stop_event = threading.Event()
        self.version, self.drifts, self.recovered_version = None, 0.0, None
        self.versions: list[float | None] = [None] * len(self.worker_urls)  # what each worker serves
        self.candidate, self.candidate_value = None, None  # the shadow candidate's version and statistic, if any
        self.agent_samples: dict | None = None  # the last successful scrape of the agent
        self.slice_end: float | None = None  # the event time up to which the agent's windows hold every record
        self.swapped_at: float | None = None  # when every worker was last seen serving a new version (wall clock)
        self.worker_samples: list[dict | None] = [None] * len(self.worker_urls)  # ... and of each worker

    def run(self) -> None:
        """Scrape the agent and the workers until stopped."""
        while not self.stop_event.wait(self.interval):
            agent = _scraped(self.agent_url)
            if agent is not None:
                self.agent_samples = agent
            for i, url in enumerate(self.worker_urls):
                samples = _scraped(url)
                if samples is not None:
                    self.worker_samples[i] = samples
            self._observe(time.monotonic() - self.start_time)

    def _metric(self, samples: dict | None, name: str, **labels) -> float | None:
        """The value of ``name`` with ``labels`` for this pipeline, or None."""
        return None if samples is None else metric(samples, name, pipeline=self.pipeline, **labels)

    def _summed(self, name: str, **labels) -> float:
        """A counter summed over every worker (0 for a worker not scraped yet)."""
        return sum(self._metric(samples, name, **labels) or 0.0 for samples in self.worker_samples)

    def _observe(self, t: float) -> None:
        self.processed = sum(self._summed(name, agent="records")
                             for name in ("fairstream_records_repaired_total", "fairstream_records_dead_lettered_total"))
        self.versions = [self._metric(samples, "fairstream_artifact_version", kind=self.kind)
                         for samples in self.worker_samples]
        version = min(self.versions) if self.versions and None not in self.versions else None
        value = self._statistic("active")
        self.slice_end = self._metric(self.agent_samples, "fairstream_agent_slice_end_timestamp_seconds")
        self._observe_candidate(t)
        drifts = self._metric(self.agent_samples, "fairstream_drift_events_total", statistic=self.statistic,
                              detector=self.monitor.detector) or 0.0
        if version is not None and version != self.version:
            self.report.events.append((t, f"{self.kind} version in use", f"version {int(version)}"))
            if self.version is not None:  # the agent's figures until it has counted past now are the old chain's
                self.swapped_at = time.time()
            self.version = version
        if drifts > self.drifts:
            shown = "not measured" if value is None else f"{value:.3f}"
            self.report.events.append((t, "drift detected by the monitor",
                                       f"{self.statistic} = {shown} (the pipeline's, {_workers(len(self.worker_urls))})"))
            self.drifts = drifts
        if self.say is not None and t - self.last_line >= 2.0:
            self._live_line(t, version, value)
        if value is not None and version is not None and self._counted_since_swap():
            self.report.series.append((t, value, int(version)))
            if version > 1 and value < self.threshold and self.recovered_version != version:
                self.report.events.append((t, "statistic back below threshold", f"{value:.3f} < {self.threshold}"))
                self.recovered_version = version

    def _counted_since_swap(self) -> bool:
        """Whether the agent's figures are the serving version's: after a swap, once its windows hold records sent
        after every worker served the new version.

        The agent exports the serving chain's statistics only once a slice of its records has closed; until then
        its gauges keep the replaced chain's last values. A record's event time is when the demo sent it, and every
        record of the old chain was sent before the last worker swapped, so a slice closed past that time is the
        new chain's.
        """
        return self.swapped_at is None or (self.slice_end is not None and self.slice_end > self.swapped_at)

    def _statistic(self, role: str) -> float | None:
        """The pipeline's monitored statistic after the chain over the count window (the agent's), of the serving
        chain or the candidate's."""
        return self._metric(self.agent_samples, fairness_family(self.statistic), statistic=self.statistic,
                            stage="after", stratum="all", feature="all", group_pair="all", window="count", role=role,
                            scope="pipeline")

    def _observe_candidate(self, t: float) -> None:
        shadowed = [self._metric(samples, "fairstream_candidate_version", kind=self.kind)
                    for samples in self.worker_samples]
        candidate = max((v for v in shadowed if v is not None), default=None)
        if candidate is not None and candidate != self.candidate:
            self.report.events.append((t, "candidate in shadow", f"{self.kind} version {int(candidate)}"))
        value = None if candidate is None else self._statistic("candidate")
        self.candidate, self.candidate_value = candidate, value
        if value is not None:
            self.report.candidate_series.append((t, value, int(candidate)))

    def _live_line(self, t: float, version, value) -> None:
        taken = self._summed("fairstream_records_in_total", agent="records")
        repaired = self._summed("fairstream_records_repaired_total", agent="records")
        dead = self._summed("fairstream_records_dead_lettered_total", agent="records")
        rate = (repaired + dead - self.last_done[1]) / max(t - self.last_done[0], 1e-9)
        serving = "" if len(set(self.versions)) <= 1 else \
            " (" + "/".join("-" if v is None else f"v{int(v)}" for v in self.versions) + ")"
        self.say(f"[{t:6.1f}s] in {taken:.0f}  repaired {repaired:.0f}  dead-lettered {dead:.0f}  {rate:,.0f} rec/s  "
                 f"{_workers(len(self.worker_urls))}  {self.kind} v{int(version) if version else '-'}{serving}  "
                 f"{self.statistic} after {value if value is None else round(value, 3)} (pipeline)")
        self.last_line, self.last_done = t, (t, repaired + dead)


def _scraped(url: str) -> dict | None:
    try:
        return scrape(url)
    except (OSError, ValueError):  # not up yet, or gone; a half-written answer
        return None


def _workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


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
    control = ControlClient.of(config, bootstrap)
    trained = capabilities(job.kind)
    scorer_first = trained.needs_labels and "score" not in trained.writes  # trained through the scorer's scores
    demo = dict(actor=f"demo@{socket.gethostname()}", reason="the demo's initial scorer")
    if scorer_first:
        serve_initial(control, balanced_scorer(research, list(config.features)).to_artifact(), config.promotion, demo)
    replay(bootstrap, config.topics.research, record_messages(research, config, id_prefix="research"), progress=False)
    outcome = job.run_once(TopicSource(bootstrap, config, last_n=len(research)))
    if not outcome.published:
        raise RuntimeError(f"the initial {job.kind} was not published: {outcome.reason}")
    if outcome.candidate:  # under "approve" (or "shadow") even the first version serves only once a person approves it
        control.decide_sync(job.kind, outcome.version, "approve", actor=OPERATOR,
                            reason=f"the initial {job.kind}, reviewed on its holdout before the stream starts")
    if not scorer_first:
        serve_initial(control, LogisticScorer().fit(research.X, research.y, columns=list(config.features)).to_artifact(),
                      config.promotion, demo)


def serve_initial(control: ControlClient, artifact, promotion: str, audit: dict) -> None:
    """Publish ``artifact`` as the pipeline's promotion says; a candidate (under "approve") is approved by the operator:
    every reader refuses a publish that would serve at once there."""
    record = control.publish_under_sync(artifact, promotion, **audit).record
    if record.candidate:
        control.decide_sync(record.kind, record.version, "approve", actor=OPERATOR,
                            reason=f"the initial {record.kind}, reviewed before the stream starts")


def run_fairness_loop(config: PipelineConfig, bootstrap: str, run_dir: Path, research: Dataset, stable: Dataset,
                      drifted: Dataset, drifted_research: Dataset, rate: float = 2000.0, recovery_timeout: float = 120.0,
                      prometheus: bool = True, short_for: bool = False, extra: list = (), live: bool = False,
                      say: Callable[[str], None] = print, refit_params: dict | None = None,
                      workers: int = 1) -> LoopReport:
    """Run the whole loop with ``workers`` worker processes and the monitoring agent; returns the timeline and the
    statistic over time."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(config.topics.partitions, int) and config.topics.partitions < workers:
        config = config.with_topics(partitions=workers)  # every worker gets partitions of records.in
    config = demo_slices(config, rate)
    ensure_topics(bootstrap, config.topics)
    statistic = config.monitor.statistics[0]
    report = LoopReport(threshold=config.monitor.thresholds[statistic], statistic=statistic, kind=config.refit_kind,
                        workers=workers)
    start = time.monotonic()
    note = lambda event, detail="": (report.events.append((time.monotonic() - start, event, detail)),  # noqa: E731
                                     say(f"[{time.monotonic() - start:6.1f}s] {event} {detail}".rstrip()))
    job = RefitJob(config, bootstrap, ArtifactStore(config.artifact_dir), kind=config.refit_kind, **(refit_params or {}))
    pipeline = DemoPipeline(config, bootstrap, run_dir, workers)
    spacing = 1.0 / rate  # event times as the records are sent: a slice of the agent holds what was sent in it
    with pipeline, OptionalPrometheus(prometheus, run_dir, pipeline.worker_targets, pipeline.agent_target,
                                      short_for) as prom:
        publish_initial(config, bootstrap, research, job)
        note(f"initial {job.kind} and scorer published", f"research rows {len(research)}")
        poller = MetricsPoller(pipeline.agent_url, pipeline.worker_urls, report, start, config,
                               say=say if live else None)
        poller.start()
        _wait(lambda: poller.version is not None, 120.0, pipeline)  # every worker has joined and serves v1
        if poller.version is None:
            raise RuntimeError(f"not every worker serves a {job.kind} after 120 s (each serves: {poller.versions}); "
                               f"last lines of the first worker's log:\n{pipeline.workers[0].log_tail()}")
        note("pipeline running", f"{_workers(workers)} and the monitoring agent (slices of "
                                 f"{config.monitor.slice_seconds:g} s)")
        stop_refits = threading.Event()
        service = RefitService(job, TopicSource(bootstrap, config, last_n=len(drifted_research)), min_interval_seconds=30.0)
        refits = threading.Thread(target=service.serve, args=(stop_refits,), daemon=True)
        refits.start()
        try:
            began = time.time()
            first = record_messages(stable, config, "stable", start_ts=began, spacing=spacing)
            if extra:
                first = interleave(first, list(extra))
            report.sent += replay(bootstrap, config.topics.records_in, first, rate=rate, progress=False)
            # The agent closes a slice once its partials stop coming (a few seconds): the drift follows once the
            # pipeline's statistic covers the stable records, so the timeline shows it before the drift.
            counted = lambda: (poller.slice_end or 0.0) >= began + (len(stable) - 1) * spacing  # noqa: E731
            _wait(counted, 30.0, pipeline)
            if not counted():
                say("the monitoring agent has not counted every stable record after 30 s; the drift follows anyway")
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
                approve_when_shadow_closes_gap(config, bootstrap, poller, note, pipeline, recovery_timeout)
            _wait(lambda: report.first("statistic back below threshold") is not None, recovery_timeout, pipeline)
            stop_sending.set()
            sender.join()
            # Nothing lost: the workers finish what was sent before they are stopped.
            _wait(lambda: poller.processed >= report.sent, recovery_timeout, pipeline)
        finally:
            stop_refits.set()
            refits.join(timeout=30)
            service.close()
            poller.stop_event.set()
            poller.join()
    epoch = time.time() - (time.monotonic() - start)  # wall-clock time of the loop's start
    for record in ControlClient.of(config, bootstrap).history_sync():
        if record.kind == job.kind and record.version > 1 and record.published_at and record.action == "publish":
            report.events.append((record.published_at - epoch, "re-fit published",
                                  f"{job.kind} version {record.version}{' (a candidate)' if record.candidate else ''}"))
    _add_requests(report, read_requests(bootstrap, config), service.decisions, epoch)
    report.events.sort()
    report.refit_outcomes = [o.reason for o in service.outcomes]
    return report


def read_requests(bootstrap: str, config: PipelineConfig, timeout: float = 10.0) -> list[RefitRequest]:
    """Every re-fit request on ``refit.requests`` (the monitoring agent's: one per statistic whose drift it
    confirmed), oldest first."""
    messages = []
    with TopicReader(bootstrap, config.topics.refit_requests) as reader:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            messages += reader.poll()
            if reader.at_end():
                break
    requests = []
    for message in messages:
        try:
            requests.append(parse_request(message.value))
        except RefitRequestError:
            continue
    return sorted(requests, key=lambda request: request.ts)


def _add_requests(report: LoopReport, requests: list[RefitRequest], decisions, epoch: float) -> None:
    """The re-fit requests on the timeline, at the time the agent made them (when it confirmed the drift), with what
    the re-fit service did with each; the poller's drift event moves to the agent's own time (it saw the drift
    counter one scrape later)."""
    decided = {d.request_id: d for d in decisions if d.request_id is not None}
    for request in requests:
        t = request.ts - epoch
        decision = decided.get(request.request_id)
        answer = f"{decision.action}: {decision.reason}" if decision is not None else "not read by the re-fit service"
        report.refit_requests.append(f"{request.request_id} from {request.source or 'someone'}: {answer}")
        seen = [i for i, (when, event, _) in enumerate(report.events)
                if event == "drift detected by the monitor" and t <= when <= t + 10.0]
        value = "" if request.value is None else f" = {request.value:.3f}"
        if request.statistic == report.statistic and seen:
            report.events[seen[0]] = (t, "drift detected by the monitor",
                                      f"{request.statistic}{value} (the pipeline's, {_workers(report.workers)}), "
                                      f"under {request.kind} version {request.version}")
        report.events.append((t, "re-fit requested", f"{request.statistic}{value}, about {request.kind} version "
                                                     f"{request.version}; the re-fit service: "
                                                     f"{decision.action if decision is not None else 'not read'}"))


def approve_when_shadow_closes_gap(config: PipelineConfig, bootstrap: str, poller: MetricsPoller, note: Callable,
                                   pipeline: DemoPipeline, timeout: float) -> int:
    """Wait until the shadow candidate's statistic over the pipeline is under the threshold, approve it as
    :data:`OPERATOR`, and wait until every worker serves it; returns its version.

    What a person does under ``promotion = "approve"``, with the figures the monitoring agent exports for the
    candidate over every worker's records (``role="candidate"``, ``scope="pipeline"``). A candidate superseded by a
    newer re-fit between the look and the approval is refused by the control topic's rule; the operator then looks
    at the newer one.
    """
    control = ControlClient.of(config, bootstrap)
    kind, statistic, threshold = poller.kind, poller.statistic, poller.threshold
    deadline = time.monotonic() + timeout
    while True:
        _wait(lambda: poller.candidate_value is not None and poller.candidate_value < threshold,
              deadline - time.monotonic(), pipeline)
        if poller.candidate_value is None or poller.candidate_value >= threshold:
            raise RuntimeError(f"no shadow candidate brought {statistic} under {threshold} within {timeout:.0f}s")
        version, value = int(poller.candidate), poller.candidate_value
        reason = (f"the shadow statistics over the pipeline ({_workers(len(pipeline.workers))}) show {statistic} "
                  f"{value:.3f} under candidate version {version} on live records, below the threshold {threshold}")
        try:
            control.decide_sync(kind, version, "approve", actor=OPERATOR, reason=reason,
                                statistics={f"candidate.{statistic}": value})
        except ControlError as exc:  # superseded (or decided) meanwhile: look at the candidate now in shadow
            note("approval refused", str(exc))
            time.sleep(1.0)
            continue
        note("approved by a named operator", f"{kind} version {version} by {OPERATOR}")
        _wait(lambda: poller.version == version, deadline - time.monotonic(), pipeline)
        note("candidate promoted", f"every worker serves {kind} version {version}")
        return version


def _keep_sending(bootstrap: str, config: PipelineConfig, data: Dataset, rate: float, stop: threading.Event,
                  report: LoopReport, chunk: int = 2000) -> None:
    """Replay ``data`` in chunks, round after round with fresh ids, until ``stop`` is set."""
    for round_ in itertools.count():
        for start in range(0, len(data), chunk):
            if stop.is_set():
                return
            part = data.subset(slice(start, start + chunk))
            messages = record_messages(part, config, f"drifted-{round_}-{start}", spacing=1.0 / rate)
            report.sent += replay(bootstrap, config.topics.records_in, messages, rate=rate, progress=False)


def _wait(condition: Callable[[], bool], timeout: float, pipeline: DemoPipeline) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        failure = pipeline.failure()
        if failure is not None:
            raise RuntimeError(failure)
        time.sleep(0.5)


class OptionalPrometheus:
    """A Prometheus server with the production rules (or nothing, if disabled), scraping as production does: every
    worker as job ``fairstream-worker`` and the monitoring agent as job ``fairstream-monitor``
    (:data:`~fairstream.streams.ops.prometheus.AGENT_JOB`), whose figures (``scope="pipeline"``) the rules read."""

    def __init__(self, enabled: bool, run_dir: Path, workers: list[str], agent: str, short_for: bool):
        self.enabled, self.run_dir, self.short_for = enabled, run_dir, short_for
        self.workers, self.agent = list(workers), agent
        self.server = None

    def __enter__(self):
        if not self.enabled:
            return None
        rules = rules_with_short_for(ALERTS_YML, self.run_dir) if self.short_for else ALERTS_YML
        self.server = PrometheusServer(self.run_dir / "prometheus", self.workers, [rules],
                                       jobs={AGENT_JOB: [self.agent]}).start()
        return self.server

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()
