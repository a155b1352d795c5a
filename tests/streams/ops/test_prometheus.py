"""A real Prometheus scrapes real exporters of fairstream.streams.worker.metrics and evaluates the real alert rules.

Stand-ins first (fast and exact): a worker with a plan and its pipeline's monitoring agent, whose fairness drifts on
command, a worker of another pipeline without a plan and without an agent, and a port where nothing listens. The
workers are job ``fairstream-worker`` and the agent ``fairstream-monitor``, as in production. Then a real pipeline:
a ``fairstream worker`` and a ``fairstream monitor`` on Apache Kafka, where one group stops arriving. The rules are
deploy/prometheus/alerts.yml with only the ``for:`` durations capped at 5s
(fairstream.streams.ops.prometheus.rules_with_short_for).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from fairstream.models.plan import DistributionalRepair
from fairstream.repair import datasets
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages, replay
from fairstream.streams.ops.prometheus import (
    AGENT_JOB,
    ALERTS_YML,
    PrometheusServer,
    free_port,
    rules_with_short_for,
)
from fairstream.streams.ops.supervise import AgentProcess, WorkerProcess
from fairstream.streams.parsing import parse_duration, parse_time
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.metrics import fairness_family

pytestmark = pytest.mark.integration

FOR = "5s"

# Stand-ins: export the real metric objects on a port, as a worker ("plan": serving; "none": its input held) or as
# the pipeline's monitoring agent ("agent"), then change them on stdin commands. A worker's own fairness figure
# (scope="worker") is high from the start: a diagnostic of its partitions, which never pages. The agent's
# (scope="pipeline") is what the rules read. Each exits when its stdin closes, so it cannot outlive the test.
EXPORTER = r"""
import sys, threading, time
from fairstream.streams.worker import metrics

port, kind, pipeline = int(sys.argv[1]), sys.argv[2], sys.argv[3]
metrics.serve(port)
if kind == "agent":
    m = metrics.PipelineMetrics(pipeline, process="agent")  # what `fairstream monitor` makes
    m.agent_state.set(1)  # it reads the stats topic
    def merging():  # it merges the workers' partials every second
        while True:
            m.agent_last_partial.set(time.time())
            time.sleep(1)
    threading.Thread(target=merging, daemon=True).start()
    m.set_fairness("dependence_e", "after", "all", "all", "all", "count", 0.01, scope="pipeline")
    m.set_fairness("dependence_e", "before", "all", "all", "all", "count", 0.3, scope="pipeline")
    drift = m.drift_events.labels("dependence_e", "adwin")
    drift.inc(0)  # the label set exists at 0 before any event
else:
    m = metrics.PipelineMetrics(pipeline)  # what a worker's create_app makes
    m.records_in.labels("records").inc(1000)
    m.records_repaired.labels("records").inc(990)
    m.records_dead.labels("records").inc(10)
    m.consumer_lag.labels("records").set(12)
    m.input_held.labels("records").set(0 if kind == "plan" else 1)  # the worker without a plan holds its input
    if kind == "plan":
        m.artifact_version.labels("plan").set(3)
        m.set_fairness("dependence_e", "after", "all", "all", "all", "count", 0.3, scope="worker")
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "drift":
        m.set_fairness("dependence_e", "after", "all", "all", "all", "count", 0.2, scope="pipeline")
        drift.inc()
        print("drifted", flush=True)
"""


class Exporter:
    """A subprocess serving fairstream metrics on a free loopback port; ``send`` writes a command line."""

    def __init__(self, kind: str, pipeline: str) -> None:
        for _ in range(3):  # the free port can be lost to a race before the child binds it
            self.port = free_port()
            self.process = subprocess.Popen(
                [sys.executable, "-c", EXPORTER, str(self.port), kind, pipeline],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            if self.process.stdout.readline().strip() == "ready":
                return
            self.stop()
        raise RuntimeError(f"exporter did not start: {self.process.stderr.read()}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def send(self, command: str, reply: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == reply

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # EOF ends the command loop and the process
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prometheus")
    rules = rules_with_short_for(ALERTS_YML, run_dir, FOR)
    exporters = []
    try:
        # adult: a worker and its agent; census: a worker without a plan, and no agent at all
        exporters = [Exporter("plan", "adult"), Exporter("none", "census"), Exporter("agent", "adult")]
        dead = f"127.0.0.1:{free_port()}"  # nothing listens here
        targets = [exporters[0].target, exporters[1].target, dead]
        with PrometheusServer(run_dir / "server", targets, [rules], jobs={AGENT_JOB: [exporters[2].target]}) as prom:
            yield prom, exporters[0], exporters[1], dead, exporters[2]
    finally:
        for exporter in exporters:
            exporter.stop()


def test_short_for_copy_changes_only_for_lines(tmp_path):
    copy = rules_with_short_for(ALERTS_YML, tmp_path, FOR)
    original, short = ALERTS_YML.read_text().splitlines(), copy.read_text().splitlines()
    assert short[0].startswith("# TEST COPY") and len(short) == len(original) + 1
    changed = [(a, b) for a, b in zip(original, short[1:]) if a != b]
    assert changed and all(a.strip().startswith("for:") and b.strip().startswith(f"for: {FOR}") for a, b in changed)
    # durations at or below the cap (the drift alert's 0m) stay as they are
    assert "for: 0m" in copy.read_text()
    assert all(parse_duration(a.split()[1], positive=False) > parse_duration(FOR) for a, _ in changed)


def test_targets_are_scraped(stack):
    prom, with_plan, without_plan, dead, agent = stack
    prom.wait_for_targets_up([with_plan.target, without_plan.target])
    prom.wait_for_targets_up(job=AGENT_JOB)
    assert prom.targets_up() == sorted([with_plan.target, without_plan.target])
    assert prom.targets_up(AGENT_JOB) == [agent.target]
    prom.wait_for(lambda: [t for t in prom.targets() if t["labels"]["instance"] == dead and t["health"] == "down"],
                  30, f"{dead} reported down")
    assert prom.values('up{job="fairstream-worker"}') == {
        frozenset({"__name__": "up", "job": "fairstream-worker", "instance": with_plan.target}.items()): 1.0,
        frozenset({"__name__": "up", "job": "fairstream-worker", "instance": without_plan.target}.items()): 1.0,
        frozenset({"__name__": "up", "job": "fairstream-worker", "instance": dead}.items()): 0.0,
    }
    # the metric contract arrives intact
    versions = prom.values("fairstream_artifact_version")
    assert versions == {frozenset({"__name__": "fairstream_artifact_version", "job": "fairstream-worker",
                                   "instance": with_plan.target, "pipeline": "adult", "kind": "plan"}.items()): 3.0}
    dead_lettered = prom.values('sum by (pipeline) (fairstream_records_dead_lettered_total{agent="records"})')
    assert dead_lettered == {frozenset({"pipeline": "adult"}.items()): 10.0,
                             frozenset({"pipeline": "census"}.items()): 10.0}
    assert prom.values(f'fairstream_agent_active{{job="{AGENT_JOB}"}}') == {
        frozenset({"__name__": "fairstream_agent_active", "job": AGENT_JOB, "instance": agent.target,
                   "pipeline": "adult"}.items()): 1.0}


def test_worker_down_and_no_plan_fire_for_the_right_targets(stack):
    prom, with_plan, without_plan, dead, _ = stack
    timeout = parse_duration(FOR) + 30
    down = prom.wait_for_alert("FairstreamWorkerDown", "firing", timeout)
    assert down["labels"]["instance"] == dead and down["labels"]["severity"] == "critical"
    assert "pipeline" not in down["labels"]  # never scraped: its pipeline is not known
    no_plan = prom.wait_for_alert("FairstreamNoArtifactLoaded", "firing", timeout)
    assert no_plan["labels"]["instance"] == without_plan.target and no_plan["labels"]["pipeline"] == "census"
    assert no_plan["annotations"]["summary"] == (f"Worker {without_plan.target} (census) holds its records input: "
                                                 "an artifact is missing")
    assert no_plan["annotations"]["runbook_url"].endswith("/docs/runbook.md#fairstreamnoartifactloaded")
    # one alert each: neither the other live worker nor the dead target is reported
    assert [a["labels"]["instance"] for a in prom.alerts("FairstreamWorkerDown")] == [dead]
    assert [a["labels"]["instance"] for a in prom.alerts("FairstreamNoArtifactLoaded")] == [without_plan.target]


def test_a_pipeline_whose_workers_run_without_an_agent_fires_agent_down(stack):
    prom, *_ = stack
    down = prom.wait_for_alert("FairstreamMonitorAgentDown", "firing", parse_duration(FOR) + 30)
    assert down["labels"] == {"alertname": "FairstreamMonitorAgentDown", "severity": "critical", "pipeline": "census"}
    assert down["annotations"]["runbook_url"].endswith("/docs/runbook.md#fairstreammonitoragentdown")
    # adult's agent reads the stats topic and merges partials: neither alert for it
    assert [a["labels"]["pipeline"] for a in prom.alerts("FairstreamMonitorAgentDown")] == ["census"]
    rule = prom.wait_for_evaluation("FairstreamPipelineStatisticsStale")
    assert rule["health"] == "ok" and rule["alerts"] == [], rule


def test_injected_drift_fires_the_gap_and_drift_alerts_from_the_agent(stack):
    prom, with_plan, _, _, agent = stack
    family = fairness_family("dependence_e")
    gap_expr = f'{family}{{stage="after", statistic="dependence_e", window="count", scope="pipeline"}}'
    prom.wait_for(lambda: prom.values(gap_expr), 30, "the pipeline's low fairness gap in Prometheus")
    assert list(prom.values(gap_expr).values()) == [0.01]
    # the worker's own figure over its partitions reads 0.3, far above the threshold: a diagnostic, no page
    worker_expr = f'{family}{{stage="after", statistic="dependence_e", window="count", scope="worker"}}'
    prom.wait_for(lambda: prom.values(worker_expr), 30, "the worker's own figure in Prometheus")
    assert list(prom.values(worker_expr).values()) == [0.3]

    # Prometheus has both values: the next evaluations keep both alerts inactive
    seen = time.time()
    for name, labels in (("FairstreamFairnessGapHigh", {"statistic": "dependence_e"}),
                         ("FairstreamFairnessDrift", None)):
        rule = prom.wait_for_evaluation(name, after=seen, labels=labels)
        assert rule["health"] == "ok", rule
        assert rule["state"] == "inactive" and rule["alerts"] == [], rule
    assert prom.alerts("FairstreamFairnessGapHigh") == prom.alerts("FairstreamFairnessDrift") == []

    agent.send("drift", "drifted")

    # The gap alert is pending for for: (5s) from the first evaluation that sees the new value; the
    # drift alert (for: 0m) fires on that same evaluation and stays firing for 5m.
    pending = prom.wait_for_alert("FairstreamFairnessGapHigh", "pending", timeout=30)
    drift = prom.wait_for_alert("FairstreamFairnessDrift", "firing", timeout=30)
    assert {k: drift["labels"][k] for k in ("job", "instance", "pipeline", "statistic", "detector", "severity")} == {
        "job": AGENT_JOB, "instance": agent.target, "pipeline": "adult", "statistic": "dependence_e",
        "detector": "adwin", "severity": "warning"}
    assert "monitoring agent of pipeline adult" in drift["annotations"]["description"]

    firing = prom.wait_for_alert("FairstreamFairnessGapHigh", "firing", timeout=parse_duration(FOR) + 30)
    assert pending["labels"] == firing["labels"] == {
        "alertname": "FairstreamFairnessGapHigh", "severity": "warning", "pipeline": "adult",
        "statistic": "dependence_e", "stratum": "all", "feature": "all"}
    assert pending["activeAt"] == firing["activeAt"]  # one alert, pending then firing
    assert time.time() - parse_time(firing["activeAt"]) >= parse_duration(FOR)
    assert float(firing["value"]) == pytest.approx(0.2)
    assert "0.2000" in firing["annotations"]["description"]


def test_stop_leaves_no_process(tmp_path):
    prom = PrometheusServer(tmp_path, targets=[])
    with prom:
        pid = prom.pid
        assert prom.running and prom.get("/api/v1/status/buildinfo")["version"]
    assert not prom.running and prom.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    prom.stop()  # twice is fine


# --------------------------------------------------------------------------- a real worker and a real agent


def test_a_group_that_stops_arriving_fires_unmeasurable_on_a_real_pipeline(broker, tmp_path):
    """`fairstream worker` and `fairstream monitor` on Kafka, scraped as production scrapes them: records of both
    groups give the pipeline's figures; then only group 1 arrives. Once the agent's count window holds no (or too
    few) records of group 0, its statistics between groups are absent, never 0, and FairstreamFairnessUnmeasurable
    fires for group 0."""
    monitor = MonitorConfig(window_records=1000, buckets=4, min_records=200, min_group_records=30,
                            lateness_seconds=0.5, stats_seconds=0.5)
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact="plan"),
                          monitor=monitor).with_topics(prefix=f"unmeasurable-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    research, archive = datasets.load("adult").split(3000, seed=0)
    plan = DistributionalRepair(n_q=50, columns=list(config.features)).fit(research.X, research.s, research.u)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(plan.to_artifact())
    worker_port, agent_port = free_port(), free_port()
    worker = WorkerProcess(config.with_monitor(metrics_port=worker_port), broker.bootstrap, tmp_path, name="worker")
    agent = AgentProcess(config, broker.bootstrap, tmp_path, metrics_port=agent_port)
    rules = rules_with_short_for(ALERTS_YML, tmp_path, FOR)
    family = fairness_family("dependence_e")
    pipeline_figure = f'{family}{{stage="after", role="active", window="count", scope="pipeline", feature="all"}}'
    with agent, worker:  # the agent first: it reads the stats topic from its start
        assert worker.wait_for_log("now serving plan artifact version 1", timeout=90), worker.log_tail()
        with PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{worker_port}"], [rules],
                              jobs={AGENT_JOB: [f"127.0.0.1:{agent_port}"]}) as prom:
            both = archive.subset(slice(0, 600))
            assert replay(broker.bootstrap, config.topics.records_in, record_messages(both, config, "both"),
                          progress=False) == 600
            prom.wait_for(lambda: prom.query(f'fairstream_agent_active{{job="{AGENT_JOB}"}} == 1'), 60,
                          "the agent reading the stats topic")
            prom.wait_for(lambda: prom.query(pipeline_figure), 60, "the pipeline's figures over both groups")
            assert not prom.alerts("FairstreamFairnessUnmeasurable")

            # group 0 stops arriving: 2000 records of group 1, spread over 4 s of event time (several slices)
            ones = archive.subset(np.flatnonzero(archive.s == 1)[:2000])
            messages = record_messages(ones, config, "ones", spacing=4.0 / 2000)
            assert replay(broker.bootstrap, config.topics.records_in, messages, progress=False) == 2000
            alert = prom.wait_for_alert("FairstreamFairnessUnmeasurable", "firing", timeout=60)
            assert alert["labels"]["pipeline"] == "adult" and alert["labels"]["group"] == "0"
            assert alert["labels"]["reason"] in {"no_records", "too_few_records"}
            assert alert["annotations"]["runbook_url"].endswith("/docs/runbook.md#fairstreamfairnessunmeasurable")
            # the statistics between groups are absent, not 0; the window's records of group 0 say why
            assert prom.query(pipeline_figure) == []
            (records,) = prom.values('fairstream_window_group_records{group="0", window="count", scope="pipeline", '
                                     'role="active"}').values()
            assert records < monitor.min_group_records
            rule = prom.wait_for_evaluation("FairstreamMonitorAgentDown")  # the agent reads the stats topic
            assert rule["health"] == "ok" and rule["alerts"] == [], rule
