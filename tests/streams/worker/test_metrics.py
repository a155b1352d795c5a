"""The worker's metrics: one view per pipeline over module-global families, one family per fairness unit.

No broker: apps are created (not started) in this process, as a test that runs several does.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import REGISTRY

from fairstream.streams.config import STATISTICS, adult_config
from fairstream.streams.worker import metrics
from fairstream.streams.worker.app import create_app
from fairstream.streams.worker.metrics import FAIRNESS_FAMILIES, PipelineMetrics


def value(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


ROW = {"stage": "after", "stratum": "all", "feature": "all", "group_pair": "all", "window": "count"}
WORKER = {**ROW, "scope": "worker"}  # a worker's own figures: the default scope


def test_two_apps_of_different_pipelines_in_one_process_export_separate_series(tmp_path):
    apps = {name: create_app(adult_config(name=name, artifact_dir=str(tmp_path / name)).with_monitor(
        metrics_port="off"), "127.0.0.1:1", datadir=str(tmp_path / name / "faust")) for name in ("app-a", "app-b")}
    for name, app in apps.items():
        assert app.fairstream_metrics.pipeline == name and value("fairstream_worker_info", pipeline=name) == 1
        # created at 0 at start, per pipeline (increase() sees the first event)
        assert value("fairstream_monitor_errors_total", pipeline=name, monitor="fairness") == 0
        assert value("fairstream_stats_messages_total", pipeline=name) == 0
        # drift is detected once per pipeline, by its monitoring agent: a worker exports no drift counter
        assert value("fairstream_drift_events_total", pipeline=name, statistic="dependence_e", detector="adwin") is None
        app.fairstream_metrics.set_fairness("dependence_e", *ROW.values(), 0.05 if name == "app-a" else 0.3)
    plan = SimpleNamespace(kind="plan", version=4, sha256="ab" * 32)
    apps["app-a"].fairstream_registry.on_change(plan)  # a swap on app-a's chain
    assert value("fairstream_fairness_dependence", pipeline="app-a", role="active", statistic="dependence_e",
                 **WORKER) is None
    assert value("fairstream_fairness_dependence", pipeline="app-b", role="active", statistic="dependence_e",
                 **WORKER) == 0.3
    assert value("fairstream_artifact_version", pipeline="app-a", kind="plan") == 4
    assert value("fairstream_artifact_version", pipeline="app-b", kind="plan") is None


def test_every_statistic_has_one_family_and_the_ratio_is_exported_as_one_minus_it():
    assert set(FAIRNESS_FAMILIES) == {*STATISTICS, "out_of_range_rate"}
    view = PipelineMetrics("families")
    for statistic in FAIRNESS_FAMILIES:
        view.set_fairness(statistic, *ROW.values(), 0.75)
    exported = {statistic: value(FAIRNESS_FAMILIES[statistic], pipeline="families", role="active", statistic=statistic,
                                 **WORKER)
                for statistic in FAIRNESS_FAMILIES}
    assert exported == {**dict.fromkeys(FAIRNESS_FAMILIES, 0.75), "dp_ratio": 0.25}  # higher is worse everywhere
    assert FAIRNESS_FAMILIES["dp_ratio"] == "fairstream_fairness_ratio_gap"
    assert {FAIRNESS_FAMILIES[s] for s in ("dp_difference", "conditional_dp", "eopp", "mdp")} == {
        "fairstream_fairness_rate_gap"}
    view.clear_fairness()
    assert all(value(FAIRNESS_FAMILIES[s], pipeline="families", role="active", statistic=s, **WORKER) is None
               for s in FAIRNESS_FAMILIES)
    with pytest.raises(KeyError):
        metrics.fairness_family("no_such_statistic")


def test_the_role_label_keeps_a_candidate_apart_and_clears_by_role():
    view = PipelineMetrics("roles")
    view.set_fairness("dp_difference", *ROW.values(), 0.2)  # the default role: the chain that serves
    view.set_fairness("dp_difference", *ROW.values(), 0.05, role="candidate")
    view.set_fairness("dp_ratio", *ROW.values(), 0.9, role="candidate")
    gap = {role: value("fairstream_fairness_rate_gap", pipeline="roles", role=role, statistic="dp_difference", **WORKER)
           for role in ("active", "candidate")}
    assert gap == {"active": 0.2, "candidate": 0.05}
    view.clear_fairness(role="candidate")  # the candidate left: its series go, the active ones stay
    assert value("fairstream_fairness_rate_gap", pipeline="roles", role="candidate", statistic="dp_difference",
                 **WORKER) is None
    assert value("fairstream_fairness_ratio_gap", pipeline="roles", role="candidate", statistic="dp_ratio",
                 **WORKER) is None
    assert value("fairstream_fairness_rate_gap", pipeline="roles", role="active", statistic="dp_difference",
                 **WORKER) == 0.2
    view.set_fairness("dp_difference", *ROW.values(), 0.05, role="candidate")
    view.clear_fairness()  # None: both roles
    assert all(value("fairstream_fairness_rate_gap", pipeline="roles", role=role, statistic="dp_difference",
                     **WORKER) is None for role in ("active", "candidate"))
    with pytest.raises(ValueError, match="role must be one of active, candidate, got 'shadow'"):
        view.set_fairness("dp_difference", *ROW.values(), 0.1, role="shadow")


def test_the_candidate_version_is_exported_while_a_candidate_is_pending():
    view = PipelineMetrics("candidates")
    assert value("fairstream_candidate_version", pipeline="candidates", kind="plan") is None
    view.candidate_version.labels("plan").set(3)
    assert value("fairstream_candidate_version", pipeline="candidates", kind="plan") == 3
    view.candidate_version.remove("plan")
    assert value("fairstream_candidate_version", pipeline="candidates", kind="plan") is None
    view.candidate_version.remove("plan")  # already gone: nothing to do


# --------------------------------------------------------------------------- scope, replaced windows, unmeasurable


def fairness(pipeline: str, statistic: str, **labels) -> float | None:
    return value(FAIRNESS_FAMILIES[statistic], pipeline=pipeline, statistic=statistic,
                 **{"role": "active", **WORKER, **labels})


def test_the_scope_label_keeps_the_pipelines_figures_apart_from_a_workers():
    view = PipelineMetrics("scopes")
    view.set_fairness("dp_difference", *ROW.values(), 0.2)  # the default: this worker's own figure
    view.set_fairness("dp_difference", *ROW.values(), 0.05, scope="pipeline")  # the monitoring agent's
    assert fairness("scopes", "dp_difference") == 0.2 and fairness("scopes", "dp_difference", scope="pipeline") == 0.05
    view.window_records.labels("count", "pipeline").set(8000)
    view.window_records.labels("count", "worker").set(2600)
    assert value("fairstream_monitor_window_records", pipeline="scopes", window="count", scope="pipeline") == 8000
    assert value("fairstream_monitor_window_records", pipeline="scopes", window="count", scope="worker") == 2600
    with pytest.raises(ValueError, match="scope must be one of pipeline, worker, got 'cluster'"):
        view.set_fairness("dp_difference", *ROW.values(), 0.1, scope="cluster")
    assert metrics.SCOPES == ("pipeline", "worker")


def row(statistic, value_, feature="all", stratum="all"):
    return statistic, "after", stratum, feature, "all", value_


RECORDS = (np.array([[300, 12], [500, 40]]), np.array([0, 1]), np.array([0, 1]))  # (stratum, group) counts


def test_a_windows_rows_replace_its_series_and_the_stale_ones_go_only_after_the_new_ones_are_set(monkeypatch):
    view = PipelineMetrics("replaced")
    view.replace_fairness("active", "worker", "count", [row("dp_difference", 0.2), row("eopp", 0.1),
                                                        row("dependence_e", 0.3, feature="age")], {}, RECORDS)
    view.replace_fairness("active", "worker", "time", [row("eopp", 0.15)], {}, RECORDS)
    view.replace_fairness("active", "pipeline", "count", [row("eopp", 0.12)], {}, RECORDS)
    view.replace_fairness("candidate", "worker", "count", [row("eopp", 0.11)], {}, RECORDS)
    new = [row("dp_difference", 0.25), row("w1", 0.02, feature="age")]
    expected = {("dp_difference", "all"): 0.25, ("w1", "age"): 0.02}
    removed = []

    def spying(family):
        remove = family.remove

        def spy(*labels):  # a series removed while a new one is not set yet: a scrape would see neither
            assert {key: fairness("replaced", key[0], feature=key[1]) for key in expected} == expected, labels
            removed.append(labels)
            remove(*labels)
        return spy

    for family in (metrics.FAIRNESS_DEPENDENCE, metrics.FAIRNESS_WASSERSTEIN, metrics.FAIRNESS_RATE_GAP):
        monkeypatch.setattr(family, "remove", spying(family))
    view.replace_fairness("active", "worker", "count", new, {}, RECORDS)
    assert sorted(labels[2] for labels in removed) == ["dependence_e", "eopp"]  # the stale series of this window
    assert fairness("replaced", "dp_difference") == 0.25 and fairness("replaced", "w1", feature="age") == 0.02
    assert fairness("replaced", "eopp") is None and fairness("replaced", "dependence_e", feature="age") is None
    # other windows, scopes and roles keep theirs
    assert fairness("replaced", "eopp", window="time") == 0.15
    assert fairness("replaced", "eopp", scope="pipeline") == 0.12
    assert fairness("replaced", "eopp", role="candidate") == 0.11


def group_gauges(pipeline: str, family: str, **labels) -> dict:
    """{group: value} of a per-group family of ``pipeline`` (role active, window count, scope worker unless given)."""
    labels = {"role": "active", "window": "count", "scope": "worker", **labels}
    return {sample.labels["group"]: sample.value for metric in REGISTRY.collect() if metric.name == family
            for sample in metric.samples if sample.labels.get("pipeline") == pipeline and
            all(sample.labels.get(k) == v for k, v in labels.items())}


def test_the_groups_records_and_what_makes_a_window_unmeasurable_are_exported_and_replaced():
    view = PipelineMetrics("groups")
    view.replace_fairness("active", "worker", "count", [row("out_of_range_rate", 0.0)], {"1": "too_few_records"},
                          RECORDS)
    assert group_gauges("groups", "fairstream_window_group_records") == {"0": 800.0, "1": 52.0}
    assert group_gauges("groups", "fairstream_fairness_unmeasurable") == {"1": 1.0}
    assert value("fairstream_fairness_unmeasurable", pipeline="groups", role="active", window="count", group="1",
                 reason="too_few_records", scope="worker") == 1
    view.replace_fairness("active", "worker", "time", [], {"1": "no_records"}, (RECORDS[0] * [1, 0], *RECORDS[1:]))
    enough = (RECORDS[0] * 10, *RECORDS[1:])
    view.replace_fairness("active", "worker", "count", [row("dp_difference", 0.2)], {}, enough)  # group 1 is back
    assert group_gauges("groups", "fairstream_fairness_unmeasurable") == {}
    assert group_gauges("groups", "fairstream_window_group_records") == {"0": 8000.0, "1": 520.0}
    assert group_gauges("groups", "fairstream_fairness_unmeasurable", window="time") == {"1": 1.0}  # its own window's
    view.clear_fairness("active")
    assert group_gauges("groups", "fairstream_window_group_records", window="time") == {}
    assert group_gauges("groups", "fairstream_fairness_unmeasurable", window="time") == {}


def test_a_window_that_lost_a_group_exports_no_statistic_between_groups_and_says_why():
    from fairstream.streams.codec.repaired import RepairedBatch
    from fairstream.streams.config import AgentConfig
    from fairstream.streams.worker.monitor import FairnessMonitor, export_fairness

    config = adult_config(records=AgentConfig(artifact=())).with_monitor(
        min_records=100, window_records=1000, buckets=2, min_group_records=30)
    rng = np.random.default_rng(0)

    def batch(s):  # records that carry their own model's decision (a monitor-only pipeline)
        n = len(s)
        X = np.column_stack([rng.uniform(17, 90, n), rng.uniform(1, 99, n)])
        return RepairedBatch(X, X, np.asarray(s), rng.integers(0, 2, n), rng.integers(0, 2, n),
                             np.array([f"r{i}" for i in rng.integers(0, 10**9, n)], dtype=object),
                             np.full(n, 1.7e9), out_of_range=np.zeros(n, dtype=bool),
                             decision=rng.integers(0, 2, n))

    monitor, view = FairnessMonitor(config, detect=False), PipelineMetrics("lostgroup")
    monitor.observe_batch(batch(np.arange(1000) % 2))
    for scope in ("worker", "pipeline"):
        export_fairness(monitor, view, scope=scope)
    assert fairness("lostgroup", "dp_difference") is not None and fairness("lostgroup", "dependence_e") is not None
    assert group_gauges("lostgroup", "fairstream_fairness_unmeasurable") == {}
    # 1,000 records of group 0 alone: the count window holds no record of group 1 (the time window still does).
    monitor.observe_batch(batch(np.zeros(1000, dtype=int)))
    export_fairness(monitor, view)
    assert monitor.windows["count"].n_records == 1000 and monitor.rows("count")  # the monitor still reads numbers
    assert fairness("lostgroup", "dp_difference") is None and fairness("lostgroup", "dependence_e") is None
    assert fairness("lostgroup", "w1", feature="age") is None
    assert fairness("lostgroup", "out_of_range_rate", stage="before") == 0.0  # not between groups: measurable
    assert value("fairstream_fairness_unmeasurable", pipeline="lostgroup", role="active", window="count", group="1",
                 reason="no_records", scope="worker") == 1
    assert group_gauges("lostgroup", "fairstream_window_group_records") == {"0": 1000.0, "1": 0.0}
    assert fairness("lostgroup", "dp_difference", window="time") is not None  # the time window holds both groups
    assert fairness("lostgroup", "dp_difference", scope="pipeline") is not None  # another scope: not re-exported
    # A few records of group 1 again: fewer than min_group_records, still not a measurement.
    monitor.observe_batch(batch(np.r_[np.zeros(480, dtype=int), np.ones(20, dtype=int)]))
    export_fairness(monitor, view)
    assert group_gauges("lostgroup", "fairstream_fairness_unmeasurable") == {"1": 1.0}
    assert value("fairstream_fairness_unmeasurable", pipeline="lostgroup", role="active", window="count", group="1",
                 reason="too_few_records", scope="worker") == 1
    assert fairness("lostgroup", "dp_difference") is None
    monitor.observe_batch(batch(np.arange(1000) % 2))
    export_fairness(monitor, view)
    assert fairness("lostgroup", "dp_difference") is not None
    assert group_gauges("lostgroup", "fairstream_fairness_unmeasurable") == {}
