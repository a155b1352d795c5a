"""Fitting AdapFair flows in torch, in front of a frozen differentiable scorer; re-fitting on drift.

Huang, Tang and Chang, "AdapFair: Ensuring Adaptive Fairness for Machine Learning Operations"
(2025), Algorithm 1: the flows ``T_s`` (or one blind ``T``) minimise

    lam * BCE(y, f(T_s(x))) + (1 - lam) * S_eps(scores of group 0, scores of group 1)

while the classifier ``f`` stays frozen; gradients reach the flows through ``f`` by autograd
(the paper's ``G(x)``) and through the OT term by the closed-form Theorem 1 gradient
(:mod:`fairstream.models.fairness_loss`). Choices the paper leaves open, made here:

- Adam instead of plain gradient descent, and mini-batches sampled per fairness cell (a group for
  DP; a group and label for equal opportunity / equalized odds), ``batch_size`` rows each, so the
  OT problem stays small; the BCE term is importance-weighted back to the window's proportions.
- Coupling layers start at the identity (zero output layers), so step 0 is the frozen classifier
  alone; a re-fit can instead warm-start from the deployed flow.
- Flows work on features standardised with the fit window's mean and scale (kept by a warm start).

This module imports torch and is never imported by the apply path (:mod:`fairstream.models.flow`).
The frozen scorer is any ``torch.nn.Module`` mapping (n, d) features to (n,) logits, or a fitted
:class:`~fairstream.models.scorer.LogisticScorer` (see :func:`as_torch_scorer`).
"""

from __future__ import annotations

import copy
import time
from typing import Sequence

import numpy as np
import torch
from torch import nn

from fairstream.repair import artifacts
from fairstream.repair.estimator import FrozenPartsEstimator
from fairstream.repair.measure.metrics import as_binary
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    check_finite,
    column_names,
    normalise_labels,
)

from .fairness_loss import DIVERGENCES, NOTIONS, fairness_loss
from .flow import NETS, FlowPreprocessor, coupling_masks

__all__ = ["AdapFair", "FlowBank", "LogisticLogits", "MLPClassifier", "as_torch_scorer",
           "refit_flow", "train_classifier"]

DTYPE = torch.float64


# ---------------------------------------------------------------------------------------------
# the flow in torch


class FlowBank(nn.Module):
    """Coupling flows, one per group (or one shared), on features standardised by ``mean`` and ``scale``.

    Each coupling layer ``k`` of flow ``f`` has a scale MLP (tanh output) and a shift MLP. The j-th
    linear layers of all of them are one parameter ``weights[j]`` of shape (layers, flows, 2, in,
    out) (net 0: scale, 1: shift), so one batched matmul runs both nets of a layer for every group
    at once: with layers this small, the number of torch ops, not the arithmetic, sets the time.
    """

    def __init__(self, n_flows: int, masks: np.ndarray, hidden: Sequence[int], mean: np.ndarray, scale: np.ndarray):
        super().__init__()
        d = masks.shape[1]
        self.register_buffer("masks", torch.tensor(masks, dtype=DTYPE))
        self.register_buffer("mean", torch.tensor(mean, dtype=DTYPE))
        self.register_buffer("std", torch.tensor(scale, dtype=DTYPE))
        self.hidden = tuple(int(h) for h in hidden)
        sizes = [d, *self.hidden, d]
        shape = (len(masks), n_flows, len(NETS))
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for j, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            # torch.nn.Linear's default initialisation; the last layer starts at zero (identity map).
            bound = 0.0 if j == len(sizes) - 2 else 1.0 / np.sqrt(n_in)
            self.weights.append(nn.Parameter(torch.empty(*shape, n_in, n_out, dtype=DTYPE).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(*shape, 1, n_out, dtype=DTYPE).uniform_(-bound, bound)))

    @property
    def n_flows(self) -> int:
        """How many flows the bank holds (one per group, or one shared)."""
        return int(self.weights[0].shape[1])

    def forward(self, x: torch.Tensor, flows: Sequence[int] | None = None, inverse: bool = False) -> torch.Tensor:
        """Map ``x`` of shape (len(flows), n, d): slice ``i`` goes through flow ``flows[i]`` (default: all flows)."""
        n_flows, n, d = x.shape
        index = None if flows is None else torch.as_tensor(np.asarray(flows, dtype=np.int64))
        # Per layer k: weights (flows * 2, in, out), biases (flows * 2, 1, out); unbind is one op for all k.
        layers = [(p if index is None else p.index_select(1, index)).flatten(1, 2).unbind(0)
                  for p in [*self.weights, *self.biases]]
        n_linear = len(self.weights)
        z = (x - self.mean) / self.std
        for k in (range(len(self.masks) - 1, -1, -1) if inverse else range(len(self.masks))):
            mask = self.masks[k]
            kept = z * mask
            h = kept.unsqueeze(1).expand(n_flows, 2, n, d).reshape(n_flows * 2, n, d)
            for j in range(n_linear):
                h = torch.baddbmm(layers[n_linear + j][k], h, layers[j][k])
                if j < n_linear - 1:
                    h = torch.relu(h)
            h = h.view(n_flows, 2, n, d)
            log_scale, shift = torch.tanh(h[:, 0]), h[:, 1]
            moved = (z - shift) * torch.exp(-log_scale) if inverse else z * torch.exp(log_scale) + shift
            z = kept + (1.0 - mask) * moved
        return z * self.std + self.mean

    @classmethod
    def from_frozen(cls, frozen: FlowPreprocessor, sources: Sequence[int | None]) -> "FlowBank":
        """A bank whose flow ``f`` copies frozen flow ``sources[f]`` (None: identity)."""
        bank = cls(len(sources), frozen.masks, frozen.hidden, frozen.mean, frozen.scale)
        with torch.no_grad():
            for j, (w, b) in enumerate(zip(bank.weights, bank.biases)):
                for f, source in enumerate(sources):
                    if source is None:
                        if j == len(bank.weights) - 1:
                            w[:, f].zero_()
                            b[:, f].zero_()
                        continue
                    for net_index, net in enumerate(NETS):
                        # frozen: (flows, layers, out, in) -> here: (layers, in, out)
                        w[:, f, net_index] = torch.tensor(getattr(frozen, f"{net}_weights")[j][source]).transpose(-1, -2)
                        b[:, f, net_index, 0] = torch.tensor(getattr(frozen, f"{net}_biases")[j][source])
        return bank

    def freeze(self, **fields) -> FlowPreprocessor:
        """The numpy :class:`FlowPreprocessor` of this bank (float64 arrays, (flows, layers, out, in))."""
        arrays = {}
        for net_index, net in enumerate(NETS):
            arrays[f"{net}_weights"] = tuple(w[:, :, net_index].detach().transpose(-1, -2).transpose(0, 1)
                                             .double().numpy().copy() for w in self.weights)
            arrays[f"{net}_biases"] = tuple(b[:, :, net_index, 0].detach().transpose(0, 1).double().numpy().copy()
                                            for b in self.biases)
        return FlowPreprocessor(mean=self.mean.double().numpy().copy(), scale=self.std.double().numpy().copy(),
                                masks=self.masks.double().numpy().copy(), **arrays, **fields)


# ---------------------------------------------------------------------------------------------
# frozen scorers as differentiable torch functions


class LogisticLogits(nn.Module):
    """The log-odds of a fitted :class:`~fairstream.models.scorer.LogisticScorer`, rebuilt from its arrays."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, coef: np.ndarray, intercept: float):
        super().__init__()
        self.register_buffer("mean", torch.tensor(np.asarray(mean), dtype=DTYPE))
        self.register_buffer("std", torch.tensor(np.asarray(scale), dtype=DTYPE))
        self.register_buffer("coef", torch.tensor(np.asarray(coef), dtype=DTYPE))
        self.register_buffer("intercept", torch.tensor(float(intercept), dtype=DTYPE))

    @classmethod
    def from_scorer(cls, scorer) -> "LogisticLogits":
        """From a fitted LogisticScorer (its ``mean_``, ``scale_``, ``coef_``, ``intercept_``)."""
        missing = [name for name in ("mean_", "scale_", "coef_", "intercept_") if not hasattr(scorer, name)]
        if missing:
            raise RepairInputError(f"the scorer lacks {missing}; fit it first")
        return cls(scorer.mean_, scorer.scale_, scorer.coef_, scorer.intercept_)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen scorer's logits for a batch of rows."""
        return ((x - self.mean) / self.std) @ self.coef + self.intercept


class MLPClassifier(nn.Module):
    """Standardise, then a ReLU MLP to one logit: the paper's "Naive" classifier (hidden 20, 20)."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, hidden: Sequence[int] = (20, 20)):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(scale, dtype=torch.float32))
        sizes = [len(mean), *hidden]
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of rows."""
        return self.net((x - self.mean) / self.std).squeeze(-1)


def train_classifier(X, y, hidden: Sequence[int] = (20, 20), n_epochs: int = 30, batch_size: int = 256,
                     lr: float = 1e-3, weight_decay: float = 1e-4, seed: int = 0) -> MLPClassifier:
    """Train an :class:`MLPClassifier` with Adam on BCE; returned frozen (eval mode, no gradients)."""
    X = as_2d(X)
    check_finite(X, column_names(X.shape[1], None))
    y = as_binary(y, len(X))
    scale = X.std(axis=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MLPClassifier(X.mean(axis=0), np.where(scale > 0, scale, 1.0), hidden)
    rng = np.random.default_rng(seed)
    features, labels = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(n_epochs):
        for rows in np.array_split(rng.permutation(len(X)), max(1, len(X) // batch_size)):
            optimiser.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(model(features[rows]), labels[rows])
            loss.backward()
            optimiser.step()
    return model.eval().requires_grad_(False)


def as_torch_scorer(scorer) -> nn.Module:
    """A frozen private copy of ``scorer`` as a torch module returning logits.

    Accepts a ``torch.nn.Module`` mapping (n, d) -> (n,) logits (a user's model wrapped to that
    interface) or a fitted LogisticScorer. The copy keeps training from touching the caller's model.
    """
    if isinstance(scorer, nn.Module):
        module = copy.deepcopy(scorer)
    elif hasattr(scorer, "coef_") and hasattr(scorer, "predict_proba"):
        module = LogisticLogits.from_scorer(scorer)
    else:
        raise TypeError(f"the frozen scorer must be a torch.nn.Module returning logits or a fitted LogisticScorer, "
                        f"got {type(scorer).__name__}")
    return module.eval().requires_grad_(False)


def _dtype_of(module: nn.Module) -> torch.dtype:
    tensor = next(iter(module.parameters()), None)
    if tensor is None:
        tensor = next(iter(module.buffers()), None)
    return torch.float32 if tensor is None or not tensor.is_floating_point() else tensor.dtype


# ---------------------------------------------------------------------------------------------
# the estimator


class AdapFair(FrozenPartsEstimator):
    """Fit AdapFair flow(s) in front of a frozen scorer; ``flow_`` is the frozen :class:`FlowPreprocessor`.

    A scikit-learn style estimator (``get_params``, ``set_params``, ``sklearn.base.clone``, a repr of the
    changed parameters) whose ``fit(X, s, y)`` takes the protected attribute ``s`` besides the labels ``y``.
    The constructor only stores the parameters; ``fit`` checks them. ``scorer`` and ``warm_start`` are used
    frozen, so a clone shares them (scikit-learn's default clone would unfit a fitted scorer).

    Parameters
    ----------
    scorer:
        The frozen classifier: a torch module returning logits, or a fitted LogisticScorer.
    group_aware:
        One flow per group (``s`` needed at serving time) or one shared flow (attribute-blind).
    notion, divergence, eps, lam:
        Fairness notion (``"dp"``, ``"eopp"``, ``"eo"``), the OT divergence (``"sinkhorn"``: the
        paper's sharp Sinkhorn; ``"exact"``: exact 1-D W2^2), its inverse regularisation and the
        trade-off weight: ``lam * BCE + (1 - lam) * divergence``.
    n_blocks, hidden:
        Flow depth (blocks of two complementary coupling layers) and the coupling MLPs' hidden
        sizes; the paper uses 10 blocks of (20, 20), (20, 20, 20) for Health.
    n_steps, batch_size, lr, seed:
        Adam steps, rows sampled per fairness cell and step, learning rate, seed (masks, init, batches).
    columns:
        Feature names (default: a warm start's, else ``x0, x1, ...``).
    warm_start:
        A deployed flow (or its artifact) to start from; its architecture, masks and
        standardisation are kept, and ``n_blocks``/``hidden`` are then ignored.
    """

    _shared_parameters = ("scorer", "warm_start")

    def __init__(self, scorer, group_aware: bool = True, notion: str = "dp", divergence: str = "sinkhorn",
                 eps: float = 200.0, lam: float = 0.5, n_blocks: int = 10, hidden: Sequence[int] = (20, 20),
                 n_steps: int = 200, batch_size: int = 128, lr: float = 2e-3, seed: int = 0,
                 columns: Sequence[str] | None = None, warm_start=None):
        self.scorer = scorer
        self.group_aware = group_aware
        self.notion = notion
        self.divergence = divergence
        self.eps = eps
        self.lam = lam
        self.n_blocks = n_blocks
        self.hidden = hidden
        self.n_steps = n_steps
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed
        self.columns = columns
        self.warm_start = warm_start

    def _check_params(self) -> None:
        if self.notion not in NOTIONS:
            raise RepairInputError(f"notion must be one of {NOTIONS}, got {self.notion!r}")
        if self.divergence not in DIVERGENCES:
            raise RepairInputError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        checks = {"lam": (self.lam, lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
                  "eps": (self.eps, lambda v: 0.0 < v < np.inf, "a positive finite number"),
                  "lr": (self.lr, lambda v: 0.0 < v < np.inf, "a positive finite number")}
        for name, (value, ok, what) in checks.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not ok(value):
                raise RepairInputError(f"{name} must be {what}, got {value!r}")
        for name, value, low in (("n_blocks", self.n_blocks, 1), ("n_steps", self.n_steps, 0),
                                 ("batch_size", self.batch_size, 2), ("seed", self.seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise RepairInputError(f"{name} must be an integer >= {low}, got {value!r}")
        if not all(isinstance(h, (int, np.integer)) and not isinstance(h, bool) and h >= 1 for h in self.hidden):
            raise RepairInputError(f"hidden must be positive layer sizes, got {self.hidden!r}")

    def training_parameters(self) -> dict:
        """The training parameters recorded in the flow's ``training`` provenance."""
        return {"group_aware": bool(self.group_aware), "notion": self.notion, "divergence": self.divergence,
                "eps": float(self.eps), "lam": float(self.lam), "n_steps": int(self.n_steps),
                "batch_size": int(self.batch_size), "lr": float(self.lr), "seed": int(self.seed)}

    # ------------------------------------------------------------------ fit

    def fit(self, X, s, y) -> "AdapFair":
        """Fit the flow(s) on features ``X``, groups ``s`` and binary labels ``y`` (Algorithm 1). Returns self."""
        self._check_params()
        X = as_2d(X, columns=self.columns)
        warm = self._warm_flow(X.shape[1])
        # A re-fit keeps the deployed flow's feature names unless it is given its own.
        named = self.columns is not None or (warm is not None and warm.named)
        names = column_names(X.shape[1], self.columns if self.columns is not None or warm is None else warm.columns)
        check_finite(X, names)
        n = len(X)
        s = normalise_labels(as_labels(s, n, "s"))
        y = as_binary(y, n)
        groups, codes = np.unique(s, return_inverse=True)
        if len(groups) < 2:
            raise RepairInputError(f"s holds only the group {groups.tolist()}; a fairness flow needs two or more")
        bank, flow_of_group, all_groups = self._bank(X, groups, warm)
        scorer = as_torch_scorer(self.scorer)
        cells = self._cells(codes, y)
        started = time.perf_counter()
        self.history_ = self._train(bank, scorer, torch.as_tensor(X, dtype=DTYPE), codes, y, cells, flow_of_group)
        self.fit_seconds_ = time.perf_counter() - started
        training = {**self.training_parameters(), "n_rows": n, "warm_start": warm is not None}
        self.flow_ = bank.freeze(columns=tuple(names), groups=all_groups, group_aware=bool(self.group_aware),
                                 data_min=X.min(axis=0), data_max=X.max(axis=0), named=named,
                                 training=training)
        return self

    def _warm_flow(self, n_features: int) -> FlowPreprocessor | None:
        warm = self.warm_start
        if warm is None:
            return None
        if isinstance(warm, artifacts.Artifact):
            warm = FlowPreprocessor.from_artifact(warm)
        if not isinstance(warm, FlowPreprocessor):
            raise TypeError(f"warm_start must be a FlowPreprocessor or a flow artifact, got {type(warm).__name__}")
        if warm.n_features != n_features:
            raise RepairInputError(f"warm_start maps {warm.n_features} features, X has {n_features}")
        if warm.named and self.columns is not None and tuple(self.columns) != warm.columns:
            raise RepairInputError(f"warm_start was fitted on features {list(warm.columns)}, "
                                   f"the re-fit names {list(self.columns)}")
        if warm.group_aware != bool(self.group_aware):
            raise RepairInputError(f"warm_start is {'group-aware' if warm.group_aware else 'blind'}, "
                                   f"the re-fit asks for {'group-aware' if self.group_aware else 'blind'}")
        return warm

    def _bank(self, X: np.ndarray, groups: np.ndarray, warm: FlowPreprocessor | None):
        """The trainable flows, which flow serves each data group, and the groups the result will know."""
        if warm is None:
            scale = X.std(axis=0)
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                bank = FlowBank(len(groups) if self.group_aware else 1, coupling_masks(X.shape[1], self.n_blocks, self.seed),
                                self.hidden, X.mean(axis=0), np.where(scale > 0, scale, 1.0))
            flow_of_group = np.arange(len(groups)) if self.group_aware else np.zeros(len(groups), dtype=np.intp)
            return bank, flow_of_group, groups
        all_groups = np.union1d(groups, warm.groups)
        if not self.group_aware:
            sources, flow_of_group = [0], np.zeros(len(groups), dtype=np.intp)
        else:  # a group of the deployed flow that is absent from the window keeps its flow unchanged
            warm_index = {g: k for k, g in enumerate(warm.groups.tolist())}
            sources, flow_of_group = [warm_index.get(g) for g in all_groups.tolist()], np.searchsorted(all_groups, groups)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            return FlowBank.from_frozen(warm, sources), flow_of_group, all_groups

    def _cells(self, codes: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        """Row indices of each fairness cell, sampled separately: a group (DP) or a group and label."""
        keys = codes if self.notion == "dp" else codes * 2 + y
        return [np.flatnonzero(keys == key) for key in np.unique(keys)]

    def _sample(self, rng: np.random.Generator, cells: list[np.ndarray]) -> list[np.ndarray]:
        """``batch_size`` rows from every cell (with replacement only from a smaller cell).

        Equal counts per cell give equal counts per group, so one batched call maps every group.
        """
        return [rng.choice(cell, self.batch_size, replace=len(cell) < self.batch_size) for cell in cells]

    def _logits(self, bank: FlowBank, scorer: nn.Module, X: torch.Tensor, rows: np.ndarray, codes: np.ndarray,
                flow_of_group: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """Scores (logits) of ``scorer(T_s(x))`` for ``rows``, in the order of ``rows``."""
        if not self.group_aware:
            mapped = bank(X[rows].unsqueeze(0), flows=[0])[0]
            return scorer(mapped.to(dtype)).reshape(-1).to(DTYPE)
        present = np.unique(codes[rows])
        blocks = [np.flatnonzero(codes[rows] == g) for g in present]
        if len({len(b) for b in blocks}) == 1:  # the usual case: one call for all groups
            mapped = bank(X[rows[np.stack(blocks)]], flows=flow_of_group[present])
            parts = [mapped.reshape(-1, X.shape[1])]
        else:
            parts = [bank(X[rows[b]].unsqueeze(0), flows=[flow_of_group[g]])[0] for g, b in zip(present, blocks)]
        logits = scorer(torch.cat(parts).to(dtype)).reshape(-1).to(DTYPE)
        return logits[torch.as_tensor(np.argsort(np.concatenate(blocks)))]

    def _train(self, bank: FlowBank, scorer: nn.Module, X: torch.Tensor, codes: np.ndarray, y: np.ndarray,
               cells: list[np.ndarray], flow_of_group: np.ndarray) -> list[dict]:
        rng = np.random.default_rng(self.seed)
        labels = torch.as_tensor(y, dtype=DTYPE)
        # foreach: one Adam update over all the small parameter tensors instead of a Python loop.
        optimiser = torch.optim.Adam(bank.parameters(), lr=self.lr, foreach=True)
        dtype = _dtype_of(scorer)
        lam = float(self.lam)
        # Importance weights: each cell counts by its share of the window, whatever its sample size.
        weight = torch.as_tensor(np.repeat([len(c) / len(X) / self.batch_size for c in cells], self.batch_size),
                                 dtype=DTYPE)
        history = []
        for step in range(int(self.n_steps)):
            rows = np.concatenate(self._sample(rng, cells))
            logits = self._logits(bank, scorer, X, rows, codes, flow_of_group, dtype)
            bce = torch.sum(weight * nn.functional.binary_cross_entropy_with_logits(logits, labels[rows], reduction="none"))
            fair = (fairness_loss(torch.sigmoid(logits), codes[rows], y[rows], self.notion, self.divergence, self.eps)
                    if lam < 1.0 else logits.new_zeros(()))
            loss = lam * bce + (1.0 - lam) * fair
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            if step % 10 == 0 or step == self.n_steps - 1:
                history.append({"step": step, "loss": loss.item(), "bce": bce.item(), "fairness": fair.item()})
        return history

    # ------------------------------------------------------------------ use

    def _check_fitted(self) -> None:
        if not hasattr(self, "flow_"):
            raise RepairInputError("this AdapFair is not fitted yet; call fit(X, s, y) first")

    def transform(self, X, s=None) -> np.ndarray:
        """The fitted flow applied to ``X`` (``s`` routes rows to their group's flow when group-aware)."""
        self._check_fitted()
        return self.flow_.transform(X, s)

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """The fitted flow as a ``flow`` artifact."""
        self._check_fitted()
        return self.flow_.to_artifact(version=version, metrics=metrics, data_fingerprint=data_fingerprint)


def refit_flow(X, s, y, scorer, warm_start=None, columns: Sequence[str] | None = None, **params) -> FlowPreprocessor:
    """Fit a flow on a labelled window ``(X, s, y)`` in front of the frozen ``scorer``; the re-fit entry point.

    ``warm_start`` is the deployed flow (a :class:`FlowPreprocessor` or its artifact) or None (start
    at the identity); ``params`` are :class:`AdapFair` parameters (``lam``, ``notion``, ``n_steps``...).
    Compare the result with the active flow on a holdout with :func:`~fairstream.models.flow.validate_flow`.
    """
    return AdapFair(scorer, warm_start=warm_start, columns=columns, **params).fit(X, s, y).flow_
