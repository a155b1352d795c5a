"""Training fair scorers in torch and freezing them into a numpy :class:`~fairstream.models.scorer.Scorer`.

Methods (``method=``), each a :class:`FairScorerTrainer` with a fairness penalty:

- ``"unconstrained"``: an MLP on cross-entropy alone (the papers' "Unfair" baseline);
- ``"ftm"``: Fairness Through Matching (Kim et al., TMLR 2024), ``CE + lam * MDP`` on each
  mini-batch with the exact marginal (``map="marginal"``) or joint (``map="joint"``) OT map
  (:mod:`fairstream.models.ftm`);
- ``"reg"``: ``CE + lam * DP^2`` (the FTM paper's "Reg" baseline);
- ``"otf"``: ``(1 - lam) * CE + lam * OTF0`` (Buyl and De Bie, NeurIPS 2022) for logistic
  regression, demographic parity (``notion="dp"``) or equalized odds (``"eo"``), several
  sensitive attributes stacked (``sensitive=`` columns) (:mod:`fairstream.models.otf_training`);
- ``"norm"``: ``(1 - lam) * CE + lam * ||G h||_1``, OTF's L1 norm-penalty baseline;
- ``"logistic"`` (in :func:`fit_scorer` only): :class:`~fairstream.models.scorer.LogisticScorer` by IRLS, no torch.

The MLP methods sample, per step, equal-size blocks of every group (``batch_size`` rows each, fewer
if a group is smaller), with the cross-entropy weighted by each group's share of the data, as the
FTM code does; an epoch is one pass over the largest group. OTF and the norm penalty sample plain
random batches of ``batch_size`` rows. Adam, learning rate multiplied by ``lr_decay`` each epoch.

Defaults train in seconds on ~10k rows (a re-fit job). The papers' settings, for the reproduction
scripts: FTM two hidden layers of width d, 200 epochs, lr 1e-3, batch 1024 (Adult); OTF logistic
regression, 100 epochs, lr 1e-3, batch 1000, eps 1e-3.

After training, a :class:`~fairstream.repair.group_maps.GroupTransportMap` is fitted on the training
data and carried by the scorer (``group_map=False`` to skip): the FTM map the model was trained
with (marginal or joint), the marginal map for every other method. The monitor measures MDP with it.

This module imports torch; the apply path (:mod:`fairstream.models.scorer`) never imports it.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(600, 3)); s = (X[:, 2] + rng.normal(size=600) > 0).astype(int)
>>> y = (X[:, 0] + X[:, 2] > 0).astype(int)
>>> scorer = fit_scorer(X, s, y, method="ftm", lam=2.0, n_epochs=5, seed=0)
>>> type(scorer).__name__, scorer.training_["method"], scorer.group_map_.method
('Scorer', 'ftm', 'marginal')
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
from torch import nn

from fairstream.repair import artifacts
from fairstream.repair.estimator import FrozenPartsEstimator
from fairstream.repair.group_maps import GroupTransportMap, reference_index
from fairstream.repair.measure.metrics import as_binary
from fairstream.repair.measure.otf import NOTIONS, one_hot
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    check_finite,
    column_names,
    encode,
    normalise_labels,
)

from .ftm import GapPenalty, MatchingPenalty
from .otf_training import NormPenalty, OTFPenalty
from .scorer import LogisticScorer, Scorer

__all__ = ["METHODS", "FairScorerTrainer", "ScorerNet", "TrainingData", "fit_scorer"]

METHODS = ("logistic", "unconstrained", "ftm", "reg", "otf", "norm")
MAPS = ("marginal", "joint")
DTYPE = torch.float32
# Per method: (hidden layers, epochs, batch size, learning rate); "paper" hidden = two layers of width d.
_DEFAULTS = {"unconstrained": ("paper", 20, 256, 2e-3), "ftm": ("paper", 20, 256, 2e-3),
             "reg": ("paper", 20, 256, 2e-3), "otf": ((), 5, 256, 1e-2), "norm": ((), 5, 256, 1e-2)}


class ScorerNet(nn.Module):
    """Standardise with fixed ``mean``/``scale``, ReLU hidden layers, one logit: a Scorer in torch."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, hidden: Sequence[int] = ()):
        super().__init__()
        self.register_buffer("mean", torch.tensor(np.asarray(mean), dtype=DTYPE))
        self.register_buffer("std", torch.tensor(np.asarray(scale), dtype=DTYPE))
        sizes = [len(mean), *[int(h) for h in hidden]]
        layers: list[nn.Module] = []
        for n_in, n_out in pairwise(sizes):
            layers += [nn.Linear(n_in, n_out, dtype=DTYPE), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], 1, dtype=DTYPE))

    @property
    def linears(self) -> list[nn.Linear]:
        """The linear layers, input first."""
        return [m for m in self.net if isinstance(m, nn.Linear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of rows."""
        return self.net((x - self.mean) / self.std).squeeze(-1)

    @classmethod
    def from_scorer(cls, scorer: Scorer) -> ScorerNet:
        """A trainable copy of a frozen scorer (warm start): same layers, weights and standardisation."""
        net = cls(scorer.mean_, scorer.scale_, scorer.hidden_)
        with torch.no_grad():
            for layer, w, b in zip(net.linears, scorer.weights_, scorer.biases_):
                layer.weight.copy_(torch.tensor(w.T, dtype=DTYPE))
                layer.bias.copy_(torch.tensor(b, dtype=DTYPE))
        return net

    def freeze(self, columns: Sequence[str], group_map=None, training: dict | None = None) -> Scorer:
        """The numpy :class:`Scorer` of this network (float64 arrays)."""
        weights = [layer.weight.detach().double().numpy().T.copy() for layer in self.linears]
        biases = [layer.bias.detach().double().numpy().copy() for layer in self.linears]
        return Scorer.from_weights(weights, biases, self.mean.double().numpy().copy(), self.std.double().numpy().copy(),
                                   columns=columns, group_map=group_map, training=training)


@dataclass
class TrainingData:
    """What the penalties read: features (raw, min-max scaled ``Z``, ``standardised``), groups, labels, ``S``."""

    X: np.ndarray
    Z: np.ndarray
    standardised: np.ndarray
    codes: np.ndarray
    y: np.ndarray
    S: np.ndarray
    reference: int
    groups: np.ndarray


class FairScorerTrainer(FrozenPartsEstimator):
    """Train a scorer with a fairness penalty; ``scorer_`` is the frozen :class:`Scorer`.

    A scikit-learn style estimator (``get_params``, ``set_params``, ``sklearn.base.clone``, a repr of the
    changed parameters) whose ``fit(X, s, y, sensitive=None)`` takes the protected attribute ``s`` besides
    the labels ``y``. The constructor only stores the parameters; ``fit`` checks them. ``warm_start`` is used
    frozen, so a clone shares it (scikit-learn's default clone would unfit a fitted scorer).

    Parameters
    ----------
    method:
        ``"unconstrained"``, ``"ftm"``, ``"reg"``, ``"otf"`` or ``"norm"`` (see the module docstring).
    lam:
        The penalty weight: ``CE + lam * penalty`` (FTM, Reg), ``(1 - lam) * CE + lam * penalty``
        with ``lam`` in [0, 1] (OTF, norm; the OTF paper's alpha).
    hidden:
        Hidden layer widths; None: the method's default (two layers of width d for the MLP
        methods, none for OTF and the norm penalty).
    map, joint_alpha:
        FTM's transport map, ``"marginal"`` or ``"joint"``, and the joint cost's label weight.
    notion, eps, cost_scale:
        OTF/norm: ``"dp"`` or ``"eo"`` (corrected equalized odds), the entropic regularisation (in
        units of the batch's largest distance unless ``cost_scale`` fixes the unit).
    n_epochs, batch_size, lr, lr_decay, weight_decay:
        Adam training; None takes the method's default (a few seconds on 10k rows). The default
        number of epochs is raised until training takes at least ``min_steps`` steps, so a small
        window is not under-trained.
    seed:
        Seeds initialisation, batches and the group map's subsamples.
    columns, groups:
        Feature names; the group labels the scorer must serve (each needs training rows).
    warm_start:
        A :class:`Scorer` (or its artifact) to start from; its layers and standardisation are kept.
    group_map, map_points:
        Fit a :class:`GroupTransportMap` on the training data and carry it (``map_points`` per group).
    matching_cache:
        A dict shared by FTM fits on the same data (a lambda sweep): each batch's assignment is solved once
        (``sklearn.base.clone`` copies it, as it copies any plain value: pass the same dict to each estimator).
    """

    _shared_parameters = ("warm_start",)

    def __init__(self, method: str = "ftm", lam: float = 1.0, hidden: Sequence[int] | None = None,
                 map: str = "marginal", joint_alpha: float = 100.0, notion: str = "dp", eps: float = 1e-3,
                 cost_scale: float | None = None, n_epochs: int | None = None, batch_size: int | None = None,
                 lr: float | None = None, lr_decay: float = 0.95, weight_decay: float = 0.0, seed: int = 0,
                 columns: Sequence[str] | None = None, groups: Sequence | None = None, warm_start=None,
                 group_map: bool = True, map_points: int = 1024, matching_cache: dict | None = None,
                 min_steps: int = 300):
        self.method = method
        self.lam = lam
        self.hidden = hidden
        self.map = map
        self.joint_alpha = joint_alpha
        self.notion = notion
        self.eps = eps
        self.cost_scale = cost_scale
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.lr_decay = lr_decay
        self.weight_decay = weight_decay
        self.seed = seed
        self.columns = columns
        self.groups = groups
        self.warm_start = warm_start
        self.group_map = group_map
        self.map_points = map_points
        self.matching_cache = matching_cache
        self.min_steps = min_steps

    # ------------------------------------------------------------------ parameters

    def _settings(self, n_features: int, steps_per_epoch) -> dict:
        """The effective training settings (defaults filled in); ``steps_per_epoch(batch_size)`` sizes the default."""
        hidden, n_epochs, batch_size, lr = _DEFAULTS[self.method]
        hidden = self.hidden if self.hidden is not None else ((n_features, n_features) if hidden == "paper" else hidden)
        batch_size = int(self.batch_size if self.batch_size is not None else batch_size)
        if self.n_epochs is None:
            n_epochs = max(n_epochs, -(-int(self.min_steps) // max(1, steps_per_epoch(batch_size))))
        return {"method": self.method, "lam": float(self.lam), "hidden": [int(h) for h in hidden],
                "n_epochs": int(self.n_epochs if self.n_epochs is not None else n_epochs),
                "batch_size": batch_size,
                "lr": float(self.lr if self.lr is not None else lr), "lr_decay": float(self.lr_decay),
                "weight_decay": float(self.weight_decay), "seed": int(self.seed),
                **({"map": self.map, "joint_alpha": float(self.joint_alpha)} if self.method == "ftm" else {}),
                **({"notion": self.notion} if self.method in ("otf", "norm") else {}),
                **({"eps": float(self.eps), "cost_scale": self.cost_scale} if self.method == "otf" else {})}

    def _check_params(self) -> None:
        if self.method not in _DEFAULTS:
            raise RepairInputError(f"method must be one of {tuple(_DEFAULTS)}, got {self.method!r}")
        if self.map not in MAPS:
            raise RepairInputError(f"map must be one of {MAPS}, got {self.map!r}")
        if self.notion not in NOTIONS:
            raise RepairInputError(f"notion must be one of {NOTIONS}, got {self.notion!r}")
        upper = 1.0 if self.method in ("otf", "norm") else np.inf
        checks = {"lam": (self.lam, lambda v: 0.0 <= v <= upper, f"a number in [0, {upper}]"),
                  "eps": (self.eps, lambda v: 0.0 < v < np.inf, "a positive finite number"),
                  "joint_alpha": (self.joint_alpha, lambda v: 0.0 <= v < np.inf, "a finite number >= 0"),
                  "lr_decay": (self.lr_decay, lambda v: 0.0 < v <= 1.0, "a number in (0, 1]"),
                  "weight_decay": (self.weight_decay, lambda v: 0.0 <= v < np.inf, "a finite number >= 0")}
        for name, (value, ok, what) in checks.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not ok(value):
                raise RepairInputError(f"{name} must be {what}, got {value!r}")
        for name, value, low in (("n_epochs", self.n_epochs, 0), ("batch_size", self.batch_size, 2),
                                 ("seed", self.seed, 0), ("map_points", self.map_points, 1),
                                 ("min_steps", self.min_steps, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low):
                raise RepairInputError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and 0 < self.lr < np.inf):
            raise RepairInputError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.hidden is not None and not all(isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h >= 1
                                               for h in self.hidden):
            raise RepairInputError(f"hidden must be positive layer sizes, got {self.hidden!r}")

    # ------------------------------------------------------------------ fit

    def fit(self, X, s, y, sensitive=None) -> FairScorerTrainer:
        """Train on features ``X``, groups ``s`` and binary labels ``y``; returns self.

        ``sensitive`` (OTF and the norm penalty): sensitive columns (n, d_S) to constrain, e.g. two
        attributes one-hot and stacked; default: ``s`` one-hot.
        """
        self._check_params()
        X = as_2d(X, columns=self.columns)
        warm = self._warm_scorer(X.shape[1])
        names = column_names(X.shape[1], self.columns if self.columns is not None or warm is None else warm.columns_)
        check_finite(X, names)
        s, y, groups, codes = self._labels(X, s, y)
        penalty_kind = _PENALTIES[self.method]
        sampling = "groups" if penalty_kind is None else penalty_kind.sampling
        settings = self._settings(X.shape[1], lambda size: _steps_per_epoch(codes, sampling, size))
        net = self._net(X, settings["hidden"], warm)
        data = self._data(X, s, y, codes, groups, net, sensitive)
        penalty = self._penalty(data)
        started = time.perf_counter()
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.history_ = self._train(net, data, penalty, settings)
        self.fit_seconds_ = time.perf_counter() - started
        group_map = self._group_map(X, s, y, groups, names) if self.group_map else None
        training = {**settings, "hidden": [int(w) for w in net_hidden(net)], "n_rows": len(X),
                    "warm_start": warm is not None}
        self.scorer_ = net.eval().freeze(names, group_map, training)
        return self

    def _labels(self, X: np.ndarray, s, y):
        n = len(X)
        s = normalise_labels(as_labels(s, n, "s"))
        y = as_binary(y, n)
        if y.min() == y.max():
            raise RepairInputError(f"y holds only the class {int(y[0])}; a scorer needs both classes")
        groups = np.unique(s) if self.groups is None else np.unique(normalise_labels(np.asarray(list(self.groups))))
        codes = encode(s, groups, "s")
        counts = np.bincount(codes, minlength=len(groups))
        if len(groups) < 2:
            raise RepairInputError(f"s holds only the group {groups.tolist()}; a fair scorer needs two or more")
        if counts.min() == 0:
            raise RepairInputError(f"group {groups[np.argmin(counts)].item()!r} has no training rows")
        return s, y, groups, codes

    def _warm_scorer(self, n_features: int) -> Scorer | None:
        warm = self.warm_start
        if warm is None:
            return None
        if isinstance(warm, artifacts.Artifact):
            warm = Scorer.from_artifact(warm)
        if not isinstance(warm, Scorer):
            raise TypeError(f"warm_start must be a Scorer or a scorer artifact, got {type(warm).__name__}")
        warm._check_fitted()
        if warm.n_features_in_ != n_features:
            raise RepairInputError(f"warm_start takes {warm.n_features_in_} features, X has {n_features}")
        return warm

    def _net(self, X: np.ndarray, hidden: list, warm: Scorer | None) -> ScorerNet:
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            if warm is not None:
                return ScorerNet.from_scorer(warm)
            scale = X.std(axis=0)
            return ScorerNet(X.mean(axis=0), np.where(scale > 0, scale, 1.0), hidden)

    def _data(self, X, s, y, codes, groups, net: ScorerNet, sensitive) -> TrainingData:
        lo, hi = X.min(axis=0), X.max(axis=0)
        S = one_hot(s, groups)[0] if sensitive is None else as_2d(sensitive)
        if len(S) != len(X):
            raise RepairInputError(f"sensitive must have one row per record ({len(X)}), got {len(S)}")
        return TrainingData(X=X, Z=(X - lo) / np.where(hi > lo, hi - lo, 1.0),
                            standardised=(X - net.mean.double().numpy()) / net.std.double().numpy(),
                            codes=codes, y=y, S=S, groups=groups,
                            reference=reference_index(np.bincount(codes, minlength=len(groups)), groups))

    def _penalty(self, data: TrainingData):
        kind = _PENALTIES[self.method]
        if kind is None:
            return None
        args = {MatchingPenalty: (self.map, self.joint_alpha, self.matching_cache), GapPenalty: (),
                OTFPenalty: (self.notion, self.eps, self.cost_scale), NormPenalty: (self.notion,)}[kind]
        return kind(*args).bind(data)

    def _group_map(self, X, s, y, groups, names) -> GroupTransportMap:
        method = self.map if self.method == "ftm" else "marginal"
        return GroupTransportMap(method=method, alpha=self.joint_alpha, n_points=self.map_points,
                                 seed=self.seed).fit(X, s, y, groups=groups, columns=names)

    # ------------------------------------------------------------------ the loop

    def _batches(self, rng: np.random.Generator, data: TrainingData, sampling: str, batch_size: int):
        """One epoch of ``(rows, blocks, ce_weights)``: per-group blocks of equal size, or random batches."""
        n = len(data.X)
        if sampling == "random":
            for rows in np.array_split(rng.permutation(n), max(1, -(-n // batch_size))):
                yield rows, None, np.full(len(rows), 1.0 / len(rows))
            return
        members = [np.flatnonzero(data.codes == k) for k in range(len(data.groups))]
        m = min(batch_size, min(len(rows) for rows in members))
        steps = _steps_per_epoch(data.codes, sampling, batch_size)
        streams = [np.concatenate([rng.permutation(rows) for _ in range(-(-steps * m // len(rows)))])
                   for rows in members]
        share = np.repeat([len(rows) / n / m for rows in members], m)
        for step in range(steps):
            rows = np.concatenate([stream[step * m:(step + 1) * m] for stream in streams])
            yield rows, [np.arange(k * m, (k + 1) * m) for k in range(len(members))], share

    def _train(self, net: ScorerNet, data: TrainingData, penalty, settings: dict) -> list[dict]:
        rng = np.random.default_rng(self.seed)
        features, labels = torch.as_tensor(data.X, dtype=DTYPE), torch.as_tensor(data.y, dtype=DTYPE)
        optimiser = torch.optim.Adam(net.parameters(), lr=settings["lr"], weight_decay=settings["weight_decay"])
        schedule = torch.optim.lr_scheduler.ExponentialLR(optimiser, gamma=settings["lr_decay"])
        lam = settings["lam"]
        convex = penalty is not None and penalty.convex
        sampling = "groups" if penalty is None else penalty.sampling
        history = []
        for epoch in range(settings["n_epochs"]):
            totals = np.zeros(3)
            for rows, blocks, weights in self._batches(rng, data, sampling, settings["batch_size"]):
                logits = net(features[rows])
                ce = torch.sum(torch.as_tensor(weights, dtype=DTYPE)
                               * nn.functional.binary_cross_entropy_with_logits(logits, labels[rows], reduction="none"))
                fair = penalty(torch.sigmoid(logits), rows, blocks) if penalty is not None and lam > 0 \
                    else logits.new_zeros(())
                loss = (1.0 - lam) * ce + lam * fair if convex else ce + lam * fair
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                totals += (1.0, ce.item(), fair.item())
            schedule.step()
            history.append({"epoch": epoch, "ce": totals[1] / max(totals[0], 1), "penalty": totals[2] / max(totals[0], 1)})
        return history


_PENALTIES = {"unconstrained": None, "ftm": MatchingPenalty, "reg": GapPenalty, "otf": OTFPenalty, "norm": NormPenalty}


def _steps_per_epoch(codes: np.ndarray, sampling: str, batch_size: int) -> int:
    """Steps in one epoch of :meth:`FairScorerTrainer._batches`."""
    if sampling == "random":
        return -(-len(codes) // batch_size)
    counts = np.bincount(codes)
    return int(counts.max() // min(batch_size, counts.min()))


def net_hidden(net: ScorerNet) -> list[int]:
    """Hidden widths of a :class:`ScorerNet`."""
    return [layer.out_features for layer in net.linears[:-1]]


def fit_scorer(X, s, y, method: str = "ftm", columns: Sequence[str] | None = None, groups: Sequence | None = None,
               warm_start=None, seed: int = 0, sensitive=None, **params) -> Scorer:
    """Fit a scorer on a labelled window: the re-fit entry point (``fairstream refit --kind scorer --method ...``).

    ``method``: one of :data:`METHODS`; ``params`` go to :class:`FairScorerTrainer` (``lam``, ``map``,
    ``n_epochs``, ...) or, for ``"logistic"``, to :class:`~fairstream.models.scorer.LogisticScorer`
    (plus ``group_map``/``map_points``). Compare the result with the active scorer on a holdout with
    :func:`~fairstream.models.scorer.validate_scorer`.
    """
    if method not in METHODS:
        raise RepairInputError(f"method must be one of {METHODS}, got {method!r}")
    if method != "logistic":
        trainer = FairScorerTrainer(method, columns=columns, groups=groups, warm_start=warm_start, seed=seed, **params)
        return trainer.fit(X, s, y, sensitive=sensitive).scorer_
    with_map, points = params.pop("group_map", True), params.pop("map_points", 1024)
    scorer = LogisticScorer(**params).fit(X, y, columns=columns)
    if with_map:
        scorer.attach_group_map(GroupTransportMap(n_points=points, seed=seed).fit(X, s, groups=groups,
                                                                                columns=scorer.columns_))
    return scorer
