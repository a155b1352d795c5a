"""A plain logistic-regression scorer, fitted with Newton's method (IRLS), frozen as an artifact.

The stream serves a frozen scorer per record (as in Kim et al., Fairness Through Matching (2024): no OT at inference); this is
the numpy-only baseline one, so the repair layer can score, threshold and monitor decisions (DP,
MDP) without torch. Features are standardised with the training mean and standard deviation; the
model is ``p(y=1 | x) = sigmoid(z @ coef_ + intercept_)`` with ``z = (x - mean_) / scale_``, fitted
by minimising the mean log-loss plus ``l2 / 2 * ||coef_||^2`` (the intercept is not penalised).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(500, 2))
>>> y = (X[:, 0] - X[:, 1] + 0.3 * rng.normal(size=500) > 0).astype(int)
>>> scorer = LogisticScorer().fit(X, y)
>>> float((scorer.decision(X) == y).mean()) > 0.9
True
>>> scorer.decision([[2.0, -2.0]]).tolist()
[1]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import expit

from fairstream.repair import artifacts
from fairstream.repair._validation import RepairInputError, as_2d, check_finite, column_names
from fairstream.repair.logistic import fit_logistic
from fairstream.repair.measure.metrics import as_binary
from fairstream.repair.protocol import Applied, Batch, IncompatibleArtifact, PipelineSchema

__all__ = ["LogisticScorer"]

ARTIFACT_KIND = "scorer"


class LogisticScorer:
    """Binary logistic regression on standardised features, fitted by Newton/IRLS.

    Parameters
    ----------
    l2:
        Ridge penalty on the standardised coefficients (>= 0); it keeps the fit finite on
        separable data.
    max_iter:
        Newton steps at most.
    tol:
        Stop when the largest change of a parameter in a step is below ``tol``.
    """

    def __init__(self, l2: float = 1e-3, max_iter: int = 50, tol: float = 1e-8):
        self.l2 = l2
        self.max_iter = max_iter
        self.tol = tol

    def _check_params(self) -> None:
        if isinstance(self.l2, bool) or not isinstance(self.l2, (int, float, np.integer, np.floating)) \
                or not np.isfinite(self.l2) or self.l2 < 0:
            raise RepairInputError(f"l2 must be a finite number >= 0, got {self.l2!r}")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise RepairInputError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        if isinstance(self.tol, bool) or not isinstance(self.tol, (int, float, np.integer, np.floating)) \
                or not np.isfinite(self.tol) or self.tol <= 0:
            raise RepairInputError(f"tol must be a positive finite number, got {self.tol!r}")

    def fit(self, X, y, columns: Sequence[str] | None = None) -> "LogisticScorer":
        """Fit on features ``X`` (n, d) and binary labels ``y``; ``columns`` name the features in errors."""
        self._check_params()
        X = as_2d(X, columns=columns)
        names = column_names(X.shape[1], columns)
        check_finite(X, names)
        if X.shape[0] == 0:
            raise RepairInputError("cannot fit a scorer on 0 rows")
        y = as_binary(y, X.shape[0]).astype(np.float64)
        if y.min() == y.max():
            raise RepairInputError(f"y holds only the class {int(y[0])}; a scorer needs both classes")
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale = np.where(scale > 0, scale, 1.0)  # a constant column stays 0 after standardising
        Z = np.hstack([np.ones((X.shape[0], 1)), (X - mean) / scale])
        theta, n_iter, converged = fit_logistic(Z, y, float(self.l2), int(self.max_iter), float(self.tol))
        self.columns_ = names
        self.n_features_in_ = X.shape[1]
        self.mean_, self.scale_ = mean, scale
        self.intercept_, self.coef_ = float(theta[0]), theta[1:]
        self.n_iter_, self.converged_ = n_iter, converged
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise RepairInputError("this LogisticScorer is not fitted yet; call fit(X, y) first")

    def decision_function(self, X) -> np.ndarray:
        """The log-odds ``z @ coef_ + intercept_`` of each row, shape (n,)."""
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_, columns=self.columns_)
        check_finite(X, self.columns_)
        return ((X - self.mean_) / self.scale_) @ self.coef_ + self.intercept_

    def predict_proba(self, X) -> np.ndarray:
        """Pr[y = 1 | x] of each row, shape (n,); a 1-D ``X`` of length d is one row."""
        return expit(self.decision_function(X))

    def decision(self, X, threshold: float = 0.5) -> np.ndarray:
        """0/1 decisions (int64): 1 where ``predict_proba(X) >= threshold``."""
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
                or not 0.0 <= threshold <= 1.0:
            raise RepairInputError(f"threshold must be a number in [0, 1], got {threshold!r}")
        return (self.predict_proba(X) >= threshold).astype(np.int64)

    # ------------------------------------------------------------------ module protocol

    kind = ARTIFACT_KIND
    seed = ""  # no random draws

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a scorer fitted on a different number of features than the pipeline's."""
        self._check_fitted()
        if schema.features and self.n_features_in_ != len(schema.features):
            raise IncompatibleArtifact(f"the scorer takes {self.n_features_in_} features, "
                                       f"the pipeline has {len(schema.features)} {list(schema.features)}")

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: the batch's values unchanged, plus columns ``score`` and ``decision``."""
        score = self.predict_proba(batch.X)
        return Applied.all_ok(batch, batch.X, score=score, decision=(score >= 0.5).astype(np.int64))

    # ------------------------------------------------------------------ artifacts

    def get_params(self) -> dict:
        """The constructor parameters, JSON-ready (sealed into the artifact)."""
        return {"l2": float(self.l2), "max_iter": int(self.max_iter), "tol": float(self.tol)}

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the fitted scorer into an :class:`~fairstream.repair.artifacts.Artifact` of kind ``scorer``.

        >>> import numpy as np
        >>> scorer = LogisticScorer().fit([[0.0], [1.0], [2.0], [3.0]], [0, 1, 0, 1])
        >>> copy = LogisticScorer.from_artifact(scorer.to_artifact(version=3))
        >>> bool(np.array_equal(copy.predict_proba([[1.5]]), scorer.predict_proba([[1.5]])))
        True
        """
        self._check_fitted()
        arrays = {"mean": self.mean_, "scale": self.scale_, "coef": self.coef_,
                  "intercept": np.array(self.intercept_), "n_iter": np.array(self.n_iter_),
                  "converged": np.array(self.converged_)}
        parameters = {**self.get_params(), "columns": list(self.columns_)}
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters=parameters, metrics=metrics or {},
                              data_fingerprint=data_fingerprint, version=version)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> "LogisticScorer":
        """Rebuild the fitted scorer (bit-exact: the same arrays, the same probabilities)."""
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        params = dict(artifact.parameters)
        columns = params.pop("columns")
        scorer = cls(**params)
        a = artifact.arrays
        scorer.mean_, scorer.scale_, scorer.coef_ = (np.array(a[name]) for name in ("mean", "scale", "coef"))
        scorer.intercept_ = float(a["intercept"])
        scorer.n_iter_, scorer.converged_ = int(a["n_iter"]), bool(a["converged"])
        scorer.n_features_in_ = scorer.coef_.shape[0]
        scorer.columns_ = column_names(scorer.n_features_in_, columns)
        return scorer
