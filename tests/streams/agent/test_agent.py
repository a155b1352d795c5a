"""The monitoring agent's decisions, without a broker: one drift decision and one re-fit request per pipeline,
whatever the number of workers; the shadow policy on every worker's paired evidence pooled."""

from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.agent.service import MonitoringAgent, pipeline_figures
from fairstream.streams.codec.refit_requests import parse_request
from fairstream.streams.codec.repaired import decode_repaired
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.partials import PartialAggregates, paired_figures
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

RATE = 100.0  # records per second of event time
STEP = 300  # records per step of the simulated stream: three whole slices


class Clock:
    """The agent's monotonic clock, moved by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def repaired(config, data, plan, prefix: str, start: float):
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix=prefix)]
    batch = decode_repaired([v for _, v in RecordRepairer(config).process(messages, plan).repaired], config)
    return replace(batch, ts=start + np.arange(len(batch)) / RATE)


def shifted(data, hours=15.0):
    """The demo's drift: in the college stratum, women's hours-per-week go up by ``hours``."""
    X = data.X.copy()
    X[(data.u == 1) & (data.s == 0), 1] += hours
    return replace(data, X=np.clip(X, 1, 99))


@pytest.fixture(scope="module")
def drifting():
    config = adult_config(monitor=MonitorConfig(window_records=2000, buckets=4, min_records=500, lateness_seconds=1.0,
                                                cooldown_seconds=3600.0, threshold=0.1))
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = Active("plan", 1, "p" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    stable = repaired(config, archive.subset(slice(0, 6000)), plan, "stable", 1.7e9)
    drifted = repaired(config, shifted(archive.subset(slice(6000, 14000))), plan, "drifted", 1.7e9 + 6000 / RATE)
    return config, plan, stable, drifted


def run(config, plan, batches, n_workers: int, name: str):
    """The stream in steps of STEP records: each step's records go to ``n_workers`` workers by key, every worker
    sends its partials, the agent's clock moves past the lateness and it ticks. Returns (agent, step of each
    drift event)."""
    clock = Clock()
    agent = MonitoringAgent(config, metrics=PipelineMetrics(name, process="agent"), monotonic=clock)
    workers = []
    for w in range(n_workers):
        partials = PartialAggregates(config, f"w{w}")
        workers.append((FairnessMonitor(config, detect=False, sink=partials.add), partials))
    found, step = [], 0
    for batch in batches:
        owner = np.array([hash(k) % n_workers for k in batch.keys.tolist()]) if n_workers > 1 else \
            np.zeros(len(batch), dtype=int)
        for start in range(0, len(batch), STEP):
            rows = np.arange(start, min(start + STEP, len(batch)))
            for w, (monitor, partials) in enumerate(workers):
                mine = rows[owner[rows] == w]
                if len(mine):
                    monitor.observe_batch(batch.take(mine), plan)
                for message in partials.take():
                    agent.take(message)
            clock.now += 2.0
            found += [(step, event) for event in agent.tick()]
            step += 1
    return agent, found


def test_one_drift_one_request_whatever_the_number_of_workers(drifting):
    config, plan, stable, drifted = drifting
    one_agent, one = run(config, plan, [stable, drifted], 1, "drift-1")
    three_agent, three = run(config, plan, [stable, drifted], 3, "drift-3")
    assert len(one) == 1, one  # hysteresis: one event per shift
    assert [step for step, _ in three] == [step for step, _ in one]  # as fast with three workers as with one
    assert one[0][0] >= 6000 // STEP  # after the shift, not before
    (topic, key, value, _), = three_agent.outbox
    request = parse_request(value)
    assert topic == config.topics.refit_requests and key == b"plan"
    assert request.kind == "plan" and request.version == 1 and request.statistic == "dependence_e"
    assert request.value == pytest.approx(three[0][1].value)


def test_a_monitor_only_pipeline_detects_and_asks_nothing(drifting):
    config, plan, stable, drifted = drifting
    monitor_only = replace(config, records=AgentConfig(artifact=()))
    agent = MonitoringAgent(monitor_only, metrics=PipelineMetrics("drift-monitor-only", process="agent"))
    agent._drifted(type("Event", (), {"statistic": "dependence_e", "detector": "adwin", "value": 0.2,
                                      "version": -1})())
    assert agent.outbox == []


def test_pooled_paired_evidence_counts_every_workers_records():
    """The paired figures of every worker add up: the agent's evidence is the pipeline's records."""
    config = adult_config()
    groups = np.array([0, 1])
    rng = np.random.default_rng(0)
    n = 5000
    active_decisions = (rng.random(n) < 0.3).astype(np.int64)
    candidate_decisions = np.where(rng.random(n) < 0.1, 1 - active_decisions, active_decisions)
    s = rng.integers(0, 2, n)
    from fairstream.streams.codec.repaired import RepairedBatch

    def batch(decisions, rows):
        return RepairedBatch(np.zeros((len(rows), 2)), np.zeros((len(rows), 2)), s[rows], np.zeros(len(rows), int),
                             None, np.arange(n)[rows].astype(str), np.zeros(len(rows)), decision=decisions[rows])

    whole = paired_figures(batch(active_decisions, np.arange(n)), batch(candidate_decisions, np.arange(n)), groups)
    parts = [np.arange(n)[np.arange(n) % 3 == w] for w in range(3)]
    pooled = PartialAggregates(config, "pool")
    for rows in parts:
        pooled.add_paired((("plan", 2),), (("plan", 1),), paired_figures(batch(active_decisions, rows),
                                                                         batch(candidate_decisions, rows), groups))
    held = pooled.paired[(("plan", 2),), (("plan", 1),)]
    for name, sums in whole.items():
        for field in ("n", "active", "active_sq", "change", "change_sq"):
            assert np.allclose(held[name][field], sums[field]), (name, field)
    assert whole["decision_rate"]["change_sq"].sum() == np.sum(active_decisions != candidate_decisions)


def test_the_announced_figures_say_how_many_decisions_change():
    from fairstream.streams.agent.promotion import PairedSums, ShadowEvidence, verdict
    from fairstream.streams.config import ShadowConfig

    rng = np.random.default_rng(1)
    group = rng.integers(0, 2, 20_000)
    active = (rng.random(20_000) < np.where(group == 1, 0.2, 0.32)).astype(float)
    candidate = np.where((group == 1) & (rng.random(20_000) < 0.1), 1.0, active)
    rates = PairedSums.of(active, candidate - active, group, ("0", "1"))
    decisions = PairedSums.of(active, candidate - active, np.zeros(20_000, int), ("all",))
    evidence = ShadowEvidence(20_000, {"dp_difference": rates}, {}, decisions=decisions)
    result = verdict(evidence, ShadowConfig(), ("dp_difference",))
    figures = pipeline_figures(result, evidence, None, ("dp_difference",))
    assert figures["verdict"] == 1.0 and result.action == "promote"
    assert figures["changed"] == np.sum(candidate != active)
    assert figures["changed.1"] == np.sum((candidate != active) & (group == 1)) and figures["changed.0"] == 0
    assert figures["active.dp_difference"] > figures["candidate.dp_difference"]


from fairstream.streams.agent.service import DECISION_RETRY_SECONDS  # noqa: E402
from fairstream.streams.control.gate import GENESIS, Authority  # noqa: E402


class Registry:
    """What the control topic says serves: plan version 1 then the scorer, and a pending plan candidate version 2."""

    def __init__(self):
        from fairstream.streams.control.registry import Served

        active = Active("plan", 1, "a" * 64, None, None)
        scorer = Active("scorer", 1, "s" * 64, None, None)
        self.candidate = Active("plan", 2, "b" * 64, None, None)
        self.state = Served({"plan": active, "scorer": scorer}, {"plan": self.candidate})
        self.gate = Authority().gate()  # the trail's last record: where the policy's decision goes

    def served(self):
        return self.state


def paired_stream(n: int, improvement: float, seed: int):
    """Decisions of two correlated chains on the same records. ``improvement`` 0: the candidate re-draws one
    decision in ten from the same group rates (as fair, decided differently); else it accepts more of group 1, whose
    rate rises by about ``improvement`` (the gap narrows by it)."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 2, n)
    rates = np.where(group == 1, 0.22, 0.30)
    active = (rng.random(n) < rates).astype(np.int64)
    if improvement == 0:
        return group, active, np.where(rng.random(n) < 0.1, (rng.random(n) < rates).astype(np.int64), active)
    return group, active, np.where((group == 1) & (rng.random(n) < improvement / 0.78), 1, active)


@pytest.mark.parametrize("improvement, decided", [(0.05, "promote"), (0.0, None)])
def test_the_shadow_policy_decides_once_on_every_workers_pooled_records(improvement, decided):
    from fairstream.streams.codec.repaired import RepairedBatch
    from fairstream.streams.control.records import parse_control

    config = adult_config(promotion="shadow", records=AgentConfig(artifact=("plan", "scorer"))).with_shadow(
        statistic="dp_difference")
    agent = MonitoringAgent(config, metrics=PipelineMetrics(f"shadow-{improvement}", process="agent"))
    agent.registry = Registry()
    group, active, candidate = paired_stream(30_000, improvement, seed=3)
    n = len(group)
    workers = [PartialAggregates(config, f"w{w}") for w in range(3)]

    def batch(decisions, rows):
        return RepairedBatch(np.zeros((len(rows), 2)), np.zeros((len(rows), 2)), group[rows], np.zeros(len(rows), int),
                             None, rows.astype(str), np.zeros(len(rows)), decision=decisions[rows])

    for start in range(0, n, 3000):  # each worker takes a third of every stretch of records
        for w, partials in enumerate(workers):
            rows = np.arange(start, start + 3000)[np.arange(3000) % 3 == w]
            partials.add_paired((("plan", 2), ("scorer", 1)), (("plan", 1), ("scorer", 1)),
                                paired_figures(batch(active, rows), batch(candidate, rows), np.array([0, 1])))
            for message in partials.take():
                agent.take(message)
        agent.tick()
    decisions = [parse_control(value) for topic, _, value, _ in agent.outbox if topic == config.topics.control]
    assert agent.figures["records"] == n  # every worker's records, pooled
    if decided is None:
        assert decisions == [] and agent.verdict.action == "wait"
        return
    (record,) = decisions  # once, however many ticks follow
    assert (record.kind, record.version, record.action) == ("plan", 2, decided)
    assert record.actor.startswith("shadow-policy@") and "dp_difference" in record.reason
    assert record.statistics["bound.dp_difference.lower"] > 0
    # Still pending long after: the decision lost a race in the trail (every reader refused it): decided again, once.
    later = agent.monotonic() + DECISION_RETRY_SECONDS + 1
    agent.monotonic = lambda: later
    agent.tick()
    agent.tick()
    again = [parse_control(value) for topic, _, value, _ in agent.outbox if topic == config.topics.control]
    assert [(r.version, r.action) for r in again] == [(2, decided)] * 2 and again[1].previous == GENESIS


def test_two_statistics_drifting_at_one_shift_ask_one_refit(drifting):
    config, _, _, _ = drifting
    agent = MonitoringAgent(config, metrics=PipelineMetrics("two-statistics", process="agent"))
    agent.statistics.latest = (("plan", 1),)
    agent.statistics.chains["active", (("plan", 1),)] = type("Chain", (), {"key": (("plan", 1),)})()
    for statistic in ("dependence_e", "w1"):
        agent._drifted(type("Event", (), {"statistic": statistic, "detector": "adwin", "value": 0.3, "version": 1})())
    (request,) = [parse_request(value) for _, _, value, _ in agent.outbox]
    assert request.statistic == "dependence_e" and request.version == 1


def test_workers_that_bin_otherwise_do_not_stop_the_agent_and_their_e_is_not_reported():
    """A chain without a fitted range, on features without a finite valid range: each worker bins E and W1 over its
    first batch. The agent adds every other statistic and says why E and W1 are not reported."""
    from prometheus_client import REGISTRY

    research, archive = datasets.load("adult").split(3000, seed=0)
    config = replace(adult_config(records=AgentConfig(artifact="scorer"), valid_ranges={}), name="bins-differ") \
        .with_monitor(statistic="dp_difference", min_records=100, lateness_seconds=0.0, metrics_port="off")
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y))
    young, old = archive.subset(np.flatnonzero(archive.X[:, 0] < 40)[:800]), \
        archive.subset(np.flatnonzero(archive.X[:, 0] >= 40)[:800])
    agent = MonitoringAgent(config, metrics=PipelineMetrics("bins-differ", process="agent"))
    for name, part in (("young", young), ("old", old)):  # first batches of other ranges: other bins
        partials = PartialAggregates(config, name)
        FairnessMonitor(config, detect=False, sink=partials.add).observe_batch(
            repaired(config, part, scorer, name, 1.7e9), scorer)
        for message in partials.take():
            assert agent.take(message)
    agent.tick(everything=True)
    labels = {"pipeline": "bins-differ", "role": "active", "scope": "pipeline", "window": "count"}
    assert REGISTRY.get_sample_value("fairstream_fairness_unmeasurable", {**labels, "group": "all",
                                                                            "reason": "bins_differ"}) == 1.0
    row = {"stage": "after", "stratum": "all", "feature": "all", "group_pair": "all"}
    assert REGISTRY.get_sample_value("fairstream_fairness_dependence", {**labels, **row,
                                                                         "statistic": "dependence_e"}) is None
    assert REGISTRY.get_sample_value("fairstream_fairness_rate_gap", {**labels, **row,
                                                                       "statistic": "dp_difference"}) is not None
    assert agent.statistics.active.records == 1600  # every record of both workers, in the other statistics
