"""The evidence on a candidate, gathered on Apache Kafka: the control topic, the store and ``records.in``.

A pipeline ``plan -> scorer`` under ``promotion = "approve"`` serves a scorer and a plan, has a candidate
plan pending, a worker's announcement of its own live shadow figures for it and the monitoring agent's
announcement of the pipeline-wide ones, and a few hundred records on ``records.in``:
:func:`~fairstream.streams.refit.evidence.gather` finds the version's state, the pending candidate, the
worker's and the agent's figures apart, and both chains' outputs on the latest records.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import numpy as np
import pytest
from kafka import KafkaProducer

from fairstream.models.plan import DistributionalRepair
from fairstream.repair import datasets
from fairstream.streams.codec.partials import AGENT_SUFFIX
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import WorkerStatus, encode_announcement
from fairstream.streams.demo.replay import record_messages, replay
from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.refit import evidence
from fairstream.streams.refit.evidence import HoldoutFigures, gather, measured_columns
from fairstream.streams.topics import ensure_topics
from tests.streams.refit.test_flow_refit import balanced_scorer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adult():
    research, rest = datasets.load("adult").split(3000, seed=5)
    live, _ = rest.split(400, seed=6)
    X = research.X.copy()
    X[(research.s == 1) & (research.u == 1), 1] += 8  # the candidate is fitted on a shifted window
    return research, dataclasses.replace(research, X=X), live


def pipeline(broker, tmp_path):
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact=("plan", "scorer")),
                          promotion="approve").with_topics(prefix=f"report-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    return config, ControlClient.of(config, broker.bootstrap)  # the pipeline's own gate and promotion policy


def serve(control, artifact, **audit):
    """A version that serves under the pipeline's promotion "approve": published as a candidate, approved by a person
    (every reader refuses a publish that would serve at once)."""
    record = control.publish_sync(artifact, candidate=True, **audit)
    control.decide_sync(record.kind, record.version, "approve", actor="risk officer", reason="reviewed")
    return record


def plan(data, **metrics):
    return DistributionalRepair(n_q=30, columns=["age", "hours-per-week"]).fit(data.X, data.s, data.u).to_artifact(
        metrics=metrics or None)


def announce(broker, config, worker: str, shadowing: tuple, figures: dict, app_id: str = "fairstream-records") -> None:
    status = WorkerStatus(worker=worker, app_id=app_id, host="test-host", pid=4242, at=time.time(),
                          every=300.0, kinds=("plan", "scorer"), serving=(), shadowing=shadowing, shadow=figures)
    key, value = encode_announcement(status)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=KAFKA_API_VERSION)
    try:
        producer.send(config.topics.control, value=value, key=key, partition=0).get(timeout=30)
    finally:
        producer.close()


def to_records_in(broker, config, data) -> None:
    messages = record_messages(data, config, id_prefix="live")
    assert replay(broker.bootstrap, config.topics.records_in, messages, progress=False) == len(messages)


AGENT_APP = "fairstream-records" + AGENT_SUFFIX
AGENT_NAME = f"{AGENT_APP}@test-host:4343"


def agent_figures(statistic: str) -> dict:
    """The pipeline-wide figures the monitoring agent announces of a candidate it would promote (its keys)."""
    return {"records": 12_400.0, "alpha": 0.05, "verdict": 1.0, f"bound.{statistic}.estimate": 0.018,
            f"bound.{statistic}.lower": 0.006, f"bound.{statistic}.upper": 0.031,
            "guard.decision_rate.estimate": 0.012, "guard.decision_rate.lower": 0.004,
            "guard.decision_rate.upper": 0.02, "changed": 1240.0, "records.0": 7650.0, "changed.0": 620.0,
            "records.1": 4750.0, "changed.1": 620.0, f"active.{statistic}": 0.092, f"candidate.{statistic}": 0.074}


@pytest.fixture(scope="module")
def with_candidate(broker, adult, tmp_path_factory):
    """A pending candidate plan v2 beside served plan v1 and scorer v1, shadowed by one worker, and live records."""
    research, shifted, live = adult
    config, control = pipeline(broker, tmp_path_factory.mktemp("report"))
    serve(control, balanced_scorer(research).to_artifact(), actor="alice@bank", reason="first scorer")
    serve(control, plan(research), actor="alice@bank", reason="first plan")
    candidate = control.publish_sync(
        plan(shifted, holdout_statistic="E", holdout_value=0.031, current_holdout_value=0.094, n_research=3000,
             n_fit=2400, n_holdout=600, source="topic report.research"),
        actor="refit@worker-7", reason="drift of E in cell (u=1, s=1) (alert FairstreamDrift)",
        statistics={"E": 0.031, "current E": 0.094}, candidate=True)
    statistic = config.shadow_statistics[0]  # what the workers compare: the monitor's statistic
    figures = {"records": 1800.0, "since": time.time() - 600, f"active.{statistic}": 0.092,
               f"candidate.{statistic}": 0.034, f"noise.{statistic}": 0.011,
               "active.decision_rate": 0.31, "candidate.decision_rate": 0.33,
               "active.decision_rate.0": 0.22, "candidate.decision_rate.0": 0.29,
               "active.decision_rate.1": 0.40, "candidate.decision_rate.1": 0.37}
    announce(broker, config, "fairstream-records@test-host:4242", (("plan", 2, candidate.sha256),), figures)
    announce(broker, config, AGENT_NAME, (("plan", 2, candidate.sha256),), agent_figures(statistic), app_id=AGENT_APP)
    to_records_in(broker, config, live)
    return config, control, candidate, figures


def test_the_evidence_names_the_state_the_pending_candidate_and_its_shadow_figures(broker, with_candidate):
    config, _, candidate, figures = with_candidate

    found = gather(config, broker.bootstrap, "plan", 2, sample=50)

    assert found.state == "candidate" and found.pending == (2, candidate.sha256)
    assert [(status.worker, shown) for status, shown in found.shadow] == [
        ("fairstream-records@test-host:4242", figures)]  # the worker's own figures, the agent's apart
    agent, pipeline_wide = found.pipeline
    assert agent.worker == AGENT_NAME and pipeline_wide == agent_figures(config.shadow_statistics[0])
    assert found.holdout == HoldoutFigures("E", 0.031, 0.094, 600)
    assert found.publish.sha256 == candidate.sha256 == found.artifact.sha256 and found.artifact_refusal is None
    assert [e.record.action for e in found.trail] == ["publish"]
    assert found.measured == ("features", "score", "decision")


def test_the_distributions_differ_between_the_chains_as_the_candidate_plan_repairs(broker, with_candidate):
    config, _, _, _ = with_candidate
    found = gather(config, broker.bootstrap, "plan", 2, sample=300)
    active, candidate = found.applied["active"], found.applied["candidate"]
    assert active.ok.all() and candidate.ok.all() and len(active.ok) == 300
    # The chains differ in the plan only: the same records, other repaired features, so other scores.
    assert not np.allclose(active.X, candidate.X)
    assert not np.allclose(active.columns["score"], candidate.columns["score"])
    assert found.chains.versions == {"plan": 1, "scorer": 1}


def test_what_is_compared_follows_what_the_kinds_write():
    assert measured_columns("plan", ("plan", "scorer")) == ("features", "score", "decision")
    assert measured_columns("plan", ("plan",)) == ("features",)
    assert measured_columns("scorer", ("plan", "scorer", "thresholds")) == ("score", "decision")
    assert measured_columns("thresholds", ("scorer", "thresholds")) == ("decision",)


def test_the_sample_is_read_from_each_partitions_tail_and_holds_the_latest_records(broker, adult, tmp_path,
                                                                                   monkeypatch):
    from fairstream.streams.codec.inputs import InputDecoder

    research, _, _ = adult
    config, _ = pipeline(broker, tmp_path)
    for prefix, part in (("old", research.subset(slice(0, 2400))), ("new", research.subset(slice(2400, 2600)))):
        messages = record_messages(part, config, id_prefix=prefix)
        assert replay(broker.bootstrap, config.topics.records_in, messages, progress=False) == len(messages)
    decoded = []
    decode = InputDecoder.decode
    monkeypatch.setattr(InputDecoder, "decode", lambda self, values, keys: decoded.append(len(values)) or decode(
        self, values, keys))

    window, note = evidence._sample(config, broker.bootstrap, 40)

    assert note is None and len(window) == 40 and all(key.startswith("new") for key in window.keys.tolist())
    # each partition's tail (and the window), never the 2600 records
    assert 40 <= sum(decoded) <= 41 * config.topics.partitions + 40


def test_a_read_cut_short_at_its_deadline_is_said(broker, with_candidate, monkeypatch):
    config, _, _, _ = with_candidate
    monkeypatch.setattr(evidence, "SAMPLE_SECONDS", 0.0)

    found = gather(config, broker.bootstrap, "plan", 2, sample=50)

    assert (f"the read of {config.topics.records_in} was cut short after 0 s: the records compared are the latest "
            "of those read, not necessarily the topic's latest") in found.window_note
