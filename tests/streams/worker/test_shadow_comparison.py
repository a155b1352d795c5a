"""The shadow comparison: the active and the candidate chain measured on the same live records, cumulatively.

No broker: batches are built as the record agent hands them to the monitor (arrays of one batch), with the
decisions each chain wrote, so each test chooses what the two chains decided.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.measure.accumulators import HistogramDependenceAccumulator, WassersteinAccumulator
from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.worker.monitor import E_BINS, W1_BINS, plan_edges
from fairstream.streams.worker.shadow_comparison import MAX_FIGURES, ShadowComparison

CONFIG = adult_config()
COMPARED = ("dp_difference", "eopp", "dependence_e", "w1")


def clock() -> float:
    return 1_700_000_000.0


@pytest.fixture(scope="module")
def adult():
    return datasets.load("adult").split(3000, seed=0)


@pytest.fixture(scope="module")
def chains(adult):
    """An active chain (plan v1, scorer v1) and a candidate (plan v2, same scorer): what each decided is the batch's."""
    research, archive = adult
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y))
    plan = DistributionalRepair(n_q=50).fit(research.X, research.s, research.u)
    active = (Active("plan", 1, "a" * 64, None, plan), scorer)
    candidate = (Active("plan", 2, "b" * 64, None, plan), scorer)
    return archive.subset(slice(0, 3000)), active, candidate


def batch(data, decisions, labelled=True, shift=0.0) -> RepairedBatch:
    """The records of ``data`` as a chain delivered them: features moved by ``shift`` and ``decisions``."""
    n = len(data.s)
    return RepairedBatch(before=data.X, after=data.X + shift, s=data.s, u=data.u, y=data.y if labelled else None,
                         keys=np.array([f"k{i}" for i in range(n)], dtype=object), ts=np.full(n, clock()),
                         decision=np.asarray(decisions, dtype=np.int64))


def decided(s, rates, seed):
    """Decisions at the rate of each group (``rates[g]``), drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.random(len(s)) < np.asarray(rates)[s]).astype(np.int64)


def compared(data, active_decisions, candidate_decisions, pieces=1, labelled=True, shift=0.0, chains=None):
    _, active, candidate = chains
    comparison = ShadowComparison(CONFIG, COMPARED, clock=clock)
    a, c = batch(data, active_decisions, labelled), batch(data, candidate_decisions, labelled, shift)
    for rows in np.array_split(np.arange(len(data.s)), pieces):
        comparison.observe(a.take(rows), active, c.take(rows), candidate)
    return comparison


def rates_by_group(values, s):
    return np.array([values[s == g].mean() for g in (0, 1)])


def gap_se(decisions, s):
    p, n = rates_by_group(decisions, s), np.bincount(s, minlength=2)
    return np.sqrt(np.sum(p * (1 - p) / n))


def test_the_figures_are_those_of_every_record_since_the_candidate_began(chains):
    data, active, _ = chains
    a = decided(data.s, [0.2, 0.5], seed=1)
    c = decided(data.s, [0.3, 0.4], seed=2)
    figures = compared(data, a, c, pieces=3, shift=0.5, chains=chains).figures()
    s, y, u = data.s, data.y, data.u
    for role, d, shift in (("active", a, 0.0), ("candidate", c, 0.5)):
        rates = rates_by_group(d, s)
        assert figures[f"{role}.dp_difference"] == pytest.approx(rates.max() - rates.min(), abs=1e-12)
        positive = y == 1
        eopp = rates_by_group(d[positive], s[positive])
        assert figures[f"{role}.eopp"] == pytest.approx(eopp.max() - eopp.min(), abs=1e-12)
        assert figures[f"{role}.decision_rate"] == pytest.approx(d.mean(), abs=1e-12)
        assert figures[f"{role}.accuracy"] == pytest.approx(np.mean(d == y), abs=1e-12)
        for g in (0, 1):
            assert figures[f"{role}.decision_rate.{g}"] == pytest.approx(rates[g], abs=1e-12)
            assert figures[f"{role}.accuracy.{g}"] == pytest.approx(np.mean((d == y)[s == g]), abs=1e-12)
        # the histogram statistics on the plan's own bins, each counted once over all the records
        X = data.X + shift
        e = HistogramDependenceAccumulator(plan_edges(active[0].module, E_BINS), [0, 1], [0, 1]).update(X, s, u)
        w1 = WassersteinAccumulator(plan_edges(active[0].module, W1_BINS), [0, 1], [0, 1]).update(X, s, u)
        assert figures[f"{role}.dependence_e"] == pytest.approx(e.value().total, rel=1e-9)
        assert figures[f"{role}.w1"] == pytest.approx(np.mean(w1.value().per_feature), rel=1e-9)
    # two standard errors of the gap between the two groups' rates, the noisier side's
    assert figures["noise.dp_difference"] == pytest.approx(2 * max(gap_se(a, s), gap_se(c, s)), rel=1e-9)
    assert "noise.dependence_e" not in figures and "noise.w1" not in figures  # no noise floor of its own
    assert figures["records"] == 3000 and figures["since"] == clock()
    assert all(np.isfinite(v) for v in figures.values())


def test_the_same_records_and_decisions_on_both_sides_give_equal_figures(chains):
    data, _, _ = chains
    d = decided(data.s, [0.2, 0.5], seed=3)
    figures = compared(data, d, d.copy(), pieces=2, chains=chains).figures()
    paired = [key[len("active."):] for key in figures if key.startswith("active.")]
    assert len(paired) == len(COMPARED) + 2 + 2 * 2  # the statistics, decision rate and accuracy, and per group
    assert all(figures[f"active.{key}"] == figures[f"candidate.{key}"] for key in paired)


def test_a_candidate_that_equalises_the_decision_rates_shows_a_lower_gap_beyond_the_noise(chains):
    data, _, _ = chains
    figures = compared(data, decided(data.s, [0.2, 0.5], seed=4), decided(data.s, [0.35, 0.35], seed=5),
                       chains=chains).figures()
    assert figures["active.dp_difference"] - figures["candidate.dp_difference"] > figures["noise.dp_difference"]
    assert figures["candidate.dp_difference"] < figures["noise.dp_difference"]  # equal rates: within the noise


def test_one_batch_or_the_same_records_in_three_give_the_same_figures(chains):
    data, _, _ = chains
    a, c = decided(data.s, [0.2, 0.5], seed=6), decided(data.s, [0.3, 0.4], seed=7)
    whole = compared(data, a, c, pieces=1, shift=1.0, chains=chains).figures()
    split = compared(data, a, c, pieces=3, shift=1.0, chains=chains).figures()
    assert whole.keys() == split.keys()
    assert all(split[key] == pytest.approx(whole[key], rel=1e-9, abs=1e-12) for key in whole)


def test_without_labels_there_is_no_accuracy_and_no_eopp(chains):
    data, _, _ = chains
    figures = compared(data, decided(data.s, [0.2, 0.5], seed=8), decided(data.s, [0.3, 0.4], seed=9),
                       labelled=False, chains=chains).figures()
    assert not [key for key in figures if "accuracy" in key or "eopp" in key]
    assert {"active.dp_difference", "candidate.dp_difference", "active.decision_rate.1"} <= figures.keys()


def test_only_the_records_both_chains_delivered_are_compared(chains):
    data, active, candidate = chains
    a, c = decided(data.s, [0.2, 0.5], seed=10), decided(data.s, [0.3, 0.4], seed=11)
    accepted = np.flatnonzero(np.arange(3000) % 3 != 0)  # the candidate refused every third record
    comparison = ShadowComparison(CONFIG, COMPARED, clock=clock)
    comparison.observe(batch(data, a), active, batch(data, c).take(accepted), candidate)
    figures = comparison.figures()
    assert comparison.n_records == figures["records"] == len(accepted)
    assert figures["active.decision_rate"] == pytest.approx(a[accepted].mean(), abs=1e-12)


def test_many_groups_keep_every_compared_statistic_and_drop_whole_groups_past_the_bound(chains):
    data, _, _ = chains
    config = replace(CONFIG, groups=tuple(range(20)))
    s = np.arange(3000) % 20
    many = SimpleNamespace(X=data.X, s=s, u=data.u, y=data.y)
    rates = np.linspace(0.1, 0.6, 20)
    comparison = ShadowComparison(config, ("dp_difference", "eopp", "dependence_e", "w1", "dp_ratio"), clock=clock)
    _, active, candidate = chains
    comparison.observe(batch(many, decided(s, rates, 12)), active, batch(many, decided(s, rates[::-1], 13)), candidate)
    figures = comparison.figures()
    assert len(figures) <= MAX_FIGURES and all(np.isfinite(v) for v in figures.values())
    for name, role in itertools.product(("dp_difference", "eopp", "dependence_e", "w1", "dp_ratio"),
                                        ("active", "candidate")):
        assert f"{role}.{name}" in figures
    shown = {key.rsplit(".", 1)[1] for key in figures if key.count(".") == 2}
    # the statistics, their noise, the overall rates: 2 + 10 + 2 + 4 = 18 entries; 4 per group fit 11 groups
    assert shown == {str(g) for g in range(11)}
    assert all(f"{role}.{what}.{g}" in figures for role, what, g in
               itertools.product(("active", "candidate"), ("decision_rate", "accuracy"), range(11)))


def test_a_batch_it_cannot_measure_ends_the_comparison_without_raising(chains, caplog):
    data, active, candidate = chains
    comparison = ShadowComparison(CONFIG, COMPARED, clock=clock)
    good = decided(data.s, [0.2, 0.5], seed=14)
    comparison.observe(batch(data, good), active, batch(data, good), candidate)
    with caplog.at_level(logging.ERROR):
        comparison.observe(batch(data, good), active, batch(data, good * 2), candidate)  # a decision of 2
    assert "decisions must be 0 or 1" in comparison.failed and "shadow comparison" in caplog.text
    comparison.observe(batch(data, good), active, batch(data, good), candidate)  # no longer measured
    assert comparison.figures() == {"records": 3000.0, "since": clock()}


def test_both_sides_measure_mdp_on_the_same_records_chosen_by_key_whatever_the_batches(adult, chains):
    # Each side samples the records its key puts in the pipeline's sample (not a draw per batch and side): the same
    # records and decisions give both sides the same MDP, and so do the same records in other batches.
    data, (plan, _), _ = chains
    research, _ = adult
    mapped = Active("scorer", 2, "m" * 64, None, LogisticScorer().fit(research.X, research.y).attach_group_map(
        GroupTransportMap(n_points=300, seed=0).fit(research.X, research.s)))
    active, candidate = (plan, mapped), (Active("plan", 2, "b" * 64, None, plan.module), mapped)
    d = decided(data.s, [0.2, 0.5], seed=15)
    figures = []
    for pieces in (1, 4):
        comparison = ShadowComparison(CONFIG, ("mdp", "dp_difference"), clock=clock)
        for rows in np.array_split(np.random.default_rng(pieces).permutation(3000), pieces):
            comparison.observe(batch(data, d).take(rows), active, batch(data, d).take(rows), candidate)
        figures.append(comparison.figures())
    whole, split = figures
    assert whole["active.mdp"] > 0 and whole["active.mdp"] == whole["candidate.mdp"]
    assert split["active.mdp"] == pytest.approx(whole["active.mdp"], rel=1e-12, abs=1e-15)
    assert split["candidate.mdp"] == pytest.approx(whole["candidate.mdp"], rel=1e-12, abs=1e-15)
