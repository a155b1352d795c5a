"""Centroid Fairness regression targets and weights, in numpy (no torch).

From Conti and Clémençon, "Mitigating Bias in Facial Recognition Systems: Centroid Fairness Loss
Optimization" (2024). Real pair scores are replaced by *pseudo-scores* between each normalised
training embedding ``z_i`` and each identity centroid ``mu_k`` (the mean of the identity's
normalised embeddings): genuine when ``k`` is the image's identity, impostor otherwise, and only
pairs whose image and centroid share a group count. Per group ``a`` these give pseudo error curves
``FRR_a`` (genuine) and ``FAR_a`` (impostor). Each pre-trained pseudo-score ``s`` of group ``a`` gets
a fixed target on the reference group's scale (quantile matching) and a weight:

    genuine:  T = FRR_r^{-1}(FRR_a(s)),  w = 1 / (|G_a| FRR_a(s))
    impostor: T = FAR_r^{-1}(FAR_a(s)),  w = 1 / (|I_a| FAR_a(s))

Gaps the paper leaves open, and the choices made here:

- **ranks and ties**: ``FRR_a(s) = #{s' <= s} / n`` and ``FAR_a(s) = #{s' > s} / n`` (the paper's
  strict accept rule); tied scores share a target. The top impostor has ``FAR_a = 0``; it is
  clipped to ``1 / |I_a|``, so the largest weight of every group is exactly 1 as the paper intends.
  Index arithmetic is exact integer arithmetic (float ``ceil`` is off by one often enough to break
  the identity map of the reference group), and the curves are float64.
- **impostor pairs at scale**: ``|I_a| ~ N_a K_a`` pseudo-pairs (10^10 on a real training set) are
  scored in blocks. Up to ``exact_limit`` pairs per group the curve is exact and every pair's
  target and weight is kept (two float32 matrices, 8 bytes a pair); above it the curve is a fine
  histogram (``bins`` on [-1, 1], int64 counts) and targets and weights are one lookup per bin,
  so memory is fixed, a batch's pre-trained scores are recomputed, and targets are exact up to
  one bin width (2e-6 by default).

>>> import numpy as np
>>> from fairstream.repair.measure.verification import ScoreCurve
>>> source, reference = ScoreCurve.from_scores([0.1, 0.2, 0.3, 0.4]), ScoreCurve.from_scores([0.5, 0.6])
>>> frr_matching(source, reference, [0.1, 0.2, 0.3, 0.4]).tolist()
[0.5, 0.5, 0.6, 0.6]
>>> frr_weights(source, [0.1, 0.4]).tolist()
[1.0, 0.25]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairstream.repair.estimator import Estimator
from fairstream.repair.measure.verification import ScoreCurve, l2_normalise
from fairstream.repair.validation import RepairInputError, as_labels, normalise_labels

__all__ = [
    "CentroidTargets",
    "GroupQuantileScoreNormaliser",
    "IdentityStructure",
    "far_matching",
    "far_weights",
    "frr_matching",
    "frr_weights",
    "pretrained_centroids",
    "pseudo_score_block",
    "pseudo_score_block_rows",
]

_BLOCK_ROWS = 2048


# --------------------------------------------------------------------------------------------
# Quantile matching with exact integer ranks
# --------------------------------------------------------------------------------------------


def _scaled(m, num: int, den: int, ceil: bool) -> np.ndarray:
    """``ceil`` or ``floor`` of ``m * num / den`` exactly, for counts ``m`` >= 0.

    int64 when the product fits, Python integers otherwise (histogram curves of 10^10 pairs).
    """
    m = np.asarray(m, dtype=np.int64)
    extra = den - 1 if ceil else 0
    if int(m.max(initial=0)) * num + extra < 2 ** 63:
        return (m * num + extra) // den
    return np.array([(int(x) * num + extra) // den for x in m.ravel()], dtype=np.int64).reshape(m.shape)


def frr_matching(source: ScoreCurve, reference: ScoreCurve, scores) -> np.ndarray:
    """``FRR_ref^{-1}(FRR_src(s))`` for each score: the reference score at the same genuine error level."""
    m = np.asarray(source.count_le(np.asarray(scores, dtype=np.float64)), dtype=np.int64)
    # inf{t : C_r(t) / n_r >= m / n_s}  <=>  C_r(t) >= ceil(m * n_r / n_s)
    return reference._value_reaching(_scaled(m, reference.n, source.n, ceil=True))


def far_matching(source: ScoreCurve, reference: ScoreCurve, scores) -> np.ndarray:
    """``FAR_ref^{-1}(FAR_src(s))`` for each score: the reference score at the same impostor error level."""
    above = source.n - np.asarray(source.count_le(np.asarray(scores, dtype=np.float64)), dtype=np.int64)
    # inf{t : n_r - C_r(t) <= above * n_r / n_s}  <=>  C_r(t) >= n_r - floor(above * n_r / n_s)
    return reference._value_reaching(reference.n - _scaled(above, reference.n, source.n, ceil=False))


def frr_weights(source: ScoreCurve, scores) -> np.ndarray:
    """``1 / (n FRR_src(s)) = 1 / #{s' <= s}`` (at most 1; a score below the curve counts as rank 1)."""
    return 1.0 / np.maximum(np.asarray(source.count_le(np.asarray(scores, dtype=np.float64))), 1)


def far_weights(source: ScoreCurve, scores) -> np.ndarray:
    """``1 / (n FAR_src(s)) = 1 / #{s' > s}``, with the count clipped at 1 so the top impostor weighs 1."""
    above = source.n - np.asarray(source.count_le(np.asarray(scores, dtype=np.float64)))
    return 1.0 / np.maximum(above, 1)


# --------------------------------------------------------------------------------------------
# Identities, centroids and pseudo-score curves
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class IdentityStructure:
    """Identity codes ``y`` (0..K-1) of each vector, and each identity's group code ``identity_group``."""

    y: np.ndarray
    identity_group: np.ndarray
    identity_labels: np.ndarray
    group_labels: np.ndarray

    @classmethod
    def of(cls, identities, groups, n_rows: int) -> IdentityStructure:
        """Encode per-vector identity and group labels; an identity in two groups is an error."""
        ids = normalise_labels(as_labels(identities, n_rows, "identities"))
        grp = normalise_labels(as_labels(groups, n_rows, "groups"))
        id_labels, y = np.unique(ids, return_inverse=True)
        group_labels, g = np.unique(grp, return_inverse=True)
        identity_group = np.full(id_labels.size, -1, dtype=np.intp)
        identity_group[y] = g
        if np.any(identity_group[y] != g):
            bad = int(np.flatnonzero(identity_group[y] != g)[0])
            raise RepairInputError(f"identity {ids[bad]!r} appears in more than one group; the group must be "
                                   "per identity")
        return cls(y.astype(np.intp), identity_group, id_labels, group_labels)

    @property
    def n_identities(self) -> int:
        """Number of distinct identities K."""
        return int(self.identity_labels.size)

    def group_codes(self) -> np.ndarray:
        """Group code of every vector."""
        return self.identity_group[self.y]


def pretrained_centroids(Z: np.ndarray, y: np.ndarray, n_identities: int) -> np.ndarray:
    """Mean of each identity's L2-normalised embeddings (not re-normalised; cosine ignores the norm).

    >>> pretrained_centroids(np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]), np.array([0, 0, 1]), 2).tolist()
    [[0.5, 0.5], [0.0, 1.0]]
    """
    sums = np.zeros((n_identities, Z.shape[1]))
    np.add.at(sums, y, Z)
    counts = np.bincount(y, minlength=n_identities)
    if np.any(counts == 0):
        raise RepairInputError("every identity needs at least one embedding")
    return sums / counts[:, None]


def pseudo_score_block(Z_rows: np.ndarray, centroids_unit: np.ndarray) -> np.ndarray:
    """Cosine pseudo-scores of unit rows against unit centroids, float64 (one code path for curves and training)."""
    return Z_rows @ centroids_unit.T


def _bin(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    n = edges.size - 1
    return np.clip(((scores - edges[0]) / (edges[-1] - edges[0]) * n).astype(np.intp), 0, n - 1)


@dataclass(frozen=True, eq=False)
class _GroupImpostors:
    """One group's impostor pseudo-pairs: their curve and how to get targets and weights of a block.

    Exact groups keep dense (images x centroids) target and weight matrices (float32; the
    own-identity entries are unused). Binned groups keep one target and weight per bin and look
    blocks up by recomputing their pre-trained scores.
    """

    curve: ScoreCurve
    targets: np.ndarray  # (n_a, K_a) when exact, else (bins,)
    weights: np.ndarray
    edges: np.ndarray | None  # None when exact


class CentroidTargets:
    """Fixed Centroid Fairness targets and weights of every same-group image/centroid pseudo-pair.

    Built once from the normalised training embeddings ``Z``, the unit pre-trained centroids and
    the reference group's code; :meth:`block` then gives the targets, weights and own-identity mask
    of a batch's images against their group's centroids. ``curves`` holds each group's
    (genuine, impostor) pseudo-score curves.
    """

    def __init__(self, Z: np.ndarray, structure: IdentityStructure, centroids_unit: np.ndarray, reference: int,
                 exact_limit: int = 10_000_000, bins: int = 2 ** 20):
        n_groups = structure.group_labels.size
        if not 0 <= reference < n_groups:
            raise RepairInputError(f"reference group code {reference} is not one of the {n_groups} groups")
        self.Z, self.structure, self.centroids_unit, self.reference = Z, structure, centroids_unit, reference
        codes = structure.group_codes()
        self.members = [np.flatnonzero(structure.identity_group == a) for a in range(n_groups)]
        self.images = [np.flatnonzero(codes == a) for a in range(n_groups)]
        for a, cols in enumerate(self.members):
            if cols.size < 2:
                raise RepairInputError(f"group {structure.group_labels[a]!r} has {cols.size} identity; impostor "
                                       "pseudo-pairs need at least two")
        self.position = np.empty(codes.size, dtype=np.intp)  # row of each image within its group
        self.column = np.empty(structure.n_identities, dtype=np.intp)  # column of each identity in its group
        for a in range(n_groups):
            self.position[self.images[a]] = np.arange(self.images[a].size)
            self.column[self.members[a]] = np.arange(self.members[a].size)
        own = pseudo_score_block_rows(Z, centroids_unit, structure.y)
        genuine_curves = [ScoreCurve.from_scores(own[rows]) for rows in self.images]
        # The reference group first: every other group's targets are read off its impostor curve.
        self.impostors: list = [None] * n_groups
        for a in [reference, *(g for g in range(n_groups) if g != reference)]:
            self.impostors[a] = self._impostors(a, exact_limit, bins)
        self.curves = [(g, i.curve) for g, i in zip(genuine_curves, self.impostors)]
        gen_r = self.curves[reference][0]
        self.genuine_targets = np.empty(codes.size)
        self.genuine_weights = np.empty(codes.size)
        for a, rows in enumerate(self.images):
            self.genuine_targets[rows] = frr_matching(genuine_curves[a], gen_r, own[rows])
            self.genuine_weights[rows] = frr_weights(genuine_curves[a], own[rows])

    def _blocks(self, a: int):
        """(image rows, scores, own-identity mask) of group ``a``'s pseudo-pairs, a block of images at a time."""
        rows, cols = self.images[a], self.members[a]
        for start in range(0, rows.size, _BLOCK_ROWS):
            r = rows[start:start + _BLOCK_ROWS]
            own = np.zeros((r.size, cols.size), dtype=bool)
            own[np.arange(r.size), self.column[self.structure.y[r]]] = True
            yield r, pseudo_score_block(self.Z[r], self.centroids_unit[cols]), own

    def _impostors(self, a: int, exact_limit: int, bins: int) -> _GroupImpostors:
        n_pairs = self.images[a].size * (self.members[a].size - 1)
        return self._exact_impostors(a) if n_pairs <= exact_limit else self._binned_impostors(a, bins)

    def _exact_impostors(self, a: int) -> _GroupImpostors:
        blocks = list(self._blocks(a))
        scores = np.concatenate([s[~own] for _, s, own in blocks])
        values, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
        curve = ScoreCurve(values, np.cumsum(counts))
        reference = self._reference_impostor_curve(a, curve)
        shape = (self.images[a].size, self.members[a].size)
        targets, weights = np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.float32)
        mask = np.concatenate([~own for _, _, own in blocks])
        targets[mask] = far_matching(curve, reference, values)[inverse]
        weights[mask] = far_weights(curve, values)[inverse]
        return _GroupImpostors(curve, targets, weights, None)

    def _binned_impostors(self, a: int, bins: int) -> _GroupImpostors:
        edges = np.linspace(-1.0, 1.0, bins + 1)
        hist = np.zeros(bins, dtype=np.int64)
        for _, s, own in self._blocks(a):
            hist += np.bincount(_bin(s[~own], edges), minlength=bins)
        curve = ScoreCurve.from_histogram(edges, hist)
        reference = self._reference_impostor_curve(a, curve)
        left = edges[:-1]  # every score of a bin stands at its left edge
        return _GroupImpostors(curve, far_matching(curve, reference, left).astype(np.float32),
                               far_weights(curve, left).astype(np.float32), edges)

    def _reference_impostor_curve(self, a: int, own_curve: ScoreCurve) -> ScoreCurve:
        return own_curve if a == self.reference else self.impostors[self.reference].curve

    def block(self, a: int, images: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Targets, weights and own-identity mask of ``images`` (all of group ``a``) against the group's centroids."""
        cols = self.members[a]
        genuine = self.structure.y[images][:, None] == cols[None, :]
        imp = self.impostors[a]
        if imp.edges is None:
            targets, weights = imp.targets[self.position[images]], imp.weights[self.position[images]]
        else:
            b = _bin(pseudo_score_block(self.Z[images], self.centroids_unit[cols]), imp.edges)
            targets, weights = imp.targets[b], imp.weights[b]
        r, c = np.nonzero(genuine)
        targets[r, c] = self.genuine_targets[images[r]]
        weights[r, c] = self.genuine_weights[images[r]]
        return targets, weights, genuine

    def weight_sums(self) -> np.ndarray:
        """Total (genuine, impostor) weight of each group over all its pseudo-pairs, shape (n_groups, 2)."""
        return np.array([[self.genuine_weights[rows].sum(), _impostor_weight_sum(imp)]
                         for rows, imp in zip(self.images, self.impostors)])


def _impostor_weight_sum(imp: _GroupImpostors) -> float:
    if imp.edges is None:
        return float(imp.weights.sum(dtype=np.float64))
    counts = np.diff(imp.curve.cumulative, prepend=0)
    at = _bin(imp.curve.values, imp.edges)
    return float(np.sum(counts * imp.weights[at]))


def pseudo_score_block_rows(Z: np.ndarray, centroids_unit: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each image's genuine pseudo-score ``cos(z_i, mu_{y_i})``."""
    return np.einsum("ij,ij->i", Z, centroids_unit[y])


# --------------------------------------------------------------------------------------------
# Score-level baseline: per-group quantile normalisation of pair scores
# --------------------------------------------------------------------------------------------


class GroupQuantileScoreNormaliser(Estimator):
    """Score-level baseline: map each group's pair scores onto the reference group's impostor quantiles.

    ``fit`` builds every group's impostor-score curve from the same-group pairs of a labelled set;
    ``transform_scores(scores, group)`` returns ``FAR_r^{-1}(FAR_a(s))``, which aligns the groups'
    FAR curves (the false-accept side, as score normalisation methods do). Unlike the embedding
    module, it needs each pair's group at test time. ``get_params``, ``set_params``, ``sklearn.base.clone``
    and the repr follow scikit-learn; ``fit(vectors, identities, groups)`` takes identities and groups.
    """

    def __init__(self, reference=None, bins: int = 2 ** 18):
        self.reference = reference
        self.bins = bins

    def fit(self, vectors, identities, groups) -> GroupQuantileScoreNormaliser:
        """Impostor curves per group from all same-group pairs of the fit set (binned). Returns self."""
        from fairstream.repair.measure.verification import group_pair_blocks

        Z = l2_normalise(vectors)
        structure = IdentityStructure.of(identities, groups, Z.shape[0])
        codes = structure.group_codes()
        self.groups_ = structure.group_labels
        self.reference_ = reference_code(self.reference, self.groups_, codes)
        edges = np.linspace(-1.0, 1.0, self.bins + 1)
        self.curves_ = []
        for a in range(self.groups_.size):
            rows = np.flatnonzero(codes == a)
            hist = np.zeros(self.bins, dtype=np.int64)
            for _, imp in group_pair_blocks(Z[rows], structure.y[rows], 1024):
                hist += np.bincount(_bin(imp, edges), minlength=self.bins)
            self.curves_.append(ScoreCurve.from_histogram(edges, hist))
        return self

    def transform_scores(self, scores, group: int) -> np.ndarray:
        """Scores of pairs of group code ``group`` on the reference group's impostor scale."""
        return far_matching(self.curves_[group], self.curves_[self.reference_], scores)


def reference_code(reference, group_labels: np.ndarray, codes: np.ndarray) -> int:
    """Code of the reference group; by default the one with the most vectors (as in the paper)."""
    if reference is None:
        return int(np.argmax(np.bincount(codes, minlength=group_labels.size)))
    found = np.flatnonzero(group_labels.astype(str) == str(reference))
    if found.size != 1:
        raise RepairInputError(f"reference group {reference!r} is not among the groups {group_labels.tolist()}")
    return int(found[0])
