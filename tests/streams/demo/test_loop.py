"""Drift -> detection -> Prometheus alert -> re-fit -> hot swap -> recovery, all real.

Real workers (records agent + /metrics; three in the first test), the pipeline's monitoring agent (``fairstream
monitor``: their partial aggregates merged, drift detected once, one re-fit request per drift), a real re-fit
service on refit.requests, a real Prometheus server with the production alert rules (only their ``for:`` durations
shortened) scraping the workers and the agent, Apache Kafka, and Adult records whose distribution shifts half way: in
the college stratum, women's hours-per-week rise by 15 while the labelling process keeps feeding the research topic.
"""

import json
import time
from dataclasses import replace

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from fairstream.repair import datasets
from fairstream.streams.codec.partials import AGENT_SUFFIX
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.loop import OPERATOR, run_fairness_loop, shift_group
from fairstream.streams.kafka import librdkafka_options

pytestmark = pytest.mark.integration


def test_drift_is_detected_alerted_refitted_swapped_and_repaired_with_three_workers(broker, tmp_path):
    """Three workers share the input; the monitoring agent detects the drift over all their records, once, and
    asks one re-fit; every worker then serves the new plan, and nothing is lost."""
    research, archive = datasets.load("adult").split(10_000, seed=0)
    shifted = shift_group(archive.subset(slice(10_000, None)), feature=1, group=0, stratum=1, amount=15.0, lo=1, hi=99)
    drifted_research, drifted_stream = shifted.subset(slice(0, 6_000)), shifted.subset(slice(6_000, None))
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix="loop").with_monitor(
        window_records=4000, min_records=500, threshold=0.1, cooldown_seconds=600.0, lateness_seconds=1.0,
        stats_seconds=0.5)  # the agent closes a slice 1 s after its last partial, workers send every 0.5 s
    report = run_fairness_loop(config, broker.bootstrap, tmp_path / "run", research, archive.subset(slice(0, 6_000)),
                               drifted_stream, drifted_research, rate=2000.0, short_for=True, say=lambda _: None,
                               workers=3)
    timeline = "\n".join(f"{t:7.1f}s  {e}  {d}" for t, e, d in report.events) + "\nseries: " + " ".join(
        f"{t:.0f}:{v:.2f}/v{ver}" for t, v, ver in report.series[::4])
    at = {event: report.first(event) for event in ("drift injected", "drift detected by the monitor",
                                                   "Prometheus alert firing", "re-fit published",
                                                   "statistic back below threshold")}
    assert None not in at.values(), timeline
    assert at["drift injected"] < at["drift detected by the monitor"] < at["re-fit published"], timeline
    assert at["drift detected by the monitor"] <= at["Prometheus alert firing"] + 2.0, timeline
    assert at["re-fit published"] < at["statistic back below threshold"], timeline
    # One drift decision for the pipeline, one re-fit request, one re-fit, one new version: served by every worker.
    assert [e for _, e, _ in report.events].count("drift detected by the monitor") == 1, timeline
    (request,) = report.refit_requests  # what refit.requests holds: the agent's one request, taken at once
    assert f"{AGENT_SUFFIX}@" in request and ": queued: " in request, report.refit_requests
    assert len(report.refit_outcomes) == 1 and [e for _, e, _ in report.events].count("re-fit published") == 1, timeline
    versions = [d for _, e, d in report.events if e == "plan version in use"]  # the version every worker serves
    assert versions == ["version 1", "version 2"], timeline
    logs = sorted((tmp_path / "run").glob("*.log"))
    assert report.workers == 3 and [p.name for p in logs] == ["monitor.log", "worker-1.log", "worker-2.log",
                                                              "worker-3.log"]
    for log in logs[1:]:
        assert "now serving plan artifact version 2" in log.read_text(), log
    before_drift = [v for t, v, ver in report.series if t < at["drift injected"] and ver == 1]
    peak = max(v for _, v, ver in report.series if ver == 1)
    assert before_drift and max(before_drift[-3:]) < report.threshold < peak, timeline
    # Nothing lost: every record sent came out repaired or dead-lettered.
    assert collected_ids(broker.bootstrap, config, report.sent) == report.sent


def test_under_approve_the_refit_waits_in_shadow_until_a_named_operator_approves_it(broker, tmp_path):
    """The third act: the re-fit after the drift is a candidate; the worker serves version 1 until the operator
    approves the candidate on its live shadow statistics, then the approved version, and the statistic recovers."""
    research, archive = datasets.load("adult").split(10_000, seed=0)
    shifted = shift_group(archive.subset(slice(10_000, None)), feature=1, group=0, stratum=1, amount=15.0, lo=1, hi=99)
    drifted_research, drifted_stream = shifted.subset(slice(0, 6_000)), shifted.subset(slice(6_000, None))
    config = replace(adult_config(artifact_dir=str(tmp_path / "artifacts")), promotion="approve").with_topics(
        prefix="approve").with_monitor(window_records=4000, min_records=500, threshold=0.1, cooldown_seconds=600.0,
                                       lateness_seconds=1.0, stats_seconds=0.5)
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


def collected_ids(bootstrap: str, config, expected: int, timeout: float = 60.0) -> int:
    """Distinct ids on the repaired topic (at least once: a record may come out twice) plus the dead-lettered
    messages, once they reach ``expected`` (or at the timeout); read with librdkafka, every partition assigned."""
    topics = (config.topics.records_repaired, config.topics.dlq)
    consumer = Consumer({"bootstrap.servers": bootstrap, **librdkafka_options(), "group.id": "demo-test-outputs",
                         "enable.auto.commit": False})
    try:
        found = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for topic in topics for p in found[topic].partitions])
        ids, letters = set(), 0
        deadline = time.monotonic() + timeout
        while len(ids) + letters < expected and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                if message.error() is not None:
                    continue
                if message.topic() == topics[0]:
                    ids.add(json.loads(message.value())["id"])
                else:
                    letters += 1
        return len(ids) + letters
    finally:
        consumer.close()
