"""The worker's metrics: one view per pipeline over module-global families, one family per fairness unit.

No broker: apps are created (not started) in this process, as a test that runs several does.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from fairstream.streams.config import STATISTICS, adult_config
from fairstream.streams.worker import metrics
from fairstream.streams.worker.app import create_app
from fairstream.streams.worker.metrics import FAIRNESS_FAMILIES, PipelineMetrics


def value(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


ROW = {"stage": "after", "stratum": "all", "feature": "all", "group_pair": "all", "window": "count"}


def test_two_apps_of_different_pipelines_in_one_process_export_separate_series(tmp_path):
    apps = {name: create_app(adult_config(name=name, artifact_dir=str(tmp_path / name)).with_monitor(
        metrics_port="off"), "127.0.0.1:1", datadir=str(tmp_path / name / "faust")) for name in ("app-a", "app-b")}
    for name, app in apps.items():
        assert app.fairstream_metrics.pipeline == name and value("fairstream_worker_info", pipeline=name) == 1
        # created at 0 at start, per pipeline (increase() sees the first event)
        assert value("fairstream_drift_events_total", pipeline=name, statistic="dependence_e", detector="adwin") == 0
        app.fairstream_metrics.set_fairness("dependence_e", *ROW.values(), 0.05 if name == "app-a" else 0.3)
    plan = SimpleNamespace(kind="plan", version=4, sha256="ab" * 32)
    apps["app-a"].fairstream_registry.on_change(plan)  # a swap on app-a's chain
    assert value("fairstream_fairness_dependence", pipeline="app-a", role="active", statistic="dependence_e",
                 **ROW) is None
    assert value("fairstream_fairness_dependence", pipeline="app-b", role="active", statistic="dependence_e",
                 **ROW) == 0.3
    assert value("fairstream_artifact_version", pipeline="app-a", kind="plan") == 4
    assert value("fairstream_artifact_version", pipeline="app-b", kind="plan") is None


def test_every_statistic_has_one_family_and_the_ratio_is_exported_as_one_minus_it():
    assert set(FAIRNESS_FAMILIES) == {*STATISTICS, "out_of_range_rate"}
    view = PipelineMetrics("families")
    for statistic in FAIRNESS_FAMILIES:
        view.set_fairness(statistic, *ROW.values(), 0.75)
    exported = {statistic: value(FAIRNESS_FAMILIES[statistic], pipeline="families", role="active", statistic=statistic,
                                 **ROW)
                for statistic in FAIRNESS_FAMILIES}
    assert exported == {**dict.fromkeys(FAIRNESS_FAMILIES, 0.75), "dp_ratio": 0.25}  # higher is worse everywhere
    assert FAIRNESS_FAMILIES["dp_ratio"] == "fairstream_fairness_ratio_gap"
    assert {FAIRNESS_FAMILIES[s] for s in ("dp_difference", "conditional_dp", "eopp", "mdp")} == {
        "fairstream_fairness_rate_gap"}
    view.clear_fairness()
    assert all(value(FAIRNESS_FAMILIES[s], pipeline="families", role="active", statistic=s, **ROW) is None
               for s in FAIRNESS_FAMILIES)
    with pytest.raises(KeyError):
        metrics.fairness_family("no_such_statistic")


def test_the_role_label_keeps_a_candidate_apart_and_clears_by_role():
    view = PipelineMetrics("roles")
    view.set_fairness("dp_difference", *ROW.values(), 0.2)  # the default role: the chain that serves
    view.set_fairness("dp_difference", *ROW.values(), 0.05, role="candidate")
    view.set_fairness("dp_ratio", *ROW.values(), 0.9, role="candidate")
    gap = {role: value("fairstream_fairness_rate_gap", pipeline="roles", role=role, statistic="dp_difference", **ROW)
           for role in ("active", "candidate")}
    assert gap == {"active": 0.2, "candidate": 0.05}
    view.clear_fairness(role="candidate")  # the candidate left: its series go, the active ones stay
    assert value("fairstream_fairness_rate_gap", pipeline="roles", role="candidate", statistic="dp_difference",
                 **ROW) is None
    assert value("fairstream_fairness_ratio_gap", pipeline="roles", role="candidate", statistic="dp_ratio",
                 **ROW) is None
    assert value("fairstream_fairness_rate_gap", pipeline="roles", role="active", statistic="dp_difference",
                 **ROW) == 0.2
    view.set_fairness("dp_difference", *ROW.values(), 0.05, role="candidate")
    view.clear_fairness()  # None: both roles
    assert all(value("fairstream_fairness_rate_gap", pipeline="roles", role=role, statistic="dp_difference",
                     **ROW) is None for role in ("active", "candidate"))
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
