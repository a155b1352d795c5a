"""Flows in the product: the re-fit job fits one in front of the published scorer, a running worker swaps it in.

A real worker process on Apache Kafka applies the record chain ``flow`` then ``scorer``;
outputs must carry the flow's features, the scorer's score and decision, and one version of each.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from fairstream.models.flow import FlowPreprocessor, validate_flow
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.replay import record_messages, replay
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.sources import ResearchWindow, TopicSource
from fairstream.streams.refit.trainers import Validation
from fairstream.streams.refit.trainers.flow import FlowTrainer
from fairstream.streams.topics import ensure_topics
from tests.streams.worker.outputs import collect_outputs, send

pytestmark = pytest.mark.integration
FAST_FLOW = dict(n_steps=40, n_blocks=2, hidden=(8,))  # a tiny flow: the test checks the plumbing, not the paper


@pytest.fixture(scope="module")
def adult():
    research, rest = datasets.load("adult").split(4000, seed=3)
    stream, _ = rest.split(300, seed=4)
    return research, stream


def balanced_scorer(data) -> LogisticScorer:
    """A scorer fitted on as many positives as negatives, so that its decisions are not all 0."""
    rng = np.random.default_rng(0)
    pos, neg = np.flatnonzero(data.y == 1), np.flatnonzero(data.y == 0)
    rows = np.concatenate([pos, rng.choice(neg, len(pos), replace=False)])
    return LogisticScorer().fit(data.X[rows], data.y[rows], columns=["age", "hours-per-week"])


def flow_config(tmp_path, prefix):
    return adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact=("flow", "scorer")),
                        monitor=MonitorConfig(statistic=("dp_difference", "eopp"))).with_topics(prefix=prefix)


def test_a_flow_refit_is_published_and_a_running_worker_swaps_it_in(broker, adult, tmp_path):
    research, stream = adult
    config = flow_config(tmp_path, f"flow-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    scorer = balanced_scorer(research)
    control.publish_sync(scorer.to_artifact())
    control.publish_sync(FlowPreprocessor.identity(list(config.features), groups=(0, 1)).to_artifact())
    with WorkerProcess(config, broker.bootstrap, tmp_path / "run") as worker:
        alive = lambda: None if worker.running else worker.log_tail()  # noqa: E731
        first = record_messages(stream.subset(slice(0, 100)), config, id_prefix="before")
        send(broker.bootstrap, config, first)
        before, _ = collect_outputs(broker.bootstrap, config, {f"before-{i}" for i in range(100)}, 120.0, alive)
        assert {tuple((c["kind"], c["version"]) for c in r[0]["provenance"]["chain"]) for r in before.values()} == \
            {(("flow", 1), ("scorer", 1))}

        replay(broker.bootstrap, config.topics.research, record_messages(research, config, "research"),
               progress=False)
        outcome = RefitJob(config, broker.bootstrap, kind="flow", **FAST_FLOW).run_once(
            TopicSource(broker.bootstrap, config, last_n=None))
        assert outcome.published and outcome.version == 2 and outcome.current_version == 1, outcome.reason
        assert outcome.statistic == "DP gap" and "replaces v1" in outcome.reason

        wait_for_log(worker, "now serving flow artifact version 2")
        flow = FlowPreprocessor.from_artifact(control.store.get(outcome.sha256))
        assert flow.training["warm_start"] is True  # started from the deployed identity flow
        ids = {f"after-{i}" for i in range(200)}
        send(broker.bootstrap, config, record_messages(stream.subset(slice(100, 300)), config, id_prefix="after"))
        after, dead = collect_outputs(broker.bootstrap, config, ids, 120.0, alive)
    assert not dead
    swapped = [copies[0] for copies in after.values()]
    assert {r["provenance"]["version"] for r in swapped} == {2}
    X = np.array([[r["original"][f] for f in config.features] for r in swapped])
    s = np.array([r["s"] for r in swapped])
    np.testing.assert_allclose([[r["features"][f] for f in config.features] for r in swapped], flow.transform(X, s))
    score = scorer.predict_proba(flow.transform(X, s))
    np.testing.assert_allclose([r["score"] for r in swapped], score)
    assert [r["decision"] for r in swapped] == (score >= 0.5).astype(int).tolist()
    assert all([c["kind"] for c in r["provenance"]["chain"]] == ["flow", "scorer"] for r in swapped)


def wait_for_log(worker: WorkerProcess, line: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in worker.log_path.read_text():
        assert time.monotonic() < deadline and worker.running, f"no {line!r} in the worker's log:\n{worker.log_tail()}"
        time.sleep(0.2)


def test_a_flow_refit_without_a_published_scorer_is_refused_with_the_reason(broker, adult, tmp_path):
    research, _ = adult
    config = flow_config(tmp_path, f"flow-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    window = ResearchWindow.of(research.X, research.s, research.u, y=research.y)

    outcome = RefitJob(config, broker.bootstrap, kind="flow", **FAST_FLOW).run_once(window)

    assert not outcome.published and outcome.reason.startswith("no scorer is published")


def test_a_flow_refit_needs_labels(broker, adult, tmp_path):
    research, _ = adult
    config = flow_config(tmp_path, f"flow-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
        balanced_scorer(research).to_artifact())

    outcome = RefitJob(config, broker.bootstrap, kind="flow", **FAST_FLOW).run_once(
        ResearchWindow.of(research.X, research.s, research.u))

    assert not outcome.published and "needs every research record labelled" in outcome.reason


def test_the_first_flow_must_beat_the_scorer_alone(adult):
    research, _ = adult
    trainer = FlowTrainer(adult_config(), tolerance=0.1)
    scorer = balanced_scorer(research)
    window = ResearchWindow.of(research.X, research.s, research.u, y=research.y)
    alone = trainer.baseline(window, {"scorer": type("A", (), {"module": scorer})()})
    expected = validate_flow(None, scorer, research.X, research.s, research.y)
    assert alone.value == pytest.approx(expected.dp_gap) and alone.metrics["accuracy"] == expected.accuracy


@pytest.mark.parametrize("candidate, current, refused", [
    ((0.10, 0.80), (0.10, 0.80), None),
    ((0.12, 0.80), (0.10, 0.80), None),  # within 10 % + 0.01
    ((0.13, 0.80), (0.10, 0.80), "candidate DP gap 0.13 > current 0.1 x 1.10 + 0.01"),
    ((0.05, 0.775), (0.10, 0.80), "candidate accuracy 0.775 is 0.025 below the current 0.800"),
    ((0.05, 0.785), (0.10, 0.80), None),
])
def test_a_flow_is_refused_for_a_wider_gap_or_a_real_accuracy_loss(candidate, current, refused):
    trainer = FlowTrainer(adult_config(), tolerance=0.1, max_accuracy_drop=0.02)
    as_validation = lambda gap, acc: Validation("DP gap", gap, "", metrics={"accuracy": acc})  # noqa: E731
    reason = trainer.refusal(as_validation(*candidate), as_validation(*current))
    assert reason == refused if refused is None else reason.startswith(refused)


# --------------------------------------------------------------------------- scorers at the end of the chain


def test_a_scorer_refit_trains_on_the_chain_output_and_publishes_a_scorer_with_its_group_map(broker, adult, tmp_path):
    from fairstream.models.scorer import Scorer
    from fairstream.models.plan import DistributionalRepair

    research, _ = adult
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"), records=AgentConfig(artifact=("plan", "scorer")),
                          monitor=MonitorConfig(statistic="mdp")).with_topics(prefix=f"sc-{uuid.uuid4().hex[:8]}")
    ensure_topics(broker.bootstrap, config.topics)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    plan = DistributionalRepair(n_q=50, columns=list(config.features)).fit(research.X, research.s, research.u)
    control.publish_sync(plan.to_artifact())
    window = ResearchWindow.of(research.X, research.s, research.u, y=research.y)

    outcome = RefitJob(config, broker.bootstrap, kind="scorer", method="ftm", lam=1.0, n_epochs=3).run_once(window)

    assert outcome.published and outcome.version == 1 and outcome.statistic == "MDP", outcome.reason
    assert {"accuracy", "dp_gap", "mdp", "auc"} <= set(outcome.metrics)
    scorer = Scorer.from_artifact(control.store.get(outcome.sha256))
    assert scorer.group_map_ is not None and scorer.columns_ == list(config.features)
    # It was fitted on what it will read, the plan's output: Adult's ages and hours are whole numbers, the
    # repaired ones mostly are not, and the map's fitted points are rows of the repaired window.
    points = scorer.group_map_.source_
    assert not np.allclose(points, np.round(points)) and np.allclose(research.X, np.round(research.X))

    again = RefitJob(config, broker.bootstrap, kind="scorer", method="ftm", lam=1.0, n_epochs=3).run_once(window)
    assert again.current_version == 1 and ("replaces v1" in again.reason or "not publishing" in again.reason)
