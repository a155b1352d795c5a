"""The Grafana dashboard asks for what a live worker and its monitoring agent export, in valid PromQL, and gets data.

A real worker and the pipeline's monitoring agent (the compose pipeline, with local paths) run on Apache Kafka with
a plan; records flow through the worker while a real Prometheus scrapes both (the agent as job fairstream-monitor).
Then:

- every metric a panel or annotation names appears in the worker's or the agent's /metrics scrape, and every label
  a query matches on is a label that metric has there;
- the fairness panels read the pipeline's figures (``scope="pipeline"``, the agent's), never one worker's;
- every query reads the data source and the pipeline(s) the dashboard's variables choose, and counts
  over Grafana's ``$__rate_interval``;
- promtool accepts every query (as a recording rule, template variables filled in);
- every panel whose metrics the traffic produced returns at least one series from Prometheus.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from dataclasses import replace

import pytest
import yaml

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import PipelineConfig
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages, replay
from fairstream.streams.ops.prometheus import AGENT_JOB, PrometheusServer, binary, free_port
from fairstream.streams.ops.supervise import AgentProcess, WorkerProcess
from fairstream.streams.topics import ensure_topics
from fairstream.streams.worker.consumer import LATENCY_SAMPLES
from fairstream.streams.worker.metrics import FAIRNESS_FAMILIES
from tests.streams.test_alert_rules import exported_sample_names, metric_names

from .conftest import DASHBOARD_JSON, DOCKER

pytestmark = pytest.mark.integration

# What the template variables (and Grafana's own) resolve to.
VARIABLES = {"$pipeline": ".*", "$instance": ".*", "$window": "count", "$role": "active|candidate",
             "$__rate_interval": "1m", "$__range": "1h"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}  # the data source variable, never a fixed uid
PIPELINE_MATCHER = 'pipeline=~"$pipeline"'
PROMETHEUS_SERIES = {"up", "ALERTS", "process_cpu_seconds_total"}  # series Prometheus or the client library make
ONLY_AFTER_EVENTS = {  # registered at start, sampled only once the event happens
    "fairstream_refit_requests_total",  # a confirmed drift
    "fairstream_artifacts_refused_total",  # a refused artifact
    "fairstream_verification",  # labelled embeddings (the test sends records only)
    "fairstream_fairness_transport_cost",  # otf monitored with a scorer (the compose pipeline has neither)
    "fairstream_candidate_version",  # a pending candidate in shadow (the test publishes none)
    "fairstream_fairness_unmeasurable",  # a group short of records in a window (both groups flow here)
}
SCOPED = {"fairstream_window_group_records", "fairstream_fairness_unmeasurable", "fairstream_monitor_window_records",
          *FAIRNESS_FAMILIES.values()}  # the families with a scope label: the pipeline's figure or one worker's
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')


def dashboard() -> dict:
    return json.loads(DASHBOARD_JSON.read_text())


def panels() -> list[dict]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def raw_queries() -> dict[str, str]:
    """Every PromQL query of the dashboard as Grafana holds it (template variables in), by where it is."""
    found = {f"{p['title']} / {t['refId']}": t["expr"] for p in panels() for t in p["targets"]}
    found.update({f"annotation {a['name']}": a["expr"] for a in dashboard()["annotations"]["list"]})
    return found


def resolved(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def queries() -> dict[str, str]:
    """Every PromQL query of the dashboard, template variables filled in, by where it is."""
    return {where: resolved(expr) for where, expr in raw_queries().items()}


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names it matches on) for every ``metric{...}`` in ``expr``."""
    return [(name, set(_MATCHER.findall(body))) for name, body in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)]


class Scrape:
    """/metrics pages: the sample names with their label names, and every declared family."""

    def __init__(self, *texts: str):
        self.labels: dict[str, set[str]] = {}
        self.declared: set[str] = set()
        for line in "\n".join(texts).splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                suffixes = {"counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}.get(kind, ("",))
                self.declared |= {name + suffix for suffix in suffixes}
            elif match := _SAMPLE.match(line):
                self.labels.setdefault(match[1], set()).update(_MATCHER.findall((match[2] or "") + ","))
        self.declared |= set(self.labels)


@pytest.fixture(scope="module")
def live(broker, tmp_path_factory):
    """A worker of the compose pipeline with a plan and the pipeline's monitoring agent, scraped by Prometheus while
    1500 records go through the worker."""
    run_dir = tmp_path_factory.mktemp("grafana")
    config = PipelineConfig.from_toml(DOCKER / "pipeline.toml")
    config = replace(config, artifact_dir=str(run_dir / "artifacts")).with_topics(
        prefix=f"grafana-{uuid.uuid4().hex[:8]}").with_monitor(metrics_port=0, min_records=50)  # the monitor samples
    ensure_topics(broker.bootstrap, config.topics)
    research, archive = datasets.load("adult").split(3000, seed=0)
    plan = DistributionalRepair(n_q=50, columns=list(config.features)).fit(research.X, research.s, research.u)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(plan.to_artifact())
    agent_target = f"127.0.0.1:{free_port()}"
    agent = AgentProcess(config, broker.bootstrap, run_dir / "worker", metrics_port=int(agent_target.split(":")[1]))
    worker = WorkerProcess(config, broker.bootstrap, run_dir / "worker")
    try:
        agent.start()
        worker.start()
        assert worker.wait_for_log("now serving plan artifact version 1", timeout=90), worker.log_tail()
        port = int(re.search(r"serving Prometheus /metrics on port (\d+)", worker.log_path.read_text()).group(1))
        target = f"127.0.0.1:{port}"
        with PrometheusServer(run_dir / "prometheus", [target], jobs={AGENT_JOB: [agent_target]}) as prom:
            prom.wait_for_targets_up()
            prom.wait_for_targets_up(job=AGENT_JOB)
            messages = record_messages(archive.subset(slice(0, 1500)), config, id_prefix="grafana")
            # Two waves, as on a worker that was already busy: the counters exist before the second
            # one, so increase() and rate() over the scrapes see it (a series' first sample is no increase).
            assert replay(broker.bootstrap, config.topics.records_in, messages[:100], progress=False) == 100
            prom.wait_for(lambda: prom.query("fairstream_records_in_total"), 30, "the first wave scraped")
            assert replay(broker.bootstrap, config.topics.records_in, messages[100:], progress=False) == 1400
            prom.wait_for(lambda: prom.query('sum(fairstream_records_repaired_total{agent="records"}) >= 1500')
                          and prom.query('fairstream_fairness_dependence{scope="pipeline"}'), 90,
                          "1500 repaired records and the pipeline's fairness statistics")
            # A series born with the traffic needs two samples before rate() and increase() see it.
            prom.wait_for(lambda: prom.query("count_over_time(fairstream_record_latency_seconds_count[1m]) >= 2"), 30,
                          "two scrapes of the latency histogram")
            pages = []
            for address in (target, agent_target):
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                    pages.append(response.read().decode())
            yield prom, Scrape(*pages)
    finally:
        worker.stop()
        agent.stop()


# --------------------------------------------------------------------------- the file


def test_the_dashboard_is_complete_json_on_the_datasource_variable():
    board = dashboard()
    assert board["uid"] == "fairstream" and board["title"] == "fairstream"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "pipeline", "instance", "window", "role"}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    # the compose stack provisions a data source of that type, whatever its uid
    datasources = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    for panel in panels():
        assert panel["datasource"] == DATASOURCE and panel["targets"], panel["title"]
        assert all(t["datasource"] == DATASOURCE and t["expr"].strip() for t in panel["targets"]), panel["title"]
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
    queried = [v for v in variables.values() if v["type"] == "query"] + board["annotations"]["list"]
    assert all(item["datasource"] == DATASOURCE for item in queried)
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', DASHBOARD_JSON.read_text())) - {dashboard()["uid"]}
    assert uids == {"${datasource}"}, f"fixed data source uids: {sorted(uids - {'${datasource}'})}"
    # what the issue asks the dashboard to show
    titles = " | ".join(p["title"] for p in panels()).lower()
    for shown in ("dependence e", "w1", "rate gap", "ratio gap", "out-of-range", "drift events", "records per second",
                  "dead-letter", "lag", "latency", "artifact version", "records per group", "unmeasurable",
                  "monitoring agents", "partial aggregates", "age of the pipeline's numbers", "late records"):
        assert shown in titles, shown
    metrics = {name for expr in queries().values() for name in metric_names(expr)}
    assert {"fairstream_records_in_total", "fairstream_records_repaired_total",
            "fairstream_records_dead_lettered_total", "fairstream_records_group_imputed_total",
            "fairstream_drift_events_total", "fairstream_artifact_version", "fairstream_consumer_lag_records",
            "fairstream_record_latency_seconds_bucket", *FAIRNESS_FAMILIES.values(), "fairstream_window_group_records",
            "fairstream_fairness_unmeasurable", "fairstream_agent_active", "fairstream_agent_info",
            "fairstream_agent_partials_total", "fairstream_stats_messages_total",
            "fairstream_agent_last_partial_timestamp_seconds", "fairstream_agent_late_records"} <= metrics


def test_the_pipeline_variable_filters_and_splits_every_query():
    (pipeline,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "pipeline"]
    assert pipeline["definition"] == "label_values(fairstream_records_in_total, pipeline)"
    assert pipeline["multi"] and pipeline["includeAll"]
    for where, expr in raw_queries().items():
        for name, body in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
            if name.startswith("fairstream_"):
                assert PIPELINE_MATCHER in body, f"{where}: {name} is not filtered by the pipeline variable"
        if where.startswith("annotation") or "ALERTS" in expr:
            continue
        assert re.search(r"\bby \((?:[a-z_]+, )*pipeline\b", expr), f"{where}: not grouped by pipeline"
    for panel in panels():
        for target in panel["targets"]:
            assert "{{pipeline}}" in target["legendFormat"], f"{panel['title']} / {target['refId']}"


def test_every_fairness_query_chooses_and_shows_the_role():
    """The fairness panels show the chain that serves by default, a candidate in shadow on request, never mixed."""
    (role,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "role"]
    assert role["current"]["value"] == ["active"] and role["multi"] and role["allValue"] == "active|candidate"
    families = set(FAIRNESS_FAMILIES.values())
    fairness = [(p, t) for p in panels() for t in p["targets"] if metric_names(resolved(t["expr"])) & families]
    assert {n for _, t in fairness for n in metric_names(resolved(t["expr"]))} == families
    for panel, target in fairness:
        where = f"{panel['title']} / {target['refId']}"
        assert 'role=~"$role"' in target["expr"] and "by (pipeline, role, " in target["expr"], where
        assert "{{role}}" in target["legendFormat"] and "candidate" in panel["description"], where


def test_every_scoped_query_reads_the_pipelines_figure():
    """The fairness panels, the records per group and the unmeasurable statistics are the agent's (scope="pipeline"),
    never one worker's (they are not filtered by the worker variable either: the agent is no worker)."""
    scoped = [(where, name, body) for where, expr in raw_queries().items()
              for name, body in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr) if name in SCOPED]
    assert {name for _, name, _ in scoped} == SCOPED
    for where, name, body in scoped:
        assert 'scope="pipeline"' in body and "$instance" not in body, f"{where}: {name}{{{body}}}"
    for where, expr in raw_queries().items():  # the agent's counters: one per pipeline, not per worker
        if "fairstream_drift_events_total" in expr or "fairstream_refit_requests_total" in expr:
            assert "$instance" not in expr, where


def test_every_range_is_the_rate_interval():
    ranges = {where: re.findall(r"\[([^\]]*)\]", expr) for where, expr in raw_queries().items()}
    assert any(ranges.values())
    for where, found in ranges.items():
        # $__range only where a whole time range is meant (a worker seen at all), never under rate()
        assert set(found) <= {"$__rate_interval", "$__range"}, f"{where}: fixed range {found}"
    for where, expr in raw_queries().items():
        for function, window in re.findall(r"\b(rate|irate|increase|changes)\([^\[]*\[([^\]]*)\]", expr):
            assert window == "$__rate_interval", f"{where}: {function}() over [{window}]"


def test_every_metric_a_query_names_is_exported_by_the_worker_code():
    exported = exported_sample_names()
    for where, expr in queries().items():
        unknown = metric_names(expr) - exported - PROMETHEUS_SERIES
        assert not unknown, f"{where}: streams/worker/metrics.py exports no {sorted(unknown)}"


def test_the_fairness_panels_say_their_unit_and_direction():
    families = set(FAIRNESS_FAMILIES.values())  # every family a fairness statistic is exported in
    shown = set()
    for panel in panels():
        names = {n for t in panel["targets"] for n in metric_names(resolved(t["expr"]))} & families
        if names:
            shown |= names
            assert "higher is worse" in panel["description"], panel["title"]
            assert panel["fieldConfig"]["defaults"]["unit"] in {"none", "percentunit"}, panel["title"]
    assert shown == families


def test_the_latency_panel_says_how_the_histogram_is_sampled():
    (panel,) = [p for p in panels() if "fairstream_record_latency_seconds_bucket" in p["targets"][0]["expr"]]
    assert "sampled" in panel["title"].lower()
    # the rule the worker follows (streams/worker/consumer.py), with its constant
    assert f"k = max(1, n // {LATENCY_SAMPLES})" in panel["description"]
    assert f"fewer than {2 * LATENCY_SAMPLES} such records" in panel["description"]


def test_promtool_accepts_every_query(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(queries().values())]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([binary("promtool"), "check", "rules", str(path)], check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries())} rules found" in result.stdout


# --------------------------------------------------------------------------- against a live worker


def test_every_metric_a_query_names_is_on_the_metrics_page_of_the_worker_or_the_agent(live):
    _, scrape = live
    for where, expr in queries().items():
        unknown = metric_names(expr) - scrape.declared - PROMETHEUS_SERIES
        assert not unknown, f"{where}: neither the worker nor the agent exports {sorted(unknown)}"
    sampled_only_later = {name for expr in queries().values() for name in metric_names(expr)} - set(scrape.labels)
    assert sampled_only_later - PROMETHEUS_SERIES <= ONLY_AFTER_EVENTS


def test_every_label_a_query_matches_on_is_a_label_of_that_metric(live):
    _, scrape = live
    target_labels = {"job", "instance"}  # added by Prometheus to every scraped series
    for where, expr in queries().items():
        for name, labels in selectors(expr):
            if name in scrape.labels:
                unknown = labels - scrape.labels[name] - target_labels
                assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"


def test_the_label_check_can_fail(live):
    _, scrape = live
    ((name, labels),) = selectors('max(fairstream_fairness_dependence{pair="all", stage="after"})')
    assert labels - scrape.labels[name] == {"pair"}


def test_every_panel_shows_data_once_records_flow(live):
    prom, _ = live
    time.sleep(2)  # one more scrape, so every rate has two samples after the traffic
    empty = []
    for panel in panels():
        for target in panel["targets"]:
            if metric_names(target["expr"]) & (ONLY_AFTER_EVENTS | {"ALERTS"}):
                continue
            expr = resolved(target["expr"])
            if not prom.query(expr):
                empty.append(f"{panel['title']} / {target['refId']}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
