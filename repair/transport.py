"""One-dimensional optimal transport on a shared grid: barycentres, exact plans, row samplers.

In 1-D with a convex cost the optimal plan is the monotone (north-west corner) coupling, and the
W2 barycentre of several distributions is the one whose quantile function is the weighted mean
of theirs. Both are exact here, which is why the paper's LP barycentre is not needed (spec 004,
gap 1, option a).

>>> import numpy as np
>>> nodes = np.arange(5.0)
>>> p = np.array([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]])
>>> barycenter(p, nodes)
array([0., 0., 1., 0., 0.])
"""

from __future__ import annotations

import numpy as np
import ot

from .density import linear_binning


def _cdf(pmf: np.ndarray) -> np.ndarray:
    """Cumulative sums with the last value pinned to exactly 1 (float round-off would leave 1-eps)."""
    c = np.cumsum(pmf, axis=-1)
    c /= c[..., -1:]
    c[..., -1] = 1.0
    return c


def quantile_indices(cdf: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Node index of the generalised inverse ``min{j : F(j) >= level}`` of a grid CDF."""
    return np.minimum(np.searchsorted(cdf, levels, side="left"), len(cdf) - 1)


def barycenter(pmfs: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """W2 barycentre of the rows of ``pmfs`` (all on ``nodes``), returned on the same nodes.

    The quantile functions are step functions that change only at the union of the groups' CDF
    levels, so the weighted mean quantile is exact on each interval between consecutive levels;
    its atoms are then linearly binned back onto the grid (which keeps the mean).
    """
    pmfs = np.atleast_2d(np.asarray(pmfs, dtype=np.float64))
    w = np.full(len(pmfs), 1.0 / len(pmfs)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    cdfs = _cdf(pmfs)
    levels = np.unique(np.concatenate([[0.0], cdfs.ravel()]))
    mass = np.diff(levels)
    mids = 0.5 * (levels[:-1] + levels[1:])
    atoms = sum(w[g] * nodes[quantile_indices(cdfs[g], mids)] for g in range(len(pmfs)))
    return linear_binning(atoms, nodes, weights=mass)


def monotone_plan(source: np.ndarray, target: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """The exact OT plan (squared Euclidean cost) between two pmfs on the same nodes.

    Rows index source nodes and sum to ``source``; columns index target nodes and sum to
    ``target`` (Eq. 13). POT's ``emd_1d`` solves it in O(n log n).
    """
    a = source / source.sum()
    b = target / target.sum()
    return ot.emd_1d(nodes, nodes, a, b, metric="sqeuclidean", dense=True)


def row_cdfs(plan: np.ndarray, source: np.ndarray, target: np.ndarray, min_mass: float = 1e-12) -> np.ndarray:
    """Per-row conditional CDFs of a plan, for O(log n) sampling of Eq. 15.

    A row with (almost) no source mass has no conditional distribution; the paper leaves this open
    and a public port falls back to the identity, which does not repair. Here such a row becomes
    a point mass at the target quantile of the source CDF at that node: the continuous limit of
    the monotone map, so an unseen value is mapped where its rank says it belongs.
    """
    n = len(source)
    rows = plan.sum(axis=1)
    empty = rows <= min_mass
    cond = np.where(empty[:, None], 0.0, plan / np.where(empty, 1.0, rows)[:, None])
    if empty.any():
        level = np.maximum(_cdf(source)[empty], min_mass)
        cond[np.flatnonzero(empty), quantile_indices(_cdf(target), level)] = 1.0
    return _cdf(cond) if n > 0 else cond


def sample_rows(cdfs: np.ndarray, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Column index drawn from each selected row's CDF with the given uniforms (inverse CDF).

    All rows are searched at once: CDF values are quantised to 40-bit integers and row r is
    offset by r * 2^41, so the flattened array is sorted and one exact ``searchsorted`` serves the
    whole batch (a float offset would round away the small masses of late rows).
    """
    n = cdfs.shape[1]
    shifted = (_quantise(cdfs) + (np.arange(len(cdfs), dtype=np.int64) << 41)[:, None]).ravel()
    flat = np.searchsorted(shifted, _quantise(u) + (np.asarray(rows, dtype=np.int64) << 41), side="right")
    return flat - rows * n


def _quantise(p: np.ndarray) -> np.ndarray:
    """Probabilities in [0, 1] as integers in [0, 2^40] (exact for the pinned final CDF value 1)."""
    return np.floor(np.asarray(p) * float(1 << 40)).astype(np.int64)
