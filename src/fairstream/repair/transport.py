"""One-dimensional optimal transport on a shared grid: barycentres, exact plans, row samplers.

In 1-D with a convex cost the optimal plan is the monotone (north-west corner) coupling, and the
W2 barycentre of several distributions is the one whose quantile function is the weighted mean
of theirs. Both are exact here, which is why the paper's LP barycentre is not needed (Langbridge, Quinn and Shorten (2024),
gap 1, option a).

>>> import numpy as np
>>> nodes = np.arange(5.0)
>>> p = np.array([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]])
>>> barycenter(p, nodes)
array([0., 0., 1., 0., 0.])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    # Imported here: POT imports torch when it is installed (seconds, hundreds of MB), and a worker
    # that only applies frozen plans never needs POT at all.
    import ot

    a = source / source.sum()
    b = target / target.sum()
    return ot.emd_1d(nodes, nodes, a, b, metric="sqeuclidean", dense=True)


@dataclass(frozen=True)
class MonotonePlan:
    """The exact 1-D plan from ``source`` to ``target`` (pmfs on the same nodes), ready to sample.

    The monotone (north-west corner) plan couples source level L with target quantile F_t^-1(L),
    so row r's conditional distribution is the target restricted to the source levels
    [S_{r-1}, S_r). Drawing L uniformly in that interval and reading off the target quantile
    samples the row exactly (Eq. 15), with one binary search in a CDF of n entries instead of a
    table of n x n row CDFs, and O(n) storage. A row without source mass (a value no research
    record had) has a degenerate interval and goes to the target quantile at its rank: the
    continuous limit of the monotone map. (The paper leaves such rows open; a public port falls
    back to the identity, which does not repair.)

    >>> plan = MonotonePlan.between(np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.5, 0.5]))
    >>> plan.sample(np.array([0, 1, 2]), np.array([0.3, 0.3, 0.3])).tolist()
    [1, 2, 2]
    """

    lower: np.ndarray
    upper: np.ndarray
    target_cdf: np.ndarray
    last_target: int

    @classmethod
    def between(cls, source: np.ndarray, target: np.ndarray) -> "MonotonePlan":
        """The monotone (exact 1-D OT) plan from pmf ``source`` to pmf ``target`` on shared nodes."""
        upper = _cdf(np.asarray(source, dtype=np.float64))
        positive = np.flatnonzero(np.asarray(target) > 0)
        return cls(lower=np.concatenate([[0.0], upper[:-1]]), upper=upper, target_cdf=_cdf(np.asarray(target, dtype=np.float64)),
                   last_target=int(positive[-1]) if positive.size else len(target) - 1)

    def sample(self, rows: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Target node index for each selected source row, given uniforms ``v`` in [0, 1)."""
        levels = self.lower[rows] + v * (self.upper[rows] - self.lower[rows])
        return np.minimum(np.searchsorted(self.target_cdf, levels, side="right"), self.last_target)

    def dense(self) -> np.ndarray:
        """The plan as an n x n matrix (for audit and tests): mass of [lower_r, upper_r) in each target bin."""
        t_lower = np.concatenate([[0.0], self.target_cdf[:-1]])
        overlap = np.minimum(self.upper[:, None], self.target_cdf[None, :]) - np.maximum(self.lower[:, None], t_lower[None, :])
        return np.clip(overlap, 0.0, None)
