"""The anytime-valid confidence sequences and their interval arithmetic (fairstream.repair.measure.sequential)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair.measure.sequential import (
    absolute_bounds,
    confidence_sequence,
    linear_bounds,
    mixture_rho2,
    normal_mixture_radius,
    regularised_variance,
)

STREAMS, LENGTH = 400, 5000


def miscoverage(values: np.ndarray, mean: float, alpha: float, **options) -> float:
    """The share of streams (rows) whose sequence misses ``mean`` at some look (every record is a look)."""
    n = np.arange(1, values.shape[1] + 1)
    cs = confidence_sequence(n, np.cumsum(values, axis=1), np.cumsum(values**2, axis=1), alpha, **options)
    return float(((cs.lower > mean) | (cs.upper < mean)).any(axis=1).mean())


def allowed(alpha: float) -> float:
    """alpha plus three Monte Carlo standard errors of a share over STREAMS streams."""
    return alpha + 3 * np.sqrt(alpha * (1 - alpha) / STREAMS)


@settings(max_examples=12)
@given(rate=st.sampled_from([0.001, 0.003, 0.01, 0.05, 0.2, 0.5, 0.9]), alpha=st.sampled_from([0.0125, 0.05, 0.1]),
       seed=st.integers(0, 2**32 - 1))
def test_the_sequence_holds_a_bernoulli_mean_at_every_look_in_one_minus_alpha_of_streams(rate, alpha, seed):
    values = (np.random.default_rng(seed).random((STREAMS, LENGTH)) < rate).astype(float)
    assert miscoverage(values, rate, alpha) <= allowed(alpha)


@settings(max_examples=8)
@given(mean=st.floats(-1, 1), sd=st.floats(0.1, 2), seed=st.integers(0, 2**32 - 1))
def test_the_sequence_holds_a_gaussian_mean_at_every_look_in_one_minus_alpha_of_streams(mean, sd, seed):
    values = np.random.default_rng(seed).normal(mean, sd, (STREAMS, LENGTH))
    # The prior variance must not be below the stream's: 4 bounds every sd drawn here.
    assert miscoverage(values, mean, 0.05, prior_variance=4.0) <= allowed(0.05)


def test_a_fixed_n_interval_checked_at_every_look_would_fail_the_coverage_check():
    """The coverage check can fail: peeking at a 95% CLT interval after every record misses far more than 5%."""
    values = (np.random.default_rng(0).random((STREAMS, LENGTH)) < 0.3).astype(float)
    n = np.arange(1, LENGTH + 1)
    mean = np.cumsum(values, axis=1) / n
    radius = 1.96 * np.sqrt(np.maximum(mean * (1 - mean), 1e-12) / n)
    assert ((mean - radius > 0.3) | (mean + radius < 0.3)).any(axis=1).mean() > allowed(0.05)
    assert miscoverage(values, 0.3, 0.05) <= allowed(0.05)


sums = st.tuples(st.integers(1, 10**6), st.floats(-1, 1), st.floats(0, 1)).map(
    lambda t: (float(t[0]), t[0] * t[1], t[0] * (t[1] ** 2 + t[2])))  # (n, sum, sum of squares) of some stream


@given(stats=sums, alphas=st.tuples(st.floats(1e-6, 0.99), st.floats(1e-6, 0.99)).map(sorted))
def test_a_smaller_alpha_gives_a_wider_sequence(stats, alphas):
    small, large = (confidence_sequence(*stats, alpha) for alpha in alphas)
    assert small.lower <= large.lower + 1e-12 and small.upper >= large.upper - 1e-12


@given(stats=sums, alpha=st.floats(1e-6, 0.99))
def test_the_sequence_holds_its_running_mean_and_is_never_of_zero_width(stats, alpha):
    cs = confidence_sequence(*stats, alpha)
    assert cs.lower < cs.mean < cs.upper


def test_no_record_gives_no_estimate_and_infinite_bounds():
    cs = confidence_sequence([0, 0], [0, 0], [0, 0], 0.05)
    np.testing.assert_array_equal(cs.lower, [-np.inf, -np.inf])
    np.testing.assert_array_equal(cs.upper, [np.inf, np.inf])
    assert np.isnan(cs.mean).all()
    assert np.isinf(normal_mixture_radius(0, 0.05, 1e-3))


def test_records_that_are_all_equal_still_get_an_interval_of_some_width():
    for n in (1, 10, 1000):  # a variance of 0 so far: the prior variance keeps the interval open
        cs = confidence_sequence(n, 0.0, 0.0, 0.05)
        assert cs.upper > 0 > cs.lower
    assert regularised_variance(10, 0.0, 0.0, 0.25, prior_weight=30) == pytest.approx(0.25 * 30 / 40)


@settings(max_examples=30)
@given(st.lists(st.tuples(sums, st.floats(1e-4, 0.5), st.floats(10, 10**6)), min_size=1, max_size=6))
def test_the_vectorised_sequence_equals_one_call_per_element(rows):
    stats, alpha, target = (np.array(column) for column in zip(*rows))
    n, total, total_sq = stats.T
    together = confidence_sequence(n, total, total_sq, alpha, target=target)
    for i in range(len(rows)):
        alone = confidence_sequence(n[i], total[i], total_sq[i], float(alpha[i]), target=float(target[i]))
        for part in ("mean", "lower", "upper"):
            assert getattr(together, part)[i] == pytest.approx(float(getattr(alone, part)), rel=1e-12)


@given(target=st.floats(1, 1e7), alpha=st.floats(1e-6, 0.5))
def test_the_tuned_mixture_is_narrowest_at_its_target(target, alpha):
    best = mixture_rho2(target, alpha)
    radius = normal_mixture_radius(target, alpha, best)
    for factor in (0.8, 1.25):
        assert radius <= normal_mixture_radius(target, alpha, best * factor) * (1 + 1e-12)


def test_the_mixture_refuses_a_level_outside_zero_one():
    with pytest.raises(ValueError):
        mixture_rho2(1000, 1.0)
    with pytest.raises(ValueError):
        confidence_sequence(-1, 0, 0, 0.05)


box = st.integers(1, 4).flatmap(lambda p: st.tuples(
    st.lists(st.lists(st.sampled_from([-2.0, -1.0, 0.0, 1.0, 3.0]), min_size=p, max_size=p), min_size=1, max_size=4),
    st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 3)), min_size=p, max_size=p)))


@given(box)
def test_linear_bounds_are_the_extremes_over_the_corners_of_the_box(case):
    coefficients, intervals = case
    lower = np.array([low for low, _ in intervals])
    upper = lower + np.array([width for _, width in intervals])
    low, high = linear_bounds(coefficients, lower, upper)
    corners = np.array(list(itertools.product(*zip(lower, upper))))
    values = np.asarray(coefficients) @ corners.T
    np.testing.assert_allclose(low, values.min(axis=1), atol=1e-9)
    np.testing.assert_allclose(high, values.max(axis=1), atol=1e-9)


def test_a_mean_that_cancels_adds_no_width_even_when_unbounded():
    low, high = linear_bounds([[0.0, 1.0, -1.0], [1.0, 0.0, 0.0]], [-np.inf, 0.0, 0.1], [np.inf, 1.0, 0.2])
    np.testing.assert_array_equal(low, [-0.2, -np.inf])
    np.testing.assert_array_equal(high, [0.9, np.inf])


@given(st.floats(-3, 3), st.floats(0, 3))
def test_absolute_bounds_hold_every_absolute_value_of_the_interval(low, width):
    least, most = absolute_bounds(low, low + width)
    inside = np.abs(np.linspace(low, low + width, 101))
    assert least == pytest.approx(inside.min(), abs=width / 50 + 1e-12) and least <= inside.min() + 1e-12
    assert most == pytest.approx(inside.max())
