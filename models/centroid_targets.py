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
  streamed in blocks. Up to ``exact_limit`` pairs per group their sorted scores are kept (exact);
  above it the curve is a fine histogram (``bins`` on [-1, 1], int64 counts), so memory is fixed
  and targets are exact up to one bin width.

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

from fairstream.repair._validation import RepairInputError, as_labels, normalise_labels
from fairstream.repair.measure.verification import ScoreCurve, l2_normalise

__all__ = [
    "CentroidTargets",
    "GroupQuantileScoreNormaliser",
    "IdentityStructure",
    "far_matching",
    "far_weights",
    "frr_matching",
    "frr_weights",
    "pretrained_centroids",
    "pseudo_score_curves",
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
    def of(cls, identities, groups, n_rows: int) -> "IdentityStructure":
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


def pseudo_score_curves(Z: np.ndarray, structure: IdentityStructure, centroids_unit: np.ndarray,
                        exact_limit: int = 20_000_000, bins: int = 2 ** 20) -> list[tuple[ScoreCurve, ScoreCurve]]:
    """Per group: the (genuine, impostor) pseudo-score curves of same-group image/centroid pairs."""
    groups = structure.group_codes()
    curves = []
    for a in range(structure.group_labels.size):
        rows = np.flatnonzero(groups == a)
        cols = np.flatnonzero(structure.identity_group == a)
        if cols.size < 2:
            raise RepairInputError(f"group {structure.group_labels[a]!r} has {cols.size} identity; "
                                   "impostor pseudo-pairs need at least two")
        col_of = np.full(structure.identity_labels.size, -1)
        col_of[cols] = np.arange(cols.size)
        exact = rows.size * (cols.size - 1) <= exact_limit
        edges = np.linspace(-1.0, 1.0, bins + 1)
        genuine, impostor, hist = [], [], np.zeros(bins, dtype=np.int64)
        for start in range(0, rows.size, _BLOCK_ROWS):
            r = rows[start:start + _BLOCK_ROWS]
            block = pseudo_score_block(Z[r], centroids_unit[cols])
            own = np.zeros(block.shape, dtype=bool)
            own[np.arange(r.size), col_of[structure.y[r]]] = True
            genuine.append(block[own])
            if exact:
                impostor.append(block[~own])
            else:
                hist += np.bincount(_bin(block[~own], edges), minlength=bins)
        imp = ScoreCurve.from_scores(np.concatenate(impostor)) if exact else ScoreCurve.from_histogram(edges, hist)
        curves.append((ScoreCurve.from_scores(np.concatenate(genuine)), imp))
    return curves


def _bin(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    n = edges.size - 1
    return np.clip(((scores + 1.0) / 2.0 * n).astype(np.intp), 0, n - 1)


# --------------------------------------------------------------------------------------------
# Lookup tables used during training
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Table:
    """Target and weight at every distinct value of one group's curve."""

    values: np.ndarray
    targets: np.ndarray
    weights: np.ndarray

    def lookup(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The block products of training can differ from the curve's in the last bit; the nearest
        # value at or below the score is the same rank up to such rounding.
        j = np.clip(np.searchsorted(self.values, scores, side="right") - 1, 0, self.values.size - 1)
        return self.targets[j], self.weights[j]


class CentroidTargets:
    """Fixed Centroid Fairness targets and weights of every group's pseudo-scores, as lookup tables.

    Built once from the pre-trained pseudo-score curves and the reference group; during training
    :meth:`lookup` maps a block of pre-trained pseudo-scores to (targets, weights) by binary search.
    """

    def __init__(self, curves: list[tuple[ScoreCurve, ScoreCurve]], reference: int):
        if not 0 <= reference < len(curves):
            raise RepairInputError(f"reference group code {reference} is not one of the {len(curves)} groups")
        self.curves = curves
        self.reference = reference
        gen_r, imp_r = curves[reference]
        self.genuine_tables = [_Table(g.values, frr_matching(g, gen_r, g.values), frr_weights(g, g.values))
                               for g, _ in curves]
        self.impostor_tables = [_Table(i.values, far_matching(i, imp_r, i.values), far_weights(i, i.values))
                                for _, i in curves]

    def lookup(self, group: int, scores: np.ndarray, genuine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Targets and weights for pre-trained pseudo-scores of group ``group`` (``genuine`` marks own-identity pairs)."""
        targets, weights = np.empty(scores.shape), np.empty(scores.shape)
        targets[genuine], weights[genuine] = self.genuine_tables[group].lookup(scores[genuine])
        targets[~genuine], weights[~genuine] = self.impostor_tables[group].lookup(scores[~genuine])
        return targets, weights

    def weight_sums(self) -> np.ndarray:
        """Total (genuine, impostor) weight of each group over all its pseudo-pairs, shape (n_groups, 2)."""
        return np.array([[_total_weight(g, t) for g, t in ((gen, tg), (imp, ti))]
                         for (gen, imp), tg, ti in zip(self.curves, self.genuine_tables, self.impostor_tables)])


def _total_weight(curve: ScoreCurve, table: _Table) -> float:
    counts = np.diff(curve.cumulative, prepend=0)
    return float(np.sum(counts * table.weights))


# --------------------------------------------------------------------------------------------
# Score-level baseline: per-group quantile normalisation of pair scores
# --------------------------------------------------------------------------------------------


class GroupQuantileScoreNormaliser:
    """Score-level baseline: map each group's pair scores onto the reference group's impostor quantiles.

    ``fit`` builds every group's impostor-score curve from the same-group pairs of a labelled set;
    ``transform_scores(scores, group)`` returns ``FAR_r^{-1}(FAR_a(s))``, which aligns the groups'
    FAR curves (the false-accept side, as score normalisation methods do). Unlike the embedding
    module, it needs each pair's group at test time.
    """

    def __init__(self, reference=None, bins: int = 2 ** 18):
        self.reference = reference
        self.bins = bins

    def fit(self, vectors, identities, groups) -> "GroupQuantileScoreNormaliser":
        """Impostor curves per group from all same-group pairs of the fit set (binned)."""
        from fairstream.repair.measure.verification import _group_pair_blocks

        Z = l2_normalise(vectors)
        structure = IdentityStructure.of(identities, groups, Z.shape[0])
        codes = structure.group_codes()
        self.groups_ = structure.group_labels
        self.reference_ = _reference_code(self.reference, self.groups_, codes)
        edges = np.linspace(-1.0, 1.0, self.bins + 1)
        self.curves_ = []
        for a in range(self.groups_.size):
            rows = np.flatnonzero(codes == a)
            hist = np.zeros(self.bins, dtype=np.int64)
            for _, imp in _group_pair_blocks(Z[rows], structure.y[rows], 1024):
                hist += np.bincount(_bin(imp, edges), minlength=self.bins)
            self.curves_.append(ScoreCurve.from_histogram(edges, hist))
        return self

    def transform_scores(self, scores, group: int) -> np.ndarray:
        """Scores of pairs of group code ``group`` on the reference group's impostor scale."""
        return far_matching(self.curves_[group], self.curves_[self.reference_], scores)


def _reference_code(reference, group_labels: np.ndarray, codes: np.ndarray) -> int:
    """Code of the reference group; by default the one with the most vectors (as in the paper)."""
    if reference is None:
        return int(np.argmax(np.bincount(codes, minlength=group_labels.size)))
    found = np.flatnonzero(group_labels.astype(str) == str(reference))
    if found.size != 1:
        raise RepairInputError(f"reference group {reference!r} is not among the groups {group_labels.tolist()}")
    return int(found[0])
