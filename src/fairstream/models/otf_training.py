"""The OTF regulariser and the norm-penalty baseline for training a scorer in torch (training code).

Buyl and De Bie, "Optimal Transport of Classifiers to Fairness" (NeurIPS 2022), eq. 13: minimise

    (1 - lam) * cross-entropy + lam * OTF0_eps(h)

on each mini-batch, ``h`` the batch's scores. :class:`OTF0Loss` is a torch autograd function whose
forward pass solves the duals in numpy (:func:`fairstream.repair.measure.otf.otf0`: L-BFGS on the
semi-dual, converged, not the authors' truncated two sweeps) and whose backward pass returns the
envelope-theorem gradient. Each batch is solved from zero duals: warm-starting from the previous
*random* batch saved no iterations on Adult (``benchmarks/scorer_training_cost.py``); a caller whose
batches overlap (a sliding window) can pass a ``state`` dict to carry them. The cost matrix is
the Euclidean distance between the batch's standardised features divided by the batch's largest
(as the authors' code), the value is per record (see :mod:`fairstream.repair.measure.otf` for the
normalisation), and the *penalty* is that value divided by ``eps``, as the authors' code divides its
loss by eps for eps <= 0.01 (it multiplies by a further 100, compensating its truncated duals, whose
gradients are about 1.5 % of the converged ones). Without the 1/eps the converged OTF0 gradient on
Adult (batch 256, eps 1e-3) is about 100 times smaller than the norm penalty's, so no alpha in the
paper's grid would move the model. ``lam`` is the paper's alpha; its values are still not
comparable with the authors' code.

The baseline ("Norm", Buyl and De Bie's comparison, after Kamishima et al. 2011 and Zafar et al.
2019): ``(1 - lam) * cross-entropy + lam * ||G h||_1``, the L1 norm of the same constraint vector
(per group, the gap between its mean score and its cell's), which ignores the features.
"""

from __future__ import annotations

import numpy as np
import torch

from fairstream.repair.measure.otf import constraint_matrix, cost_matrix, otf0

__all__ = ["NormPenalty", "OTF0Loss", "OTFPenalty", "otf0_loss"]


class OTF0Loss(torch.autograd.Function):
    """``OTF0_eps(h)`` per record for a cost ``C`` and constraints ``G``; backward: its exact gradient.

    ``state`` (optional dict): ``tol`` for the solver; the duals ``mu``/``nu`` to start from, replaced by
    the solution's (a warm start for the next call).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, C: np.ndarray, G: np.ndarray, eps: float, state: dict | None):
        """Solve the duals (from ``state``'s, updated) and return the value."""
        state = {} if state is None else state
        result = otf0(h.detach().double().cpu().numpy(), C, G, eps=eps, mu0=state.get("mu"), nu0=state.get("nu"),
                      tol=state.get("tol", 1e-9))
        state.update(mu=result.mu, nu=result.nu, n_iter=result.n_iter)
        ctx.save_for_backward(torch.as_tensor(result.gradient, dtype=h.dtype, device=h.device))
        return h.new_tensor(result.value)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        """The envelope-theorem gradient, scaled by the incoming gradient."""
        (gradient,) = ctx.saved_tensors
        return grad * gradient, None, None, None, None


def otf0_loss(h: torch.Tensor, C: np.ndarray, G: np.ndarray, eps: float = 1e-3, state: dict | None = None) -> torch.Tensor:
    """Differentiable OTF0 of the scores ``h`` (a 1-D tensor in (0, 1]).

    >>> import numpy as np
    >>> C = np.array([[0.0, 1.0], [1.0, 0.0]]); G = np.array([[1.0, -1.0]])
    >>> h = torch.tensor([0.8, 0.2], dtype=torch.float64, requires_grad=True)
    >>> loss = otf0_loss(h, C, G, eps=0.1); loss.backward()
    >>> loss.item() > 0, bool(h.grad[0] > 0 > h.grad[1])  # lowering the high score, raising the low one helps
    (True, True)
    """
    return OTF0Loss.apply(h, C, G, float(eps), state)


class OTFPenalty:
    """OTF0 / eps of each random mini-batch's scores: features standardised, sensitive columns stacked."""

    sampling = "random"
    convex = True  # (1 - lam) * cross-entropy + lam * penalty

    def __init__(self, notion: str = "dp", eps: float = 1e-3, cost_scale: float | None = None, tol: float = 1e-9):
        self.notion, self.eps, self.cost_scale, self.tol = notion, float(eps), cost_scale, float(tol)

    def bind(self, data) -> OTFPenalty:
        """Attach the training data (``data.standardised`` features, sensitive columns ``data.S``, labels ``data.y``)."""
        self.data = data
        return self

    def __call__(self, proba: torch.Tensor, rows: np.ndarray, blocks) -> torch.Tensor:
        """OTF0 / eps of the batch (0 when no constraint is measurable in it)."""
        G = constraint_matrix(self.data.S[rows], self.data.y[rows], self.notion)
        if len(G) == 0:
            return proba.sum() * 0.0
        C = cost_matrix(self.data.standardised[rows], self.cost_scale)
        return otf0_loss(proba.double(), C, G, self.eps, {"tol": self.tol}).to(proba.dtype) / self.eps


class NormPenalty:
    """The L1 norm of the constraint vector ``G h`` of each random mini-batch."""

    sampling = "random"
    convex = True

    def __init__(self, notion: str = "dp"):
        self.notion = notion

    def bind(self, data) -> NormPenalty:
        """Attach the training data (sensitive columns ``data.S``, labels ``data.y``)."""
        self.data = data
        return self

    def __call__(self, proba: torch.Tensor, rows: np.ndarray, blocks) -> torch.Tensor:
        """``||G h||_1`` of the batch."""
        G = torch.as_tensor(constraint_matrix(self.data.S[rows], self.data.y[rows], self.notion), dtype=proba.dtype)
        return (G @ proba).abs().sum()
