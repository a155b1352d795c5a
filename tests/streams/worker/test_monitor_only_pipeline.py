"""Monitor-only pipelines on Apache Kafka with real worker processes: a team's own loan records, mapped.

The records carry their own model's score and decision (``model.score``, ``model.decision`` as true/false) and a
label. A worker with ``agents.records.artifact = []`` applies nothing and publishes nothing: it consumes at once,
passes every record through, and its ``/metrics`` exports the DP gap, the conditional DP and equal opportunity of
the records' own decisions, equal to the offline metrics of those decisions. A worker serving group thresholds alone
decides on the records' own scores, and its gauge is the gap of the thresholds' decisions, not of the model's.
A worker that ignored the records' decisions would export no decision statistic at all; one that measured
anything else (the scores at 0.5, the thresholds' input) would miss the offline figure by far more than 1e-9.
"""

from __future__ import annotations

import json
import time
import tomllib
from datetime import datetime, timezone

import numpy as np
import pytest

from fairstream.models.thresholds import GroupThresholds
from fairstream.repair import datasets
from fairstream.repair.measure.metrics import demographic_parity, dp_difference
from fairstream.streams.config import PipelineConfig, adult_config
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.demo.collect import TopicReader
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics

from .outputs import send
from .test_liveness import died, metric_samples, wait_ready

pytestmark = pytest.mark.integration

N = 1500  # records sent to each worker; its count window (WINDOW) holds them all
WINDOW = 4000
SEXES, BRANCHES = ("F", "M"), ("north", "south")
MAPPING = {"id": "application_id", "time": {"path": "submitted_at", "format": "iso8601"},
           "s": {"path": "applicant.sex", "values": {"F": 0, "M": 1}},
           "u": {"path": "branch", "values": {"north": 0, "south": 1}}, "y": "repaid",
           "score": "model.score", "decision": "model.decision",
           "features": {"age": "applicant.age", "hours-per-week": "applicant.hours"}}


def pipeline_config(tmp_path, prefix: str, chain: list) -> PipelineConfig:
    data = tomllib.loads(adult_config(artifact_dir=str(tmp_path / "artifacts")).to_toml())
    data["agents"]["records"]["artifact"] = chain
    data["topics"]["prefix"] = prefix
    data["mapping"] = MAPPING
    data["monitor"].update(statistic=["dp_difference", "conditional_dp", "eopp"], threshold=0.1, min_records=100,
                           window_records=WINDOW, buckets=1, metrics_port=0)
    return PipelineConfig.from_dict(data)


def loan_records(part, prefix: str, seed: int) -> tuple[list[tuple[bytes, bytes]], dict]:
    """The archive's rows as a lender's records whose own model favours men; the messages and their columns."""
    rng = np.random.default_rng(seed)
    n = len(part.s)
    score = np.clip(0.3 + 0.25 * part.s + 0.2 * part.y + rng.normal(0, 0.15, n), 0, 1).round(6)
    decision = score >= 0.5
    ids = [f"{prefix}-{i}" for i in range(n)]
    now = datetime.now(timezone.utc).isoformat()
    messages = [(rid.encode(), json.dumps({
        "application_id": rid, "submitted_at": now, "amount": 12000 + i, "channel": "web",
        "applicant": {"age": float(part.X[i, 0]), "hours": float(part.X[i, 1]), "sex": SEXES[part.s[i]]},
        "branch": BRANCHES[part.u[i]], "repaid": bool(part.y[i]),
        "model": {"score": float(score[i]), "decision": bool(decision[i]), "name": "credit-v7"}}).encode())
        for i, rid in enumerate(ids)]
    return messages, {"ids": ids, "score": score, "decision": decision.astype(np.int64), "s": part.s, "u": part.u,
                      "y": part.y}


def outputs(worker: WorkerProcess, config: PipelineConfig, ids: list[str], timeout: float = 90.0) -> list[dict]:
    """The output of every id (by its Kafka key, which outputs keep), in the order of ``ids``; none dead-lettered."""
    found, dead, alive = {}, [], died(worker)
    with TopicReader(worker.bootstrap, config.topics.records_repaired) as out, \
            TopicReader(worker.bootstrap, config.topics.dlq) as dlq:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(found) < len(ids) and not dead:
            found.update((m.key.decode(), json.loads(m.value)) for m in out.poll())
            dead += [json.loads(m.value)["reason"] for m in dlq.poll()]
            assert alive() is None, alive()
    assert not dead, f"dead-lettered: {dead[:3]}"
    assert set(ids) <= found.keys(), f"{len(set(ids) - found.keys())} records never came out"
    return [found[rid] for rid in ids]


def gauges(worker: WorkerProcess) -> tuple[dict, float | None]:
    """The decision gauges after the chain, all strata and pairs, over the count window (statistic -> value), and the
    records that window holds."""
    samples = metric_samples(worker)
    found = {sample.labels["statistic"]: sample.value for sample in samples
             if sample.name in ("fairstream_fairness_rate_gap", "fairstream_fairness_ratio_gap")
             and sample.labels.get("stage") == "after" and sample.labels.get("window") == "count"
             and sample.labels.get("stratum") == "all" and sample.labels.get("group_pair") == "all"
             and sample.labels.get("role") == "active"}
    held = [sample.value for sample in samples
            if sample.name == "fairstream_monitor_window_records" and sample.labels.get("window") == "count"]
    return found, (held or [None])[0]


def exported_once_all_are_in(worker: WorkerProcess, n: int) -> dict:
    """The gauges once the count window holds ``n`` records (exported at most once a second after a batch)."""
    deadline, found, held = time.monotonic() + 30, {}, None
    while time.monotonic() < deadline and held != n:
        found, held = gauges(worker)
        time.sleep(0.2)
    assert held == n, (held, n)
    return found


@pytest.fixture(scope="module")
def research_and_archive():
    return datasets.load("adult").split(3000, seed=5)


@pytest.fixture(scope="module")
def monitor_only(broker, tmp_path_factory, research_and_archive):
    tmp = tmp_path_factory.mktemp("monitor-only")
    config = pipeline_config(tmp, "monitoronly", [])
    ensure_topics(broker.bootstrap, config.topics)
    worker = WorkerProcess(config, broker.bootstrap, tmp, name="monitor-only").start()
    try:
        wait_ready(worker)  # nothing is published: an empty chain waits for no artifact
        yield config, worker
    finally:
        worker.stop()


def test_a_monitor_only_pipeline_exports_the_dp_gap_of_the_records_own_decisions(monitor_only, research_and_archive):
    config, worker = monitor_only
    messages, own = loan_records(research_and_archive[1].subset(slice(0, N)), "own", seed=11)
    send(worker.bootstrap, config, messages)
    records = outputs(worker, config, own["ids"])
    # Every record passes through with what it had, its own model's fields included, and no module in provenance.
    sent = [json.loads(value) for _, value in messages]
    assert all(r["model"] == s["model"] and r["channel"] == s["channel"] for r, s in zip(records, sent))
    assert {json.dumps(r["fairstream"]["provenance"]["chain"]) for r in records} == {"[]"}
    exported = exported_once_all_are_in(worker, N)
    decision, s, u, y = own["decision"], own["s"], own["u"], own["y"]
    offline = dp_difference(decision, s)
    print(f"monitor-only DP gap: exported {exported['dp_difference']!r}, offline {offline!r}, "
          f"difference {abs(exported['dp_difference'] - offline):.3g}")
    assert abs(exported["dp_difference"] - offline) <= 1e-9
    assert offline > 0.1  # the own model is unfair: an equality a constant gauge cannot meet
    assert exported["conditional_dp"] == pytest.approx(demographic_parity(decision, s, u).conditional_difference,
                                                       abs=1e-9)
    assert exported["eopp"] == pytest.approx(dp_difference(decision[y == 1], s[y == 1]), abs=1e-9)
    assert exported["dp_ratio"] == pytest.approx(1 - demographic_parity(decision, s).ratio, abs=1e-9)
    assert exported["dp_difference"] != pytest.approx(dp_difference((own["score"] >= 0.4).astype(int), s), abs=1e-3)


@pytest.fixture(scope="module")
def thresholds_only(broker, tmp_path_factory, research_and_archive):
    tmp = tmp_path_factory.mktemp("thresholds-only")
    config = pipeline_config(tmp, "thronly", ["thresholds"])
    ensure_topics(broker.bootstrap, config.topics)
    research = research_and_archive[0]
    _, fit = loan_records(research, "fit", seed=3)  # the model's scores of the research split
    fitted = GroupThresholds(constraint="dp").fit(fit["score"], research.s, research.y, research.u)
    control = ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir))
    assert control.publish_sync(fitted.to_artifact()).version == 1
    worker = WorkerProcess(config, broker.bootstrap, tmp, name="thresholds-only").start()
    try:
        wait_ready(worker)
        yield config, worker, fitted
    finally:
        worker.stop()


def test_thresholds_alone_decide_on_the_records_own_scores_and_their_gap_is_exported(thresholds_only,
                                                                                     research_and_archive):
    config, worker, fitted = thresholds_only
    messages, own = loan_records(research_and_archive[1].subset(slice(N, 2 * N)), "thr", seed=12)
    send(worker.bootstrap, config, messages)
    records = outputs(worker, config, own["ids"])
    expected = fitted.decide(own["score"], own["s"], own["u"], keys=np.array(own["ids"], dtype=object))
    decided = np.array([r["fairstream"]["decision"] for r in records])
    assert np.array_equal(decided, expected)
    assert all(r["model"]["decision"] == bool(d) for r, d in zip(records, own["decision"]))  # the model's, kept
    exported = exported_once_all_are_in(worker, N)
    assert abs(exported["dp_difference"] - dp_difference(expected, own["s"])) <= 1e-9
    assert abs(dp_difference(expected, own["s"]) - dp_difference(own["decision"], own["s"])) > 0.05
