"""Train the embedding Fairness Module with the Centroid Fairness loss; re-fit and validation entry points.

Conti and Clémençon, "Mitigating Bias in Facial Recognition Systems: Centroid Fairness Loss
Optimization" (2024). On normalised embeddings ``z`` of a frozen encoder, the module
``g(z) = z + W2 relu(W1 z + b1) + b2`` and one learnable centroid per training identity
(initialised at the identity's mean embedding) are trained so that, in every group, the new
image/centroid pseudo-scores regress onto fixed quantile-matched targets on a reference group's
scale (:mod:`fairstream.models.centroid_targets`):

    L_CF = sum_imp w (s - T)^2 / sum_imp w  +  sum_gen w (s - T)^2 / sum_gen w

over same-group image/centroid pairs only. Only the image is transformed at inference, with no
attribute and no centroid: the frozen result is a :class:`~fairstream.models.embedding.FairnessModule`.

Choices where the paper is silent (besides the rank, tie and scale conventions of the targets):

- **initialisation**: the first layer has torch's default init, the last layer (W2, b2) is zero,
  so training starts exactly at the pre-trained (normalised) embedding. Zeroing both layers would
  leave both with zero gradients.
- **batches**: Adam (lr 1e-3) on the MLP and the centroids, batches of 4096 images drawn with
  replacement, ``ceil(N / batch)`` steps an epoch, 20 epochs. Each image is scored against every
  centroid of its own group; targets and weights are looked up on the fly (never stored as an
  N x K matrix). Each term is normalised by the batch's own weight sum.
- **sampling**: ``"balanced"`` draws image i with probability proportional to 1 / (images of its
  group), as the paper does; combined with the 1/|G_a| and 1/|I_a| weight factors this
  double-balances small groups, so ``"uniform"`` is offered for comparison.
- **reference group**: the one with the most training images by default (the paper uses the
  most represented group, also its best performing one); any group label can be given.

torch is imported only inside :meth:`CentroidFairness.fit`; importing this module, validating and
applying modules stays numpy-only.

>>> import numpy as np
>>> from fairstream.models.embedding import FairnessModule
>>> from fairstream.repair.embedding_datasets import simulate_train_test
>>> _, test = simulate_train_test(train_identities=(2, 2), test_identities=(20, 20), test_images=4,
...                               concentration=(0.3, 0.5), noise=(0.7, 0.7), dimension=8, seed=0)
>>> report = validate_embedding_module(FairnessModule.identity(8), test.vectors, test.identities, test.groups, far=0.01)
>>> report.impostor_pairs, report.before.fnmr == report.after.fnmr
(6080, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fairstream.repair.estimator import Estimator
from fairstream.repair.measure.verification import VerificationRates, l2_normalise, same_group_pair_scores
from fairstream.repair.validation import RepairInputError, as_2d, check_finite

from .centroid_targets import (
    CentroidTargets,
    IdentityStructure,
    reference_code,
    pretrained_centroids,
)
from .embedding import FairnessModule

__all__ = [
    "CentroidFairness",
    "ModuleComparison",
    "centroid_fairness_loss",
    "fit_embedding_module",
    "validate_embedding_module",
]

_SAMPLING = ("balanced", "uniform")


def centroid_fairness_loss(scores, targets, weights, genuine):
    """``L_FAR + L_FRR``: weighted squared errors of impostor and of genuine pseudo-scores, each over its weight sum.

    Arguments are flat torch tensors (``genuine`` boolean); a kind with no pair contributes 0.
    """
    squared = weights * (scores - targets) ** 2
    loss = scores.new_zeros(())
    for part in (~genuine, genuine):
        total = weights[part].sum()
        if total > 0:
            loss = loss + squared[part].sum() / total
    return loss


class CentroidFairness(Estimator):
    """Fit the Fairness Module ``g(z) = z + MLP(z)`` with the Centroid Fairness loss (scikit-learn style).

    ``get_params``, ``set_params``, ``sklearn.base.clone`` and the repr follow scikit-learn; ``fit(vectors,
    identities, groups)`` takes each vector's identity and group where scikit-learn's ``fit(X, y)`` takes
    labels. The constructor only stores the parameters; ``fit`` checks them.

    Parameters
    ----------
    reference:
        Group label whose pseudo error curves the others are aligned to (default: most images).
    hidden:
        Width of the MLP's hidden layer (default 2 d).
    epochs, batch_size, learning_rate:
        Adam settings (paper: 20, 4096, 1e-3).
    sampling:
        ``"balanced"`` (probability 1 / images of the group, the paper's) or ``"uniform"``.
    exact_limit, bins:
        Impostor pseudo-pairs per group up to which the curves are exact; above, a histogram of
        ``bins`` bins on [-1, 1].
    seed:
        Seeds the initialisation and the batches (CPU training is then reproducible).

    Fitted attributes: ``module_`` (the frozen :class:`FairnessModule`), ``groups_``,
    ``reference_`` (label), ``targets_`` (:class:`CentroidTargets`; it keeps the training
    embeddings and, for exact groups, 8 bytes per same-group pseudo-pair), ``centroids_`` (trained,
    unit rows, training-only), ``history_`` (per-epoch mean loss and its FAR and FRR terms),
    ``n_steps_`` and ``fit_seconds_``.
    """

    def __init__(self, reference=None, hidden: int | None = None, epochs: int = 20, batch_size: int = 4096,
                 learning_rate: float = 1e-3, sampling: str = "balanced", exact_limit: int = 10_000_000,
                 bins: int = 2 ** 20, seed: int = 0):
        self.reference = reference
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.sampling = sampling
        self.exact_limit = exact_limit
        self.bins = bins
        self.seed = seed

    def artifact_parameters(self) -> dict:
        """The constructor arguments, JSON-ready: what a module artifact's ``training`` provenance records."""
        params = {k: getattr(self, k) for k in ("reference", "hidden", "epochs", "batch_size", "learning_rate",
                                                  "sampling", "exact_limit", "bins", "seed")}
        if params["reference"] is not None:
            params["reference"] = str(params["reference"])
        return params

    def _check_params(self) -> None:
        for name in ("epochs", "batch_size", "exact_limit", "bins"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise RepairInputError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden is not None and (isinstance(self.hidden, bool) or not isinstance(self.hidden, (int, np.integer))
                                        or self.hidden < 1):
            raise RepairInputError(f"hidden must be a positive integer or None, got {self.hidden!r}")
        if not (isinstance(self.learning_rate, (int, float)) and 0 < self.learning_rate < np.inf):
            raise RepairInputError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.sampling not in _SAMPLING:
            raise RepairInputError(f"sampling must be one of {_SAMPLING}, got {self.sampling!r}")

    def fit(self, vectors, identities, groups) -> CentroidFairness:
        """Train on embeddings with per-vector identity and group labels (the group is per identity). Returns self."""
        self._check_params()
        start = time.perf_counter()
        X = as_2d(vectors)
        check_finite(X, [f"v{k}" for k in range(X.shape[1])])
        Z = l2_normalise(X)
        structure = IdentityStructure.of(identities, groups, Z.shape[0])
        codes = structure.group_codes()
        if structure.group_labels.size < 2:
            raise RepairInputError("Centroid Fairness needs at least two groups")
        self.groups_ = structure.group_labels
        reference = reference_code(self.reference, self.groups_, codes)
        self.reference_ = self.groups_[reference].item()
        mu0 = l2_normalise(pretrained_centroids(Z, structure.y, structure.n_identities))
        self.targets_ = CentroidTargets(Z, structure, mu0, reference, self.exact_limit, self.bins)
        weights, self.centroids_, self.history_, self.n_steps_ = _train(self, Z, structure, mu0)
        self.module_ = FairnessModule(*weights)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def transform(self, vectors) -> np.ndarray:
        """Apply the fitted module (numpy)."""
        if not hasattr(self, "module_"):
            raise RepairInputError("CentroidFairness is not fitted; call fit first")
        return self.module_.transform(vectors)


def _sampling_probabilities(codes: np.ndarray, sampling: str) -> np.ndarray:
    if sampling == "uniform":
        return np.full(codes.size, 1.0 / codes.size)
    p = 1.0 / np.bincount(codes)[codes]
    return p / p.sum()


def _train(est: CentroidFairness, Z: np.ndarray, structure: IdentityStructure, mu0: np.ndarray):
    """The Adam loop; returns the module weights (numpy), trained unit centroids, history and step count."""
    import torch

    n, d = Z.shape
    hidden = est.hidden or 2 * d
    codes = structure.group_codes()
    p = _sampling_probabilities(codes, est.sampling)
    rng = np.random.default_rng(est.seed)
    steps_per_epoch = -(-n // est.batch_size)
    Z32 = torch.from_numpy(Z.astype(np.float32))
    history = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(est.seed)
        first, last = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)
        torch.nn.init.zeros_(last.weight)
        torch.nn.init.zeros_(last.bias)
        centroids = torch.nn.Parameter(torch.from_numpy(mu0.astype(np.float32)))
        optimiser = torch.optim.Adam([*first.parameters(), *last.parameters(), centroids], lr=est.learning_rate)
        for _ in range(est.epochs):
            sums = np.zeros(3)
            for _ in range(steps_per_epoch):
                idx = rng.choice(n, size=est.batch_size, p=p)
                z = Z32[idx]
                out = torch.nn.functional.normalize(z + last(torch.relu(first(z))), dim=1)
                mu = torch.nn.functional.normalize(centroids, dim=1)
                scores, targets, weights, genuine = _batch_terms(out, mu, idx, codes, est.targets_)
                optimiser.zero_grad()
                loss = centroid_fairness_loss(scores, targets, weights, genuine)
                loss.backward()
                optimiser.step()
                with torch.no_grad():
                    sums += [loss.item(), centroid_fairness_loss(scores, targets, weights * ~genuine, genuine).item(),
                             centroid_fairness_loss(scores, targets, weights * genuine, genuine).item()]
            history.append(dict(zip(("loss", "far_term", "frr_term"), (sums / steps_per_epoch).tolist())))
    weights = [t.detach().numpy().astype(np.float64) for t in (first.weight, first.bias, last.weight, last.bias)]
    trained = l2_normalise(centroids.detach().numpy())
    return weights, trained, history, est.epochs * steps_per_epoch


def _batch_terms(out, mu, idx, codes, targets: CentroidTargets):
    """Flat (new scores, targets, weights, genuine) of the batch's same-group image/centroid pairs."""
    import torch

    batch_groups = codes[idx]
    parts = []
    for a in np.unique(batch_groups):
        rows = np.flatnonzero(batch_groups == a)
        t, w, genuine = targets.block(int(a), idx[rows])
        new = out[torch.from_numpy(rows)] @ mu[torch.from_numpy(targets.members[a])].T
        parts.append((new.reshape(-1), t.ravel(), w.ravel(), genuine.ravel()))
    scores = torch.cat([p[0] for p in parts])
    flat = (lambda k, dtype: torch.from_numpy(np.concatenate([p[k] for p in parts])).to(dtype))
    return scores, flat(1, torch.float32), flat(2, torch.float32), flat(3, torch.bool)


# --------------------------------------------------------------------------------------------
# Entry points for re-fit jobs
# --------------------------------------------------------------------------------------------


def fit_embedding_module(vectors, identities, groups, **params) -> FairnessModule:
    """Train a Fairness Module on (vectors, identity, group) and return it frozen (numpy, torch-free to apply).

    ``params`` are :class:`CentroidFairness` arguments. The module's ``to_artifact(training=...)``
    can record them (:meth:`CentroidFairness.artifact_parameters`); use :func:`validate_embedding_module` on
    held-out identities before publishing.
    """
    return CentroidFairness(**params).fit(vectors, identities, groups).module_


@dataclass(frozen=True, eq=False)
class ModuleComparison:
    """Verification rates of held-out identities at one target FAR, before (active) and after (candidate).

    Each side has its own global threshold at the target FAR (a module changes the score scale, so
    the threshold is re-calibrated with it). ``impostor_pairs`` and ``genuine_pairs`` say how many
    same-group pairs back the figures: below ~10 / far impostor pairs the threshold is noise.
    """

    far: float
    before: VerificationRates
    after: VerificationRates
    impostor_pairs: int
    genuine_pairs: int

    @property
    def bfar_reduction(self) -> float:
        """Relative BFAR reduction ``1 - after / before`` (positive is better)."""
        return 1.0 - self.after.bfar / self.before.bfar

    @property
    def bfrr_reduction(self) -> float:
        """Relative BFRR reduction ``1 - after / before`` (positive is better)."""
        return 1.0 - self.after.bfrr / self.before.bfrr

    @property
    def fnmr_change(self) -> float:
        """FNMR after minus before, as a fraction (0.01 is one point worse)."""
        return self.after.fnmr - self.before.fnmr

    def as_dict(self) -> dict:
        """JSON-ready summary (non-finite values become None), e.g. an artifact's metrics."""
        clean = (lambda x: float(x) if np.isfinite(x) else None)
        return {"far": self.far, "impostor_pairs": self.impostor_pairs, "genuine_pairs": self.genuine_pairs,
                "bfar_reduction": clean(self.bfar_reduction), "bfrr_reduction": clean(self.bfrr_reduction),
                "fnmr_change": clean(self.fnmr_change), "before": self.before.as_dict(), "after": self.after.as_dict()}


def validate_embedding_module(candidate: FairnessModule, vectors, identities, groups, far: float = 1e-4,
                              active: FairnessModule | None = None) -> ModuleComparison:
    """FNMR, BFAR and BFRR of all same-group pairs of held-out identities at ``far``, before and after.

    "Before" applies ``active`` (default: plain normalisation, i.e. the frozen encoder as is),
    "after" applies ``candidate``. The identities should not be ones the candidate was trained on.
    """
    base = active.transform if active is not None else l2_normalise
    results = []
    for transform in (base, candidate.transform):
        pairs = same_group_pair_scores(transform(vectors), identities, groups, max_far=far)
        results.append(pairs.rates_at_far(far))
    return ModuleComparison(far=float(far), before=results[0], after=results[1],
                            impostor_pairs=pairs.n_impostor, genuine_pairs=int(pairs.genuine.size))
