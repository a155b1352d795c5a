"""Probability mass functions on a uniform grid: linear binning, Gaussian KDE, and their blend.

Why linear binning matters: the off-sample repair (Algorithm 2) sends a record at x to the plan
row below x with probability 1 - tau and to the row above with probability tau. The distribution
of plan rows that arriving records actually use is therefore the *linear binning* of the data
onto the grid. A plan designed on a KDE pmf that differs from that (for example a KDE that melts
the 40-hours-a-week atom of Adult into its neighbours) sends the wrong share of records through
each row, and the repaired groups no longer meet at the barycentre. So the source pmf is:

- ``kde``: the paper's choice (Gaussian KDE at the nodes, Silverman bandwidth), right for smooth
  features with small research samples;
- ``empirical``: the linear binning of the research sample itself, right for features with atoms;
- a blend ``(1 - lam) * empirical + lam * kde`` with ``lam = n0 / (n0 + n)``: the posterior mean of
  a Dirichlet process with a KDE base measure and prior strength ``n0``. Large samples keep their
  atoms; small strata borrow smoothness from the KDE.

>>> import numpy as np
>>> nodes = np.linspace(0.0, 4.0, 5)
>>> linear_binning(np.array([1.25]), nodes)
array([0.  , 0.75, 0.25, 0.  , 0.  ])
"""

from __future__ import annotations

import numpy as np


def silverman_bandwidth(x: np.ndarray) -> float:
    """Silverman's rule ``0.9 * min(sd, IQR / 1.34) * n^(-1/5)``.

    Features with a large atom (half of Adult works exactly 40 hours) have IQR = 0; the rule then
    falls back to ``1.06 * sd * n^(-1/5)``; a constant sample gets bandwidth 0 (a point mass).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        return 0.0
    sd = float(np.std(x, ddof=1))
    iqr = float(np.subtract(*np.percentile(x, [75, 25])))
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    factor = 0.9 if iqr > 0 else 1.06
    return factor * spread * x.size ** (-0.2)


def bin_position(x: np.ndarray, start: float, step: float, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower node index q and interpolation ratio tau in [0, 1] of each x on a uniform grid.

    Values are clamped to the grid, and the top node is reached as (q = n - 2, tau = 1), so row
    q + 1 always exists (the paper leaves x equal to the top node undefined).
    """
    if n_nodes < 2 or step <= 0:
        return np.zeros(np.shape(x), dtype=np.intp), np.zeros(np.shape(x))
    f = np.clip((np.asarray(x, dtype=np.float64) - start) / step, 0.0, n_nodes - 1.0)
    q = np.minimum(np.floor(f).astype(np.intp), n_nodes - 2)
    return q, f - q


def linear_binning(x: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Mass of the sample ``x`` spread onto the two neighbouring nodes, normalised to sum 1."""
    n = len(nodes)
    step = float(nodes[1] - nodes[0]) if n > 1 else 0.0
    q, tau = bin_position(x, float(nodes[0]), step, n)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    mass = np.bincount(q, w * (1.0 - tau), minlength=n)
    if n > 1:
        mass += np.bincount(q + 1, w * tau, minlength=n)
    total = mass.sum()
    return mass / total if total > 0 else mass


def kde_pmf(x: np.ndarray, nodes: np.ndarray, bandwidth: float) -> np.ndarray:
    """Gaussian KDE of ``x`` at ``nodes``, normalised over them (Eq. 11-12), computed binned.

    The sample is linearly binned onto the grid and the bins are convolved with the kernel: O(n +
    n_nodes^2) instead of O(n * n_nodes), and exact when the data sit on the nodes (integer data
    on the integer lattice). A bandwidth below the grid spacing cannot be resolved by the grid, so
    it is raised to half a spacing; with no spread at all the KDE is the linear binning.
    """
    step = float(nodes[1] - nodes[0]) if len(nodes) > 1 else 0.0
    h = max(bandwidth, 0.5 * step)
    binned = linear_binning(x, nodes)
    if h <= 0:
        return binned
    offsets = (np.arange(len(nodes)) * step / h) ** 2
    kernel = np.exp(-0.5 * offsets[np.abs(np.subtract.outer(np.arange(len(nodes)), np.arange(len(nodes))))])
    dens = kernel @ binned
    return dens / dens.sum()


def source_pmf(x: np.ndarray, nodes: np.ndarray, smoothing: float, bandwidth: float) -> np.ndarray:
    """The blend ``(1 - smoothing) * linear_binning + smoothing * kde`` (see module docstring)."""
    if smoothing <= 0:
        return linear_binning(x, nodes)
    if smoothing >= 1:
        return kde_pmf(x, nodes, bandwidth)
    return (1.0 - smoothing) * linear_binning(x, nodes) + smoothing * kde_pmf(x, nodes, bandwidth)
