"""Fairness losses on classifier scores, in torch: the sharp Sinkhorn divergence as an autograd function.

Training code only (imports torch). The numbers come from :mod:`fairstream.models.score_transport`
(numpy): the forward pass solves the entropic OT dual, the backward pass returns the closed-form
score gradients of Huang, Tang and Chang (2025), Theorem 1, so no Sinkhorn iteration is unrolled.
:func:`fairness_loss` builds the loss of a fairness notion from per-row scores:

- ``"dp"`` (demographic parity): the divergence between the groups' score distributions;
- ``"eopp"`` (equal opportunity): the same among rows with ``y = 1``;
- ``"eo"`` (equalized odds): the sum of the ``y = 1`` and ``y = 0`` terms.

With more than two groups the loss is the mean over pairs of groups. ``divergence="exact"`` uses
the exact squared 2-Wasserstein distance (1-D, by sorting) instead of the sharp Sinkhorn value.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import torch

from fairstream.repair.validation import RepairInputError

from .score_transport import coupling_path, probability_weights, sharp_sinkhorn

__all__ = ["DIVERGENCES", "NOTIONS", "SharpSinkhornLoss", "fairness_loss", "sharp_sinkhorn_loss", "wasserstein2_loss"]

NOTIONS = ("dp", "eopp", "eo")
DIVERGENCES = ("sinkhorn", "exact")


class SharpSinkhornLoss(torch.autograd.Function):
    """``S_eps(r0, r1) = <P*, M>`` with the Theorem 1 gradients ``C0``, ``C1`` as its backward pass."""

    @staticmethod
    def forward(ctx, r0: torch.Tensor, r1: torch.Tensor, eps: float, a, b):
        """The sharp Sinkhorn cost between the two groups' scores (one scalar)."""
        needs = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        result = sharp_sinkhorn(r0.detach().double().cpu().numpy(), r1.detach().double().cpu().numpy(),
                                eps=eps, a=a, b=b, gradient=needs)
        if needs:
            ctx.save_for_backward(torch.as_tensor(result.grad_r0, dtype=r0.dtype, device=r0.device),
                                  torch.as_tensor(result.grad_r1, dtype=r1.dtype, device=r1.device))
        return r0.new_tensor(result.value)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        """The closed-form gradients of Theorem 1, scaled by the incoming gradient."""
        grad_r0, grad_r1 = ctx.saved_tensors
        return grad * grad_r0, grad * grad_r1, None, None, None


def sharp_sinkhorn_loss(r0: torch.Tensor, r1: torch.Tensor, eps: float = 200.0, a=None, b=None) -> torch.Tensor:
    """Differentiable sharp Sinkhorn value between two 1-D score tensors (``eps``: inverse regularisation)."""
    return SharpSinkhornLoss.apply(r0, r1, float(eps), a, b)


def wasserstein2_loss(r0: torch.Tensor, r1: torch.Tensor, a=None, b=None) -> torch.Tensor:
    """Exact squared 2-Wasserstein distance between 1-D score tensors, differentiable almost everywhere.

    The monotone coupling is found on detached values; the gradient flows through the matched scores.
    """
    x, y = r0.detach().double().cpu().numpy(), r1.detach().double().cpu().numpy()
    widths, i, j = coupling_path(x, y, probability_weights(a, len(x), "a"), probability_weights(b, len(y), "b"))
    widths = torch.as_tensor(widths, dtype=r0.dtype, device=r0.device)
    return torch.sum(widths * (r0[torch.as_tensor(i)] - r1[torch.as_tensor(j)]) ** 2)


def fairness_loss(scores: torch.Tensor, groups, y, notion: str = "dp", divergence: str = "sinkhorn",
                  eps: float = 200.0) -> torch.Tensor:
    """The fairness term of ``notion`` for per-row ``scores`` (in [0, 1]), group codes and labels ``y``.

    >>> scores = torch.tensor([0.2, 0.4, 0.6, 0.8], dtype=torch.float64, requires_grad=True)
    >>> loss = fairness_loss(scores, groups=[0, 0, 1, 1], y=[0, 1, 0, 1], divergence="exact")
    >>> round(loss.item(), 4)
    0.16
    """
    if notion not in NOTIONS:
        raise RepairInputError(f"notion must be one of {NOTIONS}, got {notion!r}")
    if divergence not in DIVERGENCES:
        raise RepairInputError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    groups, y = np.asarray(groups), np.asarray(y)
    labels = {"dp": [None], "eopp": [1], "eo": [1, 0]}[notion]
    total = scores.new_zeros(())
    for label in labels:
        rows = np.ones(len(groups), dtype=bool) if label is None else y == label
        present = np.unique(groups[rows])
        pairs = list(combinations(present, 2))
        if not pairs:
            raise RepairInputError(f"the {notion!r} loss needs two groups with rows"
                                   + ("" if label is None else f" where y = {label}") + f"; found {present.tolist()}")
        for g, h in pairs:
            r0 = scores[torch.as_tensor(np.flatnonzero(rows & (groups == g)))]
            r1 = scores[torch.as_tensor(np.flatnonzero(rows & (groups == h)))]
            term = sharp_sinkhorn_loss(r0, r1, eps) if divergence == "sinkhorn" else wasserstein2_loss(r0, r1)
            total = total + term / len(pairs)
    return total
