"""Transport maps between protected groups in input space, fitted by exact optimal assignment, frozen as arrays.

Kim, Kong, Lee, Chae, Park and Kim, "Fairness Through Matching" (TMLR 2024), section 4, pair each
individual of one group with an individual of another by an optimal-transport (OT) map between the
groups' input distributions, and use the pairs to define and train matched demographic parity (MDP):

- **marginal map** (their eq. 5): between two equal-size samples, the OT plan for the cost
  ``||x - x'||^2`` with uniform weights is a permutation (Birkhoff), so the map is an *assignment*,
  multivariate (all features at once, not one feature at a time);
- **joint map** (their eq. 6): the same with the cost ``||x - x'||^2 + alpha |y - y'|``, which pairs
  people with the same label wherever it can (``alpha = 100`` in the paper).

The assignment is solved exactly by the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``),
at any size. A network simplex with an iteration cap is not: POT's ``ot.emd`` at its default
``numItermax`` returns a suboptimal coupling at m = 2048 with only a warning. Both take about
0.26 s at m = 1024 on one core with Adult's one-hot features.

**Features are min-max scaled** (the paper's preprocessing) with the fit data's range before any cost
is computed, so a column in dollars does not drown the one-hot columns; counterparts are returned in
the original units.

**More than two groups.** Every group is matched to one *reference* group (by default the largest at
fit time; ``reference=`` picks another). That needs K - 1 assignments instead of K(K-1)/2 for all
pairs, and it still bounds every pair: by the triangle inequality for W1 and Theorem 3.7 of the
paper, ``W1(f_a, f_b) <= MDP(a, r) + MDP(b, r)``, so keeping each MDP(g, r) small keeps every pair's
score distributions within twice that. (The monitor's former "next group, cyclically" rule needed K
maps and chained up to K/2 of them between two groups, in an order set by the labels' spelling.)
A record of a non-reference group has one counterpart (in the reference group); a record of the
reference group has one in every other group, so :meth:`GroupTransportMap.counterparts` returns
``rows`` saying which input row each counterpart belongs to (``rows == arange(n)`` for two groups).

**Out-of-sample extension.** The fitted map pairs the fitted points only; a new record ``x`` of group
``g`` is first snapped to its nearest fitted point of ``g`` (in the scaled feature space), whose
partner is its counterpart (``extension="nearest"``, the default; exact ties, i.e. duplicate
records, are spread round-robin over the tied points, so the map stays one-to-one on its points). The counterpart is then a real
record of the other group, so a scorer is evaluated on the data's support (one-hot columns stay
one-hot): exactly what the training penalty compares. ``extension="shift"`` instead carries ``x`` by
its nearest fitted point's displacement, ``x + (T(x_nn) - x_nn)`` (POT's ``EMDTransport`` rule),
which is exact for a translation between the groups but leaves the support for one-hot data. Both
reproduce the assignment on the fitted points. The joint map's pairing used labels; a new record's
label is usually unknown, so by default the snap ignores it; pass ``y`` to snap to a fitted point
with the same label. The reverse direction (reference -> g) snaps to the reference group's fitted
points and returns their partners: the inverse permutation, so one assignment serves both ways.

>>> import numpy as np
>>> X = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0]])
>>> s = np.array([0, 0, 0, 1, 1, 1])
>>> gmap = GroupTransportMap().fit(X, s)
>>> matched = gmap.counterparts([[0.9], [11.8]], [0, 1])
>>> matched.X.ravel().tolist(), matched.s.tolist(), matched.rows.tolist()
([11.0, 2.0], [1, 0], [0, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from ._validation import RepairInputError, as_2d, as_labels, check_finite, column_names, normalise_labels
from .measure.metrics import as_binary

__all__ = ["Counterparts", "GroupTransportMap", "exact_matching", "reference_index", "squared_distances"]

METHODS = ("marginal", "joint")
EXTENSIONS = ("nearest", "shift")
_CHUNK_ROWS = 4096  # rows snapped per pass: bounds the (rows x fitted points) distance block
_LABEL_PENALTY = 1e30  # added to the distance of a fitted point with another label (a finite "never")


class Counterparts(NamedTuple):
    """Each matched row's counterpart ``X``, the counterpart's group ``s`` and the input row it belongs to."""

    X: np.ndarray
    s: np.ndarray
    rows: np.ndarray


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``||a_i - b_j||^2`` for every pair of rows, (len(A), len(B)), by one matrix product (clipped at 0).

    >>> squared_distances(np.array([[0.0, 0.0]]), np.array([[3.0, 4.0], [0.0, 1.0]])).tolist()
    [[25.0, 1.0]]
    """
    D = np.einsum("ij,ij->i", A, A)[:, None] + np.einsum("ij,ij->i", B, B)[None, :]
    D -= 2.0 * (A @ B.T)
    return np.maximum(D, 0.0, out=D)


_TREE_NEIGHBOURS = 8  # candidates a k-d tree returns per row; rows whose 8 are all tied get every distance


def _nearest_by_tree(Z: np.ndarray, tree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nearest fitted point of each row by a k-d tree (O(log m) per row, not m distances), the rows with
    ties, and their tied points.

    The tree gives each row its nearest ``_TREE_NEIGHBOURS`` points; ties are those within the same
    relative tolerance of the nearest squared distance as the dense path. A row tied with all of
    them may tie with more, so its distances to every point are taken the dense way.
    """
    P = tree.data
    k = min(_TREE_NEIGHBOURS, len(P))
    distance, index = tree.query(Z, k=k)
    distance, index = distance.reshape(len(Z), k), index.reshape(len(Z), k)
    squared = distance ** 2
    low = squared[:, 0]
    near = squared <= (low + 1e-12 * (1.0 + low))[:, None]
    best = index[:, 0].copy()
    tied = np.flatnonzero(near.sum(axis=1) > 1)
    ties = np.zeros((len(tied), len(P)), dtype=bool)
    np.put_along_axis(ties, index[tied], near[tied], axis=1)
    full = np.flatnonzero(near[tied].all(axis=1)) if k < len(P) else np.empty(0, dtype=np.intp)
    if full.size:
        D = squared_distances(Z[tied[full]], P)
        floor = D.min(axis=1)
        best[tied[full]] = np.argmin(D, axis=1)
        ties[full] = D <= (floor + 1e-12 * (1.0 + floor))[:, None]
    return best, tied, ties


def _unique_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``A`` and each row's index among them (exact: a lexicographic sort, not a hash).

    ``np.unique(axis=0)`` does the same through a structured view, many times slower on small batches.
    """
    if len(A) == 0:
        return A, np.empty(0, dtype=np.intp)
    order = np.lexsort(A.T[::-1])
    ordered = A[order]
    new = np.ones(len(A), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    group = np.cumsum(new) - 1
    inverse = np.empty(len(A), dtype=np.intp)
    inverse[order] = group
    return ordered[new], inverse


def _round_robin(ties: np.ndarray, distinct_of_row: np.ndarray) -> np.ndarray:
    """For rows in order, each tied between the fitted points ``ties[distinct_of_row[i]]``: the k-th row with a
    given set of tied points takes the k-th of them (cyclically)."""
    packed = np.packbits(ties, axis=1)  # 1024 booleans -> 128 bytes per row, compared exactly
    _, set_of_distinct = _unique_rows(packed)
    sets = ties[np.unique(set_of_distinct, return_index=True)[1]]
    set_of_row = set_of_distinct[distinct_of_row]
    order = np.argsort(set_of_row, kind="stable")  # rows grouped by tie set, in row order within a set
    first = np.searchsorted(set_of_row[order], set_of_row[order], side="left")
    turn = np.empty(len(order), dtype=np.int64)
    turn[order] = np.arange(len(order)) - first
    counts = sets.sum(axis=1)
    members = np.flatnonzero(sets.ravel()) % sets.shape[1]  # each set's tied points, in index order
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return members[offsets[set_of_row] + turn % counts[set_of_row]]


def exact_matching(A, B, y_a=None, y_b=None, alpha: float = 0.0) -> np.ndarray:
    """The optimal assignment between equal-size samples: ``A[i]`` is matched with ``B[perm[i]]``.

    Minimises ``sum_i ||A[i] - B[perm[i]]||^2 + alpha |y_a[i] - y_b[perm[i]]|`` exactly (Hungarian
    algorithm): the marginal OT map (``alpha = 0``) or the joint one (labels given, ``alpha > 0``).

    >>> exact_matching(np.array([[0.0], [5.0]]), np.array([[4.0], [1.0]])).tolist()
    [1, 0]
    >>> exact_matching(np.array([[0.0], [5.0]]), np.array([[4.0], [1.0]]), [0, 1], [0, 1], alpha=100.0).tolist()
    [0, 1]
    """
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    if A.ndim != 2 or A.shape != B.shape:
        raise RepairInputError(f"exact matching needs two samples of equal shape, got {A.shape} and {B.shape}")
    cost = squared_distances(A, B)
    if alpha:
        if y_a is None or y_b is None:
            raise RepairInputError("the joint map's cost needs the labels of both samples (y_a, y_b)")
        cost += alpha * np.abs(np.asarray(y_a, dtype=np.float64)[:, None] - np.asarray(y_b, dtype=np.float64)[None, :])
    _, perm = linear_sum_assignment(cost)
    return perm


def reference_index(counts: np.ndarray, groups: np.ndarray, reference=None) -> int:
    """Index (in ``groups``) of the reference group: the given label, else the largest group (first on ties)."""
    if reference is None:
        return int(np.argmax(counts))
    label = normalise_labels(np.asarray([reference]))[0]
    hits = np.flatnonzero(groups.astype(str) == str(label))
    if hits.size == 0:
        raise RepairInputError(f"reference group {reference!r} is not among the groups {groups.tolist()}")
    return int(hits[0])


class GroupTransportMap:
    """Frozen OT maps from every group to a reference group (and back), in input space.

    Parameters
    ----------
    method:
        ``"marginal"`` (cost ``||x - x'||^2``) or ``"joint"`` (plus ``alpha |y - y'|``; needs ``y``).
    alpha:
        The joint map's label weight (the paper's 100: with min-max scaled features it dominates).
    n_points:
        At most this many records per group enter each assignment (the paper's mini-batch size m
        is 1024); the smaller of the two groups sets the size, both are subsampled to it.
    reference:
        The reference group's label; None picks the largest group at fit time.
    extension:
        How a new record finds its counterpart: ``"nearest"`` (the nearest fitted point's partner)
        or ``"shift"`` (the nearest fitted point's displacement). See the module docstring.
    seed:
        Seeds the subsamples.
    """

    def __init__(self, method: str = "marginal", alpha: float = 100.0, n_points: int = 1024, reference=None,
                 extension: str = "nearest", seed: int = 0):
        self.method = method
        self.alpha = alpha
        self.n_points = n_points
        self.reference = reference
        self.extension = extension
        self.seed = seed

    def _check_params(self) -> None:
        if self.method not in METHODS:
            raise RepairInputError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.extension not in EXTENSIONS:
            raise RepairInputError(f"extension must be one of {EXTENSIONS}, got {self.extension!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float, np.integer, np.floating)) \
                or not 0.0 <= self.alpha < np.inf:
            raise RepairInputError(f"alpha must be a finite number >= 0, got {self.alpha!r}")
        for name, value, low in (("n_points", self.n_points, 1), ("seed", self.seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise RepairInputError(f"{name} must be an integer >= {low}, got {value!r}")

    # ------------------------------------------------------------------ fit

    def fit(self, X, s, y=None, groups: Sequence | None = None, columns: Sequence[str] | None = None):
        """Fit the maps on records ``X`` (n, d) of groups ``s`` (labels ``y`` for the joint map).

        ``groups`` are the labels the map must serve (default: those in ``s``); each needs a record.
        """
        self._check_params()
        X = as_2d(X, columns=columns)
        names = column_names(X.shape[1], columns)
        check_finite(X, names)
        s = normalise_labels(as_labels(s, len(X), "s"))
        labels = self._labels(y, len(X))
        self.groups_ = np.unique(s) if groups is None else np.unique(normalise_labels(np.asarray(list(groups))))
        codes = self._codes(s)
        if (codes < 0).any():
            raise RepairInputError(f"s has the value {s[np.argmax(codes < 0)].item()!r}, not among the groups "
                                   f"{self.groups_.tolist()}")
        counts = np.bincount(codes, minlength=len(self.groups_))
        if len(self.groups_) < 2:
            raise RepairInputError(f"a group map needs two or more groups, got {self.groups_.tolist()}")
        if counts.min() == 0:
            raise RepairInputError(f"group {self.groups_[np.argmin(counts)].item()!r} has no records to fit a map on")
        self.columns_, self.n_features_in_ = names, X.shape[1]
        self.reference_index_ = reference_index(counts, self.groups_, self.reference)
        lo, hi = X.min(axis=0), X.max(axis=0)
        self.offset_, self.scale_ = lo, np.where(hi > lo, hi - lo, 1.0)
        self._fit_pairs(X, codes, labels)
        return self

    def _labels(self, y, n: int) -> np.ndarray | None:
        if self.method == "marginal":
            return None
        if y is None:
            raise RepairInputError("the joint map needs the labels y of the records it is fitted on")
        return as_binary(y, n).astype(np.int8)

    def _fit_pairs(self, X: np.ndarray, codes: np.ndarray, labels: np.ndarray | None) -> None:
        rng = np.random.default_rng(self.seed)
        ref = self.reference_index_
        ref_rows = np.flatnonzero(codes == ref)
        parts = []
        for k in range(len(self.groups_)):
            if k == ref:
                continue
            rows = np.flatnonzero(codes == k)
            m = min(int(self.n_points), len(rows), len(ref_rows))
            source = rng.choice(rows, m, replace=False)
            target = rng.choice(ref_rows, m, replace=False)
            alpha = float(self.alpha) if labels is not None else 0.0
            ys, yt = (None, None) if labels is None else (labels[source], labels[target])
            perm = exact_matching(self._unit(X[source]), self._unit(X[target]), ys, yt, alpha)
            parts.append((np.full(m, k), source, target[perm]))
        pair, source, target = (np.concatenate(p) for p in zip(*parts))
        self.pair_ = pair.astype(np.int64)
        self.source_, self.target_ = X[source], X[target]
        self.source_y_ = None if labels is None else labels[source]
        self.target_y_ = None if labels is None else labels[target]

    # ------------------------------------------------------------------ use

    def _check_fitted(self) -> None:
        if not hasattr(self, "source_"):
            raise RepairInputError("this GroupTransportMap is not fitted yet; call fit(X, s) first")

    @property
    def reference_group(self):
        """The reference group's label."""
        self._check_fitted()
        return self.groups_[self.reference_index_].item()

    def scaled(self, X) -> np.ndarray:
        """``X`` min-max scaled with the fit data's range: the space where costs and nearest points are taken."""
        self._check_fitted()
        return self._unit(as_2d(X, n_features=self.n_features_in_, columns=self.columns_))

    def _unit(self, X: np.ndarray) -> np.ndarray:
        return (X - self.offset_) / self.scale_

    def transport_cost(self) -> dict:
        """Mean squared distance (scaled features) between matched fitted points, per non-reference group."""
        self._check_fitted()
        gaps = np.sum((self._unit(self.source_) - self._unit(self.target_)) ** 2, axis=1)
        return {self.groups_[k].item(): float(gaps[self.pair_ == k].mean()) for k in np.unique(self.pair_)}

    def counterparts(self, X, s, y=None) -> Counterparts:
        """Every row's counterpart(s) in the other group(s): vectorised, one nearest-point pass per pair.

        Rows of a non-reference group get one counterpart (in the reference group); rows of the
        reference group one per other group. Rows with a group the map was not fitted on or a
        non-finite feature get none (they are absent from ``rows``). ``y`` (optional, joint map)
        snaps each row to a fitted point with its own label.
        """
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_, columns=self.columns_)
        s = normalise_labels(as_labels(s, len(X), "s"))
        y = None if y is None or self.source_y_ is None else np.asarray(as_labels(y, len(X), "y"), dtype=np.float64)
        codes = self._codes(s)
        valid = (codes >= 0) & np.isfinite(X).all(axis=1)
        Z = np.where(valid[:, None], self._unit(X), 0.0)
        out_X, out_s, out_rows = [], [], []
        for k in np.unique(self.pair_):
            pair = self.pair_ == k
            for from_group, fitted, partner, fitted_y, to_group in (
                    (k, self.source_[pair], self.target_[pair], self._y(self.source_y_, pair), self.reference_index_),
                    (self.reference_index_, self.target_[pair], self.source_[pair], self._y(self.target_y_, pair), k)):
                rows = np.flatnonzero(valid & (codes == from_group))
                if rows.size == 0:
                    continue
                nearest = self._nearest(Z[rows], fitted, fitted_y, None if y is None else y[rows], (k, from_group))
                moved = partner[nearest] if self.extension == "nearest" else X[rows] + (partner - fitted)[nearest]
                out_X.append(moved)
                out_s.append(np.full(rows.size, to_group))
                out_rows.append(rows)
        if not out_rows:
            return Counterparts(np.empty((0, self.n_features_in_)), self.groups_[:0], np.empty(0, dtype=np.int64))
        rows = np.concatenate(out_rows)
        order = np.argsort(rows, kind="stable")
        return Counterparts(np.concatenate(out_X)[order], self.groups_[np.concatenate(out_s)[order]], rows[order])

    @staticmethod
    def _y(labels: np.ndarray | None, pair: np.ndarray) -> np.ndarray | None:
        return None if labels is None else labels[pair]

    def _codes(self, s: np.ndarray) -> np.ndarray:
        """Index of each row's group in ``groups_``; -1 for a group the map does not know."""
        keys, probe = self.groups_.astype(str), s.astype(str)
        order = np.argsort(keys)
        pos = np.clip(np.searchsorted(keys[order], probe), 0, len(keys) - 1)
        return np.where(keys[order][pos] == probe, order[pos], -1)

    def _nearest(self, Z: np.ndarray, fitted: np.ndarray, fitted_y, y, direction=None) -> np.ndarray:
        """Index of the nearest fitted point (scaled space) for each row of ``Z``.

        Exact ties (duplicate records, frequent with one-hot features) are broken round-robin: the
        k-th row tied between the same fitted points takes the k-th of them, so duplicates of fitted
        points are carried to distinct partners and the map stays one-to-one on its own points.
        Distances are taken once per *distinct* row (integer and one-hot data repeat a lot), through
        a k-d tree built once per ``direction`` (pair and side) when no labels are involved.
        """
        keys = Z if y is None else np.column_stack([Z, y])
        distinct, inverse = _unique_rows(keys)
        if y is None:
            best, tied, ties = _nearest_by_tree(distinct, self._tree(direction, fitted))
        else:  # the label penalty needs every distance
            best, tied, ties = self._nearest_distinct(distinct[:, :Z.shape[1]], self._unit(fitted), fitted_y,
                                                      distinct[:, -1])
        out = best[inverse]
        position = np.full(len(distinct), -1)
        position[tied] = np.arange(len(tied))
        rows = np.flatnonzero(position[inverse] >= 0)
        if rows.size:
            out[rows] = _round_robin(ties, position[inverse[rows]])
        return out

    def _tree(self, direction, fitted: np.ndarray):
        """The k-d tree of one side's fitted points (scaled), built on first use; the map is frozen."""
        from scipy.spatial import cKDTree

        trees = self.__dict__.setdefault("_trees", {})
        if direction is None or direction not in trees:
            tree = cKDTree(self._unit(fitted))
            if direction is None:
                return tree
            trees[direction] = tree
        return trees[direction]

    @staticmethod
    def _nearest_distinct(Z: np.ndarray, P: np.ndarray, fitted_y, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The nearest fitted point of each distinct row, the rows with ties and their tied points, in chunks."""
        best = np.empty(len(Z), dtype=np.int64)
        ties = np.zeros((len(Z), len(P)), dtype=bool)
        for start in range(0, len(Z), _CHUNK_ROWS):
            block = slice(start, start + _CHUNK_ROWS)
            D = squared_distances(Z[block], P)
            if y is not None:
                D += _LABEL_PENALTY * (y[block][:, None] != fitted_y[None, :])
            best[block] = np.argmin(D, axis=1)
            low = D[np.arange(len(D)), best[block]]
            ties[block] = D <= (low + 1e-12 * (1.0 + low))[:, None]
        tied = np.flatnonzero(ties.sum(axis=1) > 1)
        return best, tied, ties[tied]

    # ------------------------------------------------------------------ arrays (embedded in artifacts)

    def get_params(self) -> dict:
        """The constructor parameters, JSON-ready (the reference as fitted, so a reload keeps it)."""
        reference = self.reference if not hasattr(self, "groups_") else self.reference_group
        return {"method": self.method, "alpha": float(self.alpha), "n_points": int(self.n_points),
                "reference": reference, "extension": self.extension, "seed": int(self.seed)}

    def to_arrays(self, prefix: str = "group_map.") -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (names prefixed), for an artifact payload."""
        self._check_fitted()
        arrays = {"groups": self.groups_, "reference_index": np.array(self.reference_index_), "offset": self.offset_,
                  "scale": self.scale_, "pair": self.pair_, "source": self.source_, "target": self.target_}
        if self.source_y_ is not None:
            arrays.update(source_y=self.source_y_, target_y=self.target_y_)
        return {prefix + name: np.asarray(value) for name, value in arrays.items()}

    @classmethod
    def from_arrays(cls, arrays, params: dict, columns: Sequence[str], prefix: str = "group_map.") -> GroupTransportMap:
        """Rebuild a fitted map from :meth:`to_arrays` and :meth:`get_params` (bit-exact)."""
        gmap = cls(**params)
        gmap._check_params()
        missing = [prefix + name for name in ("groups", "reference_index", "offset", "scale", "pair", "source", "target")
                   if prefix + name not in arrays]
        if missing:
            raise RepairInputError(f"the group map lacks the arrays {missing}")
        get = (lambda name: np.array(arrays[prefix + name]) if prefix + name in arrays else None)
        gmap.groups_, gmap.reference_index_ = get("groups"), int(get("reference_index"))
        gmap.offset_, gmap.scale_, gmap.pair_ = get("offset"), get("scale"), get("pair")
        gmap.source_, gmap.target_ = get("source"), get("target")
        gmap.source_y_, gmap.target_y_ = get("source_y"), get("target_y")
        gmap.n_features_in_ = gmap.source_.shape[1]
        gmap.columns_ = column_names(gmap.n_features_in_, columns)
        if gmap.source_.shape != gmap.target_.shape or gmap.pair_.shape != (len(gmap.source_),) \
                or gmap.offset_.shape != (gmap.n_features_in_,) or gmap.scale_.shape != (gmap.n_features_in_,):
            raise RepairInputError("the group map's arrays do not fit together (source, target, pair, offset, scale)")
        return gmap
