"""Conventions of the batch metrics that mutation testing (docs/mutation.md) found unpinned by test_metrics.py."""

import numpy as np
import pytest

from fairstream.repair.measure.metrics import (
    auc,
    demographic_parity,
    dependence_e_noise_floor,
    wasserstein_between_groups,
)
from fairstream.repair.validation import RepairInputError


def test_the_noise_floors_spread_is_the_sample_sd_across_permutations():
    rng = np.random.default_rng(0)
    X, s = rng.normal(size=(200, 3)), rng.integers(0, 2, 200)
    floor = dependence_e_noise_floor(X, s, n_permutations=6)
    assert floor.samples.shape == (6, 3)  # one row per permutation, one column per feature
    np.testing.assert_allclose(floor.per_feature_sd, [np.std(column, ddof=1) for column in floor.samples.T])
    totals = floor.samples.sum(axis=1)
    assert floor.total_sd == pytest.approx(np.std(totals, ddof=1)) and floor.total_mean == pytest.approx(totals.mean())
    np.testing.assert_allclose(floor.per_feature_mean, [np.mean(column) for column in floor.samples.T])
    assert dependence_e_noise_floor(X, s, n_permutations=2).samples.shape == (2, 3)  # two are enough for an sd
    # strata change what is permuted (within each stratum) and measured (per stratum)
    within = dependence_e_noise_floor(X, s, u=rng.integers(0, 3, 200), n_permutations=6)
    assert not np.allclose(within.samples, floor.samples)
    with pytest.raises(RepairInputError, match="n_permutations must be an integer >= 2"):
        dependence_e_noise_floor(X, s, n_permutations=1)


def test_a_group_of_one_record_counts_in_demographic_parity():
    result = demographic_parity([1, 0, 0, 0], s=["a", "b", "b", "b"])
    assert result.difference == 1.0 and result.ratio == 0.0


def test_a_stratum_with_one_group_adds_zero_wasserstein():
    # stratum 0 holds both groups (W1 = 1 on the feature), stratum 1 only group 0: its term is 0, weighted 2/6
    result = wasserstein_between_groups([[0.0], [1.0], [1.0], [2.0], [5.0], [7.0]], s=[0, 0, 1, 1, 0, 0],
                                        u=[0, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(result.per_stratum[:, 0], [1.0, 0.0])
    np.testing.assert_allclose(result.weights, [4 / 6, 2 / 6])
    assert result.per_feature[0] == pytest.approx(4 / 6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_is_the_share_of_positive_negative_pairs_ranked_right_ties_counting_half(seed):
    rng = np.random.default_rng(seed)
    score, positive = rng.integers(0, 5, 40) / 4, rng.random(40) < 0.3  # many ties, unbalanced classes
    pairs = [(p, n) for p in score[positive] for n in score[~positive]]  # the O(n^2) definition
    expected = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    assert auc(score, positive) == pytest.approx(expected, rel=1e-12)
    assert np.isnan(auc(score, np.zeros(40, dtype=bool))) and np.isnan(auc(score, np.ones(40, dtype=bool)))


def test_auc_of_a_single_positive_or_negative_is_its_rank_among_the_other_class():
    # The smallest classes are where a guard that starts one too early hides (a mutant survived here).
    score = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    one_positive = np.array([False, False, False, True, False])
    assert auc(score, one_positive) == pytest.approx(3 / 4)  # above three of the four negatives
    assert auc(score, ~one_positive) == pytest.approx(1 / 4)  # one negative, above one of four positives
