"""Monitor-only pipelines without a broker: an empty chain passes records through, and the monitor measures the
decisions (and scores) the records carry of their own model, or those group thresholds alone made on them."""

import json
import tomllib

import numpy as np
import pytest

from fairstream.models.thresholds import GroupThresholds
from fairstream.repair.measure.metrics import demographic_parity, dp_difference
from fairstream.streams.codec.repaired import NO_MODULE, RepairedBatch
from fairstream.streams.config import AgentConfig, PipelineConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

EMPTY = adult_config(records=AgentConfig(artifact=())).with_monitor(min_records=100, window_records=5000, buckets=1)


def own_model(n: int, seed: int = 0) -> dict:
    """Records whose own model decides more often for group 1 (and per stratum differently), with labels."""
    rng = np.random.default_rng(seed)
    s, u, y = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 2, n)
    score = np.clip(0.35 + 0.2 * s + 0.1 * u + 0.2 * y + rng.normal(0, 0.15, n), 0, 1)
    X = np.column_stack([rng.uniform(17, 90, n), rng.uniform(1, 99, n)])
    return {"X": X, "s": s, "u": u, "y": y, "score": score, "decision": (score >= 0.5).astype(np.int64),
            "keys": np.array([f"r{i}" for i in range(n)], dtype=object)}


def repaired_batch(data: dict, rows: slice, decision=None, score=None) -> RepairedBatch:
    X = data["X"][rows]
    return RepairedBatch(X, X, data["s"][rows], data["u"][rows], data["y"][rows], data["keys"][rows],
                         np.full(len(X), 1.7e9), out_of_range=np.zeros(len(X), dtype=bool),
                         decision=decision, score=score)


def gauge(monitor: FairnessMonitor, statistic: str, stage: str = "after") -> float:
    (value,) = [row[-1] for row in monitor.rows("count", statistic)
                if row[1] == stage and row[2:5] == ("all", "all", "all")]
    return value


def test_an_empty_chain_passes_every_record_through_with_provenance_naming_no_module():
    messages = [SimpleMessage(json.dumps({"id": i, "features": {"age": 30.0 + i, "hours-per-week": 40.0}, "s": i % 2,
                                          "u": 1, "ts": 1.7e9}).encode(), key=str(i).encode()) for i in range(4)]
    outcome = RecordRepairer(EMPTY).process(messages, ())
    records = [json.loads(value) for _, value in outcome.repaired]
    assert not outcome.dead and outcome.version == NO_MODULE == 0
    assert [r["features"] for r in records] == [r["original"] for r in records]
    assert [r["features"]["age"] for r in records] == [30.0, 31.0, 32.0, 33.0]
    assert {json.dumps(r["provenance"]) for r in records} == {
        '{"kind": null, "version": 0, "sha256": "", "seed": "", "chain": []}'}
    assert outcome.monitor_batch.decision is None and outcome.monitor_batch.score is None


def test_the_monitor_measures_the_records_own_decisions_as_offline_metrics_do():
    data, monitor = own_model(3000), FairnessMonitor(EMPTY)
    for start in range(0, 3000, 1000):
        rows = slice(start, start + 1000)
        monitor.observe_batch(repaired_batch(data, rows, decision=data["decision"][rows], score=data["score"][rows]))
    assert monitor.refused is None and monitor.version == NO_MODULE
    decision, s, u, y = data["decision"], data["s"], data["u"], data["y"]
    assert gauge(monitor, "dp_difference") == pytest.approx(dp_difference(decision, s), abs=1e-9)
    assert gauge(monitor, "dp_difference") > 0.1  # the own model is unfair: a gap a wrong reading would not hit
    assert gauge(monitor, "conditional_dp") == pytest.approx(
        demographic_parity(decision, s, u).conditional_difference, abs=1e-9)
    labelled = y == 1
    assert gauge(monitor, "eopp") == pytest.approx(dp_difference(decision[labelled], s[labelled]), abs=1e-9)
    # No classifier runs in a monitor-only pipeline: nothing is measured "before" it.
    assert not [row for row in monitor.rows("count") if row[0] in ("dp_difference", "eopp") and row[1] == "before"]


def test_a_batch_without_the_decisions_its_first_batch_carried_ends_the_monitoring_of_the_chain():
    data, monitor = own_model(400), FairnessMonitor(EMPTY)
    monitor.observe_batch(repaired_batch(data, slice(0, 200), decision=data["decision"][:200]))
    assert monitor.refused is None
    monitor.observe_batch(repaired_batch(data, slice(200, 400)))
    assert monitor.refused == () and monitor.unmeasured == 200


def test_thresholds_alone_decide_on_the_records_own_scores_and_the_monitor_measures_their_decisions():
    data = own_model(3000, seed=1)
    fitted = GroupThresholds(constraint="dp").fit(data["score"], data["s"], data["y"], data["u"])
    thresholds = Active("thresholds", 1, "t" * 64, None, fitted)
    decided = fitted.decide(data["score"], data["s"], data["u"], keys=data["keys"])
    monitor = FairnessMonitor(EMPTY)
    for start in range(0, 3000, 1000):
        rows = slice(start, start + 1000)
        monitor.observe_batch(repaired_batch(data, rows, decision=decided[rows], score=data["score"][rows]),
                              thresholds)
    assert monitor.refused is None and monitor.version == 1
    assert gauge(monitor, "dp_difference") == pytest.approx(dp_difference(decided, data["s"]), abs=1e-9)
    assert gauge(monitor, "dp_difference") < dp_difference(data["decision"], data["s"]) - 0.05  # not the own model's


def mapped_config(chain: tuple, **roles) -> PipelineConfig:
    data = tomllib.loads(EMPTY.to_toml())
    data["agents"]["records"]["artifact"] = list(chain)
    data["mapping"] = {"id": "application_id", "s": "applicant.sex", "u": "branch", "y": "repaid",
                       "features": {"age": "applicant.age", "hours-per-week": "applicant.hours"}, **roles}
    return PipelineConfig.from_dict(data)


def loan_messages(data: dict, rows: slice) -> list[SimpleMessage]:
    return [SimpleMessage(json.dumps({
        "application_id": str(key), "applicant": {"age": float(x[0]), "hours": float(x[1]), "sex": int(s)},
        "branch": int(u), "repaid": int(y), "channel": "web",
        "model": {"score": float(score), "decision": bool(decision)}}).encode(), key=str(key).encode())
        for key, x, s, u, y, score, decision in zip(*(data[name][rows] for name in (
            "keys", "X", "s", "u", "y", "score", "decision")))]


def test_the_records_own_mapped_decisions_and_scores_reach_the_monitor_batch_of_an_empty_chain():
    data = own_model(300, seed=2)
    config = mapped_config((), score="model.score", decision="model.decision")
    outcome = RecordRepairer(config).process(loan_messages(data, slice(None)), ())
    assert not outcome.dead and len(outcome.repaired) == 300
    assert np.array_equal(outcome.monitor_batch.decision, data["decision"])
    assert np.array_equal(outcome.monitor_batch.score, data["score"])


def test_thresholds_alone_decide_on_the_records_own_mapped_score_and_the_monitor_batch_holds_their_decisions():
    data = own_model(600, seed=4)
    fitted = GroupThresholds(constraint="dp").fit(data["score"], data["s"], data["y"], data["u"])
    config = mapped_config(("thresholds",), score="model.score", decision="model.decision")
    outcome = RecordRepairer(config).process(loan_messages(data, slice(None)),
                                             (Active("thresholds", 1, "t" * 64, None, fitted),))
    expected = fitted.decide(data["score"], data["s"], data["u"], keys=data["keys"].astype(str))
    assert not outcome.dead and not np.array_equal(expected, data["decision"])
    assert np.array_equal(outcome.monitor_batch.decision, expected)  # the chain's decision wins over the record's
    assert np.array_equal(outcome.monitor_batch.score, data["score"])  # the score it read: the record's own
    records = [json.loads(value) for _, value in outcome.repaired]
    assert [r["model"]["decision"] for r in records] == data["decision"].astype(bool).tolist()  # passed through


def test_a_shift_of_the_records_own_decisions_is_one_drift_event_of_their_dp_gap():
    config = mapped_config((), decision="model.decision").with_monitor(
        statistic="dp_difference", threshold=0.2, min_records=500, window_records=8000, buckets=8,
        cooldown_seconds=3600.0)
    monitor, rng = FairnessMonitor(config), np.random.default_rng(8)
    data = own_model(30000, seed=8)
    fair = (rng.uniform(size=30000) < 0.4).astype(np.int64)  # the own model decides alike for both groups ...
    unfair = (rng.uniform(size=30000) < 0.2 + 0.5 * data["s"]).astype(np.int64)  # ... then favours group 1
    decisions = np.concatenate([fair[:10000], unfair[10000:]])
    events = []
    for start in range(0, 30000, 1000):
        rows = slice(start, start + 1000)
        found = monitor.observe_batch(repaired_batch(data, rows, decision=decisions[rows]))
        assert not found or start >= 10000, "no drift while the decisions are fair"
        events += found
    assert [event.statistic for event in events] == ["dp_difference"]
    assert events[0].value > 0.2 and events[0].version == NO_MODULE
