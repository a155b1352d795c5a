"""The shadow trial (:class:`~fairstream.streams.worker.shadow.ShadowTrial`): alone, then behind the worker's hooks.

The hooks hand it each batch the candidate chain went through, export its gauges when due, and send the decisions it
queues; these tests drive both with fakes of the registry and the notice producer (no broker).
"""

import pytest
from prometheus_client import REGISTRY

from fairstream.models.plan import DistributionalRepair
from fairstream.repair import datasets
from fairstream.streams.config import adult_config
from fairstream.streams.control.records import read_message
from fairstream.streams.control.registry import Active, Served
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker import app
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.processing import BatchOutcome, RecordRepairer, SimpleMessage
from fairstream.streams.worker.shadow import FAILED, REFUSED, ShadowTrial, decide

# --------------------------------------------------------------------------- the trial on its own

ACTIVE = (Active("plan", 3, "a" * 64, None, None),)
CANDIDATE = (Active("plan", 4, "b" * 64, None, None),)


def candidate_version(pipeline: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_candidate_version", {"pipeline": pipeline, "kind": "plan"})


def trial(promotion: str, name: str) -> ShadowTrial:
    shadow = ShadowTrial(adult_config(name=name, promotion=promotion), PipelineMetrics(name), f"shadow-policy@{name}")
    shadow.candidate_changed("plan", CANDIDATE[0])
    return shadow


def failed(refused: int = 200) -> BatchOutcome:
    """A batch the candidate chain raised on: it refused every record, and no candidate batch was measured."""
    return BatchOutcome(candidate_refused=refused, candidate_failed="TypeError: bug in the candidate")


def test_a_trial_counts_what_the_candidate_refused_and_announces_it_only_once_exported():
    shadow = trial("approve", "trialfigures")
    assert candidate_version("trialfigures") == 4
    shadow.export()
    assert shadow.announced is None  # nothing measured, nothing refused: nothing to announce
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.observe(failed(50), ACTIVE, CANDIDATE)
    assert shadow.figures() == {REFUSED: 250.0, FAILED: 1.0, "records": 0.0}
    assert shadow.announced is None
    shadow.export()
    assert shadow.announced == shadow.figures()


def test_without_the_shadow_policy_a_trial_measures_and_never_decides():
    shadow = trial("approve", "trialapprove")
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.decide(ACTIVE, CANDIDATE)
    assert shadow.policy is None and shadow.pending == [] and shadow.next_decision() is None


def test_a_trial_queues_one_decision_per_candidate_and_sends_each_once():
    shadow = trial("shadow", "trialdecides")
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.decide(ACTIVE, CANDIDATE)
    shadow.decide(ACTIVE, CANDIDATE)  # decided once, however many batches follow
    (queued,) = shadow.pending
    first, again = shadow.next_decision(), shadow.next_decision()
    assert (first.kind, first.version, first.action) == ("plan", 4, "retire")
    assert first.actor == "shadow-policy@trialdecides"
    assert first.reason == queued.reason and again.published_at >= first.published_at  # stamped afresh each time
    shadow.sent()
    assert shadow.pending == [] and shadow.next_decision() is None


def test_a_candidate_leaving_starts_the_measurement_afresh_and_keeps_what_was_decided():
    shadow = trial("shadow", "trialleaves")
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.export()
    shadow.decide(ACTIVE, CANDIDATE)
    measured = (shadow.monitor, shadow.comparison)
    shadow.candidate_changed("plan", None)
    assert shadow.announced is None and (shadow.refused, shadow.failure) == (0, None)
    assert shadow.monitor is not measured[0] and shadow.comparison is not measured[1]
    assert len(shadow.pending) == 1  # a decision not sent yet still goes
    assert candidate_version("trialleaves") is None
    shadow.candidate_changed("plan", CANDIDATE[0])  # the same candidate again (a replay): never decided twice
    shadow.observe(failed(), ACTIVE, CANDIDATE)
    shadow.decide(ACTIVE, CANDIDATE)
    assert len(shadow.pending) == 1


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
    def __init__(self):
        self.sent = []

    def send(self, topic, key, value, timeout=None):
        self.sent.append((topic, key, value))


@pytest.fixture(scope="module")
def plans():
    research, archive = datasets.load("adult").split(6000, seed=0)
    fit = (lambda amount: DistributionalRepair(n_q=60, repair_amount=amount, posterior=False).fit(
        research.X, research.s, research.u))
    return archive.subset(slice(0, 1200)), Active("plan", 3, "a" * 64, None, fit(0.3)), \
        Active("plan", 4, "b" * 64, None, fit(1.0))


def shadow_hooks(plans, promotion: str, name: str):
    data, active, candidate = plans
    config = adult_config(name=name, promotion=promotion).with_monitor(
        statistic="dependence_e", min_records=100, window_records=2000, buckets=1, metrics_port="off").with_shadow(
        min_records=500)
    hooks = app.WorkerHooks(config, "127.0.0.1:1", f"{name}-test", refit_source="test")
    hooks.registry, hooks.notices = FakeRegistry({"plan": active}, {"plan": candidate}), FakeNotices()
    hooks.ready.set()
    hooks.candidate_changed("plan", candidate)
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix=name)]
    return hooks, RecordRepairer(config), [messages[i:i + 200] for i in range(0, len(messages), 200)]


def gauge(pipeline: str, role: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_fairness_dependence", {
        "pipeline": pipeline, "role": role, "statistic": "dependence_e", "stage": "after", "stratum": "all",
        "feature": "all", "group_pair": "all", "window": "count"})


def test_the_shadow_policy_decides_a_candidate_once_after_min_records_and_writes_it_to_the_control_topic(plans):
    hooks, repairer, batches = shadow_hooks(plans, "shadow", "shadowtest")
    served = hooks.active_chain()
    assert served.active == (plans[1],) and served.candidate == (plans[2],)
    assert REGISTRY.get_sample_value("fairstream_candidate_version", {"pipeline": "shadowtest", "kind": "plan"}) == 4
    for batch in batches[:2]:
        hooks.records_delivered(repairer.process(batch, served), served)
    assert hooks.notices.sent == [] and hooks.shadow.comparison.n_records == 400  # below shadow.min_records
    for batch in batches[2:]:
        hooks.records_delivered(repairer.process(batch, served), served)
    ((topic, key, value),) = hooks.notices.sent  # one decision, however many batches follow
    record = read_message(key, value).record
    assert topic == hooks.topics.control and (record.kind, record.version, record.sha256) == ("plan", 4, "b" * 64)
    assert record.actor.startswith("shadow-policy@shadowtest-test@")
    assert record.statistics["records"] == 600 and "active.dependence_e" in record.statistics
    assert (record.action, record.reason) == decide(record.statistics, hooks.config.shadow)
    hooks.export_unexported()
    assert gauge("shadowtest", "active") is not None and gauge("shadowtest", "candidate") is not None
    assert gauge("shadowtest", "candidate") != gauge("shadowtest", "active")
    assert hooks.shadow_figures()["records"] == 1200


def test_a_candidate_that_left_is_no_longer_measured_and_its_gauges_go(plans):
    hooks, repairer, batches = shadow_hooks(plans, "approve", "approvetest")
    served = hooks.active_chain()
    for batch in batches:
        hooks.records_delivered(repairer.process(batch, served), served)
    hooks.export_unexported()
    assert hooks.notices.sent == []  # under "approve" a person decides, never the worker
    assert gauge("approvetest", "candidate") is not None and hooks.shadow_figures()["records"] == 1200
    hooks.registry.state = Served({"plan": plans[1]}, {})  # rejected
    hooks.candidate_changed("plan", None)
    assert gauge("approvetest", "candidate") is None and gauge("approvetest", "active") is not None
    assert hooks.shadow_figures() is None and REGISTRY.get_sample_value(
        "fairstream_candidate_version", {"pipeline": "approvetest", "kind": "plan"}) is None
    hooks.records_delivered(repairer.process(batches[0], served), served)  # taken before the candidate left
    assert hooks.shadow.comparison.n_records == 0 and hooks.shadow.monitor.version is None
    now = hooks.active_chain()
    assert now.candidate is None and repairer.process(batches[0], now).candidate_batch is None


def test_a_candidate_that_refuses_records_is_decided_on_them_too_and_retired(plans):
    data, active, _ = plans
    research, _ = datasets.load("adult").split(6000, seed=0)
    young = research.subset(research.X[:, 0] < 25)  # refuses (out of its range) everyone older
    refusing = Active("plan", 5, "c" * 64, None, DistributionalRepair(
        n_q=30, out_of_range="reject", posterior=False).fit(young.X, young.s, young.u))
    hooks, repairer, batches = shadow_hooks((data, active, refusing), "shadow", "refusingtest")
    served = hooks.active_chain()
    for batch in batches:
        hooks.records_delivered(repairer.process(batch, served), served)
    ((_, key, value),) = hooks.notices.sent
    record = read_message(key, value).record
    refused = record.statistics["candidate.refused"]
    assert record.statistics["records"] < 500 <= record.statistics["records"] + refused  # due on both together
    assert (record.version, record.action) == (5, "retire")
    assert f"failed refusals: the candidate refused {refused:.0f} records the active chain repaired" in record.reason


def errors(pipeline: str, monitor: str) -> float | None:
    return REGISTRY.get_sample_value("fairstream_monitor_errors_total", {"pipeline": pipeline, "monitor": monitor})


def test_a_candidate_that_raises_in_shadow_is_retired_at_once_and_the_active_chain_is_unaffected(plans):
    """At once, not when the window fills: another worker whose records never made it fail could promote it first."""
    data, active, candidate = plans

    class Raising:
        def __getattr__(self, name):
            return getattr(candidate.module, name)

        def apply(self, batch):
            raise TypeError("bug in the candidate")

    broken = Active("plan", 4, "b" * 64, None, Raising())
    hooks, repairer, batches = shadow_hooks((data, active, broken), "shadow", "raisingtest")
    served = hooks.active_chain()
    for batch in batches:
        outcome = repairer.process(batch, served)
        assert len(outcome.repaired) == len(batch)  # delivered whatever the candidate does
        hooks.records_delivered(outcome, served)
    ((_, key, value),) = hooks.notices.sent  # after the first batch it failed on, and once
    record = read_message(key, value).record
    assert (record.version, record.action) == (4, "retire") and record.statistics["candidate.refused"] == 200
    assert record.statistics["candidate.failed"] == 1.0
    assert record.reason == ("retired: its chain failed in shadow (TypeError: bug in the candidate): it refused 200 "
                             "records the active chain repaired")
    assert hooks.shadow_figures()["candidate.failed"] == 1.0  # what a person reading the workers' figures sees
    assert errors("raisingtest", "fairness") == 0 and gauge("raisingtest", "active") is not None


def test_a_candidate_whose_statistics_cannot_be_measured_is_retired_at_once(plans):
    hooks, repairer, batches = shadow_hooks(plans, "shadow", "unmeasuredtest")

    def fails(*args):
        raise ValueError("no statistic")

    hooks.shadow.comparison._observe = fails
    served = hooks.active_chain()
    hooks.records_delivered(repairer.process(batches[0], served), served)  # 200 records, below shadow.min_records
    for batch in batches[1:]:
        hooks.records_delivered(repairer.process(batch, served), served)
    ((_, key, value),) = hooks.notices.sent
    record = read_message(key, value).record
    assert (record.version, record.action) == (4, "retire")
    assert record.reason == "retired: its statistics cannot be measured: ValueError: no statistic"


def test_a_failing_candidate_monitor_counts_under_its_own_label_not_the_serving_chains(plans):
    hooks, repairer, batches = shadow_hooks(plans, "approve", "candidateerrortest")

    def fails(*args):
        raise ValueError("cannot observe")

    hooks.shadow.monitor.observe_batch = fails
    served = hooks.active_chain()
    for batch in batches[:2]:
        hooks.records_delivered(repairer.process(batch, served), served)
    assert errors("candidateerrortest", "candidate") == 2 and errors("candidateerrortest", "fairness") == 0


def test_a_decision_sent_again_after_a_timeout_is_stamped_afresh_and_keyed_apart(plans):
    hooks, repairer, batches = shadow_hooks(plans, "shadow", "resendtest")
    attempts = []

    class Flaky(FakeNotices):
        def send(self, topic, key, value, timeout=None):
            attempts.append((key, read_message(key, value).record))
            if len(attempts) == 1:
                raise app.NoticeNotSent("no acknowledgement")  # it may still arrive: the copy must differ
            super().send(topic, key, value)

    hooks.notices = Flaky()
    served = hooks.active_chain()
    for batch in batches:
        hooks.records_delivered(repairer.process(batch, served), served)
    (first_key, first), (second_key, second) = attempts
    assert first_key != second_key and second.published_at > first.published_at
    assert (first.action, first.version, first.reason) == (second.action, second.version, second.reason)
    assert len(hooks.notices.sent) == 1 and hooks.shadow.pending == []
