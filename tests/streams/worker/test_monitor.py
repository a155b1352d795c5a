"""The fairness monitor on what the record agent really produces, without a broker."""

from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.repair.distributional import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

CONFIG = adult_config().with_monitor(window_records=8000, buckets=8, min_records=500, threshold=0.1,
                                     cooldown_seconds=3600.0)


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = Active("plan", 1, "p" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y))
    return research, archive, plan, scorer


def repaired_values(data, plan, prefix):
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, CONFIG, id_prefix=prefix)]
    out = RecordRepairer(CONFIG).process(messages, plan)
    return [v for _, v in out.repaired]


def in_batches(values, size=1000):
    return [values[i:i + size] for i in range(0, len(values), size)]


def shifted(data, hours=15.0):
    """Drift: in the college stratum, women's hours-per-week go up by ``hours``."""
    X = data.X.copy()
    X[(data.u == 1) & (data.s == 0), 1] += hours
    return replace(data, X=np.clip(X, 1, 99))


def stat(monitor, statistic, stage, stratum="all", feature="all", pair="all", window="count"):
    return {r[:5]: r[5] for r in monitor.rows(window)}[(statistic, stage, stratum, feature, pair)]


def test_statistics_show_the_repair(adult):
    _, archive, plan, scorer = adult
    monitor = FairnessMonitor(CONFIG)
    for batch in in_batches(repaired_values(archive.subset(slice(0, 8000)), plan, "a")):
        assert monitor.observe(batch, plan, scorer) == []
    assert stat(monitor, "dependence_e", "after") < stat(monitor, "dependence_e", "before") / 3
    assert stat(monitor, "w1", "after", feature="hours-per-week") < stat(monitor, "w1", "before", feature="hours-per-week") / 3
    assert stat(monitor, "mdp", "after") < stat(monitor, "mdp", "before")
    assert 0 <= stat(monitor, "dp_difference", "label") <= 1 and 0 <= stat(monitor, "dp_ratio", "after") <= 1
    assert stat(monitor, "out_of_range_rate", "before") < 0.01
    assert 7000 <= monitor.windows["count"].n_records <= 8000
    # The time window (120 s) holds the same records here: they were all stamped within it.
    assert monitor.windows["time"].n_records == 8000


def test_nothing_is_reported_before_min_records(adult):
    _, archive, plan, _ = adult
    monitor = FairnessMonitor(CONFIG)
    monitor.observe(repaired_values(archive.subset(slice(0, 300)), plan, "b"), plan)
    assert monitor.rows() == [] and monitor.statistic() is None


def test_one_shift_gives_one_drift_event_within_a_bounded_number_of_records(adult):
    _, archive, plan, scorer = adult
    monitor = FairnessMonitor(CONFIG)
    stable = repaired_values(archive.subset(slice(0, 12000)), plan, "c")
    drifted = repaired_values(shifted(archive.subset(slice(12000, 35000))), plan, "d")
    events_before = sum((monitor.observe(b, plan, scorer) for b in in_batches(stable)), [])
    assert events_before == [] and monitor.statistic() < CONFIG.monitor.threshold
    seen, events = 0, []
    for batch in in_batches(drifted):
        found = monitor.observe(batch, plan, scorer)
        seen += len(batch)
        if found and not events:
            detected_after = seen
        events += found
    assert len(events) == 1, "one shift, one event (hysteresis)"
    assert detected_after <= 8000 and events[0].value > CONFIG.monitor.threshold and events[0].version == 1


def test_a_new_plan_version_starts_fresh_windows(adult):
    research, archive, plan, _ = adult
    monitor = FairnessMonitor(CONFIG)
    monitor.observe(repaired_values(archive.subset(slice(0, 2000)), plan, "e"), plan)
    v2 = Active("plan", 2, "q" * 64, None, plan.module)
    old = repaired_values(archive.subset(slice(2000, 3000)), plan, "f")  # still stamped version 1
    monitor.observe(old, v2)
    assert monitor.version == 2 and monitor.windows["count"].n_records == 0 and monitor.skipped == 1000
