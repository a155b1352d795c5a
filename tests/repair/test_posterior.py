"""Pr[s | x, u]: calibration on data from a known logistic model, shapes, row-wise determinism."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.special import expit

from fairstream.repair.validation import RepairInputError
from fairstream.repair.logistic import fit_logistic, fit_logistic_stack
from fairstream.repair.posterior import (
    GroupPosterior,
    calibration_metrics,
    distinct_rows,
    missing_mask,
    one_vs_rest,
    polynomial_design,
)


def logistic_data(n, coef_by_stratum, seed):
    """x ~ N(0, I_2); Pr[s = 1 | x, u] = sigmoid(a + b x_0 + c x_0^2 + d x_1) with per-stratum (a, b, c, d)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, len(coef_by_stratum), n)
    X = rng.normal(size=(n, 2))
    a, b, c, d = np.array(coef_by_stratum)[u].T
    p = expit(a + b * X[:, 0] + c * X[:, 0] ** 2 + d * X[:, 1])
    return X, (rng.random(n) < p).astype(int), u, p


coefficients = st.tuples(st.floats(-1, 1), st.floats(-2, 2), st.floats(-0.8, 0.8), st.floats(-2, 2))


@settings(max_examples=8, deadline=None)
@given(st.lists(coefficients, min_size=1, max_size=2), st.integers(0, 1000))
def test_probabilities_recover_a_known_posterior_and_are_calibrated(coefs, seed):
    X, s, u, p_true = logistic_data(6000, coefs, seed)
    assume(min(np.bincount(s, minlength=2)) >= 100)  # enough of both groups to estimate anything
    post = GroupPosterior(degree=2).fit(X, s, u)
    proba = post.predict_proba(X, u)
    assert np.allclose(proba.sum(axis=1), 1.0)
    assert np.mean(np.abs(proba[:, 1] - p_true)) < 0.04
    report = post.report()
    assert report["ece"] < 0.04
    # Cross-validated log-loss is close to the true model's (no overfitting with 5 parameters).
    true_loss = calibration_metrics(np.column_stack([1 - p_true, p_true]), s)[0]
    assert report["log_loss"] < true_loss + 0.02


def test_bic_keeps_squares_only_where_the_data_need_them():
    rng = np.random.default_rng(3)
    n = 20_000
    x = rng.normal(size=n)
    # Stratum 0: log-odds linear in x; stratum 1: groups with unequal spread (log-odds quadratic).
    u = rng.integers(0, 2, n)
    s = (rng.random(n) < expit(np.where(u == 0, 1.5 * x, 1.5 * x ** 2 - 1.0))).astype(int)
    post = GroupPosterior(degree="bic").fit(x[:, None], s, u)
    squares = post.coef_[:, 1, 2]  # group 1's coefficient of x^2, per stratum
    assert squares[0] == 0.0 and abs(squares[1]) > 1.0


def test_absent_and_single_groups():
    X = np.arange(12.0).reshape(6, 2)
    post = GroupPosterior(n_folds=0).fit(X, s=[0, 0, 0, 1, 0, 1], u=[0, 0, 0, 1, 1, 1], groups=[0, 1, 2])
    proba = post.predict_proba(X, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(proba[:3], [[1.0, 0.0, 0.0]] * 3)  # stratum 0 only ever saw group 0
    assert np.all(proba[:, 2] == 0.0)  # group 2 never seen
    assert np.allclose(proba.sum(axis=1), 1.0)


BATCH = logistic_data(300, [(0.2, 1.0, 0.3, -0.5), (-0.3, 0.5, -0.2, 1.0)], seed=4)
BATCH_POSTERIOR = GroupPosterior().fit(*BATCH[:3])


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 299))
def test_a_rows_probabilities_do_not_depend_on_its_batch(cut):
    X, s, u, _ = BATCH
    post = BATCH_POSTERIOR
    whole = post.predict_proba(X, u)
    np.testing.assert_array_equal(post.predict_proba(X[cut:], u[cut:]), whole[cut:])
    np.testing.assert_array_equal(post.predict_proba(X[cut - 1], u[cut - 1:cut]), whole[cut - 1:cut])


def test_arrays_round_trip_bit_exact():
    X, s, u, _ = logistic_data(2000, [(0.1, 1.0, 0.5, 0.0), (0.0, -1.0, 0.0, 2.0)], seed=5)
    post = GroupPosterior().fit(X, s, u)
    again = GroupPosterior.from_arrays(post.to_arrays(), post.groups_, post.strata_)
    np.testing.assert_array_equal(again.predict_proba(X, u), post.predict_proba(X, u))
    assert again.degree == post.degree and again.l2 == post.l2
    np.testing.assert_array_equal(again.cv_, post.cv_)


def test_missing_mask_reads_none_and_nan_only():
    assert missing_mask(np.array([0, 1, 2])).tolist() == [False] * 3
    assert missing_mask(np.array(["f", "m"])).tolist() == [False, False]
    assert missing_mask(np.array([1.0, np.nan])).tolist() == [False, True]
    assert missing_mask(np.array(["m", None, np.nan, 0], dtype=object)).tolist() == [False, True, True, False]


def test_unseen_stratum_and_unfitted_raise():
    post = GroupPosterior(n_folds=0).fit([[0.0], [1.0], [2.0], [3.0]], [0, 1, 0, 1], [0, 0, 0, 0])
    with pytest.raises(RepairInputError, match="u has an unknown value 7"):
        post.predict_proba([[0.0]], [7])
    with pytest.raises(RepairInputError, match="not fitted"):
        GroupPosterior().predict_proba([[0.0]], [0])
    with pytest.raises(RepairInputError, match="degree"):
        GroupPosterior(degree=0).fit([[0.0], [1.0]], [0, 1], [0, 0])


@pytest.mark.parametrize("n_groups", [2, 3])
def test_the_fit_on_distinct_rows_is_the_per_row_maximum_likelihood_fit(n_groups):
    # Integer features repeat (ages, hours): the posterior is fitted once per distinct row with its
    # group counts, and with two groups one regression is mirrored. Both must give the coefficients
    # of one logistic regression per group on every row.
    rng = np.random.default_rng(n_groups)
    X = rng.integers(0, 12, size=(4000, 2)).astype(float)
    codes = np.minimum((X[:, 0] / 4 + rng.normal(size=4000)).astype(int).clip(0), n_groups - 1)
    values, counts = distinct_rows(X, codes, n_groups)
    assert len(values) <= 144 and counts.sum() == 4000 and len(np.unique(values, axis=0)) == len(values)
    for v, c in zip(values[:20], counts[:20]):
        np.testing.assert_array_equal(c, np.bincount(codes[(X == v).all(axis=1)], minlength=n_groups))
    standardise = lambda Z: (Z - X.mean(axis=0)) / X.std(axis=0)
    got = one_vs_rest(polynomial_design(standardise(values), 2), counts, 1e-3)
    per_row = polynomial_design(standardise(X), 2)
    want = [fit_logistic(per_row, (codes == g).astype(float), 1e-3)[0] for g in range(n_groups)]
    np.testing.assert_allclose(got, want, atol=1e-6)


def logistic_problem(rng, rows, separable=False):
    """Grouped rows of a random logistic problem: design (intercept and two columns), records and positives per row."""
    Z = np.column_stack([np.ones(rows), 4.0 * rng.normal(size=rows), 3.0 * rng.normal(size=rows) ** 2])
    total = rng.integers(1, 30, rows).astype(float)
    p = (Z[:, 1] > 0.5).astype(float) if separable else expit(Z @ rng.normal(scale=0.3, size=3))
    return Z, rng.binomial(total.astype(int), p).astype(float), total


def penalised_loss(theta, Z, positive, total, l2):
    eta = Z @ theta
    return (total @ np.logaddexp(0.0, eta) - positive @ eta) / total.sum() + 0.5 * l2 * theta[1:] @ theta[1:]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stacked_problems_take_the_steps_each_would_take_alone(seed):
    # A plan fit solves every (stratum, feature, degree) regression in one stack: of different sizes, one
    # using fewer columns, one separable (only the ridge keeps it finite). Each must stop on its own and get
    # the parameters it gets alone (up to the rounding of another summation order: a lone problem's sums
    # are matrix products) and the minimum of its penalised loss.
    from scipy.optimize import minimize

    rng = np.random.default_rng(seed)
    problems = [logistic_problem(rng, rows, separable)
                for rows, separable in ((5, False), (40, False), (30, True), (1, False))]
    widths = np.array([3, 2, 3, 3])
    lengths = np.array([len(Z) for Z, _, _ in problems])
    masked = [Z * (np.arange(3) < w) for (Z, _, _), w in zip(problems, widths)]
    theta, n_iter, converged = fit_logistic_stack(np.concatenate(masked), np.concatenate([y for _, y, _ in problems]),
                                                  np.concatenate([t for _, _, t in problems]),
                                                  np.cumsum(lengths) - lengths, 1e-3, width=widths)
    assert converged.all() and len(set(n_iter.tolist())) > 1
    for r, ((Z, positive, total), w) in enumerate(zip(problems, widths)):
        alone = fit_logistic_stack(masked[r], positive, total, np.zeros(1, dtype=np.intp), 1e-3, width=widths[r:r + 1])
        np.testing.assert_allclose(theta[r], alone[0][0], rtol=1e-7, atol=1e-8)
        assert np.all(theta[r, w:] == 0.0)
        best = minimize(penalised_loss, np.zeros(w), args=(Z[:, :w], positive, total, 1e-3), method="BFGS",
                        options={"gtol": 1e-10}).x
        np.testing.assert_allclose(theta[r, :w], best, atol=1e-4)


def test_fit_distinct_is_the_fit_from_rows_without_folds():
    # The plan fit hands the posterior each stratum's distinct values and group counts directly.
    X, s, u, _ = logistic_data(3000, [(0.1, 1.0, 0.5, 0.0), (0.0, -1.0, 0.0, 2.0)], seed=6)
    X = np.round(X, 1)  # repeated rows, as integer features have
    rows = GroupPosterior(n_folds=0).fit(X, s, u)
    stats = [distinct_rows(X[u == a], s[u == a], 2) for a in (0, 1)]
    mean = np.array([X[u == a].mean(axis=0) for a in (0, 1)])
    scale = np.array([X[u == a].std(axis=0) for a in (0, 1)])
    counted = GroupPosterior(n_folds=0).fit_distinct([v for v, _ in stats], [c for _, c in stats], mean, scale,
                                                     rows.groups_, rows.strata_)
    np.testing.assert_allclose(counted.coef_, rows.coef_, rtol=1e-10, atol=1e-12)
    assert np.isnan(counted.cv_).all()
    with pytest.raises(RepairInputError, match="n_folds must be 0"):
        GroupPosterior().fit_distinct([v for v, _ in stats], [c for _, c in stats], mean, scale, rows.groups_,
                                      rows.strata_)
