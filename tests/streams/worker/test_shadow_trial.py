"""The shadow trial (:class:`~fairstream.streams.worker.shadow.ShadowTrial`): alone, then behind the worker's hooks.

A worker decides nothing about a candidate: its trial measures the candidate beside the active chain and hands the
candidate's counts (its slices) and the per-record paired figures of the two chains, with the records the candidate
refused and why its chain failed, to the worker's partial aggregates, which go to the stats topic; the pipeline's
monitoring agent decides on every worker's evidence pooled (tests/streams/agent/test_promotion.py). The hooks hand the
trial each batch the candidate chain went through and export its gauges when due; these tests drive both with fakes of
the registry and the notice producer (no broker), and read what the worker sends as the agent does
(:func:`~fairstream.streams.codec.partials.decode_partial`).
"""

import numpy as np
import pytest
from prometheus_client import REGISTRY

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.codec.partials import PAIRED_FIELDS, decode_partial
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active, Served
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker import app
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import slice_of
from fairstream.streams.worker.partials import PartialAggregates
from fairstream.streams.worker.processing import BatchOutcome, RecordRepairer, SimpleMessage
from fairstream.streams.worker.shadow import FAILED, REFUSED, ShadowTrial

# --------------------------------------------------------------------------- the trial on its own

ACTIVE = (Active("plan", 3, "a" * 64, None, None),)
CANDIDATE = (Active("plan", 4, "b" * 64, None, None),)


def candidate_version(pipeline: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_candidate_version", {"pipeline": pipeline, "kind": "plan"})


def trial(name: str) -> ShadowTrial:
    config = adult_config(name=name)
    shadow = ShadowTrial(config, PipelineMetrics(name), PartialAggregates(config, f"{name}-worker"))
    shadow.candidate_changed("plan", CANDIDATE[0])
    return shadow


def failed(refused: int = 200) -> BatchOutcome:
    """A batch the candidate chain raised on: it refused every record, and no candidate batch was measured."""
    return BatchOutcome(candidate_refused=refused, candidate_failed="TypeError: bug in the candidate")


def sent(partials: PartialAggregates, config) -> list:
    """What the worker would send now, read back as the agent reads it."""
    return [decode_partial(value, config.groups, config.strata) for value in partials.take()]


def test_a_trial_counts_what_the_candidate_refused_and_announces_it_only_once_exported():
    shadow = trial("trialfigures")
    assert candidate_version("trialfigures") == 4
    shadow.export()
    assert shadow.announced is None  # nothing measured, nothing refused: nothing to announce
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.observe(failed(50), ACTIVE, CANDIDATE)
    assert shadow.figures() == {REFUSED: 250.0, FAILED: 1.0, "records": 0.0}
    assert shadow.announced is None
    shadow.export()
    assert shadow.announced == shadow.figures()


def test_the_refusals_and_the_failure_go_to_the_agent_in_the_candidates_partial_and_nothing_is_decided():
    shadow = trial("trialpartial")
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.observe(failed(50), ACTIVE, CANDIDATE)
    assert not hasattr(shadow, "decide") and not hasattr(shadow, "pending")  # the agent decides, not a worker
    (partial,) = sent(shadow.partials, shadow.config)
    assert (partial.role, partial.chain, partial.active) == ("candidate", (("plan", 4),), (("plan", 3),))
    assert (partial.refused, partial.failed) == (250, "TypeError: bug in the candidate")
    assert partial.worker == "trialpartial-worker" and partial.slices == {} and partial.paired == {}
    assert sent(shadow.partials, shadow.config) == []  # taken once


def test_a_candidate_change_restarts_the_trial_and_what_was_counted_before_still_goes():
    shadow = trial("trialleaves")
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.export()
    measured = (shadow.monitor, shadow.comparison)
    shadow.candidate_changed("plan", None)
    assert shadow.announced is None and (shadow.refused, shadow.failure) == (0, None)
    assert shadow.monitor is not measured[0] and shadow.comparison is not measured[1]
    # the new monitor counts for the agent as the old one did: a candidate's, no detectors, into the same partials
    assert (shadow.monitor.role, shadow.monitor.detect, shadow.monitor.version) == ("candidate", False, None)
    assert shadow.monitor.sink == shadow.partials.add
    assert candidate_version("trialleaves") is None
    (partial,) = sent(shadow.partials, shadow.config)  # the records before the change were refused all the same
    assert (partial.chain, partial.refused) == ((("plan", 4),), 200)
    newer = (Active("plan", 5, "c" * 64, None, None),)
    shadow.candidate_changed("plan", newer[0])
    shadow.observe(failed(30), ACTIVE, newer)
    assert candidate_version("trialleaves") == 5 and shadow.figures()[REFUSED] == 30
    (partial,) = sent(shadow.partials, shadow.config)
    assert (partial.chain, partial.refused) == ((("plan", 5),), 30)


# --------------------------------------------------------------------------- behind the worker's hooks (with fakes)


class FakeRegistry:
    """What the hooks read of the registry: one served state (active artifacts and pending candidates)."""

    def __init__(self, active: dict, candidates: dict):
        self.state = Served(active, candidates)

    def served(self) -> Served:
        return self.state

    def current(self, kind):
        return self.state.active.get(kind)


class FakeNotices:
    """The notice producer: it takes every message (``producer`` set: the worker has started)."""

    producer = "started"

    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, timeout=None):
        self.sent.append((topic, key, value))


@pytest.fixture(scope="module")
def adult():
    return datasets.load("adult").split(6000, seed=0)


@pytest.fixture(scope="module")
def chains(adult):
    """Records, and a plan (v3, repairing 30%) and a candidate plan (v4, 100%) in front of the same scorer: the two
    chains decide some records differently."""
    research, archive = adult
    fit = (lambda amount: DistributionalRepair(n_q=60, repair_amount=amount, posterior=False).fit(
        research.X, research.s, research.u))
    positive = np.flatnonzero(research.y == 1)
    rows = np.concatenate([positive, np.flatnonzero(research.y == 0)[:len(positive)]])  # as many of each label
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X[rows], research.y[rows]))
    return (archive.subset(slice(0, 1200)), Active("plan", 3, "a" * 64, None, fit(0.3)), scorer,
            Active("plan", 4, "b" * 64, None, fit(1.0)))


def shadow_hooks(chains, name: str, candidate=None):
    """The hooks of a worker serving plan v3 -> scorer with a pending candidate plan; batches of 200 records whose
    event times span six one-second slices."""
    data, active, scorer, pending = chains
    pending = pending if candidate is None else candidate
    config = adult_config(name=name, records=AgentConfig(artifact=("plan", "scorer"))).with_monitor(
        statistic="dependence_e", min_records=100, window_records=2000, buckets=1, metrics_port="off",
        stats_seconds=60.0)
    hooks = app.WorkerHooks(config, "127.0.0.1:1", f"{name}-test")
    hooks.registry = FakeRegistry({"plan": active, "scorer": scorer}, {"plan": pending})
    hooks.notices = FakeNotices()
    hooks.ready.set()
    hooks.candidate_changed("plan", pending)
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix=name, spacing=0.005)]
    return hooks, RecordRepairer(config), [messages[i:i + 200] for i in range(0, len(messages), 200)]


def deliver(hooks, repairer, batches) -> list[BatchOutcome]:
    """Each batch through both chains and delivered (the hooks observe it); the outcomes."""
    served, outcomes = hooks.active_chain(), []
    for batch in batches:
        outcome = repairer.process(batch, served)
        assert len(outcome.repaired) == len(batch)  # delivered whatever the candidate does
        hooks.records_delivered(outcome, served)
        outcomes.append(outcome)
    return outcomes


def stats_sent(hooks) -> dict:
    """Every partial the worker sent to the stats topic (after a last send of whatever is counted), read as the agent
    reads them, by (role, chain); nothing goes to any other topic."""
    hooks.send_partials(everything=True)
    assert {topic for topic, _, _ in hooks.notices.sent} <= {hooks.topics.stats}  # no decision, no re-fit request
    partials = [decode_partial(value, hooks.config.groups, hooks.config.strata) for _, _, value in hooks.notices.sent]
    assert all(key == hooks.partials.worker.encode() for _, key, _ in hooks.notices.sent)
    by_chain = {(p.role, p.chain): p for p in partials}
    assert len(by_chain) == len(partials)  # one message per chain (stats_seconds is long)
    return by_chain


def gauge(pipeline: str, role: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_fairness_dependence", {
        "pipeline": pipeline, "role": role, "statistic": "dependence_e", "stage": "after", "stratum": "all",
        "feature": "all", "group_pair": "all", "window": "count", "scope": "worker"})


def sums(x, d, among=None) -> dict:
    among = np.ones(len(x), dtype=bool) if among is None else among
    x, d = x[among].astype(float), d[among].astype(float)
    return {"n": len(x), "active": x.sum(), "active_sq": (x * x).sum(), "change": d.sum(), "change_sq": (d * d).sum()}


def test_the_trial_sends_the_candidates_slices_and_the_paired_figures_to_the_agent(chains):
    hooks, repairer, batches = shadow_hooks(chains, "pairedtest")
    outcomes = deliver(hooks, repairer, batches)
    by_chain = stats_sent(hooks)
    active_key, candidate_key = (("plan", 3), ("scorer", 1)), (("plan", 4), ("scorer", 1))
    assert set(by_chain) == {("active", active_key), ("candidate", candidate_key)}
    partial = by_chain["candidate", candidate_key]
    assert (partial.active, partial.refused, partial.failed) == (active_key, 0, "")
    # The candidate's counts, per event-time slice of its records: what its own records give.
    a = [o.monitor_batch for o in outcomes]
    c = [o.candidate_batch for o in outcomes]
    ts, s, y = (np.concatenate([getattr(b, name) for b in c]) for name in ("ts", "s", "y"))
    active, candidate = np.concatenate([b.decision for b in a]), np.concatenate([b.decision for b in c])
    slices = slice_of(ts, hooks.config.monitor.slice_seconds)
    assert len(np.unique(slices)) >= 6
    assert {index: n for index, (n, _) in partial.slices.items()} == dict(zip(*np.unique(slices, return_counts=True)))
    for index, (_, accumulators) in partial.slices.items():
        dp = accumulators["dp", "after"]
        here = slices == index
        assert dp.totals_.sum(axis=0).tolist() == np.bincount(s[here], minlength=2).tolist()
        assert dp.positives_.sum(axis=0).tolist() == np.bincount(s[here], candidate[here], minlength=2).tolist()
    assert by_chain["active", active_key].records == partial.records == 1200
    # The paired figures: per record, x the active chain's decision (or whether it is right), d the candidate's minus
    # it; per group for the gaps, overall for the decision rate and accuracy.
    assert np.array_equal(np.concatenate([b.keys for b in a]), np.concatenate([b.keys for b in c]))
    change = candidate - active
    assert 0 < np.abs(change).sum() < 1200  # the chains disagree on some records
    right = (active == y).astype(int)
    expected = {"dp_difference": {g: sums(active, change, s == g) for g in (0, 1)},
                "eopp": {g: sums(active, change, (s == g) & (y == 1)) for g in (0, 1)},
                "decision_rate": {"all": sums(active, change)},
                "accuracy": {"all": sums(right, (candidate == y).astype(int) - right)}}
    assert set(partial.paired) == set(expected)
    for name, cells in expected.items():
        assert partial.paired[name]["cells"] == tuple(map(str, cells))
        for f in PAIRED_FIELDS:
            assert partial.paired[name][f].tolist() == pytest.approx([cell[f] for cell in cells.values()]), (name, f)
    # The worker's own view stays: both chains' gauges (this worker's figures) and its announced comparison.
    hooks.export_unexported()
    assert gauge("pairedtest", "active") is not None and gauge("pairedtest", "candidate") is not None
    assert gauge("pairedtest", "candidate") != gauge("pairedtest", "active")
    assert hooks.shadow_figures()["records"] == 1200


def test_a_candidate_that_left_is_no_longer_measured_or_sent_and_its_gauges_go(chains):
    hooks, repairer, batches = shadow_hooks(chains, "leavestest")
    deliver(hooks, repairer, batches[:3])
    hooks.export_unexported()
    assert gauge("leavestest", "candidate") is not None and hooks.shadow_figures()["records"] == 600
    taken = repairer.process(batches[3], hooks.active_chain())  # taken before the candidate left
    hooks.registry.state = Served({"plan": chains[1], "scorer": chains[2]}, {})  # rejected
    hooks.candidate_changed("plan", None)
    assert gauge("leavestest", "candidate") is None and gauge("leavestest", "active") is not None
    assert hooks.shadow_figures() is None and candidate_version("leavestest") is None
    hooks.records_delivered(taken, hooks.active_chain())
    assert hooks.shadow.comparison.n_records == 0 and hooks.shadow.monitor.version is None
    now = hooks.active_chain()
    assert now.candidate is None and repairer.process(batches[4], now).candidate_batch is None
    by_chain = stats_sent(hooks)
    candidate = by_chain["candidate", (("plan", 4), ("scorer", 1))]
    assert candidate.records == 600 and candidate.paired["decision_rate"]["n"].tolist() == [600]  # not the 4th batch
    assert by_chain["active", (("plan", 3), ("scorer", 1))].records == 800


def test_the_records_a_candidate_refuses_are_counted_on_neither_side_and_sent_as_refused(adult, chains):
    research, _ = adult
    young = research.subset(research.X[:, 0] < 25)  # refuses (out of its range) everyone older
    refusing = Active("plan", 5, "c" * 64, None, DistributionalRepair(
        n_q=30, out_of_range="reject", posterior=False).fit(young.X, young.s, young.u))
    hooks, repairer, batches = shadow_hooks(chains, "refusingtest", candidate=refusing)
    outcomes = deliver(hooks, repairer, batches)
    refused = sum(o.candidate_refused for o in outcomes)
    accepted = sum(len(o.candidate_batch) for o in outcomes)
    assert 0 < refused and accepted + refused == 1200
    partial = stats_sent(hooks)["candidate", (("plan", 5), ("scorer", 1))]
    assert (partial.refused, partial.failed) == (refused, "")
    assert partial.records == accepted and partial.paired["decision_rate"]["n"].tolist() == [accepted]
    assert partial.paired["dp_difference"]["n"].sum() == accepted
    assert hooks.shadow.figures()[REFUSED] == refused and hooks.shadow.comparison.n_records == accepted


def errors(pipeline: str, monitor: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_monitor_errors_total", {"pipeline": pipeline, "monitor": monitor})


def test_a_candidate_that_raises_in_shadow_is_sent_as_failed_and_the_active_chain_is_unaffected(chains):
    candidate = chains[3]

    class Raising:
        def __getattr__(self, name):
            return getattr(candidate.module, name)

        def apply(self, batch):
            raise TypeError("bug in the candidate")

    broken = Active("plan", 4, "b" * 64, None, Raising())
    hooks, repairer, batches = shadow_hooks(chains, "raisingtest", candidate=broken)
    deliver(hooks, repairer, batches)
    by_chain = stats_sent(hooks)
    partial = by_chain["candidate", (("plan", 4), ("scorer", 1))]
    assert (partial.refused, partial.failed) == (1200, "TypeError: bug in the candidate")
    assert partial.slices == {} and partial.paired == {}  # nothing of it measured
    assert by_chain["active", (("plan", 3), ("scorer", 1))].records == 1200
    hooks.export_unexported()
    assert hooks.shadow_figures()["candidate.failed"] == 1.0  # what a person reading the workers' figures sees
    assert errors("raisingtest", "fairness") == 0 and gauge("raisingtest", "active") is not None


def test_a_comparison_that_cannot_measure_still_leaves_the_agent_the_candidates_counts(chains, caplog):
    hooks, repairer, batches = shadow_hooks(chains, "unmeasuredtest")

    def fails(*args):
        raise ValueError("no statistic")

    hooks.shadow.comparison._observe = fails
    deliver(hooks, repairer, batches)
    assert hooks.shadow.comparison.failed == "ValueError: no statistic"  # this worker's own figures stop
    partial = stats_sent(hooks)["candidate", (("plan", 4), ("scorer", 1))]
    assert partial.records == 1200 and partial.paired["decision_rate"]["n"].tolist() == [1200]


def test_a_failing_candidate_monitor_counts_under_its_own_label_not_the_serving_chains(chains):
    hooks, repairer, batches = shadow_hooks(chains, "candidateerrortest")

    def fails(*args):
        raise ValueError("cannot observe")

    hooks.shadow.monitor.observe_batch = fails
    deliver(hooks, repairer, batches[:2])
    assert errors("candidateerrortest", "candidate") == 2 and errors("candidateerrortest", "fairness") == 0
