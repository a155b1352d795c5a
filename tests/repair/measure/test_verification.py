"""Tests of the verification metrics against brute-force definitions on small data."""

import doctest
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair.validation import RepairInputError
from fairstream.repair.measure import verification
from fairstream.repair.measure.verification import (
    CalibratedVerificationAccumulator,
    ScoreCurve,
    VerificationAccumulator,
    bias_ratio,
    cosine_scores,
    curve_distance,
    l2_normalise,
    paired_cosine,
    same_group_pair_scores,
    threshold_at_far,
    verification_rates,
)
from fairstream.repair.measure.windows import CountWindow

PROPERTY = settings(max_examples=60, deadline=None)

# Rounded scores make ties common: the conventions (<= for FRR, > for FAR) matter there.
scores_st = st.lists(st.integers(-20, 20), min_size=1, max_size=40).map(lambda v: np.array(v) / 20.0)


def test_docstring_examples_run():
    result = doctest.testmod(verification, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@PROPERTY
@given(scores_st, st.lists(st.integers(-25, 25), min_size=1, max_size=10))
def test_curve_matches_its_definition(scores, probes):
    curve = ScoreCurve.from_scores(scores)
    t = np.array(probes) / 20.0
    np.testing.assert_array_equal(curve.frr(t), [(scores <= x).mean() for x in t])
    np.testing.assert_array_equal(curve.far(t), [(scores > x).mean() for x in t])
    assert curve.n == scores.size


@PROPERTY
@given(scores_st, st.integers(0, 100))
def test_inverses_are_the_generalised_inverses(scores, percent):
    curve = ScoreCurve.from_scores(scores)
    candidates = np.unique(scores)  # both infima are attained at a score
    alpha = percent / 100
    far_ok = [(scores > t).mean() <= alpha for t in candidates]
    if alpha < 1:
        assert curve.far_inverse(alpha) == candidates[np.argmax(far_ok)]
    if alpha > 0:
        frr_ok = [(scores <= t).mean() >= alpha for t in candidates]
        assert curve.frr_inverse(alpha) == candidates[np.argmax(frr_ok)]


@PROPERTY
@given(scores_st, st.integers(0, 99))
def test_threshold_at_far_is_the_smallest_threshold_meeting_the_target(scores, percent):
    alpha = percent / 100
    t = threshold_at_far(scores, alpha)
    assert (scores > t).mean() <= alpha
    below = scores[scores < t]
    assert below.size == 0 or (scores > below.max()).mean() > alpha
    assert t == ScoreCurve.from_scores(scores).far_inverse(alpha)


def test_histogram_curve_puts_mass_at_left_edges():
    curve = ScoreCurve.from_histogram([0.0, 0.5, 1.0, 1.5], [2, 0, 3])
    assert curve.values.tolist() == [0.0, 1.0] and curve.cumulative.tolist() == [2, 5]
    assert curve.frr(0.99) == 0.4 and curve.far(1.0) == 0.0


@PROPERTY
@given(scores_st, scores_st)
def test_curve_distance_is_the_sup_over_all_thresholds(a, b):
    ca, cb = ScoreCurve.from_scores(a), ScoreCurve.from_scores(b)
    grid = np.linspace(-1.1, 1.1, 881)  # contains every value k/20 and points between them
    frr_gap = (a[:, None] <= grid).mean(axis=0) - (b[:, None] <= grid).mean(axis=0)
    far_gap = (a[:, None] > grid).mean(axis=0) - (b[:, None] > grid).mean(axis=0)
    assert curve_distance(ca, cb) == pytest.approx(np.abs(frr_gap).max(), abs=1e-12)
    assert curve_distance(ca, cb) == pytest.approx(np.abs(far_gap).max(), abs=1e-12)


def test_bias_ratio_conventions():
    assert bias_ratio([0.02, 0.02, 0.02]) == pytest.approx(1.0)
    assert bias_ratio([0.01, 0.09]) == pytest.approx(3.0)  # two groups: sqrt(max / min)
    assert bias_ratio([0.0, 0.1]) == np.inf
    assert np.isnan(bias_ratio([0.0, 0.0]))
    assert bias_ratio([0.01, np.nan, 0.04]) == pytest.approx(2.0)  # a group without pairs is left out


def test_invalid_inputs_raise_clearly():
    with pytest.raises(RepairInputError, match="FAR"):
        threshold_at_far([0.1, 0.2], 1.0)
    with pytest.raises(RepairInputError, match="at least one"):
        threshold_at_far([], 0.1)
    with pytest.raises(RepairInputError, match="non-finite"):
        verification_rates([0.1, np.nan], [0, 1], s=[0, 0], threshold=0.0)
    with pytest.raises(RepairInputError, match="unknown value 'c'"):
        VerificationAccumulator(["a", "b"], 0.5).update([0.1], [1], s=["c"])
    with pytest.raises(RepairInputError, match="strictly"):
        ScoreCurve([0.2, 0.1], [1, 2])


def brute_rates(scores, genuine, s, t, groups):
    def rate(hits, pairs):
        return hits.sum() / pairs.sum() if pairs.any() else np.nan
    far = [rate((scores > t) & (s == g) & ~genuine, (s == g) & ~genuine) for g in groups]
    frr = [rate((scores <= t) & (s == g) & genuine, (s == g) & genuine) for g in groups]
    return np.array(far), np.array(frr)


@st.composite
def labelled_pairs(draw):
    n = draw(st.integers(6, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s = np.array(["x", "y", "z"])[np.r_[0, 1, 0, 1, rng.integers(0, 3, n - 4)]]
    genuine = np.r_[True, True, False, False, rng.random(n - 4) < 0.3]
    scores = np.round(rng.uniform(-1, 1, n), 1)
    cuts = sorted(rng.integers(0, n + 1, 2))
    return scores, genuine, s, float(np.round(rng.uniform(-1, 1), 1)), cuts


@PROPERTY
@given(labelled_pairs())
def test_rates_and_streaming_accumulator_agree_with_brute_force(data):
    scores, genuine, s, t, (c1, c2) = data
    groups = ["x", "y", "z"]
    batch = verification_rates(scores, genuine, s, t, groups=groups)
    far, frr = brute_rates(scores, genuine, s, t, groups)
    np.testing.assert_array_equal(batch.far, far)
    np.testing.assert_array_equal(batch.frr, frr)
    assert batch.fnmr == (scores[genuine] <= t).mean()
    parts = [VerificationAccumulator(groups, t).update(scores[a:b], genuine[a:b], s[a:b])
             for a, b in ((0, c1), (c1, c2), (c2, len(s)))]
    merged = parts[0].merge(parts[1]).merge(parts[2]).value()
    for name in ("far", "frr", "false_accepts", "impostor_pairs", "false_rejects", "genuine_pairs"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(batch, name))
    assert merged.bfar == batch.bfar or (np.isnan(merged.bfar) and np.isnan(batch.bfar))


def test_accumulator_in_a_count_window_and_merge_rules():
    window = CountWindow(lambda: VerificationAccumulator([0, 1], threshold=0.5), size=4, buckets=2)
    window.update(np.array([0.9, 0.9, 0.9, 0.1, 0.1, 0.6]), genuine=np.array([0, 0, 1, 1, 0, 0]),
                  s=np.array([0, 1, 0, 1, 0, 1]))
    value = window.value()  # the last four pairs only
    assert value.false_accepts.tolist() == [0, 1] and value.false_rejects.tolist() == [0, 1]
    with pytest.raises(RepairInputError, match="cannot merge"):
        VerificationAccumulator([0, 1], 0.5).merge(VerificationAccumulator([0, 1], 0.6))
    acc = VerificationAccumulator([0, 1], 0.5).update([0.9], [0], [0])
    assert acc.reset().impostor_pairs_.tolist() == [0, 0]


def brute_pairs(V, ids, groups):
    Z = l2_normalise(V)
    rows = [(Z[i] @ Z[j], ids[i] == ids[j], groups[i]) for i, j in combinations(range(len(V)), 2)
            if groups[i] == groups[j]]
    scores, genuine, s = (np.array(x) for x in zip(*rows))
    return scores, genuine, s


@pytest.mark.parametrize("max_far, chunk", [(0.5, 7), (0.01, 3), (0.001, 64)])
def test_same_group_pair_scores_equals_brute_force(max_far, chunk):
    rng = np.random.default_rng(3)
    n = 90
    ids = rng.integers(0, 25, n)
    groups = np.array(["p", "q", "r"])[ids % 3]
    V = rng.normal(size=(n, 5)) + 0.8 * rng.normal(size=(25, 5))[ids]
    pairs = same_group_pair_scores(V, ids, groups, max_far=max_far, chunk_rows=chunk)
    scores, genuine, s = brute_pairs(V, ids, groups)
    assert pairs.n_impostor == int((~genuine).sum()) and pairs.genuine.size == int(genuine.sum())
    for far in (max_far, max_far / 3, 0.0):
        t = pairs.threshold(far)
        assert t == pytest.approx(threshold_at_far(scores[~genuine], far), abs=1e-12)
        # Block and pairwise products may differ in the last bit, so compare just above the threshold.
        t += 1e-9
        got, want = pairs.rates(t), verification_rates(scores, genuine, s, t)
        np.testing.assert_array_equal(got.false_accepts, want.false_accepts)
        np.testing.assert_array_equal(got.false_rejects, want.false_rejects)
        np.testing.assert_array_equal(got.impostor_pairs, want.impostor_pairs)
    if pairs.top.size < pairs.n_impostor:
        with pytest.raises(RepairInputError, match="below the kept"):
            pairs.rates(-1.0)
    with pytest.raises(RepairInputError, match="max_far"):
        pairs.threshold(min(2 * max_far, 0.9))
    gen_curve, imp_curve = pairs.curves(0)
    assert imp_curve.n == pairs.impostor_pairs[0] and gen_curve.n == int((pairs.genuine_group == 0).sum())


def test_score_map_is_applied_per_group():
    rng = np.random.default_rng(0)
    V, ids = rng.normal(size=(40, 4)), np.repeat(np.arange(10), 4)
    groups = ids % 2
    plain = same_group_pair_scores(V, ids, groups, max_far=0.5)
    shifted = same_group_pair_scores(V, ids, groups, max_far=0.5, score_map=lambda x, g: x + 0.1 * g)
    np.testing.assert_allclose(np.sort(shifted.genuine[shifted.genuine_group == 1]),
                               np.sort(plain.genuine[plain.genuine_group == 1]) + 0.1)


def test_cosine_scores_ignore_scale():
    a = np.random.default_rng(1).normal(size=(3, 4))
    np.testing.assert_allclose(cosine_scores(a, 5 * a), cosine_scores(a, a))
    np.testing.assert_allclose(np.diag(cosine_scores(a, a)), 1.0)


def test_paired_cosine_is_the_diagonal_of_the_score_matrix():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    np.testing.assert_allclose(paired_cosine(a, b), np.diag(cosine_scores(a, b)))
    with pytest.raises(RepairInputError, match="equal shapes"):
        paired_cosine(a, b[:2])


# --------------------------------------------------------------------------- calibrated at a target FAR

WIDTH = 2.0 / 20_000  # the calibrated accumulator's bin width on [-1, 1]


@st.composite
def binned_pairs(draw):
    """Pair scores at bin centres (so binning loses nothing; ties are common), genuine flags, groups, a FAR."""
    n = draw(st.integers(2, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bins = rng.integers(0, draw(st.sampled_from([40, 20_000])), n)  # few distinct bins: many ties
    scores = -1.0 + (bins + 0.5) * WIDTH
    return scores, rng.random(n) < 0.3, rng.choice(["a", "b", "c"], n), draw(st.sampled_from([0.01, 0.1, 0.3]))


@PROPERTY
@given(binned_pairs(), st.integers(1, 4))
def test_calibrated_rates_are_the_exact_rates_at_the_threshold_of_the_target_far(data, parts):
    scores, genuine, s, far = data
    if genuine.all():
        return
    accumulators = [CalibratedVerificationAccumulator(["a", "b", "c"], far).update(scores[rows], genuine[rows], s[rows])
                    for rows in np.array_split(np.arange(len(scores)), parts)]
    got = accumulators[0]
    for other in accumulators[1:]:
        got = got.merge(other)
    rates = got.value()
    t = threshold_at_far(scores[~genuine], far)  # the (k+1)-th largest impostor score, k = floor(far * n)
    exact = verification_rates(scores, genuine, s, threshold=t, groups=["a", "b", "c"])
    for name in ("false_accepts", "impostor_pairs", "false_rejects", "genuine_pairs"):
        assert getattr(rates, name).tolist() == getattr(exact, name).tolist(), name
    assert rates.far_overall <= far and t < rates.threshold <= t + WIDTH
    assert got.calibrated == (np.sum(~genuine) * far >= 1)


def test_the_calibrated_threshold_follows_a_monotone_rescaling_of_the_scores():
    rng = np.random.default_rng(0)
    scores = np.clip(np.r_[rng.normal(0.7, 0.1, 300), rng.normal(0.1, 0.15, 3000)], -1, 1)
    genuine, s = np.arange(3300) < 300, rng.choice(["a", "b"], 3300)
    fixed = [VerificationAccumulator(["a", "b"], 0.5).update(x, genuine, s).value() for x in (scores, (scores + 1) / 2)]
    assert fixed[1].fnmr < 0.5 * fixed[0].fnmr  # at one fixed threshold the rescaled module looks far better
    calibrated = [CalibratedVerificationAccumulator(["a", "b"], 0.01).update(x, genuine, s).value()
                  for x in (scores, (scores + 1) / 2)]
    assert calibrated[1].threshold == pytest.approx((calibrated[0].threshold + 1) / 2, abs=2 * WIDTH)
    # The same pairs are accepted but for those sharing a bin with the threshold: 3,300 scores over
    # ~1.5 of range leave about 1 per 1e-4 bin.
    for name in ("false_accepts", "false_rejects"):
        assert np.abs(getattr(calibrated[0], name) - getattr(calibrated[1], name)).max() <= 3, name


def test_a_calibrated_accumulator_refuses_a_zero_far_and_merges_only_at_one_far():
    with pytest.raises(RepairInputError, match="FAR > 0"):
        CalibratedVerificationAccumulator(["a"], 0.0)
    with pytest.raises(RepairInputError, match="different settings"):
        CalibratedVerificationAccumulator(["a"], 0.01).merge(CalibratedVerificationAccumulator(["a"], 0.02))
    empty = CalibratedVerificationAccumulator(["a"], 0.01).update([0.9], [1], ["a"])
    assert not empty.calibrated and empty.value().frr.tolist() == [1.0]  # no impostor yet: nothing is accepted
