"""A real Prometheus scrapes real exporters of fairstream.streams.worker.metrics and evaluates the real alert rules.

Three targets: a worker with a plan whose fairness drifts on command, a worker without a plan, and
a port where nothing listens. The rules are deploy/prometheus/alerts.yml with only the ``for:``
durations capped at 5s (fairstream.streams.ops.prometheus.rules_with_short_for).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fairstream.streams.ops.prometheus import ALERTS_YML, PrometheusServer, free_port, rules_with_short_for
from fairstream.streams.parsing import parse_duration, parse_time
from fairstream.streams.worker.metrics import fairness_family

pytestmark = pytest.mark.integration

FOR = "5s"

# A stand-in worker: exports the real metric objects on a port, then changes them on stdin commands.
# It exits when its stdin closes, so it cannot outlive the test.
EXPORTER = r"""
import sys
from fairstream.streams.worker import metrics

port, plan, pipeline = int(sys.argv[1]), sys.argv[2] == "plan", sys.argv[3]
metrics.serve(port)
m = metrics.PipelineMetrics(pipeline)  # what a worker's create_app makes
m.records_in.labels("records").inc(1000)
m.records_repaired.labels("records").inc(990)
m.records_dead.labels("records").inc(10)
m.consumer_lag.labels("records").set(12)
m.input_held.labels("records").set(0 if plan else 1)  # the worker without a plan holds its input
if plan:
    m.artifact_version.labels("plan").set(3)
    m.set_fairness("dependence_e", "after", "all", "all", "all", "count", 0.01)
    m.set_fairness("dependence_e", "before", "all", "all", "all", "count", 0.3)
    drift = m.drift_events.labels("dependence_e", "adwin")
    drift.inc(0)  # the label set exists at 0 before any event
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "drift":
        m.set_fairness("dependence_e", "after", "all", "all", "all", "count", 0.2)
        drift.inc()
        print("drifted", flush=True)
"""


class Exporter:
    """A subprocess serving fairstream metrics on a free loopback port; ``send`` writes a command line."""

    def __init__(self, plan: bool, pipeline: str) -> None:
        for _ in range(3):  # the free port can be lost to a race before the child binds it
            self.port = free_port()
            self.process = subprocess.Popen(
                [sys.executable, "-c", EXPORTER, str(self.port), "plan" if plan else "none", pipeline],
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
        exporters = [Exporter(plan=True, pipeline="adult"), Exporter(plan=False, pipeline="census")]
        dead = f"127.0.0.1:{free_port()}"  # nothing listens here
        targets = [exporters[0].target, exporters[1].target, dead]
        with PrometheusServer(run_dir / "server", targets, [rules]) as prom:
            yield prom, exporters[0], exporters[1], dead
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
    prom, with_plan, without_plan, dead = stack
    prom.wait_for_targets_up([with_plan.target, without_plan.target])
    assert prom.targets_up() == sorted([with_plan.target, without_plan.target])
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


def test_worker_down_and_no_plan_fire_for_the_right_targets(stack):
    prom, with_plan, without_plan, dead = stack
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


def test_injected_drift_fires_the_gap_and_drift_alerts(stack):
    prom, with_plan, _, _ = stack
    gap_expr = f'{fairness_family("dependence_e")}{{stage="after", statistic="dependence_e", window="count"}}'
    prom.wait_for(lambda: prom.values(gap_expr), 30, "the low fairness gap in Prometheus")
    assert list(prom.values(gap_expr).values()) == [0.01]

    # Prometheus has the low value: the next evaluations keep both alerts inactive
    seen = time.time()
    for name, labels in (("FairstreamFairnessGapHigh", {"statistic": "dependence_e"}), ("FairstreamFairnessDrift", None)):
        rule = prom.wait_for_evaluation(name, after=seen, labels=labels)
        assert rule["health"] == "ok", rule
        assert rule["state"] == "inactive" and rule["alerts"] == [], rule
    assert prom.alerts("FairstreamFairnessGapHigh") == prom.alerts("FairstreamFairnessDrift") == []

    with_plan.send("drift", "drifted")

    # The gap alert is pending for for: (5s) from the first evaluation that sees the new value; the
    # drift alert (for: 0m) fires on that same evaluation and stays firing for 5m.
    pending = prom.wait_for_alert("FairstreamFairnessGapHigh", "pending", timeout=30)
    drift = prom.wait_for_alert("FairstreamFairnessDrift", "firing", timeout=30)
    assert {k: drift["labels"][k] for k in ("instance", "pipeline", "statistic", "detector", "severity")} == {
        "instance": with_plan.target, "pipeline": "adult", "statistic": "dependence_e", "detector": "adwin",
        "severity": "warning"}

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
