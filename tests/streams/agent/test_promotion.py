"""The shadow policy's rule (fairstream.streams.agent.promotion): the simulation of its error rates, and its steps.

The simulation runs the product's own :func:`verdict` with the default ``ShadowConfig()`` (first look at 2,000
records, alpha 0.05) on two groups (shares 0.35 / 0.65) and correlated chains: the candidate decides as the active
chain does, except that each decision is re-drawn with probability 0.1 from a rate of the candidate's group chosen to
give it the wanted rates. With equal fairness the re-draw rate is the group's own, so the candidate equals the active
chain in distribution (the true gap is identical) but decides differently on some records. Records arrive in blocks
whose counts are drawn at once (multinomial per group and outcome) and summed per look: no loop per record.
``benchmarks/promotion_power.py`` runs the same simulation with more repetitions and prints its figures.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.agent.promotion import (
    MIN_CHUNKS,
    PROMOTE,
    RETIRE,
    WAIT,
    ChunkDifferences,
    PairedSums,
    ShadowEvidence,
    rate_gap_bound,
    verdict,
)
from fairstream.streams.config import STATISTICS, ShadowConfig

SHARES = (0.35, 0.65)
ACTIVE_RATES = (0.30, 0.22)  # a DP gap of 0.08
REDRAW = 0.1
BLOCK = 500


def outcome_probabilities(active: float, redraw_rate: float, redraw: float) -> np.ndarray:
    """P of (x=1, d=0), (x=1, d=-1), (x=0, d=0), (x=0, d=+1) for a record of a group: x the active decision, the
    candidate's re-drawn with probability ``redraw`` from ``redraw_rate``."""
    kept_or_same_1 = active * (1 - redraw) + active * redraw * redraw_rate
    kept_or_same_0 = (1 - active) * (1 - redraw) + (1 - active) * redraw * (1 - redraw_rate)
    return np.array([kept_or_same_1, active * redraw * (1 - redraw_rate), kept_or_same_0,
                     (1 - active) * redraw * redraw_rate])


def paired_sums_per_look(rng: np.random.Generator, repetitions: int, records: int, candidate_rates: tuple,
                         active_rates: tuple = ACTIVE_RATES, block: int = BLOCK) -> tuple[np.ndarray, ...]:
    """Cumulative (n, sum x, sum d, sum d^2) per repetition, block and group, shape (repetitions, blocks, groups):
    every block of ``block`` records is a look. Sums of x^2 equal sums of x (0/1 decisions)."""
    blocks = records // block
    per_group = rng.multinomial(block, SHARES, size=(repetitions, blocks))
    counts = np.empty((repetitions, blocks, len(SHARES), 4))
    for g, (active, candidate) in enumerate(zip(active_rates, candidate_rates)):
        # The candidate's rate is (1 - redraw) active + redraw * redraw_rate.
        redraw_rate = (candidate - (1 - REDRAW) * active) / REDRAW
        assert 0 <= redraw_rate <= 1, "the re-draw cannot reach that candidate rate"
        counts[:, :, g] = rng.multinomial(per_group[:, :, g], outcome_probabilities(active, redraw_rate, REDRAW))
    counts = counts.cumsum(axis=1)
    ones_kept, ones_lost, _, ones_won = np.moveaxis(counts, -1, 0)
    return counts.sum(axis=-1), ones_kept + ones_lost, ones_won - ones_lost, ones_won + ones_lost


def simulate(repetitions: int, candidate_rates: tuple, records: int = 40_000, every: int = BLOCK,
             active_rates: tuple = ACTIVE_RATES, config: ShadowConfig = ShadowConfig(),
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(action, records at the decision) per repetition: the first promote or retire of :func:`verdict` over the
    looks every ``every`` records from ``config.min_records`` (a decision is final), else ("wait", inf)."""
    rng = np.random.default_rng(seed)
    n, ones, change, change_sq = paired_sums_per_look(rng, repetitions, records, candidate_rates, active_rates)
    looks = [b for b in range(n.shape[1]) if (b + 1) * BLOCK >= config.min_records and (b + 1) * BLOCK % every == 0]
    actions, when = np.full(repetitions, WAIT, dtype=object), np.full(repetitions, np.inf)
    cells = tuple(str(g) for g in range(len(SHARES)))
    for rep in range(repetitions):
        for b in looks:
            sums = PairedSums(n[rep, b], ones[rep, b], ones[rep, b], change[rep, b], change_sq[rep, b], cells)
            result = verdict(ShadowEvidence((b + 1) * BLOCK, {"dp_difference": sums}, {}), config, ("dp_difference",))
            if result.action != WAIT:
                actions[rep], when[rep] = result.action, (b + 1) * BLOCK
                break
    return actions, when


def improved(rates: tuple, improvement: float) -> tuple:
    """The rates with the gap between the two groups narrowed by ``improvement`` (half from each side)."""
    high, low = rates
    return high - improvement / 2, low + improvement / 2


def promoted_by_look(actions: np.ndarray, when: np.ndarray, looks: range) -> np.ndarray:
    """The cumulative share of repetitions promoted by each look."""
    return np.array([np.mean((actions == PROMOTE) & (when <= look)) for look in looks])


# --- the simulation --------------------------------------------------------------------------------------------


def test_a_candidate_exactly_as_fair_is_promoted_in_at_most_alpha_of_runs_at_every_look():
    config = ShadowConfig()
    actions, when = simulate(1000, ACTIVE_RATES)
    shares = promoted_by_look(actions, when, range(config.min_records, 40_001, BLOCK))
    assert (shares <= config.alpha).all(), shares


@pytest.mark.parametrize("rates", [(0.26, 0.26), (0.40, 0.20)], ids=["no gap", "gap 0.2"])
def test_equal_fairness_stays_under_alpha_whatever_the_gap(rates):
    actions, when = simulate(1000, rates, active_rates=rates, every=4000)
    shares = promoted_by_look(actions, when, range(4000, 40_001, 4000))
    assert (shares <= ShadowConfig().alpha).all(), shares


def test_a_gap_narrower_by_two_hundredths_is_promoted_in_most_runs():
    actions, when = simulate(300, improved(ACTIVE_RATES, 0.02), seed=1)
    assert np.mean(actions == PROMOTE) >= 0.8
    median = np.median(when[actions == PROMOTE])
    assert ShadowConfig().min_records <= median <= 20_000  # about 11,000 records (the benchmark's figure)


def test_a_gap_wider_by_two_hundredths_is_retired_in_most_runs_and_never_promoted():
    actions, _ = simulate(300, improved(ACTIVE_RATES, -0.02), seed=2)
    assert np.mean(actions == RETIRE) >= 0.8 and not np.any(actions == PROMOTE)


# --- the steps of the rule -------------------------------------------------------------------------------------


def two_groups(active_rates=(0.30, 0.22), changes=(0.0, 0.0), n=(35_000, 65_000)) -> PairedSums:
    """Sums as two groups of ``n`` records would give them (the rates and changes exact, 10% of decisions changed)."""
    n = np.asarray(n, dtype=float)
    changed = 0.1 * n  # d in {-1, 0, 1}: sum of d^2 counts the changed decisions
    return PairedSums(n, np.asarray(active_rates) * n, np.asarray(active_rates) * n, np.asarray(changes) * n,
                      changed, ("a", "b"))


def accuracy_sums(drop: float, n: int = 20_000) -> PairedSums:
    """One cell: the candidate's accuracy ``drop`` below the active chain's on ``n`` labelled records, 10% of
    decisions changed."""
    return PairedSums(np.array([n]), np.array([0.8 * n]), np.array([0.8 * n]), np.array([-drop * n]),
                      np.array([0.1 * n]), ("all",))


RECORDS = 100_000
BETTER = two_groups(changes=(-0.02, 0.02))  # on RECORDS records, the candidate narrows the gap by 0.04
SAME = two_groups()


def test_a_candidate_that_refused_a_record_or_failed_is_retired_at_once():
    refused = verdict(ShadowEvidence(10, {"dp_difference": BETTER}, {}, refused=1), ShadowConfig(), ("dp_difference",))
    assert refused.action == RETIRE and "refused 1 records" in refused.reason
    failed = verdict(ShadowEvidence(10, {"dp_difference": BETTER}, {}, failed="ZeroDivisionError: division by zero"),
                     ShadowConfig(), ("dp_difference",))
    assert failed.action == RETIRE and "ZeroDivisionError" in failed.reason


def test_the_policy_waits_below_min_records_even_for_a_clearly_better_candidate():
    result = verdict(ShadowEvidence(1999, {"dp_difference": BETTER}, {}), ShadowConfig(), ("dp_difference",))
    assert result.action == WAIT and "1999 of the 2000" in result.reason
    assert verdict(ShadowEvidence(2000, {"dp_difference": BETTER}, {}), ShadowConfig(),
                   ("dp_difference",)).action == PROMOTE


def test_a_clearly_better_candidate_is_promoted_and_the_reason_says_why():
    result = verdict(ShadowEvidence(RECORDS, {"dp_difference": BETTER}, {}, accuracy=accuracy_sums(0.0)),
                     ShadowConfig(), ("dp_difference",))
    assert result.action == PROMOTE
    bound, guard = result.bounds[0], result.guards[0]
    assert bound.passed and bound.lower > 0 and bound.lower <= bound.estimate <= bound.upper
    assert bound.estimate == pytest.approx(0.04) and bound.method == "paired records"
    assert guard.statistic == "accuracy" and guard.passed
    assert "alpha = 0.05" in result.reason and "dp_difference improves by 0.0400" in result.reason
    assert "better by more than 0 for sure" in result.reason and "accuracy guard" in result.reason


def test_an_undecided_candidate_waits_and_at_the_cap_is_retired():
    config = ShadowConfig(max_records=RECORDS)
    early = verdict(ShadowEvidence(RECORDS - 1, {"dp_difference": SAME}, {}), config, ("dp_difference",))
    assert early.action == WAIT and early.bounds[0].passed is None
    capped = verdict(ShadowEvidence(RECORDS, {"dp_difference": SAME}, {}), config, ("dp_difference",))
    assert capped.action == RETIRE and "cap reached" in capped.reason


def test_a_clearly_better_candidate_whose_accuracy_drops_is_retired():
    result = verdict(ShadowEvidence(RECORDS, {"dp_difference": BETTER}, {}, accuracy=accuracy_sums(0.1)),
                     ShadowConfig(), ("dp_difference",))
    assert result.bounds[0].passed is True and result.guards[0].passed is False
    assert result.action == RETIRE and "more than 0.02 for sure" in result.reason


def test_an_accuracy_drop_near_the_limit_keeps_the_policy_waiting():
    result = verdict(ShadowEvidence(RECORDS, {"dp_difference": BETTER}, {}, accuracy=accuracy_sums(0.02)),
                     ShadowConfig(), ("dp_difference",))
    assert result.guards[0].passed is None and result.action == WAIT


def test_without_labels_the_decision_rate_guard_applies():
    moved = PairedSums(np.array([RECORDS]), np.array([0.25 * RECORDS]), np.array([0.25 * RECORDS]),
                       np.array([0.1 * RECORDS]), np.array([0.1 * RECORDS]), ("all",))  # 10 points more yes
    result = verdict(ShadowEvidence(RECORDS, {"dp_difference": BETTER}, {}, decisions=moved), ShadowConfig(),
                     ("dp_difference",))
    assert result.guards[0].statistic == "decision_rate" and result.guards[0].passed is False
    assert result.action == RETIRE and "decision-rate guard" in result.reason


def test_a_worse_candidate_is_retired_for_sure():
    worse = two_groups(changes=(0.02, -0.02))
    result = verdict(ShadowEvidence(RECORDS, {"dp_difference": worse}, {}), ShadowConfig(), ("dp_difference",))
    assert result.bounds[0].passed is False and result.action == RETIRE
    assert "excludes an improvement of more than 0" in result.reason


def test_min_improvement_is_what_the_lower_bound_must_exceed():
    evidence = ShadowEvidence(100_000, {"dp_difference": BETTER}, {})  # the candidate narrows the gap by 0.04
    enough = verdict(evidence, ShadowConfig(min_improvement=0.02), ("dp_difference",))
    assert enough.action == PROMOTE and enough.bounds[0].lower > 0.02
    too_much = verdict(evidence, ShadowConfig(min_improvement=0.06), ("dp_difference",))
    assert too_much.action == RETIRE and too_much.bounds[0].upper <= 0.06
    assert "excludes an improvement of more than 0.06" in too_much.reason


def test_pairing_bounds_the_improvement_far_tighter_than_the_gaps_themselves():
    """Identical chains (no decision changed): the improvement is known to be 0 within the changes' width only."""
    identical = replace(SAME, change_sq=np.zeros(2))
    bound = rate_gap_bound("dp_difference", identical, 0.05, 0.0)
    rates_width = rate_gap_bound("dp_difference", SAME, 0.05, 0.0)
    assert bound.lower < 0 < bound.upper and bound.upper - bound.lower < 0.05
    assert bound.upper - bound.lower < rates_width.upper - rates_width.lower


def test_chunk_statistics_need_min_chunks_then_follow_their_sequence():
    def chunks(t: int, mean: float, sd: float = 0.005) -> ChunkDifferences:
        return ChunkDifferences(t, t * mean, t * (mean**2 + sd**2), 0.08, 0.08 - mean)

    early = verdict(ShadowEvidence(5000, {}, {"w1": chunks(MIN_CHUNKS - 1, 0.03)}), ShadowConfig(), ("w1",))
    assert early.action == WAIT and early.bounds[0].passed is None and early.bounds[0].method == "paired chunks"
    better = verdict(ShadowEvidence(40_000, {}, {"w1": chunks(40, 0.03)}), ShadowConfig(), ("w1",))
    assert better.action == PROMOTE and better.bounds[0].estimate == pytest.approx(0.03)
    worse = verdict(ShadowEvidence(40_000, {}, {"w1": chunks(40, -0.03)}), ShadowConfig(), ("w1",))
    assert worse.action == RETIRE and worse.bounds[0].passed is False


def test_promotion_needs_every_compared_statistic_to_pass():
    evidence = ShadowEvidence(40_000, {"dp_difference": BETTER},
                              {"w1": ChunkDifferences(40, 0.0, 40 * 0.005**2, 0.08, 0.08)})
    result = verdict(evidence, ShadowConfig(), ("dp_difference", "w1"))
    assert [b.passed for b in result.bounds] == [True, None] and result.action == WAIT


def test_a_compared_statistic_never_measured_cannot_pass():
    evidence = ShadowEvidence(RECORDS, {"dp_difference": BETTER}, {})
    result = verdict(evidence, ShadowConfig(), ("dp_difference", "eopp"))
    assert result.action == WAIT and "eopp: not measured yet" in result.reason
    capped = verdict(replace(evidence, records=ShadowConfig().max_records), ShadowConfig(), ("dp_difference", "eopp"))
    assert capped.action == RETIRE and "eopp: never measured" in capped.reason


def test_a_group_without_records_leaves_a_rate_gap_undecided():
    empty = two_groups(n=(0, 6500))
    bound = rate_gap_bound("dp_difference", empty, 0.05, 0.0)
    assert bound.passed is None and math.isinf(bound.lower) and math.isinf(bound.upper)


def test_nothing_to_compare_retires_and_an_unknown_statistic_is_refused():
    assert verdict(ShadowEvidence(10_000, {}, {}), ShadowConfig(), ()).action == RETIRE
    with pytest.raises(ValueError, match="unknown statistic"):
        verdict(ShadowEvidence(10_000, {}, {}), ShadowConfig(), ("gini",))


def test_figures_are_few_finite_and_short_named_and_the_reason_fits_a_control_record():
    rates = {name: BETTER for name in ("dp_difference", "eopp")}
    chunks = {name: ChunkDifferences(40, 1.2, 40 * (0.03**2 + 0.005**2), 0.08, 0.05)
              for name in STATISTICS if name not in rates}
    evidence = ShadowEvidence(RECORDS, rates, chunks, accuracy=accuracy_sums(0.0))
    result = verdict(evidence, ShadowConfig(), STATISTICS)
    figures = result.figures()
    assert len(figures) <= 64 and all(len(name) <= 64 and math.isfinite(v) for name, v in figures.items())
    assert figures["records"] == RECORDS and figures["alpha"] == 0.05
    dp_difference = next(bound for bound in result.bounds if bound.statistic == "dp_difference")
    assert figures["bound.dp_difference.lower"] == dp_difference.lower
    assert len(figures) == 2 + 3 * len(STATISTICS) + 3
    assert {f"guard.accuracy.{part}" for part in ("estimate", "lower", "upper")} <= figures.keys()
    assert len(result.reason) <= 1000 and result.action == PROMOTE
    undecided = verdict(replace(evidence, chunks={}), ShadowConfig(), ("w1",)).figures()
    assert not any(name.startswith("bound.w1") for name in undecided)  # infinite or NaN: left out


# --- the evidence's sums ---------------------------------------------------------------------------------------


def test_paired_sums_of_records_count_per_cell_and_merge_adds_them():
    x, d, codes = np.array([1.0, 0, 1, 1]), np.array([0.0, 1, -1, 0]), np.array([0, 1, 1, 0])
    sums = PairedSums.of(x, d, codes, ("a", "b"))
    np.testing.assert_array_equal(sums.n, [2, 2])
    np.testing.assert_array_equal(sums.active, [2, 1])
    np.testing.assert_array_equal(sums.change, [0, 0])
    np.testing.assert_array_equal(sums.change_sq, [0, 2])
    halves = PairedSums.of(x[:2], d[:2], codes[:2], ("a", "b")).merge(PairedSums.of(x[2:], d[2:], codes[2:],
                                                                                    ("a", "b")))
    for name in ("n", "active", "active_sq", "change", "change_sq"):
        np.testing.assert_array_equal(getattr(halves, name), getattr(sums, name))


def test_paired_sums_refuse_other_cells_and_codes_out_of_range():
    sums = PairedSums.of([1.0], [0.0], [0], ("a", "b"))
    with pytest.raises(ValueError, match="cells"):
        sums.merge(PairedSums.of([1.0], [0.0], [0], ("a", "c")))
    with pytest.raises(ValueError, match="range"):
        PairedSums.of([1.0], [0.0], [2], ("a", "b"))
    with pytest.raises(ValueError, match="one entry per cell"):
        PairedSums(np.ones(3), np.ones(2), np.ones(2), np.ones(2), np.ones(2), ("a", "b"))


group_sums = st.integers(2, 4).flatmap(lambda k: st.lists(
    st.tuples(st.integers(1, 5000), st.floats(0, 1), st.floats(-0.2, 0.2), st.floats(0, 0.3)), min_size=k,
    max_size=k))


@settings(max_examples=50)
@given(group_sums)
def test_a_rate_gap_bound_holds_its_estimate(groups):
    n, rate, change, changed = (np.array(column, dtype=float) for column in zip(*groups))
    change = np.clip(change, -rate, 1 - rate)  # a candidate's rate stays in [0, 1]
    changed = np.maximum(changed, np.abs(change))  # as many decisions changed as the net change needs, at least
    sums = PairedSums(n, rate * n, rate * n, change * n, changed * n, tuple("abcd"[:len(n)]))
    bound = rate_gap_bound("dp_difference", sums, 0.05, 0.0)
    assert bound.lower <= bound.estimate + 1e-12 and bound.estimate <= bound.upper + 1e-12
