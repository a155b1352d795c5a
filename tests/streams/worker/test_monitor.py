"""The fairness monitor on what the record agent really produces, without a broker."""

import copy
import itertools
import logging
import tomllib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.models.flow import FlowPreprocessor
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.hashing import keys_to_uint64, uniforms
from fairstream.streams.codec.repaired import RepairedBatch, decode_repaired
from fairstream.streams.config import AgentConfig, PipelineConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.loop import balanced_scorer
from fairstream.streams.demo.replay import record_messages
from fairstream.repair.measure.accumulators import DecisionRateAccumulator, PositiveRateAccumulator, RateAccumulator
from fairstream.streams.worker import monitor
from fairstream.streams.worker.monitor import FairnessMonitor, finite_edges, key_draws, sampled_rows, stage_edges
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


def mdp_standard_error(gap, config):
    """The standard error of the monitor's MDP of records whose own gaps (their counterparts' weighted mean gap) are
    ``gap``: each record is in the sample with probability p = ``sample_share``, independently, and counts 1 / p. The
    window's MDP is the ratio of the sampled gaps' sum to the sampled records', whose variance is (to first order)
    that of the Horvitz-Thompson sum of the residuals x = gap - mean: sum((1 - p) / p * x^2), over N^2."""
    p = config.monitor.sample_share
    return np.sqrt(np.sum((1 - p) / p * (gap - gap.mean()) ** 2)) / len(gap)


def test_statistics_show_the_repair(adult):
    _, archive, plan, scorer = adult
    monitor = FairnessMonitor(CONFIG)
    for batch in in_batches(repaired_values(archive.subset(slice(0, 8000)), plan, "a")):
        assert monitor.observe(batch, plan, scorer) == []
    assert stat(monitor, "dependence_e", "after") < stat(monitor, "dependence_e", "before") / 3
    assert stat(monitor, "w1", "after", feature="hours-per-week") < stat(monitor, "w1", "before", feature="hours-per-week") / 3
    # MDP: the monitor measures the records whose key puts them in the sample (about sample_share of them, each
    # standing for 1 / share), so its estimate is within 4 standard errors of repair.measure's batch MDP of all the
    # window's records with the same map and the same tie-breaks (test_monitor_mdp.py checks it exactly).
    from fairstream.repair.measure.mdp import matched_dp

    window = codec_arrays(repaired_values(archive.subset(slice(0, 8000)), plan, "a"))
    draws = key_draws(window.keys)
    f = scorer.module.predict_proba(window.after)
    pairs = scorer.module.matched_counterparts(window.after, window.s, draws=draws[:, 2])
    f_matched = scorer.module.predict_proba(pairs.X)
    truth = matched_dp(f[pairs.rows], f_matched, window.s[pairs.rows], pairs.s, weights=pairs.weights).overall
    gap = np.bincount(pairs.rows, pairs.weights * np.abs(f[pairs.rows] - f_matched), minlength=8000)  # per record
    assert truth == pytest.approx(gap.mean())
    assert abs(stat(monitor, "mdp", "after", window="time") - truth) <= 4 * mdp_standard_error(gap, CONFIG)
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


def test_a_candidates_monitor_says_in_the_log_that_its_chain_is_not_the_serving_one(adult, caplog):
    _, archive, plan, _ = adult
    values = repaired_values(archive.subset(slice(0, 300)), plan, "role")
    with caplog.at_level(logging.INFO, logger="fairstream.streams.worker.monitor"):
        FairnessMonitor(CONFIG).observe(values, plan)
        FairnessMonitor(CONFIG, role="candidate").observe(values, plan)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("monitoring")]
    assert lines == ["monitoring plan v1", "monitoring plan v1 (candidate chain, in shadow)"]


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


# --------------------------------------------------------------------------- MDP on the sample of the records by key


@pytest.fixture(scope="module")
def mapped_scorer():
    """A logistic scorer carrying a group map fitted on two groups of 3,000 records (two features)."""
    rng = np.random.default_rng(0)
    X, s = rng.normal(size=(6000, 2)), np.repeat([0, 1], 3000)
    X[s == 1] += [0.5, 0.0]
    y = (X.sum(axis=1) + rng.normal(size=6000) > 0).astype(int)
    scorer = LogisticScorer().fit(X, y).attach_group_map(GroupTransportMap(seed=0).fit(X, s))
    return Active("scorer", 1, "m" * 64, None, scorer)


def arrivals(order, rng):
    """Records and their batches. Records of the drifted kind (a shift the frozen map never saw, so their MDP gaps
    are large) arrive
    - ``alternating``: 30,000 records in batches alternating 300, 2,700; the small batches are a drifted source;
    - ``sorted by group``: group 0 (drifted) first in batches of 300, then group 1 in batches of 2,700, so every
      batch, and every sample of one, is of a single group;
    - ``interleaved groups``: 18,120 records whose groups alternate 0, 1, 0, 1, ... (a producer that interleaves
      two sources), group 0 drifted, in batches of 1,000, 512 and 300: every k-th row of a batch, for an even k,
      is of group 0."""
    if order == "interleaved groups":
        sizes = [1000, 512, 300] * 10
        s = np.arange(sum(sizes)) % 2
    elif order == "alternating":
        s, sizes = rng.permutation(np.repeat([0, 1], 15000)), [300, 2700] * 10
    else:
        s, sizes = np.repeat([0, 1], [3000, 27000]), [300] * 10 + [2700] * 10
    X = rng.normal(size=(len(s), 2)) + np.where(s[:, None] == 1, [0.5, 0.0], 0.0)
    if order == "alternating":
        small = np.zeros(len(s), dtype=bool)
        small[np.arange(10)[:, None] * 3000 + np.arange(300)] = True  # the first 300 of every 3,000
        X[small] += 1.5
    else:
        X[s == 0] += 1.5
    return X, s, np.cumsum([0] + sizes)


def windowed_mdp(scorer_active, order):
    """(the monitor's MDP of the window, the true MDP of all its records, a 4-standard-error tolerance, the MDP of
    the sampled records with each counted once, and the share of the records sampled)."""
    from fairstream.repair.measure.mdp import matched_dp
    from fairstream.streams.codec.repaired import RepairedBatch

    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        window_records=30000, buckets=10, min_records=500, statistic="mdp")
    X, s, bounds = arrivals(order, np.random.default_rng(1))
    keys = np.arange(len(X)).astype(str)
    monitor, scorer = FairnessMonitor(config), scorer_active.module
    for a, b in zip(bounds[:-1], bounds[1:]):
        n = b - a
        monitor.observe_batch(RepairedBatch(X[a:b], X[a:b], s[a:b], np.zeros(n, dtype=np.int64), None, keys[a:b],
                                            np.full(n, 1000.0)), scorer_active)
    assert monitor.windows["count"].n_records == len(X)  # the window holds every record
    # The truth: MDP of all the records with the same map (matched_dp on the whole window), and each
    # record's own gap (its counterparts' weighted mean gap).
    draws = key_draws(keys)
    f = scorer.predict_proba(X)
    pairs = scorer.matched_counterparts(X, s, draws=draws[:, 2])
    gaps = np.abs(f[pairs.rows] - scorer.predict_proba(pairs.X))
    truth = matched_dp(f[pairs.rows], scorer.predict_proba(pairs.X), s[pairs.rows], pairs.s, weights=pairs.weights)
    gap = np.bincount(pairs.rows, pairs.weights * gaps, minlength=len(X))
    assert truth.overall == pytest.approx(gap.mean())
    # 4 standard errors: a sample this far off happens about once in 16,000.
    sampled, _ = sampled_rows(draws, config.monitor.sample_share)
    return (stat(monitor, "mdp", "after"), truth.overall, 4 * mdp_standard_error(gap, config), gap[sampled].mean(),
            len(sampled) / len(X))


@pytest.mark.parametrize("order", ["alternating", "sorted by group", "interleaved groups"])
def test_windowed_mdp_estimates_the_mdp_of_all_the_windows_records(mapped_scorer, order):
    # Records of a drifted source arrive in small batches, or sorted by group, or with the groups interleaved
    # (every k-th row of a batch, for an even k, of group 0): a per-batch sample had to weigh each batch's rows by
    # its size, and a strided one saw one group only. The sample by key knows nothing of batches.
    estimate, truth, tolerance, once, share = windowed_mdp(mapped_scorer, order)
    assert abs(estimate - truth) <= tolerance
    # Every sampled record stands for the same 1 / share records whatever its batch, so the window's MDP is the mean
    # gap of the sampled records (the former per-batch sample, counted so, was about 25% off here).
    assert estimate == pytest.approx(once, rel=1e-12)
    n = 30000 if order != "interleaved groups" else 18120
    assert abs(share - 0.125) <= 4 * np.sqrt(0.125 * 0.875 / n)


def test_the_sample_is_about_sample_share_of_the_records_and_each_records_membership_is_its_keys():
    n, share = 100_000, 0.125
    keys = np.array([f"rec-{i}" for i in range(n)])
    draws = key_draws(keys)
    rows, weight = sampled_rows(draws, share)
    assert draws.shape == (n, 3) and ((draws >= 0) & (draws < 1)).all() and weight == 1 / share
    bound = 4 * np.sqrt(n * share * (1 - share))  # binomial: each record in with probability share, independently
    assert abs(len(rows) - n * share) <= bound
    # No stride: rows 0, 1, 2, 3 mod 4 (interleaved producers) are each sampled at the share.
    assert all(abs(np.sum(rows % 4 == phase) - n / 4 * share) <= bound / 2 for phase in range(4))
    # The other two draws (OTF's priority, MDP's tie-breaks) are uniform and not the sample's draw.
    for column in (1, 2):
        assert abs(draws[:, column].mean() - 0.5) <= 4 * np.sqrt(1 / 12 / n)
        assert abs(np.corrcoef(draws[:, 0], draws[:, column])[0, 1]) <= 4 / np.sqrt(n)
        assert abs(draws[rows, column].mean() - 0.5) <= 4 * np.sqrt(1 / 12 / len(rows))
    # A record's membership depends on its key only: the same keys split into batches of any size, in any order,
    # give the same sampled records (the pipeline's sample is the union of the workers').
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), 40, replace=False))
    in_batches = np.concatenate([part[sampled_rows(key_draws(keys[part]), share)[0]]
                                 for part in np.split(order, cuts)])
    assert np.array_equal(np.sort(in_batches), rows)
    assert np.array_equal(key_draws(keys[order[:5]]), draws[order[:5]])  # alone, each draws what it drew among many
    # A larger share keeps every record of a smaller one; the whole share is every record, each standing for one.
    assert np.isin(rows, sampled_rows(draws, 0.5)[0]).all()
    every, one = sampled_rows(draws[:10], 1.0)
    assert every.tolist() == list(range(10)) and one == 1.0


def tied_records(n, seed):
    """Records on a coarse grid (most are exactly as near to several of the map's points) and their groups."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n)
    X = np.round(rng.normal(size=(n, 2)) * 1.5 + np.where(s[:, None] == 1, [1.0, 0.0], 0.0))
    return X, s


@pytest.fixture(scope="module")
def tied_scorer():
    """A scorer whose group map was fitted on records of the coarse grid: records tie between its points."""
    X, s = tied_records(1600, seed=0)
    X = X + np.random.default_rng(1).choice([-0.5, 0.5], size=X.shape)  # half-way points: every grid record ties
    y = (X.sum(axis=1) + np.random.default_rng(2).normal(size=len(X)) > 0).astype(int)
    scorer = LogisticScorer().fit(X, y).attach_group_map(GroupTransportMap(seed=0).fit(X, s))
    return Active("scorer", 1, "t" * 64, None, scorer)


def test_mdp_and_the_classifier_alones_dp_of_a_window_do_not_depend_on_how_its_records_are_batched(tied_scorer):
    # The point of sampling by key and breaking ties by key: one worker reading every record in batches of 1000,
    # or several reading them in other batches and orders, measure the same window.
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        window_records=20000, buckets=2, min_records=500, statistic=("dp_difference", "mdp", "otf"))
    X, s = tied_records(6000, seed=3)
    keys = np.array([f"k{i}" for i in range(len(X))], dtype=object)
    rng = np.random.default_rng(4)
    shuffled = rng.permutation(len(X))
    splits = {"in order, batches of 1000": np.split(np.arange(len(X)), range(1000, len(X), 1000)),
              "one batch": [np.arange(len(X))],
              "shuffled, uneven batches": np.split(shuffled, np.sort(rng.choice(np.arange(1, len(X)), 11, False)))}
    measured = {}
    for name, parts in splits.items():
        worker = FairnessMonitor(config, detect=False)  # the windows only (a detector of OTF solves it per chunk)
        for rows in parts:
            n = len(rows)
            worker.observe_batch(RepairedBatch(X[rows], X[rows], s[rows], np.zeros(n, dtype=np.int64), None,
                                               keys[rows], np.full(n, 1000.0)), tied_scorer)
        assert worker.windows["count"].n_records == len(X)
        # every statistic of decisions and MDP (E and W1 are binned over the first batch's range, OTF's solver starts
        # warm: its sample is compared below)
        rows_of = {row[:5]: row[5] for statistic in ("mdp", "dp_difference", "dp_ratio", "conditional_dp")
                   for row in worker.rows(statistic=statistic)}
        otf = worker.windows["count"].windows["otf", "after"].accumulator()
        measured[name] = rows_of, np.sort(otf.priority_), np.sort(otf.scores_)
    (reference, *sample), *others = measured.values()
    assert {("mdp", "after"), ("dp_difference", "before"), ("dp_ratio", "before")} <= {key[:2] for key in reference}
    for rows_of, *other_sample in others:
        assert rows_of.keys() == reference.keys()
        assert all(abs(rows_of[key] - reference[key]) <= 1e-12 for key in reference), rows_of
        assert all(map(np.array_equal, other_sample, sample))  # OTF's bottom-k sample: the same records
    # The data do tie: breaking the ties round-robin over each call's rows (no draws) gives the same records
    # other counterparts in another batch, so the MDP above would depend on the batches.
    scorer, some = tied_scorer.module, shuffled[:700]
    whole, alone = scorer.matched_counterparts(X, s), scorer.matched_counterparts(X[some], s[some])

    def partners(pairs, n):  # each row's counterparts' weighted mean
        return np.column_stack([np.bincount(pairs.rows, pairs.weights * pairs.X[:, k], n) for k in range(2)])

    assert not np.allclose(partners(whole, len(X))[some], partners(alone, len(some)))


def test_otfs_sample_of_the_scores_records_carry_does_not_depend_on_how_they_are_batched():
    # A monitor-only pipeline (no scorer: the records carry their own model's score and decision) measures OTF on the
    # scores they carry: its bottom-k sample must be the records of the lowest key priorities too, whatever the
    # batches and the worker (otherwise each worker's accumulator draws priorities from its own generator).
    data = tomllib.loads(adult_config(records=AgentConfig(artifact=())).to_toml())
    data["mapping"] = {"id": "id", "s": "s", "u": "u", "features": {"age": "age", "hours-per-week": "hours"},
                       "score": "score", "decision": "decision"}
    config = PipelineConfig.from_dict(data).with_monitor(statistic=("otf", "dp_difference"), window_records=5000,
                                                         min_records=100, buckets=1)
    rng = np.random.default_rng(0)
    n = 3000
    s, score = rng.integers(0, 2, n), rng.random(n)
    X = np.column_stack([rng.uniform(17, 90, n), rng.uniform(1, 99, n)])
    keys = np.array([f"r{i}" for i in range(n)])
    samples = []
    for parts in ([np.arange(n)], np.split(rng.permutation(n), [400, 1700, 2100])):
        worker = FairnessMonitor(config, detect=False)
        for rows in parts:
            worker.observe_batch(RepairedBatch(X[rows], X[rows], s[rows], np.zeros(len(rows), dtype=np.int64), None,
                                               keys[rows], np.full(len(rows), 1.7e9),
                                               out_of_range=np.zeros(len(rows), dtype=bool),
                                               decision=(score[rows] >= 0.5).astype(np.int64), score=score[rows]))
        assert worker.chain_key == () and worker.windows["count"].n_records == n
        otf = worker.windows["count"].windows["otf", "after"].accumulator()
        samples.append((np.sort(otf.scores_), np.sort(otf.priority_)))
    (kept, priorities), (other_kept, other_priorities) = samples
    assert np.array_equal(kept, other_kept)  # the same records (their scores)
    priority = key_draws(keys)[:, 1]
    lowest = np.argsort(priority)[:len(kept)]  # the records of the lowest priorities by key
    assert np.array_equal(priorities, np.sort(priority[lowest])) and np.array_equal(kept, np.sort(score[lowest]))


# --------------------------------------------------------------------------- scores handed over, decisions sampled


class CountingScorer:
    """A scorer that records the rows of every ``predict_proba`` and ``matched_counterparts`` call (everything else
    is the wrapped scorer's)."""

    def __init__(self, scorer):
        self.scorer, self.calls = scorer, []

    def __getattr__(self, name):
        return getattr(self.scorer, name)

    def predict_proba(self, X):
        self.calls.append(("predict", np.array(X)))
        return self.scorer.predict_proba(X)

    def matched_counterparts(self, X, s, y=None, draws=None):
        self.calls.append(("match", np.array(X)))
        return self.scorer.matched_counterparts(X, s, y, draws=draws)

    def count(self, kind):
        return sum(call == kind for call, _ in self.calls)


def test_the_chains_scores_are_used_once_and_give_the_statistics_a_reader_recomputes(adult):
    research, archive, plan, _ = adult
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer"))).with_monitor(min_records=500)
    repaired = plan.module.transform(research.X, research.s, research.u, keys=[str(i) for i in range(len(research))])
    scorer = LogisticScorer().fit(repaired, research.y).attach_group_map(GroupTransportMap(seed=0).fit(repaired,
                                                                                                         research.s))
    chain = (plan, Active("scorer", 1, "t" * 64, None, scorer))
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive.subset(slice(0, 3000)), config, id_prefix="t")]
    handed = [RecordRepairer(config).process(batch, chain).monitor_batch for batch in in_batches(messages)]
    assert all(batch.score is not None for batch in handed)
    counting = CountingScorer(scorer)
    worker = FairnessMonitor(config)
    for batch in handed:
        worker.observe_batch(batch, plan, Active("scorer", 1, "t" * 64, None, counting))
    rows = worker.rows()
    # No second scoring of the chain's output; the classifier alone only on the batch's records in the sample.
    scored = [X for call, X in counting.calls if call == "predict"]
    assert not any(X.shape == b.after.shape and np.array_equal(X, b.after) for X in scored for b in handed)
    for batch in handed:
        sampled, weight = sampled_rows(key_draws(batch.keys), config.monitor.sample_share)
        sample = batch.before[sampled]
        assert 0 < len(sample) < len(batch) / 4 and weight == 8.0
        assert sum(np.array_equal(X, sample) for X in scored) == 1
    # and MDP's samples: matched, and their counterparts scored, in one call each when the gauges were read
    assert len(scored) == len(handed) + 1 and counting.count("match") == 1
    # A reader of the topic has no scores: it recomputes them, and measures the same.
    reader = FairnessMonitor(config)
    for batch in handed:
        reader.observe_batch(replace(batch, score=None, decision=None), *chain)
    expected = {row[:5]: row[5] for row in reader.rows()}
    assert {row[:5] for row in rows} == set(expected)
    assert all(row[5] == pytest.approx(expected[row[:5]], rel=1e-9, abs=1e-12) for row in rows)


def test_the_classifier_alones_rates_from_the_sample_are_unbiased_with_the_sampling_variance(monkeypatch,
                                                                                              mapped_scorer):
    # The totals of each group are exact, the positives estimated from the sampled records, each counting 1 / p
    # (p = sample_share): the window's rate of group g is sum(x_i Z_i / p) / N_g, Z_i the record's membership and x_i
    # its decision, whatever the batches (here of 100 and 900, the small ones a drifted source, more often positive).
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(window_records=4000, buckets=4,
                                                                               min_records=500)
    p = config.monitor.sample_share
    rng = np.random.default_rng(3)
    sizes = [100, 900] * 2
    s = rng.integers(0, 2, sum(sizes))
    X = rng.normal(size=(len(s), 2))
    keys = np.arange(len(s)).astype(str)
    bounds = np.cumsum([0] + sizes)
    for a in bounds[:-1:2]:
        X[a:a + 100] += 1.5
    plain = Active("scorer", 1, "u" * 64, None, without_map(mapped_scorer.module))
    decisions = plain.module.decision(X)
    in_group = np.array([s == g for g in (0, 1)])
    n_group = in_group.sum(axis=1)

    def estimate(member):  # the rates of the records ``member`` selects, each decision counting 1 / p
        return (in_group & member & (decisions == 1)).sum(axis=-1) / p / n_group

    for seed in range(12):  # the monitor counts exactly that, under any hash seed
        monkeypatch.setattr(monitor, "SAMPLE_SEED", seed)
        worker = FairnessMonitor(config)
        for a, b in zip(bounds[:-1], bounds[1:]):
            n = b - a
            worker.observe_batch(RepairedBatch(X[a:b], X[a:b], s[a:b], np.zeros(n, dtype=np.int64), None, keys[a:b],
                                               np.full(n, 1000.0), decision=decisions[a:b]), plain)
        window = worker.windows["count"].windows["dp", "before"].accumulator()
        assert np.array_equal(window.totals_[0], n_group)  # every record counted
        member = np.zeros(len(s), dtype=bool)
        member[sampled_rows(key_draws(keys), p)[0]] = True
        np.testing.assert_allclose(window.value().rates, estimate(member), rtol=1e-12)
    # Over many hash seeds, the estimates centre on the rates of all the records, with the variance of a
    # Horvitz-Thompson sum under Bernoulli sampling: sum((1 - p) / p * x^2) over the group's records (the decisions
    # are 0 or 1: (1 - p) / p times its positives), over N_g^2.
    exact = np.array([decisions[group].mean() for group in in_group])
    variance = (1 - p) / p * (in_group & (decisions == 1)).sum(axis=1) / n_group ** 2
    hashed = keys_to_uint64(keys)  # key_draws' first column under each seed
    members = np.array([uniforms(seed, hashed, 1)[:, 0] < p for seed in range(2000)])
    assert np.array_equal(members[11], member)  # the last seed the monitor ran under
    estimates = estimate(members[:, None, :])
    assert (np.abs(estimates.mean(axis=0) - exact) <= 4 * np.sqrt(variance / len(estimates))).all()
    # 1,999 degrees of freedom: the sample variance within 12% of the true one (4 standard errors)
    assert (np.abs(estimates.var(axis=0, ddof=1) / variance - 1) <= 4 * np.sqrt(2 / 1999)).all()


def without_map(scorer):
    """The scorer without its group map (no MDP: the test measures the classifier alone only)."""
    bare = copy.copy(scorer)
    bare.group_map_ = None
    return bare


def test_mdp_samples_wait_and_are_matched_in_one_call_per_read(monkeypatch, mapped_scorer):
    from fairstream.streams.worker import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "MATCH_ROWS", 1000)
    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
        window_records=30000, buckets=10, min_records=500, statistic="dp_difference")
    X, s, bounds = arrivals("alternating", np.random.default_rng(2))
    read_each, read_once = FairnessMonitor(config), FairnessMonitor(config)
    counting = CountingScorer(mapped_scorer.module)
    waiting, forced = 0, 0  # sampled rows waiting in read_once's queue, and the matches that bounds them
    for a, b in zip(bounds[:-1], bounds[1:]):
        n = b - a
        batch = RepairedBatch(X[a:b], X[a:b], s[a:b], np.zeros(n, dtype=np.int64), None, np.arange(a, b).astype(str),
                              np.full(n, 1000.0))
        read_each.observe_batch(batch, mapped_scorer)
        mdp_each = read_each.rows(statistic="mdp")  # a gauge export after every batch: matched batch by batch
        read_once.observe_batch(batch, Active("scorer", 1, "m" * 64, None, counting))
        waiting += len(sampled_rows(key_draws(batch.keys), config.monitor.sample_share)[0])
        if waiting >= 1000:
            waiting, forced = 0, forced + 1
    # Matched once MATCH_ROWS wait (no window read for that long), and the rest when the window is read.
    assert forced >= 2 and waiting and counting.count("match") == forced
    mdp_once = read_once.rows(statistic="mdp")
    assert counting.count("match") == forced + 1
    assert [row[:5] for row in mdp_once] == [row[:5] for row in mdp_each]
    assert all(a[5] == pytest.approx(b[5], rel=1e-9) for a, b in zip(mdp_once, mdp_each))  # the same pairs


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
    values = chain_values(archive.subset(slice(0, 4000)), (flow, scorer), "f", config)
    for batch in in_batches(values):
        assert monitor.observe(batch, flow, scorer) == []
    rows = {r[:5]: r[5] for r in monitor.rows()}
    data = archive.subset(slice(0, 4000))
    decisions = scorer.module.decision(data.X)
    women, men = decisions[data.s == 0].mean(), decisions[data.s == 1].mean()
    assert rows["dp_difference", "after", "all", "all", "all"] == pytest.approx(abs(men - women))
    positives = data.y == 1
    eopp = abs(decisions[positives & (data.s == 1)].mean() - decisions[positives & (data.s == 0)].mean())
    assert rows["eopp", "after", "all", "all", "all"] == pytest.approx(eopp)
    # The classifier alone (before; the identity flow changes nothing, so the same decisions) is measured on the
    # records the keys put in the sample: every record counted, positives estimated by the sampled decisions, each
    # counting the 1 / share records it stands for.
    sample, weight = sampled_rows(key_draws(decode_repaired(values, config).keys), config.monitor.sample_share)
    estimated = np.zeros(4000)
    estimated[sample] = decisions[sample] * weight

    def gap(among):  # |rate of group 1 - rate of group 0| among the records ``among``, by the estimated positives
        women, men = (estimated[among & (data.s == g)].sum() / (among & (data.s == g)).sum() for g in (0, 1))
        return abs(men - women)

    assert rows["dp_difference", "before", "all", "all", "all"] == pytest.approx(gap(np.ones(4000, dtype=bool)))
    assert rows["eopp", "before", "all", "all", "all"] == pytest.approx(gap(positives))
    assert monitor.statistic("count", "eopp") == pytest.approx(eopp)
    new_scorer = Active("scorer", 2, "d" * 64, None, scorer.module)
    monitor.observe(chain_values(archive.subset(slice(4000, 4600)), (flow, new_scorer), "g", config), flow, new_scorer)
    assert monitor.chain_key == (("flow", 1), ("scorer", 2)) and monitor.windows["count"].n_records == 600


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


# --------------------------------------------------------------------------- a monitor never stops the worker


def test_a_batch_the_monitor_cannot_measure_ends_that_versions_statistics_not_the_worker(adult, caplog):
    _, archive, plan, _ = adult
    monitor = FairnessMonitor(CONFIG)
    good = codec_arrays(repaired_values(archive.subset(slice(0, 1000)), plan, "h"))
    monitor.observe_batch(good, plan)
    unknown = good.take(np.arange(100))
    unknown.s = np.full(100, 7)  # a group the pipeline does not have: the accumulators raise on it
    with caplog.at_level(logging.ERROR, logger="fairstream.streams.worker.monitor"):
        assert monitor.observe_batch(unknown, plan) == []
        assert monitor.observe_batch(good, plan) == []  # the same version: counted, not measured, not logged again
    assert [r.levelname for r in caplog.records if "cannot measure" in r.getMessage()] == ["ERROR"]
    assert monitor.unmeasured == 1100 and monitor.rows() == [] and monitor.statistic() is None
    v2 = Active("plan", 2, "r" * 64, None, plan.module)  # the next version is monitored afresh
    monitor.observe_batch(good, v2)
    assert monitor.version == 2 and monitor.windows["count"].n_records == 1000 and monitor.rows()


def test_mdp_samples_that_cannot_be_matched_at_a_read_end_that_versions_statistics(mapped_scorer, caplog):
    class Unmatchable(CountingScorer):
        def matched_counterparts(self, X, s, y=None, draws=None):
            raise FloatingPointError("injected: the map cannot match")

    config = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(min_records=500, statistic="mdp")
    scorer = Active("scorer", 1, "x" * 64, None, Unmatchable(mapped_scorer.module))
    X, s = np.random.default_rng(0).normal(size=(1000, 2)), np.arange(1000) % 2
    batch = RepairedBatch(X, X, s, np.zeros(1000, dtype=np.int64), None, np.arange(1000).astype(str),
                          np.full(1000, 1000.0))
    monitor = FairnessMonitor(adult_config(records=AgentConfig(artifact="scorer")).with_monitor(min_records=500))
    monitor.observe_batch(batch, scorer)
    assert monitor.refused is None  # MDP's sample waits to be matched
    with caplog.at_level(logging.ERROR, logger="fairstream.streams.worker.monitor"):
        assert monitor.rows() == []  # the gauge export matches it, and cannot
        assert monitor.observe_batch(batch, scorer) == []
    assert monitor.refused == (("scorer", 1),) and monitor.unmeasured == 1000
    assert [r.levelname for r in caplog.records if "cannot measure" in r.getMessage()] == ["ERROR"]
    assert "injected: the map cannot match" in caplog.text
    # With MDP watched by a detector, the chunk that reads it matches it, within the batch: refused at once.
    watched = FairnessMonitor(config)
    assert watched.observe_batch(batch, scorer) == [] and watched.refused == (("scorer", 1),)


def test_a_plan_grid_ending_beyond_the_float_range_still_gives_finite_bins(adult):
    # A grid of 1e308 steps (hash-consistent, before load checked grid ends) made every batch raise in the
    # monitor ("bin edges must be finite"): the worker exited, restarted, met the same artifact, and so on.
    _, archive, plan, _ = adult
    huge = copy.deepcopy(plan.module)
    huge.grid_start_ = np.full_like(huge.grid_start_, 1e308)
    huge.grid_step_ = np.full_like(huge.grid_step_, 1e308)
    with np.errstate(over="ignore"):
        huge.grid_stop_ = huge.grid_start_ + huge.grid_step_ * (huge.grid_size_ - 1)
    monitor = FairnessMonitor(CONFIG)
    batch = codec_arrays(repaired_values(archive.subset(slice(0, 1000)), plan, "i"))
    monitor.observe_batch(batch, Active("plan", 3, "h" * 64, None, huge))
    assert monitor.refused is None and monitor.version == 3
    assert np.isfinite(stat(monitor, "dependence_e", "before")) and stat(monitor, "out_of_range_rate", "before") == 1


def test_a_first_batch_spanning_the_float_range_gets_finite_bins():
    X = np.array([[-1.7976931348623157e308, 0.0], [1.7976931348623157e308, 5e-324], [0.0, 1e-300]])
    for edges in stage_edges(None, X, 200):
        assert len(edges) == 201 and np.isfinite(edges).all() and (np.diff(edges) > 0).all()


ENDS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e308, -1e308, 5e-324, 0.0, 1.0])


@settings(max_examples=300, deadline=None)
@given(ENDS, ENDS, st.sampled_from([1, 20, 200]))
def test_finite_edges_are_finite_strictly_increasing_and_linspace_where_linspace_can(lo, hi, bins):
    edges = finite_edges(lo, hi, bins)
    bound = np.finfo(np.float64).max / 2  # bin centres and widths computed from the edges cannot overflow
    assert edges.shape == (bins + 1,) and (np.abs(edges) <= bound).all() and (np.diff(edges) > 0).all()
    with np.errstate(all="ignore"):
        reference = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        if (np.abs(reference) <= bound).all() and (np.diff(reference) > 0).all():
            assert edges.tolist() == reference.tolist()  # every real range: the bins are what they always were


def test_one_count_of_a_batch_gives_each_accumulator_what_its_own_update_counts(adult):
    # The monitor bins every histogram column at once and counts the rates from one encoding of the cells; each
    # accumulator, of the batch and of a piece of it (a detector's chunk), must hold what its public update counts.
    _, archive, plan, scorer = adult
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer"))).with_monitor(min_records=500)
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive.subset(slice(0, 1200)), config, id_prefix="c")]
    batch = RecordRepairer(config).process(messages, (plan, scorer)).monitor_batch
    batch = replace(batch, before=batch.before.copy())
    edges = stage_edges(plan.module, batch.before, monitor.E_BINS)
    for at in (0, 100):  # values on the edges and beyond them, in both pieces
        batch.before[at:at + 4] = [[e[0] for e in edges], [e[-1] for e in edges], [e[3] for e in edges], [-1e9, 1e9]]
    worker = FairnessMonitor(config)
    worker.observe_batch(batch, plan, scorer)
    statistics, chain = worker.statistics, monitor.as_chain((plan, scorer))
    view = monitor.monitored_batch(batch, chain, batch.out_of_range, config.monitor.sample_share)
    draws = key_draws(batch.keys)  # the view's sample, OTF priorities and MDP tie-breaks: the records' keys'
    rows, weight = sampled_rows(draws, config.monitor.sample_share)
    assert np.array_equal(view.sampled_before.rows, rows) and view.sampled_before.weight == weight
    assert np.array_equal(view.priority, draws[:, 1]) and np.array_equal(view.matched_after.draws, draws[rows, 2])
    counted = statistics.counted(view)
    for rows in (slice(0, len(view)), slice(100, 700)):
        made = statistics.of(counted) if rows.start == 0 else statistics.of(counted, statistics.factories, rows)
        part = view.take(rows)
        groups, strata = list(config.groups), list(config.strata)
        expected = {key: statistics.factories[key]().update(getattr(part, key[1]), part.s, part.u)
                    for key in itertools.product(("dependence_e", "w1"), ("before", "after"))}
        expected["dp", "label"] = PositiveRateAccumulator(groups, strata).update(part.y, part.s, part.u)
        expected["out_of_range_rate", "before"] = RateAccumulator(strata).update(part.out_of_range, part.u)
        sample = part.sampled_before
        for name, among in (("dp", None), ("eopp", part.y == 1)):
            expected[name, "after"] = DecisionRateAccumulator(groups, strata).count(
                part.decision_after, part.s, part.u, among=among)
            expected[name, "before"] = DecisionRateAccumulator(groups, strata).count(
                sample.decisions, part.s, part.u, among=among, rows=sample.rows, weight=sample.weight)
        for key, accumulator in expected.items():
            for name in accumulator._counts:
                pairs = list(zip(np.atleast_1d(getattr(made[key], name)), np.atleast_1d(getattr(accumulator, name))))
                assert all(np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype for a, b in pairs), key
        assert made["dependence_e", "before"].out_of_range_.sum() > 0
        assert set(made) == set(statistics.factories)


def test_a_detected_statistic_the_chain_cannot_measure_leaves_the_others_measured(adult):
    # Decision statistics are configured, but the chain has no scorer yet: batches spanning chunk boundaries are
    # measured piece by piece for the detected statistics, and those without an accumulator are left out.
    _, archive, plan, _ = adult
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer"))).with_monitor(
        statistic=("dp_difference", "mdp", "dependence_e"), min_records=500)
    worker = FairnessMonitor(config)
    handed = codec_arrays(repaired_values(archive.subset(slice(0, 2100)), plan, "n"))
    for start in range(0, 2100, 700):
        worker.observe_batch(handed.take(np.arange(start, start + 700)), plan)
    assert worker.refused is None and worker.unmeasured == 0
    assert stat(worker, "dependence_e", "after") > 0 and worker.statistic("count", "dp_difference") is None
