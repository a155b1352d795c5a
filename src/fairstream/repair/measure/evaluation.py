"""One evaluation of a repair, shared by the batch job, the paper reproduction and the stream report.

E is measured with the histogram estimator of :mod:`fairstream.repair.measure.metrics` (its own bins, not
the repair's grid or smoothing), next to its noise floor (E with s permuted within each u
stratum): a repair is judged by how close it gets to the floor, not to zero.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.integers(0, 2, 4000); u = rng.integers(0, 2, 4000)
>>> X = rng.normal(s[:, None], 1.0, size=(4000, 1))
>>> ev = evaluate_repair(X, X, s, u, n_permutations=5)
>>> bool(ev.e_before.total > 10 * ev.floor.total_mean)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .metrics import DependenceResult, NoiseFloorResult, damage, dependence_e, dependence_e_noise_floor


@dataclass(frozen=True)
class RepairEvaluation:
    """E before and after a repair, the estimator's noise floor, and the damage mean |x' - x|."""

    e_before: DependenceResult
    e_after: DependenceResult
    floor: NoiseFloorResult
    damage: np.ndarray

    @property
    def reduction(self) -> float:
        """How many times smaller total E is after the repair."""
        return float(self.e_before.total / max(self.e_after.total, 1e-300))

    @property
    def excess_reduction(self) -> float:
        """Reduction of E above the noise floor (what the repair can remove at this sample size)."""
        floor = self.floor.total_mean
        return float((self.e_before.total - floor) / max(self.e_after.total - floor, 1e-12))

    def as_dict(self) -> dict:
        """The evaluation as a JSON-ready dict."""
        return {
            "E_before": self.e_before.per_feature.tolist(),
            "E_after": self.e_after.per_feature.tolist(),
            "E_floor": self.floor.per_feature_mean.tolist(),
            "E_before_total": float(self.e_before.total),
            "E_after_total": float(self.e_after.total),
            "E_floor_total": float(self.floor.total_mean),
            "reduction": self.reduction,
            "damage": self.damage.tolist(),
        }


def evaluate_repair(X, X_repaired, s, u, bins: int = 30, n_permutations: int = 20, seed: int = 0) -> RepairEvaluation:
    """E before/after (same estimator, same bins rule) and the noise floor of the unrepaired data.

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Features before the repair.
    X_repaired : array-like of shape (n_rows, n_features)
        The same rows after the repair.
    s : array-like of shape (n_rows,)
        Protected attribute of each row.
    u : array-like of shape (n_rows,)
        Unprotected attribute (stratum) of each row.
    bins : int, default=30
        Bins per feature of the E estimator (see :func:`~fairstream.repair.measure.metrics.dependence_e`).
    n_permutations : int, default=20
        Permutations of the noise floor.
    seed : int, default=0
        Seed of the permutations.

    Returns
    -------
    RepairEvaluation
        E before and after the repair and the unrepaired data's noise floor.
    """
    return RepairEvaluation(
        e_before=dependence_e(X, s, u, bins=bins),
        e_after=dependence_e(X_repaired, s, u, bins=bins),
        floor=dependence_e_noise_floor(X, s, u, n_permutations=n_permutations, seed=seed, bins=bins),
        damage=np.atleast_1d(damage(X, X_repaired).per_feature),
    )
