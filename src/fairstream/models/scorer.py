"""Scorers: the frozen classifier at the end of a record chain (artifact kind ``scorer``), applied with numpy.

The stream serves a frozen scorer per record (as in Kim et al., Fairness Through Matching (2024):
no OT at inference). One class, :class:`Scorer`, serves the kind: features standardised with the
training mean and scale, then a ReLU network with any number of hidden layers (none: logistic
regression) to one logit, ``p(y=1 | x) = sigmoid(logit)``. The weights are plain arrays; the forward
pass is numpy, so applying a scorer never imports torch. Fair scorers are trained in torch by
:mod:`fairstream.models.scorer_training` (FTM, Reg, OTF, the norm penalty) and frozen into a Scorer.

:class:`LogisticScorer` is the special case fitted by Newton's method (IRLS, numpy only): the
minimiser of the mean log-loss plus ``l2 / 2 * ||coef_||^2`` (the intercept is not penalised). Its
artifacts keep their original layout, so earlier versions still load; :meth:`Scorer.from_artifact`
reads both layouts.

A scorer may carry its frozen :class:`~fairstream.repair.group_maps.GroupTransportMap` (``group_map_``,
None when absent), fitted on its training data: the map the monitor measures matched demographic
parity with (:meth:`Scorer.matched_counterparts`). :func:`validate_scorer` scores a scorer on a
labelled holdout (accuracy, AUC, DP, MDP, equalized odds, ...): a re-fit job compares a candidate
with the active scorer through it.

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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from scipy.stats import wasserstein_distance

from fairstream.repair import artifacts
from fairstream.repair.array_layout import (
    ArrayLayout,
    ArraySpec,
    above,
    at_least,
    at_most,
    check_arrays,
    finite,
    int_parameter,
    names_parameter,
    sizes_parameter,
)
from fairstream.repair.estimator import Estimator
from fairstream.repair.group_maps import Counterparts, GroupTransportMap
from fairstream.repair.logistic import fit_logistic
from fairstream.repair.measure.mdp import fair_matching_cost, matched_dp
from fairstream.repair.measure.metrics import as_binary, auc, demographic_parity
from fairstream.repair.measure.otf import correlation_violation, one_hot
from fairstream.repair.protocol import (
    Applied,
    Batch,
    Capabilities,
    IncompatibleArtifact,
    PipelineSchema,
    check_labels_cover,
    rowwise_matmul,
)
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    check_finite,
    column_names,
    normalise_labels,
)

__all__ = ["LogisticScorer", "Scorer", "ScorerValidation", "validate_scorer"]

ARTIFACT_KIND = "scorer"
_MAP_PREFIX = "group_map."
_LARGEST = np.finfo(np.float64).max


class Scorer:
    """A frozen scorer: standardise, ReLU hidden layers (maybe none), one logit. Built by a trainer.

    Learned state: ``mean_``, ``scale_`` (standardisation), ``weights_`` (one (in, out) array per
    layer), ``biases_``, ``columns_``, ``group_map_`` and ``training_`` (provenance: method and
    parameters). A network without hidden layers also exposes ``coef_`` and ``intercept_``.

    >>> import numpy as np
    >>> scorer = Scorer.from_weights([np.eye(2), np.array([[1.0], [-1.0]])], [np.zeros(2), np.zeros(1)],
    ...                              mean=np.zeros(2), scale=np.ones(2), columns=["a", "b"])
    >>> scorer.hidden_, scorer.decision_function([[2.0, 1.0], [-1.0, 3.0]]).tolist()
    ((2,), [1.0, -3.0])
    """

    kind = ARTIFACT_KIND
    capabilities = Capabilities(agent="records", reads=frozenset({"features"}), writes=frozenset({"score", "decision"}),
                                place="score", needs_labels=True, needs_group_map=True, counterparts=True)
    seed = ""  # no random draws

    @classmethod
    def from_weights(cls, weights: Sequence, biases: Sequence, mean, scale, columns: Sequence[str] | None = None,
                     group_map: GroupTransportMap | None = None, training: dict | None = None) -> Scorer:
        """A scorer from its layers' weights (in, out) and biases, and the features' standardisation.

        Parameters
        ----------
        weights : sequence of ndarray
            One (in, out) weight matrix per layer; the last has one output column (the logit).
        biases : sequence of ndarray
            One (out,) bias per layer.
        mean : array-like of shape (n_features,)
            Standardisation centre, in feature units.
        scale : array-like of shape (n_features,)
            Standardisation scale, in feature units.
        columns : sequence of str or None, default=None
            Feature names; None numbers them.
        group_map : GroupTransportMap or None, default=None
            The frozen transport map between the groups (for matched DP).
        training : dict or None, default=None
            Provenance: how the scorer was trained (JSON).

        Returns
        -------
        Scorer
            The frozen scorer.
        """
        scorer = cls.__new__(cls)
        mean, scale = np.asarray(mean, dtype=np.float64), np.asarray(scale, dtype=np.float64)
        scorer.weights_ = tuple(np.ascontiguousarray(w, dtype=np.float64) for w in weights)
        scorer.biases_ = tuple(np.asarray(b, dtype=np.float64).reshape(-1) for b in biases)
        scorer.mean_, scorer.scale_ = mean, scale
        scorer.n_features_in_ = mean.shape[0]
        scorer.columns_ = column_names(scorer.n_features_in_, columns)
        scorer.training_ = dict(training or {})
        scorer.group_map_ = None
        _check_layers(scorer, RepairInputError)
        return scorer.attach_group_map(group_map)

    # ------------------------------------------------------------------ the forward pass

    def _check_fitted(self) -> None:
        if not hasattr(self, "weights_"):
            raise RepairInputError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    @property
    def hidden_(self) -> tuple[int, ...]:
        """Widths of the hidden layers (empty for logistic regression)."""
        self._check_fitted()
        return tuple(int(w.shape[1]) for w in self.weights_[:-1])

    @property
    def coef_(self) -> np.ndarray:
        """The coefficients on the standardised features (networks without hidden layers only)."""
        self._check_linear("coef_")
        return self.weights_[0][:, 0]

    @property
    def intercept_(self) -> float:
        """The intercept (networks without hidden layers only)."""
        self._check_linear("intercept_")
        return float(self.biases_[0][0])

    def _check_linear(self, name: str) -> None:
        if not hasattr(self, "weights_") or len(self.weights_) != 1:
            raise AttributeError(f"{name} exists for a fitted scorer without hidden layers only")

    def decision_function(self, X) -> np.ndarray:
        """The logit of each row, shape (n,): bit-identical whatever batch the row is in (row-wise products).

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features.

        Returns
        -------
        ndarray of shape (n_rows,)
            The logits.
        """
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_, columns=self.columns_)
        check_finite(X, self.columns_)
        return self._logit(X)

    def _logit(self, X: np.ndarray) -> np.ndarray:
        """The forward pass on checked rows (a value far outside the training range may overflow it to inf or NaN)."""
        z = (X - self.mean_) / self.scale_
        for w, b in zip(self.weights_[:-1], self.biases_[:-1]):
            z = rowwise_matmul(z, w)
            z += b
            np.maximum(z, 0.0, out=z)
        return rowwise_matmul(z, self.weights_[-1])[:, 0] + self.biases_[-1][0]

    def predict_proba(self, X) -> np.ndarray:
        """Pr[y = 1 | x] of each row, shape (n,); a 1-D ``X`` of length d is one row.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features.

        Returns
        -------
        ndarray of shape (n_rows,)
            Pr[y = 1 | x], in [0, 1].
        """
        return expit(self.decision_function(X))

    def decision(self, X, threshold: float = 0.5) -> np.ndarray:
        """0/1 decisions (int64): 1 where ``predict_proba(X) >= threshold``.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features.
        threshold : float, default=0.5
            Probability at or above which the decision is 1, in [0, 1].

        Returns
        -------
        ndarray of int64, shape (n_rows,)
            The 0/1 decisions.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
                or not 0.0 <= threshold <= 1.0:
            raise RepairInputError(f"threshold must be a number in [0, 1], got {threshold!r}")
        return (self.predict_proba(X) >= threshold).astype(np.int64)

    # ------------------------------------------------------------------ the frozen group map (MDP)

    def attach_group_map(self, group_map: GroupTransportMap | None) -> Scorer:
        """Carry ``group_map`` (fitted on this scorer's features) in the scorer and its artifact. Returns self."""
        self._check_fitted()
        if group_map is not None:
            group_map._check_fitted()
            if group_map.n_features_in_ != self.n_features_in_:
                raise RepairInputError(f"the group map takes {group_map.n_features_in_} features, "
                                       f"the scorer {self.n_features_in_}")
        self.group_map_ = group_map
        return self

    def matched_counterparts(self, X, s, y=None, draws=None) -> Counterparts:
        """Each row's counterpart(s) in the other group(s) by the scorer's frozen map (for MDP).

        Returns ``(X, s, rows)``: counterparts, their groups and the input row each belongs to
        (see :meth:`~fairstream.repair.group_maps.GroupTransportMap.counterparts`; ``draws`` break ties per row).
        """
        self._check_fitted()
        if self.group_map_ is None:
            raise RepairInputError("this scorer carries no group map; fit one (GroupTransportMap) and attach it")
        return self.group_map_.counterparts(X, s, y, draws)

    # ------------------------------------------------------------------ module protocol

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a scorer fitted on other features (count, names), or whose group map lacks a pipeline group."""
        self._check_fitted()
        if schema.features and self.n_features_in_ != len(schema.features):
            raise IncompatibleArtifact(f"the scorer takes {self.n_features_in_} features, "
                                       f"the pipeline has {len(schema.features)} {list(schema.features)}")
        # A scorer fitted without column names (x0, x1, ...) is matched by position only.
        named = list(self.columns_) != column_names(self.n_features_in_, None)
        if schema.features and named and tuple(self.columns_) != tuple(schema.features):
            raise IncompatibleArtifact(f"the scorer was fitted on features {list(self.columns_)}, "
                                       f"the pipeline names {list(schema.features)}")
        if self.group_map_ is not None:
            check_labels_cover("scorer's group map", "groups", self.group_map_.groups_.tolist(), schema.groups)

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: the batch's values unchanged, plus columns ``score`` and ``decision``.

        A row with a non-finite value, or whose logit overflows (a value far outside the training range),
        is refused with a reason; the others are scored as they would be alone.
        """
        self._check_fitted()
        X = as_2d(batch.X, n_features=self.n_features_in_, columns=self.columns_)
        usable = np.isfinite(X).all(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing row is refused below, not warned about
            if usable.all():  # the common case: no masked copies
                logit = self._logit(X)
            else:
                logit = np.full(len(X), np.nan)
                logit[usable] = self._logit(X[usable])
        ok = np.isfinite(logit)
        score = expit(logit)
        reasons = [None] * len(X)
        if not ok.all():  # rare: refused rows score NaN (decision 0)
            reasons, score[~ok] = self._reasons(X, usable, ok, logit), np.nan
        return Applied(X=batch.X, ok=ok, reasons=reasons, out_of_range=np.zeros(len(X), dtype=bool),
                       columns={"score": score, "decision": (score >= 0.5).astype(np.int64)})

    def _reasons(self, X: np.ndarray, usable: np.ndarray, ok: np.ndarray, logit: np.ndarray) -> list:
        reasons: list = [None] * len(X)
        for i in np.flatnonzero(~ok):
            if not usable[i]:
                k = int(np.argmin(np.isfinite(X[i])))
                reasons[i] = f"column {self.columns_[k]!r} has a non-finite value {float(X[i, k])!r}"
            else:
                reasons[i] = (f"the scorer's logit is {float(logit[i])!r}: the row's values overflow its network "
                              "(far outside the range it was trained on)")
        return reasons

    def probe(self) -> Batch:
        """The module protocol's load-time probe: the standardisation centre and three scales either side of it."""
        self._check_fitted()
        with np.errstate(over="ignore"):
            X = np.clip(self.mean_ + np.array([[0.0], [-3.0], [3.0]]) * self.scale_, -_LARGEST, _LARGEST)
        return Batch(X=X, keys=np.array(["probe-0", "probe-1", "probe-2"], dtype=object), columns=tuple(self.columns_))

    # ------------------------------------------------------------------ artifacts

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the scorer (and its group map) into an artifact of kind ``scorer``: arrays only.

        >>> import numpy as np
        >>> scorer = Scorer.from_weights([np.ones((1, 3)), np.ones((3, 1))], [np.zeros(3), [0.5]], [0.0], [1.0])
        >>> copy = Scorer.from_artifact(scorer.to_artifact(version=2))
        >>> type(copy).__name__, copy.hidden_, copy.predict_proba([[1.0]]).tolist() == scorer.predict_proba([[1.0]]).tolist()
        ('Scorer', (3,), True)
        """
        self._check_fitted()
        arrays = {"mean": self.mean_, "scale": self.scale_,
                  **{f"weight_{k}": w for k, w in enumerate(self.weights_)},
                  **{f"bias_{k}": b for k, b in enumerate(self.biases_)}}
        parameters = {"layout": "network", "hidden": list(self.hidden_), "activation": "relu",
                      "columns": list(self.columns_), "training": self.training_}
        return self._pack(arrays, parameters, version, metrics, data_fingerprint)

    def _pack(self, arrays: dict, parameters: dict, version: int, metrics, data_fingerprint) -> artifacts.Artifact:
        if self.group_map_ is not None:
            arrays = {**arrays, **self.group_map_.to_arrays(_MAP_PREFIX)}
            parameters = {**parameters, "group_map": self.group_map_.artifact_parameters()}
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters=parameters, metrics=metrics or {},
                              data_fingerprint=data_fingerprint, version=version)

    @staticmethod
    def array_layout(parameters: dict) -> ArrayLayout:
        """The arrays of a ``scorer`` artifact in either layout: dtype, shape and value domain, checked at load.

        A network's layers are ``weight_k`` (in, out) and ``bias_k`` (out,) with the sizes
        ``n_features, *hidden, 1``; a logistic one is ``coef``, ``intercept`` and its fit's provenance.
        Arrays under ``group_map.`` are checked by :meth:`GroupTransportMap.from_arrays`.
        """
        what = "scorer artifact"
        dims = names_parameter(parameters, "columns", what)
        delegated = (_MAP_PREFIX,) if parameters.get("group_map") is not None else ()
        if parameters.get("layout") == "network":
            widths = sizes_parameter(parameters, "hidden", what)
            hidden = {f"hidden_{k + 1}": width for k, width in enumerate(widths)}
            dims.update(hidden)
            sizes = ["n_features", *hidden, 1]  # hidden sizes by name: hidden_1, hidden_2, ...
            layers = tuple(spec for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])) for spec in (
                ArraySpec(f"weight_{k}", "f", (n_in, n_out), (finite(),)),
                ArraySpec(f"bias_{k}", "f", (n_out,), (finite(),))))
            return ArrayLayout(_STANDARDISATION + layers, dims, delegated)
        if "layout" in parameters:
            raise artifacts.ArtifactError(f"{what}: unknown scorer layout {parameters['layout']!r}")
        max_iter = int_parameter(parameters, "max_iter", what)
        return ArrayLayout(_STANDARDISATION + (
            ArraySpec("coef", "f", ("n_features",), (finite(),)),
            ArraySpec("intercept", "f", (), (finite(),)),
            ArraySpec("n_iter", "iu", (), (at_least(0), at_most(max_iter))),
            ArraySpec("converged", "b", ()),
        ), dims, delegated)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> Scorer:
        """Rebuild the scorer of a ``scorer`` artifact, in either layout (a logistic one is a LogisticScorer).

        Every array is checked against :meth:`array_layout` first, so a scorer that could not score
        a batch is refused at load.

        Parameters
        ----------
        artifact : Artifact
            An artifact of kind ``scorer``.

        Returns
        -------
        Scorer
            The frozen module.
        """
        _check_kind(artifact)
        check_arrays(artifact.arrays, Scorer.array_layout(artifact.parameters), "scorer artifact")
        if artifact.parameters.get("layout") != "network":
            return LogisticScorer.from_artifact(artifact)
        params, a = artifact.parameters, artifact.arrays
        n_layers = len(params["hidden"]) + 1
        scorer = Scorer.from_weights([a[f"weight_{k}"] for k in range(n_layers)],
                                     [a[f"bias_{k}"] for k in range(n_layers)], a["mean"], a["scale"],
                                     columns=params["columns"], training=params.get("training"))
        return scorer.attach_group_map(_map_of(artifact, scorer.columns_))


def _check_kind(artifact: artifacts.Artifact) -> None:
    if artifact.kind != ARTIFACT_KIND:
        raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")


def _map_of(artifact: artifacts.Artifact, columns) -> GroupTransportMap | None:
    params = artifact.parameters.get("group_map")
    if params is None:
        return None
    try:
        return GroupTransportMap.from_arrays(artifact.arrays, params, columns, prefix=_MAP_PREFIX)
    except (KeyError, TypeError, RepairInputError) as err:
        raise artifacts.ArtifactError(f"the scorer's group map is malformed: {err}") from None


_STANDARDISATION = (ArraySpec("mean", "f", ("n_features",), (finite(),)),
                    ArraySpec("scale", "f", ("n_features",), (finite(), above(0.0))))


def _check_layers(scorer: Scorer, error: type[Exception]) -> None:
    """Layers that chain: (d, h1), (h1, h2), ..., (h_k, 1), each with a bias of its width; all finite.

    The network layout's own check, on the scorer's arrays with the hidden sizes its weights imply.
    """
    if not scorer.weights_ or len(scorer.weights_) != len(scorer.biases_):
        raise error(f"a scorer needs one bias per layer, got {len(scorer.weights_)} weights and "
                    f"{len(scorer.biases_)} biases")
    hidden = [int(w.shape[1]) if w.ndim == 2 else 0 for w in scorer.weights_[:-1]]
    arrays = {"mean": scorer.mean_, "scale": scorer.scale_, **{f"weight_{k}": w for k, w in enumerate(scorer.weights_)},
              **{f"bias_{k}": b for k, b in enumerate(scorer.biases_)}}
    layout = Scorer.array_layout({"layout": "network", "hidden": hidden, "columns": list(scorer.columns_)})
    check_arrays(arrays, layout, "scorer", error)


class LogisticScorer(Scorer, Estimator):
    """Binary logistic regression on standardised features, fitted by Newton/IRLS (no torch).

    A scikit-learn style estimator (``get_params``, ``set_params``, ``sklearn.base.clone``, a repr of the
    changed parameters): ``fit(X, y, columns=None)`` as scikit-learn's ``fit(X, y)``, ``columns`` naming the
    features in errors. The constructor only stores the parameters; ``fit`` checks them.

    Parameters
    ----------
    l2 : float, default=1e-3
        Ridge penalty on the standardised coefficients (>= 0); it keeps the fit finite on
        separable data.
    max_iter : int, default=50
        Newton steps at most.
    tol : float, default=1e-8
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

    def fit(self, X, y, columns: Sequence[str] | None = None) -> LogisticScorer:
        """Fit on features ``X`` and binary labels ``y``.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features.
        y : array-like of shape (n_rows,)
            Binary labels (0 or 1).
        columns : sequence of str or None, default=None
            Feature names, used in error messages.

        Returns
        -------
        self : LogisticScorer
            The fitted scorer.
        """
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
        self.weights_, self.biases_ = (np.ascontiguousarray(theta[1:, None]),), (theta[:1].copy(),)
        self.n_iter_, self.converged_ = n_iter, converged
        self.training_ = {"method": "logistic", **self.artifact_parameters()}
        self.group_map_ = None
        return self

    def artifact_parameters(self) -> dict:
        """The constructor parameters, JSON-ready (sealed into the artifact)."""
        return {"l2": float(self.l2), "max_iter": int(self.max_iter), "tol": float(self.tol)}

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the fitted scorer into an :class:`~fairstream.repair.artifacts.Artifact` of kind ``scorer``.

        Parameters
        ----------
        version : int, default=1
            The artifact's version number.
        metrics : dict or None, default=None
            Fit-time metrics to record in the manifest (JSON numbers).
        data_fingerprint : str or None, default=None
            Fingerprint of the fit data (see :func:`~fairstream.repair.artifacts.fingerprint_arrays`).

        Returns
        -------
        Artifact
            An artifact of kind ``scorer``.

        Examples
        --------
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
        parameters = {**self.artifact_parameters(), "columns": list(self.columns_)}
        return self._pack(arrays, parameters, version, metrics, data_fingerprint)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> LogisticScorer:
        """Rebuild the fitted scorer (bit-exact: the same arrays, the same probabilities)."""
        _check_kind(artifact)
        if artifact.parameters.get("layout") == "network":
            raise artifacts.ArtifactError("this scorer artifact holds a network, not a logistic regression; "
                                          "load it with Scorer.from_artifact")
        check_arrays(artifact.arrays, Scorer.array_layout(artifact.parameters), "scorer artifact")
        params = dict(artifact.parameters)
        columns = params.pop("columns")
        params.pop("group_map", None)
        scorer = cls(**params)
        a = artifact.arrays
        scorer.mean_, scorer.scale_ = np.array(a["mean"]), np.array(a["scale"])
        coef = np.array(a["coef"])
        scorer.weights_, scorer.biases_ = (np.ascontiguousarray(coef[:, None]),), (np.array([float(a["intercept"])]),)
        scorer.n_iter_, scorer.converged_ = int(a["n_iter"]), bool(a["converged"])
        scorer.n_features_in_ = coef.shape[0]
        scorer.columns_ = column_names(scorer.n_features_in_, columns)
        scorer.training_ = {"method": "logistic", **scorer.artifact_parameters()}
        scorer.group_map_ = None
        try:
            scorer._check_params()
        except RepairInputError as err:
            raise artifacts.ArtifactError(f"scorer artifact: {err}") from None
        return scorer.attach_group_map(_map_of(artifact, scorer.columns_))


# ---------------------------------------------------------------------------------------------
# validation on a labelled holdout


@dataclass(frozen=True)
class ScorerValidation:
    """A scorer's accuracy and fairness on a labelled holdout (decisions ``1[score >= threshold]``).

    Gaps are spreads (max - min) across groups: ``dp_gap`` of positive decisions, ``mean_dp_gap`` of
    mean scores, ``tpr_gap`` (equal opportunity) among ``y = 1``, ``fpr_gap`` among ``y = 0``,
    ``eo_gap`` their maximum (as :func:`~fairstream.models.flow.validate_flow`) and ``eo_mean_gap``
    their mean (Kim et al.'s Table 2 ΔEO). ``wdp``: the largest W1 between two groups' scores;
    ``mdp``: matched demographic parity with the group map (worst pair); ``matching_cost``: the
    transport cost of the scorer's fair matching function (scaled features, worst pair);
    ``pdp``/``peo``: the largest |Pearson correlation| of score and group membership, overall and
    within a label (Buyl and De Bie's violations).
    """

    accuracy: float
    auc: float
    dp_gap: float
    mean_dp_gap: float
    wdp: float
    mdp: float
    matching_cost: float
    tpr_gap: float
    fpr_gap: float
    eo_gap: float
    eo_mean_gap: float
    pdp: float
    peo: float
    positive_rates: dict
    n_rows: int

    def as_metrics(self) -> dict:
        """JSON-ready metrics for an artifact manifest (gaps that could not be measured are left out)."""
        values = {k: v for k, v in self.__dict__.items() if k != "positive_rates"}
        return {k: v for k, v in values.items() if not (isinstance(v, float) and np.isnan(v))}


def validate_scorer(scorer: Scorer, X, s, y, group_map: GroupTransportMap | None = None, threshold: float = 0.5,
                    seed: int = 0) -> ScorerValidation:
    """Accuracy, AUC and fairness (DP, MDP, EO, ...) of ``scorer`` on a labelled holdout ``(X, s, y)``.

    MDP uses ``group_map``, else the scorer's own map, else a marginal map fitted on the holdout:
    to compare a candidate with the active scorer, pass both the same map.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 2)); s = (X[:, 1] > 0).astype(int); y = (X[:, 0] > 0).astype(int)
    >>> result = validate_scorer(LogisticScorer().fit(X, y), X, s, y)
    >>> result.accuracy > 0.95, result.dp_gap < 0.15, result.auc > 0.99
    (True, True, True)
    """
    X = as_2d(X, n_features=scorer.n_features_in_, columns=scorer.columns_)
    n = len(X)
    s = normalise_labels(as_labels(s, n, "s"))
    y = as_binary(y, n)
    score = scorer.predict_proba(X)
    decision = (score >= threshold).astype(np.int64)
    dp = demographic_parity(decision, s)
    tpr, fpr = (demographic_parity(decision[y == label], s[y == label]).difference if (y == label).any() else np.nan
                for label in (1, 0))
    gmap = group_map or scorer.group_map_ or GroupTransportMap(seed=seed).fit(X, s, columns=scorer.columns_)
    matched = gmap.counterparts(X, s)
    mdp = matched_dp(score[matched.rows], scorer.predict_proba(matched.X), s[matched.rows], matched.s).overall
    cost = fair_matching_cost(gmap.scaled(X), score, s, reference=gmap.reference_group, n_batches=10, seed=seed).cost
    S, groups = one_hot(s)
    means = [score[s == g].mean() for g in groups]
    return ScorerValidation(
        accuracy=float(np.mean(decision == y)), auc=auc(score, y == 1), dp_gap=dp.difference,
        mean_dp_gap=float(max(means) - min(means)), wdp=_max_w1(score, s, groups), mdp=mdp,
        matching_cost=float(cost.max()) if cost.size else float("nan"),
        tpr_gap=float(tpr), fpr_gap=float(fpr), eo_gap=float(max(tpr, fpr)), eo_mean_gap=float((tpr + fpr) / 2),
        pdp=correlation_violation(score, S), peo=correlation_violation(score, S, y),
        positive_rates={g.item(): float(r) for g, r in zip(dp.groups, dp.rates)}, n_rows=n)


def _max_w1(score: np.ndarray, s: np.ndarray, groups: np.ndarray) -> float:
    samples = [score[s == g] for g in groups]
    return float(max((wasserstein_distance(a, b) for i, a in enumerate(samples) for b in samples[i + 1:]), default=0.0))
