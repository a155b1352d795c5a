"""Candidates proven on live traffic before they serve: each promotion policy with a real worker on Apache Kafka.

The record chain is ``scorer -> thresholds`` on Adult. The serving thresholds were fitted for demographic parity
with the groups' labels swapped (a fit on mislabelled data), which leaves the decisions' DP gap near 0.16; a
candidate fitted for DP on the true groups closes it (near 0.01), and one fitted with the groups swapped again does
not beat the thresholds fitted on the true groups. Under ``promotion = "shadow"`` the pipeline's monitoring agent
(``fairstream monitor``) promotes the first and retires the second on the worker's paired live figures, once its
sequential test is sure at ``shadow.alpha``; under ``"approve"`` a candidate waits in shadow until a person approves
or rejects it with ``fairstream artifacts approve|reject``. Every output is checked
bit for bit against the thresholds version it is stamped with: a candidate never decides a record before it is
promoted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.thresholds import GroupThresholds
from fairstream.repair import datasets
from fairstream.streams.cli import main
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.ops.supervise import AgentProcess, WorkerProcess
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for
from tests.streams.refit.test_flow_refit import balanced_scorer

from .outputs import collect_outputs, send
from .test_liveness import died, metric_samples, wait_ready

pytestmark = pytest.mark.integration

WAIT = 30.0  # seconds a worker is given to act on a record or a batch
SHADOW_RECORDS = 400  # live records a candidate is measured on before the shadow policy may decide
ROUND = 1500  # records sent at a time while the shadow policy's test is not sure yet
ROUNDS = 8


class Pipeline:
    """A worker serving ``scorer -> thresholds`` under one promotion policy, and the thresholds it was given."""

    def __init__(self, broker, tmp_path, research, archive, promotion: str):
        self.bootstrap, self.archive, self.research, self.sent = broker.bootstrap, archive, research, 0
        config = adult_config(artifact_dir=str(tmp_path / "artifacts"),
                              records=AgentConfig(artifact=("scorer", "thresholds")))
        self.config = replace(config, promotion=promotion).with_topics(prefix=f"promote-{promotion}").with_monitor(
            statistic="dp_difference", min_records=100, window_records=2000, buckets=1, metrics_port=0,
        ).with_shadow(min_records=SHADOW_RECORDS, max_accuracy_drop=0.05)
        ensure_topics(self.bootstrap, self.config.topics)
        self.toml = tmp_path / "pipeline.toml"
        self.toml.write_text(self.config.to_toml())
        self.control = ControlClient.of(self.config, self.bootstrap)  # the pipeline's own gate and policy
        self.scorer = balanced_scorer(research)
        self.research_scores = self.scorer.predict_proba(research.X)
        self.thresholds: dict[int, GroupThresholds] = {}
        self.tmp_path = tmp_path
        self.worker = WorkerProcess(self.config, self.bootstrap, tmp_path, name=promotion)
        self.agent = AgentProcess(self.config, self.bootstrap, tmp_path, name=f"{promotion}-monitor")

    def publish_thresholds(self, candidate: bool, swapped: bool = False, random_state: int = 0) -> int:
        """Thresholds for DP fitted on the research split, on its groups or (``swapped``) on the groups' labels
        swapped: those widen the gap they were meant to close."""
        r = self.research
        fitted = GroupThresholds(constraint="dp", random_state=random_state).fit(
            self.research_scores, 1 - r.s if swapped else r.s, r.y, r.u)
        version = self.control.publish_sync(fitted.to_artifact(), candidate=candidate,
                                            reason="thresholds for DP" + " (groups swapped)" * swapped).version
        self.thresholds[version] = fitted
        return version

    def stream(self, n: int) -> list[dict]:
        """Send the next ``n`` archive records; their outputs in order, each checked against its stamped version."""
        part = self.archive.subset(slice(self.sent, self.sent + n))
        messages = record_messages(part, self.config, id_prefix=f"r{self.sent}")
        self.sent += n
        send(self.bootstrap, self.config, messages)
        ids = [key.decode() for key, _ in messages]
        repaired, dead = collect_outputs(self.bootstrap, self.config, set(ids), timeout=60, alive=died(self.worker))
        assert not dead, f"dead-lettered: {[d[0]['reason'] for d in dead.values()][:3]}"
        records = [repaired[rid][0] for rid in ids]
        self.check_decided_by_stamp(records, ids, part)
        return records

    def check_decided_by_stamp(self, records: list[dict], ids: list[str], part) -> None:
        versions = stamped(records)
        score = np.array([r["score"] for r in records])
        decision = np.array([r["decision"] for r in records])
        for version in np.unique(versions):
            rows = np.flatnonzero(versions == version)
            expected = self.thresholds[version].decide(score[rows], part.s[rows], part.u[rows],
                                                       keys=np.array(ids, dtype=object)[rows])
            assert np.array_equal(decision[rows], expected), f"thresholds v{version}"

    def gauges(self) -> list:
        return metric_samples(self.worker)

    def candidate_version(self) -> float | None:
        return self.version_gauge("fairstream_candidate_version")

    def serving(self, version: int) -> bool:
        """Whether the worker serves thresholds ``version`` now (its exported version, not an old log line)."""
        return self.version_gauge("fairstream_artifact_version") == version

    def version_gauge(self, name: str) -> float | None:
        found = [s.value for s in self.gauges() if s.name == name and s.labels.get("kind") == "thresholds"]
        return found[0] if found else None

    def dp_gap(self, role: str) -> float | None:
        """The exported dp_difference after the chain over the count window, of the active chain or the candidate."""
        found = [s.value for s in self.gauges() if s.name == "fairstream_fairness_rate_gap"
                 and s.labels.get("statistic") == "dp_difference" and s.labels.get("stage") == "after"
                 and s.labels.get("window") == "count" and s.labels.get("stratum") == "all"
                 and s.labels.get("role") == role]
        return found[0] if found else None

    def decisions(self, version: int) -> list:
        """The decision records (promote, approve, reject, retire) naming thresholds ``version``, in log order."""
        return [r for r in self.control.history_sync() if r.kind == "thresholds" and r.version == version
                and r.action in ("promote", "approve", "reject", "retire")]

    def stream_until_decided(self, version: int) -> list:
        """Send records a round at a time until the agent decided ``version`` (its test needs a few thousand)."""
        for _ in range(ROUNDS):
            if decided := self.decisions(version):
                return decided
            self.stream(ROUND)
        return wait_for(lambda: self.decisions(version), WAIT, f"the shadow policy's decision on version {version}")

    def cli(self, *args) -> int:
        return main([*args, "--broker", self.bootstrap, "--config", str(self.toml)])


def stamped(records: list[dict]) -> np.ndarray:
    """The thresholds version each output was decided by (its provenance)."""
    return np.array([dict((s["kind"], s["version"]) for s in r["provenance"]["chain"])["thresholds"]
                     for r in records])


def started(broker, tmp_path_factory, promotion: str):
    research, archive = datasets.load("adult").split(4000, seed=5)
    live = Pipeline(broker, tmp_path_factory.mktemp(f"promotion-{promotion}"), research, archive, promotion)
    first = promotion == "approve"  # the pipeline's policy: under "approve" even a first version waits for a person
    assert live.control.publish_sync(live.scorer.to_artifact(), candidate=first).version == 1
    assert live.publish_thresholds(candidate=first, swapped=True) == 1
    for kind in ("scorer", "thresholds") if first else ():
        live.control.decide_sync(kind, 1, "approve", actor="risk officer", reason="the first version")
    live.worker.start()
    if promotion == "shadow":  # the shadow policy runs in the pipeline's monitoring agent
        live.agent.start()
    wait_ready(live.worker)
    return live


def running(broker, tmp_path_factory, promotion: str):
    """A started pipeline under ``promotion`` for a module's tests; its (current) worker stopped after them."""
    live = started(broker, tmp_path_factory, promotion)
    try:
        yield live
    finally:
        live.worker.stop()
        live.agent.stop()


@pytest.fixture(scope="module")
def shadow(broker, tmp_path_factory):
    yield from running(broker, tmp_path_factory, "shadow")


@pytest.fixture(scope="module")
def approve(broker, tmp_path_factory):
    yield from running(broker, tmp_path_factory, "approve")


# --------------------------------------------------------------------------- promotion = "shadow"


def test_shadow_promotes_a_candidate_that_closes_the_gap_on_live_records(shadow):
    assert set(stamped(shadow.stream(200))) == {1}
    assert shadow.publish_thresholds(candidate=True) == 2
    wait_for(lambda: shadow.candidate_version() == 2, WAIT, "the worker shadows candidate version 2")
    records = shadow.stream(SHADOW_RECORDS + 200)
    versions = stamped(records)
    # Nothing decided by the candidate before it was measured on SHADOW_RECORDS live records.
    assert set(versions) <= {1, 2} and np.count_nonzero(versions == 1) >= SHADOW_RECORDS, np.bincount(versions)
    [promotion] = shadow.stream_until_decided(2)
    assert promotion.action == "promote" and promotion.actor.startswith("shadow-policy@"), promotion
    figures = promotion.statistics
    assert figures["records"] >= SHADOW_RECORDS and figures["alpha"] == 0.05
    assert figures["bound.dp_difference.lower"] > 0  # better for sure, at alpha, at every look
    assert figures["candidate.dp_difference"] < figures["active.dp_difference"] - 0.05, figures
    wait_for(lambda: shadow.serving(2), WAIT, "the worker serves version 2")
    assert set(stamped(shadow.stream(300))) == {2}
    wait_for(lambda: shadow.candidate_version() is None, WAIT, "no candidate once it was promoted")


def test_shadow_retires_a_candidate_that_does_not_beat_the_serving_chain(shadow):
    assert shadow.publish_thresholds(candidate=True, swapped=True, random_state=3) == 3
    wait_for(lambda: shadow.candidate_version() == 3, WAIT, "the worker shadows candidate version 3")
    assert set(stamped(shadow.stream(SHADOW_RECORDS + 100))) == {2}
    [retirement] = shadow.stream_until_decided(3)
    assert retirement.action == "retire" and retirement.actor.startswith("shadow-policy@"), retirement
    assert "dp_difference" in retirement.reason, retirement.reason
    wait_for(lambda: shadow.candidate_version() is None, WAIT, "no candidate once it was retired")
    assert set(stamped(shadow.stream(100))) == {2}


def test_a_rollback_after_a_promotion_serves_the_version_before_it(shadow):
    record = shadow.control.rollback_sync("thresholds", actor="on-call", reason="the promotion is rolled back")
    assert (record.action, record.version) == ("rollback", 1)
    wait_for(lambda: shadow.serving(1), WAIT, "the worker serves version 1")
    assert set(stamped(shadow.stream(200))) == {1}


# --------------------------------------------------------------------------- promotion = "approve"


def test_approve_keeps_the_candidate_in_shadow_until_a_person_approves_it(approve, capsys):
    assert approve.publish_thresholds(candidate=True) == 2
    wait_for(lambda: approve.candidate_version() == 2, WAIT, "the worker shadows candidate version 2")
    assert set(stamped(approve.stream(SHADOW_RECORDS + 200))) == {1}
    # Its live figures are exported beside the serving chain's, and show it would close the gap.
    active, candidate = wait_for(lambda: (lambda a, c: (a, c) if a is not None and c is not None else None)(
        approve.dp_gap("active"), approve.dp_gap("candidate")), WAIT, "the candidate's live dp_difference")
    assert candidate < active - 0.05, (active, candidate)
    assert approve.decisions(2) == []  # no service decides under "approve"
    assert approve.cli("artifacts", "approve", "thresholds", "2", "--by", "Ada Lovelace",
                       "--reason", "closes the DP gap on live records") == 0
    assert "approve" in capsys.readouterr().out
    [approval] = approve.decisions(2)
    assert (approval.action, approval.actor) == ("approve", "Ada Lovelace")
    wait_for(lambda: approve.serving(2), WAIT, "the worker serves version 2")
    assert set(stamped(approve.stream(200))) == {2}


def test_a_rejected_candidate_never_serves(approve, capsys):
    assert approve.publish_thresholds(candidate=True, swapped=True, random_state=3) == 3
    wait_for(lambda: approve.candidate_version() == 3, WAIT, "the worker shadows candidate version 3")
    assert approve.cli("artifacts", "reject", "thresholds", "3", "--by", "Ada Lovelace",
                       "--reason", "gives back the DP gap") == 0
    capsys.readouterr()
    [rejection] = approve.decisions(3)
    assert (rejection.action, rejection.actor) == ("reject", "Ada Lovelace")
    wait_for(lambda: approve.candidate_version() is None, WAIT, "no candidate once it was rejected")
    assert set(stamped(approve.stream(200))) == {2}
    assert approve.cli("artifacts", "approve", "thresholds", "3", "--by", "Ada", "--reason", "changed my mind") != 0


def test_a_worker_restarted_mid_shadow_resumes_the_same_candidate(approve):
    assert approve.publish_thresholds(candidate=True, random_state=11) == 4
    wait_for(lambda: approve.candidate_version() == 4, WAIT, "the worker shadows candidate version 4")
    approve.worker.stop()
    approve.worker = WorkerProcess(approve.config, approve.bootstrap, approve.tmp_path, name="restarted")  # a fresh log
    approve.worker.start()
    wait_ready(approve.worker)
    assert approve.candidate_version() == 4
    assert set(stamped(approve.stream(300))) == {2}
    wait_for(lambda: approve.dp_gap("candidate") is not None, WAIT, "the restarted worker measures the candidate again")
    approve.control.decide_sync("thresholds", 4, "approve", actor="Ada Lovelace", reason="resumed after a restart")
    wait_for(lambda: approve.serving(4), WAIT, "the worker serves version 4")
    assert set(stamped(approve.stream(200))) == {4}
