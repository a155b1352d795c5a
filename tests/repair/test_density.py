import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.repair.density import kde_pmf, linear_binning, silverman_bandwidth, source_pmf

NODES = np.linspace(0.0, 10.0, 21)
samples = arrays(np.float64, st.integers(1, 200), elements=st.floats(0.0, 10.0))


@given(samples)
def test_linear_binning_keeps_mass_and_mean(x):
    p = linear_binning(x, NODES)
    assert abs(p.sum() - 1) < 1e-9
    assert abs(p @ NODES - x.mean()) < 1e-9


@given(samples, st.floats(0.0, 1.0))
def test_source_pmf_is_a_pmf(x, lam):
    p = source_pmf(x, NODES, lam, silverman_bandwidth(x))
    assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-9


def test_atoms_survive_the_empirical_estimate_but_not_the_kde():
    # Half of Adult works exactly 40 hours: the empirical pmf keeps that atom, a KDE melts it.
    rng = np.random.default_rng(0)
    x = np.where(rng.random(4000) < 0.5, 40.0, rng.integers(1, 99, 4000)).astype(float)
    nodes = np.arange(1.0, 99.0)
    assert linear_binning(x, nodes)[39] > 0.49
    assert kde_pmf(x, nodes, silverman_bandwidth(x))[39] < 0.3


def test_silverman_falls_back_when_iqr_is_zero():
    x = np.array([40.0] * 80 + [20.0, 60.0] * 10)
    assert silverman_bandwidth(x) > 0
    assert silverman_bandwidth(np.full(10, 3.0)) == 0.0
