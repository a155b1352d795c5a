"""The trainer of centroid-fairness embedding modules: split by identity, compared by BFAR at one FAR."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from fairstream.models.embedding import FairnessModule

from ..options import TrainerOption, fraction_arg, positive_int_arg
from .base import Trainer, TrainerError, Validation, cost_by, format_value, worse_by

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

    from ..sources import ResearchWindow


class EmbeddingTrainer(Trainer):
    """Centroid-fairness modules (Conti and Clémençon) on labelled embeddings, compared by BFAR at one FAR.

    The window is split by identity (held-out identities are people the candidate never saw); all
    same-group pairs of the held-out identities are scored under one global threshold at ``far``.
    The candidate is refused if its BFAR exceeds the current module's by more than ``tolerance``
    (relative), or its FNMR is worse by more than ``max_fnmr_increase``. A first module is compared
    with the identity (plain normalisation: the frozen encoder as it is).
    """

    module = FairnessModule
    TITLE = "embedding modules"
    OPTIONS = {
        "epochs": TrainerOption("--epochs", type=positive_int_arg, metavar="N",
                                help="training epochs of the Fairness Module"),
        "far": TrainerOption("--far", type=fraction_arg, metavar="RATE",
                             help="the global false accept rate the module is validated at"),
    }

    def __init__(self, config: "PipelineConfig", tolerance: float = 0.1, seed: int = 0, far: float = 1e-4,
                 max_fnmr_increase: float = 0.01, epochs: int = 20, **module_params):
        self.config, self.tolerance, self.seed, self.far = config, tolerance, seed, far
        self.max_fnmr_increase = max_fnmr_increase
        self.params = {"seed": seed, "epochs": epochs, **module_params}  # CentroidFairness parameters (hidden, ...)

    def split(self, window: "ResearchWindow", holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices (fit, holdout): ``holdout`` of every group's identities held out, all their vectors."""
        identities = _identities(window)
        rng = np.random.default_rng(seed)
        held = []
        for group in np.unique(window.s):
            people = rng.permutation(np.unique(identities[window.s == group]))
            held.append(people[: int(round(holdout * len(people)))])
        holdout_rows = np.flatnonzero(np.isin(identities, np.concatenate(held) if held else []))
        return np.setdiff1d(np.arange(len(window)), holdout_rows), holdout_rows

    def too_small(self, window: "ResearchWindow", fit_rows: np.ndarray, holdout_rows: np.ndarray,
                  min_rows: int) -> str | None:
        """Every configured group needs ``min_rows`` vectors and two identities on each side of the split."""
        identities = _identities(window)
        for group in self.config.groups:
            for side, rows in (("fit", fit_rows), ("holdout", holdout_rows)):
                mine = rows[window.s[rows] == group]
                if len(mine) < min_rows or len(np.unique(identities[mine])) < 2:
                    return (f"research window too small: group {group!r} has {len(mine)} {side} vectors of "
                            f"{len(np.unique(identities[mine]))} identities, at least {min_rows} vectors of 2 "
                            f"identities are needed (window of {len(window)} vectors from {window.source})")
        return None

    def fit(self, window: "ResearchWindow", actives: Mapping):
        """A Fairness Module trained with the Centroid Fairness loss on the window's vectors."""
        from fairstream.models.centroid import fit_embedding_module

        return fit_embedding_module(window.X, _identities(window), window.s, **self.params)

    def validate(self, module, held: "ResearchWindow", actives: Mapping) -> Validation:
        """BFAR and FNMR of ``module`` on all same-group pairs of the held-out identities, at ``far``."""
        from fairstream.models.centroid import validate_embedding_module

        comparison = validate_embedding_module(module, held.X, _identities(held), held.s, far=self.far)
        after = comparison.after
        return Validation(name=f"BFAR at FAR {self.far:g}", value=float(after.bfar),
                          summary=f"BFAR {format_value(after.bfar)}, FNMR {after.fnmr:.4f}",
                          metrics={"far": self.far, "bfar": float(after.bfar), "bfrr": float(after.bfrr),
                                   "fnmr": float(after.fnmr), "impostor_pairs": comparison.impostor_pairs,
                                   "genuine_pairs": comparison.genuine_pairs})

    def baseline(self, held: "ResearchWindow", actives: Mapping) -> Validation:
        """The identity module: what a first module must beat."""
        from fairstream.models.embedding import FairnessModule

        return self.validate(FairnessModule.identity(held.X.shape[1]), held, actives)

    def refusal(self, candidate: Validation, current: Validation) -> str | None:
        """Refuse a higher BFAR (beyond tolerance) or an FNMR more than ``max_fnmr_increase`` worse."""
        return worse_by(candidate, current, self.tolerance) or \
            cost_by(candidate, current, "fnmr", "FNMR", 1.0, self.max_fnmr_increase, ".4f")


def _identities(window: "ResearchWindow") -> np.ndarray:
    if window.identity is None:
        raise TrainerError("an embedding re-fit needs the identity of every vector (a labelled embeddings file)")
    return window.identity
