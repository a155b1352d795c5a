"""The Prometheus config and alert rules in deploy/prometheus: valid, unit-tested, and on the metrics contract.

``promtool`` comes from the Debian package ``prometheus`` (``make setup`` installs it).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from fairstream.streams.config import PipelineConfig
import yaml

from fairstream.streams.ops.alert_rules import (
    render_threshold_rules,
    runbook_url,
    with_threshold_rules,
    write_threshold_rules,
)
from fairstream.streams.ops.prometheus import ALERTS_TEST_YML, ALERTS_YML, DEPLOY, PROMETHEUS_YML, REPO, binary
from fairstream.streams.worker import metrics

DEFAULT_CONFIG = REPO / "deploy" / "pipeline.adult.toml"
RULES = 15  # three rendered thresholds and BFAR, eleven written by hand
SCOPED = {family.describe()[0].name for family in vars(metrics).values()
          if hasattr(family, "_labelnames") and "scope" in family._labelnames}
"""Every family with a ``scope`` label: the pipeline's figure (the monitoring agent's) or one worker's own."""


def promtool(*args: str, cwd=DEPLOY) -> subprocess.CompletedProcess:
    return subprocess.run([binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_ok(result: subprocess.CompletedProcess) -> str:
    output = f"$ {' '.join(result.args)}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, output
    return output


def test_promtool_check_rules():
    output = assert_ok(promtool("check", "rules", str(ALERTS_YML)))
    assert f"SUCCESS: {RULES} rules found" in output, output


def test_promtool_check_config():
    # rule_files in prometheus.yml are relative to the config file: run from its folder, as documented.
    output = assert_ok(promtool("check", "config", PROMETHEUS_YML.name))
    assert "SUCCESS: 1 rule files found" in output and f"SUCCESS: {RULES} rules found" in output, output


def test_promtool_unit_tests_of_the_rules():
    output = assert_ok(promtool("test", "rules", str(ALERTS_TEST_YML)))
    assert "SUCCESS" in output, output


def test_every_rule_has_unit_tests_that_fire_and_do_not_fire():
    """alerts_test.yml names every alert in a firing (non-empty exp_alerts) and a quiet (exp_alerts: []) case."""
    tests = ALERTS_TEST_YML.read_text()
    for name in alert_names(ALERTS_YML.read_text()):
        cases = re.findall(rf"alertname:\s*{name}\s*\n\s*exp_alerts:(.*)", tests)
        assert any(case.strip() == "[]" for case in cases), f"{name}: no case where it does not fire"
        assert any(case.strip() == "" for case in cases), f"{name}: no case where it fires"


# --------------------------------------------------------------------------- thresholds from one place


def test_the_threshold_rules_are_those_of_the_deployed_pipeline_config():
    """deploy/prometheus/alerts.yml holds exactly what `fairstream alerts --write` renders from the config."""
    config = PipelineConfig.from_toml(DEFAULT_CONFIG)
    text = ALERTS_YML.read_text()
    assert with_threshold_rules(text, config) == text, (
        "regenerate: fairstream alerts --config deploy/pipeline.adult.toml --write deploy/prometheus/alerts.yml")
    for statistic, threshold in config.monitor.thresholds.items():
        assert f'{metrics.fairness_family(statistic)}{{stage="after", statistic="{statistic}"' in text
        assert f") > {threshold:g}\n" in text


def selectors_of(families: set[str]) -> list[tuple[str, str]]:
    """(family, matchers) of every selector of one of ``families`` in the rules."""
    return [(name, body) for expr in rule_exprs(ALERTS_YML.read_text())
            for name, body in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr) if name in families]


def test_every_fairness_rule_reads_the_serving_chain_only():
    """A candidate measured in shadow (role="candidate") never pages: every selector of a fairness family in the
    rules matches role="active" (alerts_test.yml proves it with promtool)."""
    selectors = selectors_of(set(metrics.FAIRNESS_FAMILIES.values()))
    assert len(selectors) == len(PipelineConfig.from_toml(DEFAULT_CONFIG).monitor.thresholds)
    assert all('role="active"' in body for _, body in selectors_of(SCOPED)), selectors
    assert 'role="candidate"' in ALERTS_TEST_YML.read_text()


def test_every_rule_on_a_scoped_family_reads_the_pipelines_figure():
    """The fairness rules read the monitoring agent's figures over every worker's records (scope="pipeline"), never a
    worker's own (scope="worker": a fragment of the stream); alerts_test.yml has worker series far above every
    threshold that never page."""
    assert {"fairstream_fairness_dependence", "fairstream_fairness_unmeasurable",
            "fairstream_window_group_records"} <= SCOPED
    selectors = selectors_of(SCOPED)
    # the deployed pipeline monitors E, the DP gap and MDP
    assert {name for name, _ in selectors} == {"fairstream_fairness_dependence", "fairstream_fairness_rate_gap",
                                               "fairstream_fairness_unmeasurable"}
    assert all('scope="pipeline"' in body and 'window="count"' in body for _, body in selectors), selectors
    assert 'scope="worker"' in ALERTS_TEST_YML.read_text() and "worker" not in "".join(body for _, body in selectors)
    assert "worst value" not in ALERTS_YML.read_text()  # one value per pipeline: the agent's


def test_a_rendered_rule_reads_the_pipelines_figure_whatever_the_statistic():
    config = PipelineConfig.from_toml(DEFAULT_CONFIG).with_monitor(statistic=("dp_ratio", "w1", "otf"), threshold=0.2)
    text = render_threshold_rules(config)
    for statistic in ("dp_ratio", "w1", "otf"):
        assert (f'{metrics.fairness_family(statistic)}{{stage="after", statistic="{statistic}", role="active", '
                f'scope="pipeline", window="count", feature="all", group_pair="all"}}') in text


def rule(name: str) -> dict:
    (found,) = [r for g in yaml.safe_load(ALERTS_YML.read_text())["groups"] for r in g["rules"] if r["alert"] == name]
    return found


def test_the_monitoring_agents_rules_read_its_metrics():
    """Drift is the agent's counter; the agent's own health is three rules on what only it exports."""
    agent_only = {"fairstream_agent_active", "fairstream_agent_last_partial_timestamp_seconds"}
    assert metric_names(rule("FairstreamFairnessDrift")["expr"]) == {"fairstream_drift_events_total", "up"}
    unmeasurable = rule("FairstreamFairnessUnmeasurable")
    assert metric_names(unmeasurable["expr"]) == {"fairstream_fairness_unmeasurable"}
    assert "max by (pipeline, group, reason)" in unmeasurable["expr"] and unmeasurable["for"] == "1m"
    down = rule("FairstreamMonitorAgentDown")
    assert metric_names(down["expr"]) == {"fairstream_worker_info", "fairstream_agent_active"}
    assert "unless on (pipeline)" in down["expr"] and "fairstream_agent_active == 1" in down["expr"]
    assert down["for"] == "2m" and down["labels"]["severity"] == "critical"
    stale = rule("FairstreamPipelineStatisticsStale")
    assert metric_names(stale["expr"]) == agent_only | {"fairstream_records_repaired_total"}
    assert "time() - fairstream_agent_last_partial_timestamp_seconds" in stale["expr"] and ") > 60" in stale["expr"]
    for name in ("FairstreamMonitorAgentDown", "FairstreamPipelineStatisticsStale"):  # the workers keep serving
        assert "stale" in rule(name)["annotations"]["description"], name


def test_the_control_plane_rules_page_for_who_wrote_a_record_and_for_a_held_config():
    """A refusal for who wrote a control record or what the policy allows pages at once; a lost race (stale) and the
    artifact problems do not. Every refusal category of the gate is one or the other."""
    from fairstream.streams.control.gate import CATEGORIES

    refused = rule("FairstreamUnauthorisedControlRecord")
    (paging,) = set(re.findall(r'reason=~"([^"]*)"', refused["expr"]))
    assert set(paging.split("|")) == set(CATEGORIES) - {"stale", "version", "load", "unreadable"}
    assert metric_names(refused["expr"]) == {"fairstream_artifacts_refused_total", "up"}
    assert "max by (pipeline, reason)" in refused["expr"] and refused["for"] == "0m"
    assert refused["labels"]["severity"] == "critical"
    held = rule("FairstreamWorkerConfigDiffers")
    assert metric_names(held["expr"]) == {"fairstream_config_held"} and held["for"] == "5m"
    assert held["labels"]["severity"] == "warning"
    assert "fairstream_config_differs{" in held["annotations"]["description"]  # names the differing keys
    assert {"fairstream_config_held", "fairstream_config_differs"} <= exported_sample_names()


def test_a_changed_threshold_changes_the_rule_and_nothing_else(tmp_path):
    config = PipelineConfig.from_toml(DEFAULT_CONFIG)
    stricter = config.with_monitor(threshold={**config.monitor.thresholds, "mdp": 0.05})
    rules = tmp_path / "alerts.yml"
    rules.write_text(ALERTS_YML.read_text())
    assert write_threshold_rules(rules, stricter) and not write_threshold_rules(rules, stricter)
    changed = [(a, b) for a, b in zip(ALERTS_YML.read_text().splitlines(), rules.read_text().splitlines()) if a != b]
    assert [b for _, b in changed] == ["          ) > 0.05", "            the 0.05 threshold for 1m."]
    assert_ok(promtool("check", "rules", str(rules)))


def test_a_ratio_is_read_as_one_minus_it_so_its_rule_pages_above_the_threshold_like_every_other():
    config = PipelineConfig.from_toml(DEFAULT_CONFIG).with_monitor(statistic="dp_ratio", threshold=0.2)
    text = render_threshold_rules(config)
    assert 'max by (pipeline, statistic, stratum, feature) (\n            ' \
           'fairstream_fairness_ratio_gap{stage="after", statistic="dp_ratio"' in text
    assert ") > 0.2\n" in text and "(1 - ratio) after repair" in text and "<" not in text


def test_every_rule_aggregates_by_pipeline_and_links_its_runbook_section():
    rules = [rule for group in yaml.safe_load(ALERTS_YML.read_text())["groups"] for rule in group["rules"]]
    assert len(rules) == RULES
    for rule in rules:
        assert re.search(r"\b(max|min|sum) by \(pipeline[,)]", rule["expr"]), rule["alert"]
        assert rule["annotations"]["runbook_url"] == runbook_url(rule["alert"])
        assert rule["annotations"]["runbook_url"].endswith("docs/runbook.md#" + rule["alert"].lower())


def test_every_fairness_family_a_rule_may_read_is_exported():
    assert set(metrics.FAIRNESS_FAMILIES.values()) <= exported_sample_names()


def test_the_cli_prints_and_writes_the_rules(tmp_path, capsys):
    from fairstream.streams import cli

    assert cli.main(["alerts", "--config", str(DEFAULT_CONFIG)]) == 0
    assert capsys.readouterr().out == render_threshold_rules(PipelineConfig.from_toml(DEFAULT_CONFIG))
    rules = tmp_path / "alerts.yml"
    rules.write_text(ALERTS_YML.read_text())
    assert cli.main(["alerts", "--config", str(DEFAULT_CONFIG), "--write", str(rules)]) == 0
    assert "already up to date" in capsys.readouterr().out


# --------------------------------------------------------------------------- metric names in the rules

# PromQL words that look like names but are not metrics: functions, aggregations, keywords.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "absent", "absent_over_time", "changes", "resets",
    "clamp_min", "clamp_max", "histogram_quantile", "label_replace", "label_join", "vector", "scalar", "time",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "log2", "log10", "sort", "sort_desc", "timestamp",
    "inf", "nan",
}
# Series Prometheus makes itself (not exported by a worker).
PROMETHEUS_SERIES = {"up"}


def alert_names(rules_text: str) -> list[str]:
    return re.findall(r"^\s*-\s*alert:\s*(\S+)\s*$", rules_text, flags=re.M)


def rule_exprs(rules_text: str) -> list[str]:
    """Every ``expr:`` of a rule file: one-line, or a ``|`` / ``>`` block of deeper-indented lines."""
    exprs, lines = [], rules_text.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)expr:\s*(.*?)\s*$", line)
        if not match:
            continue
        indent, value = len(match[1]), match[2]
        if value[:1] not in ("|", ">"):
            exprs.append(value.strip("'\""))
            continue
        block = []
        for following in lines[i + 1:]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            block.append(following.strip())
        exprs.append("\n".join(block).strip())
    return exprs


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (regex-based; enough for rule files, not a full parser)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                 # string literals
    expr = re.sub(r"\{[^}]*\}", " ", expr)                           # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)                          # range and subquery windows
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    expr = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", expr)               # offset durations
    expr = re.sub(r"\b\d[0-9.e+-]*[a-z]*\b", " ", expr)             # numbers and durations
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {name for name in names if name.lower() not in PROMQL_WORDS}


def exported_sample_names() -> set[str]:
    """Names of the samples the metrics in fairstream.streams.worker.metrics put on /metrics."""
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",), "stateset": ("",), "enum": ("",)}
    names = set()
    for value in vars(metrics).values():
        if hasattr(value, "describe") and hasattr(value, "_labelnames"):
            for family in value.describe():
                names.update(family.name + suffix for suffix in suffixes[family.type])
    return names


def test_rule_file_parsing_finds_every_expression():
    text = ALERTS_YML.read_text()
    exprs = rule_exprs(text)
    assert len(exprs) == len(alert_names(text)) == RULES
    assert all(exprs), exprs
    assert metric_names(exprs[0]) == {"fairstream_fairness_dependence"}


def test_metric_name_parser_sees_names_and_skips_promql():
    expr = ('sum by (agent, instance) (increase(fairstream_a_total{agent="x:y"}[5m])) / on (instance) '
            'max(fairstream_b offset 5m) > 0.05 or absent(fairstream_c) unless up == 1e3')
    assert metric_names(expr) == {"fairstream_a_total", "fairstream_b", "fairstream_c", "up"}


def test_exported_names_come_from_the_metrics_module():
    names = exported_sample_names()
    assert {"fairstream_records_in_total", "fairstream_fairness_dependence", "fairstream_batch_duration_seconds_bucket",
            "fairstream_drift_events_total", "fairstream_artifact_version"} <= names
    assert "fairstream_records_in" not in names  # a counter's samples carry _total


def test_every_metric_in_the_alert_rules_is_exported():
    """Renaming a metric in streams/worker/metrics.py without updating alerts.yml fails here."""
    exported = exported_sample_names()
    used = {name for expr in rule_exprs(ALERTS_YML.read_text()) for name in metric_names(expr)}
    assert {"fairstream_fairness_dependence", "fairstream_fairness_rate_gap", "fairstream_drift_events_total",
            "fairstream_records_dead_lettered_total", "fairstream_worker_info",
            "fairstream_records_in_total", "fairstream_input_held", "fairstream_consumer_lag_records",
            "fairstream_verification", "fairstream_fairness_unmeasurable", "fairstream_agent_active",
            "fairstream_agent_last_partial_timestamp_seconds", "fairstream_records_repaired_total",
            "fairstream_artifacts_refused_total", "fairstream_config_held"} <= used
    unknown = sorted(used - exported - PROMETHEUS_SERIES)
    assert not unknown, f"alerts.yml uses metrics that fairstream.streams.worker.metrics does not export: {unknown}"


@pytest.mark.parametrize("renamed", ["fairstream_drift_event_total", "fairstream_fairness"])
def test_a_renamed_metric_is_caught(renamed):
    """The check above can fail: a rule on a name the exporter does not have is reported."""
    exported = exported_sample_names()
    assert metric_names(f"increase({renamed}[5m]) > 0") - exported - PROMETHEUS_SERIES == {renamed}
