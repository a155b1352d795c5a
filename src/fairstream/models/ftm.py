"""The FTM and Reg fairness penalties for training a scorer in torch (training code: imports torch).

Fairness Through Matching (Kim, Kong, Lee, Chae, Park and Kim, TMLR 2024), eq. 7: per mini-batch,
with equal-size samples of every group,

    cross-entropy + lam * mean_i | f(x_i) - f(T(x_i)) |

where ``T`` is the exact OT assignment between the group's sample and the reference group's
sample (:func:`~fairstream.repair.group_maps.exact_matching`): the *marginal* map (cost
``||x - x'||^2`` on min-max scaled features) or the *joint* one (plus ``alpha |y - y'|``). The
assignment depends on the batch's inputs only, never on the model, so it is solved once per batch
outside autograd; a ``cache`` shared between fits on the same data (a lambda sweep) solves each
batch once. ``f(T(x))`` is the matched row's score in the same forward pass (``T(x)`` is a row of
the reference sample), so there is no third forward pass. With more than two groups the penalty
is the mean over the non-reference groups, each matched to the reference group (see
:mod:`fairstream.repair.group_maps`).

Reg (Donini et al. 2018; Chuang and Mroueh 2021, "GapReg"), the paper's baseline:
``cross-entropy + lam * DP^2`` with DP the gap in mean scores between a group and the reference.

Deviation from the paper, deliberate: ``s`` is not an input of the scorer (the paper appends it),
so a served scorer needs only the pipeline's features; pass ``s`` as a feature column to use it.

>>> from types import SimpleNamespace
>>> data = SimpleNamespace(Z=np.array([[0.0], [1.0], [0.9], [0.1]]), y=np.array([0, 1, 1, 0]), reference=1)
>>> penalty = MatchingPenalty().bind(data)   # group 0 = rows 0, 1; group 1 (reference) = rows 2, 3
>>> penalty.matching(np.array([0, 1]), np.array([2, 3])).tolist()  # 0.0 <-> 0.1, 1.0 <-> 0.9
[1, 0]
>>> proba = torch.tensor([0.2, 0.9, 0.7, 0.3])
>>> round(penalty(proba, np.arange(4), [np.array([0, 1]), np.array([2, 3])]).item(), 3)  # (|0.2-0.3| + |0.9-0.7|) / 2
0.15
>>> round(GapPenalty().bind(data)(proba, np.arange(4), [np.array([0, 1]), np.array([2, 3])]).item(), 4)  # (0.55-0.5)^2
0.0025
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from fairstream.repair.group_maps import exact_matching

__all__ = ["GapPenalty", "MatchingPenalty"]


class MatchingPenalty:
    """FTM's matched score gap on a batch of equal-size group blocks, with the marginal or joint map.

    ``cache``: a dict shared by fits on the same training data (batches are keyed by their rows).
    """

    sampling = "groups"
    convex = False  # cross-entropy + lam * penalty

    def __init__(self, map: str = "marginal", alpha: float = 100.0, cache: dict | None = None):
        self.map = map
        self.alpha = float(alpha) if map == "joint" else 0.0
        self.cache = {} if cache is None else cache

    def bind(self, data) -> MatchingPenalty:
        """Attach the training data (``data.Z``: min-max scaled features, ``data.y``, ``data.reference``)."""
        self.data = data
        return self

    def matching(self, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        """``perm``: row ``source[i]`` is matched with ``target[perm[i]]`` (exact OT, cached)."""
        key = hashlib.sha1(b"".join([source.tobytes(), target.tobytes(), str((self.map, self.alpha)).encode()]))
        key = key.hexdigest()
        perm = self.cache.get(key)
        if perm is None:
            Z, y = self.data.Z, self.data.y
            perm = exact_matching(Z[source], Z[target], y[source], y[target], self.alpha)
            self.cache[key] = perm
        return perm

    def __call__(self, proba: torch.Tensor, rows: np.ndarray, blocks: list) -> torch.Tensor:
        """Mean over non-reference groups of mean |f(x) - f(T(x))| in the batch."""
        ref = blocks[self.data.reference]
        gaps = []
        for k, block in enumerate(blocks):
            if k == self.data.reference or block is None:
                continue
            perm = torch.as_tensor(self.matching(rows[block], rows[ref]))
            gaps.append((proba[block] - proba[ref][perm]).abs().mean())
        return torch.stack(gaps).mean()


class GapPenalty:
    """Reg: the squared gap in mean scores between each group and the reference group, averaged."""

    sampling = "groups"
    convex = False

    def bind(self, data) -> GapPenalty:
        """Attach the training data (only ``data.reference`` is read)."""
        self.data = data
        return self

    def __call__(self, proba: torch.Tensor, rows: np.ndarray, blocks: list) -> torch.Tensor:
        """Mean over non-reference groups of (mean f in the group - mean f in the reference group)^2."""
        ref = proba[blocks[self.data.reference]].mean()
        gaps = [(proba[block].mean() - ref) ** 2 for k, block in enumerate(blocks)
                if k != self.data.reference and block is not None]
        return torch.stack(gaps).mean()
