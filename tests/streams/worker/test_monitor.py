"""The fairness monitor on what the record agent really produces, without a broker."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.flow import FlowPreprocessor
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.streams.codec import decode_repaired
from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.loop import balanced_scorer
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.monitor import MDP_ROWS, FairnessMonitor, mdp_rows
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

CONFIG = adult_config().with_monitor(window_records=8000, buckets=8, min_records=500, threshold=0.1,
                                     cooldown_seconds=3600.0)


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = Active("plan", 1, "p" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y).attach_group_map(
        GroupTransportMap(seed=0).fit(research.X, research.s)))
    return research, archive, plan, scorer


def repaired_values(data, plan, prefix):
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, CONFIG, id_prefix=prefix)]
    out = RecordRepairer(CONFIG).process(messages, plan)
    return [v for _, v in out.repaired]


def codec_arrays(values):
    return decode_repaired(values, CONFIG)


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
    # MDP with the scorer's frozen map, on the features the scorer reads: the same as measured offline on the
    # monitor's sample of each batch (the map breaks exact ties between identical records round-robin per call).
    gaps = []
    for batch in in_batches(repaired_values(archive.subset(slice(0, 8000)), plan, "a")):
        window = codec_arrays(batch)
        rows = mdp_rows(len(window))
        assert len(rows) <= MDP_ROWS and rows[-1] >= len(window) - len(window) // MDP_ROWS - 1
        f = scorer.module.predict_proba(window.after[rows])
        pairs = scorer.module.matched_counterparts(window.after[rows], window.s[rows])
        gaps.append(np.abs(f[pairs.rows] - scorer.module.predict_proba(pairs.X)))
    assert stat(monitor, "mdp", "after") == pytest.approx(np.concatenate(gaps).mean())
    assert stat(monitor, "mdp", "after", pair="0-1") == stat(monitor, "mdp", "after")
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
    assert monitor.skipped == 1000 and monitor.windows["count"].n_records == 2000  # v1's windows, untouched
    monitor.observe(repaired_values(archive.subset(slice(3000, 3600)), v2, "g"), v2)
    assert monitor.version == 2 and monitor.windows["count"].n_records == 600


# --------------------------------------------------------------------------- chains with a scorer


def pair_against(data, group, block=500):
    """Within every (s, u) cell of ``group`` and block of records, pair the youngest with the longest hours:
    each feature's distribution per cell is unchanged in any run of blocks (so is E), the scorer's decisions
    are not (DP moves)."""
    X = data.X.copy()
    for start, u in itertools.product(range(0, len(X), block), np.unique(data.u)):
        rows = start + np.flatnonzero((data.s[start:start + block] == group) & (data.u[start:start + block] == u))
        order = np.argsort(X[rows, 0], kind="stable")
        X[rows[order], 0] = np.sort(X[rows, 0])
        X[rows[order], 1] = np.sort(X[rows, 1])[::-1]
    return replace(data, X=X)


def chain_values(data, chain, prefix, config):
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix=prefix)]
    return [v for _, v in RecordRepairer(config).process(messages, chain).repaired]


def test_drift_fires_on_a_dp_shift_with_e_unchanged(adult):
    research, archive, _, _ = adult
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        statistic=("dependence_e", "dp_difference"), threshold={"dependence_e": 0.1, "dp_difference": 0.3},
        cooldown_seconds=3600.0)
    scorer = (Active("scorer", 1, "b" * 64, None, balanced_scorer(research, list(config.features))),)
    monitor = FairnessMonitor(config)
    stable = chain_values(archive.subset(slice(0, 10000)), scorer, "s", config)
    later = archive.subset(slice(10000, 30000))
    drifted = chain_values(pair_against(later, group=0), scorer, "d", config)
    assert sum((monitor.observe(b, *scorer) for b in in_batches(stable)), []) == []
    events = sum((monitor.observe(b, *scorer) for b in in_batches(drifted)), [])
    assert [e.statistic for e in events] == ["dp_difference"] and events[0].value > 0.3
    # The same records without the re-pairing: E identical (the features' distributions per cell did not move).
    undrifted = FairnessMonitor(config)  # the same first batch: the same bins
    for batch in in_batches(stable + chain_values(later, scorer, "u", config)):
        undrifted.observe(batch, *scorer)
    assert monitor.statistic("count", "dependence_e") == pytest.approx(undrifted.statistic("count", "dependence_e"))
    assert undrifted.statistic("count", "dp_difference") < 0.3


def test_a_flow_then_scorer_chain_is_monitored_on_its_decisions_per_version(adult):
    research, archive, _, _ = adult
    config = adult_config(records=AgentConfig(artifact=("flow", "scorer"))).with_monitor(
        statistic=("dp_difference", "eopp"), min_records=500)
    scorer = Active("scorer", 1, "c" * 64, None, balanced_scorer(research, list(config.features)))
    # A flow that moves every group to the same place removes the decisions' dependence on s.
    flow = Active("flow", 1, "f" * 64, None, FlowPreprocessor.identity(list(config.features)))
    monitor = FairnessMonitor(config)
    for batch in in_batches(chain_values(archive.subset(slice(0, 4000)), (flow, scorer), "f", config)):
        assert monitor.observe(batch, flow, scorer) == []
    rows = {r[:5]: r[5] for r in monitor.rows()}
    for statistic in ("dp_difference", "eopp", "conditional_dp", "dp_ratio"):
        # The identity flow changes nothing: the classifier alone (before) and the chain (after) agree.
        assert rows[statistic, "after", "all", "all", "all"] == rows[statistic, "before", "all", "all", "all"]
    data = archive.subset(slice(0, 4000))
    decisions = scorer.module.decision(data.X)
    women, men = decisions[data.s == 0].mean(), decisions[data.s == 1].mean()
    assert rows["dp_difference", "after", "all", "all", "all"] == pytest.approx(abs(men - women))
    positives = data.y == 1
    eopp = abs(decisions[positives & (data.s == 1)].mean() - decisions[positives & (data.s == 0)].mean())
    assert rows["eopp", "after", "all", "all", "all"] == pytest.approx(eopp)
    assert monitor.statistic("count", "eopp") == pytest.approx(eopp)
    new_scorer = Active("scorer", 2, "d" * 64, None, scorer.module)
    monitor.observe(chain_values(archive.subset(slice(4000, 4600)), (flow, new_scorer), "g", config), flow, new_scorer)
    assert monitor.chain_key == (("flow", 1), ("scorer", 2)) and monitor.windows["count"].n_records == 600


@pytest.mark.parametrize("sizes", [[1000, 1000], [997, 1000, 3, 500, 1], [499, 2, 1500]])
def test_batches_are_cut_only_at_chunk_boundaries(sizes):
    from fairstream.streams.worker.monitor import Chunker

    chunker, filled, seen = Chunker(8000), 0, []
    for n in sizes:
        pieces = chunker.pieces(n)
        assert pieces[0].start == 0 and pieces[-1].stop == n and len(pieces) <= 2 + n // chunker.size
        for piece in pieces:
            full = chunker.add({}, piece.stop - piece.start)
            filled += piece.stop - piece.start
            seen.append(full is not None)
            assert (full is not None) == (filled % chunker.size == 0)
    assert sum(seen) == sum(sizes) // chunker.size


def test_otf0_is_an_optional_statistic_of_the_window(adult):
    research, archive, _, _ = adult
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(statistic=("otf", "dp_difference"),
                                                                                min_records=200)
    fair = Active("scorer", 1, "e" * 64, None, balanced_scorer(research, list(config.features)))
    monitor = FairnessMonitor(config)
    for batch in in_batches(chain_values(archive.subset(slice(0, 2000)), (fair,), "o", config)):
        monitor.observe(batch, fair)
    value = monitor.statistic("count", "otf")
    rows = {r[:5]: r[5] for r in monitor.rows()}
    assert value is not None and value > 0 and rows["otf", "after", "all", "all", "all"] == value
    # Without it configured, nothing solves OTF0: it is not a free statistic.
    plain = FairnessMonitor(adult_config(records=AgentConfig(artifact="scorer")).with_monitor(statistic="dp_difference"))
    plain.observe(chain_values(archive.subset(slice(0, 600)), (fair,), "p", config)[:600], fair)
    assert ("otf", "after") not in plain.statistics.factories
