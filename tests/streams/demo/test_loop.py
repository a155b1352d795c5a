"""Drift -> detection -> Prometheus alert -> re-fit -> hot swap -> recovery, all real.

A real worker (records agent + monitor + /metrics), a real re-fit service on refit.requests, a real
Prometheus server with the production alert rules (only their ``for:`` durations shortened), Apache
Kafka, and Adult records whose distribution shifts half way: in the college stratum,
women's hours-per-week rise by 15 while the labelling process keeps feeding the research topic.
"""

from dataclasses import replace

import pytest

from fairstream.repair import datasets
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.loop import OPERATOR, run_fairness_loop, shift_group

pytestmark = pytest.mark.integration


def test_drift_is_detected_alerted_refitted_swapped_and_repaired(broker, tmp_path):
    research, archive = datasets.load("adult").split(10_000, seed=0)
    shifted = shift_group(archive.subset(slice(10_000, None)), feature=1, group=0, stratum=1, amount=15.0, lo=1, hi=99)
    drifted_research, drifted_stream = shifted.subset(slice(0, 6_000)), shifted.subset(slice(6_000, None))
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix="loop").with_monitor(
        window_records=8000, min_records=500, threshold=0.1, cooldown_seconds=600.0)
    report = run_fairness_loop(config, broker.bootstrap, tmp_path / "run", research, archive.subset(slice(0, 10_000)),
                               drifted_stream, drifted_research, rate=2000.0, short_for=True, say=lambda _: None)
    timeline = "\n".join(f"{t:7.1f}s  {e}  {d}" for t, e, d in report.events) + "\nseries: " + " ".join(
        f"{t:.0f}:{v:.2f}/v{ver}" for t, v, ver in report.series[::4])
    at = {event: report.first(event) for event in ("drift injected", "drift detected by the monitor",
                                                   "Prometheus alert firing", "re-fit published",
                                                   "statistic back below threshold")}
    assert None not in at.values(), timeline
    assert at["drift injected"] < at["drift detected by the monitor"] < at["re-fit published"], timeline
    assert at["drift detected by the monitor"] <= at["Prometheus alert firing"] + 2.0, timeline
    assert at["re-fit published"] < at["statistic back below threshold"], timeline
    versions = [d for _, e, d in report.events if e == "plan version in use"]
    assert versions == ["version 1", "version 2"], timeline
    before_drift = [v for t, v, ver in report.series if t < at["drift injected"] and ver == 1]
    peak = max(v for _, v, ver in report.series if ver == 1)
    assert before_drift and max(before_drift[-3:]) < report.threshold < peak, timeline
    assert [e for _, e, _ in report.events].count("drift detected by the monitor") == 1, timeline


def test_under_approve_the_refit_waits_in_shadow_until_a_named_operator_approves_it(broker, tmp_path):
    """The third act: the re-fit after the drift is a candidate; the worker serves version 1 until the operator
    approves the candidate on its live shadow statistics, then the approved version, and the statistic recovers."""
    research, archive = datasets.load("adult").split(10_000, seed=0)
    shifted = shift_group(archive.subset(slice(10_000, None)), feature=1, group=0, stratum=1, amount=15.0, lo=1, hi=99)
    drifted_research, drifted_stream = shifted.subset(slice(0, 6_000)), shifted.subset(slice(6_000, None))
    config = replace(adult_config(artifact_dir=str(tmp_path / "artifacts")), promotion="approve").with_topics(
        prefix="approve").with_monitor(window_records=4000, min_records=500, threshold=0.1, cooldown_seconds=600.0)
    report = run_fairness_loop(config, broker.bootstrap, tmp_path / "run", research, archive.subset(slice(0, 6_000)),
                               drifted_stream, drifted_research, rate=2000.0, prometheus=False, say=lambda _: None)
    history = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).history_sync()
    timeline = "\n".join(f"{t:7.1f}s  {e}  {d}" for t, e, d in report.events)
    at = {event: report.first(event) for event in ("drift injected", "drift detected by the monitor", "re-fit published",
                                                   "candidate in shadow", "approved by a named operator",
                                                   "candidate promoted", "statistic back below threshold")}
    assert None not in at.values(), timeline
    assert list(at.values()) == sorted(at.values()), timeline
    approvals = [r for r in history if r.action == "approve" and r.version > 1]  # version 1: approved at the start
    assert len(approvals) == 1 and approvals[0].actor == OPERATOR, history
    approved = approvals[0].version
    candidate = next(r for r in history if r.action == "publish" and r.version == approved)
    assert candidate.candidate and candidate.actor.startswith("refit@"), candidate
    # Nothing but version 1 served before the approval; the approved version after it.
    assert {ver for t, _, ver in report.series if t < at["approved by a named operator"]} == {1}, timeline
    assert [d for _, e, d in report.events if e == "plan version in use"] == ["version 1", f"version {approved}"]
    # What the operator approved on: the candidate's live statistic, under the threshold, before it served.
    shadow = [v for t, v, ver in report.candidate_series if ver == approved and t < at["approved by a named operator"]]
    assert shadow and shadow[-1] < report.threshold, report.candidate_series
