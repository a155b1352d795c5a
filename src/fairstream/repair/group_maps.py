"""Transport maps between protected groups in input space: exact optimal couplings, frozen as arrays.

Kim, Kong, Lee, Chae, Park and Kim, "Fairness Through Matching" (TMLR 2024), section 4, pair each
individual of one group with individuals of another by an optimal-transport (OT) plan between the
groups' input distributions, and use the pairs to define and train matched demographic parity (MDP):

- **marginal map** (their eq. 5): the OT plan for the cost ``||x - x'||^2``, multivariate (all
  features at once, not one feature at a time);
- **joint map** (their eq. 6): the same with the cost ``||x - x'||^2 + alpha |y - y'|``, which pairs
  people with the same label wherever it can (``alpha = 100`` in the paper).

**A coupling, not a subsample's assignment.** Each group is sampled (at most ``n_points`` records, the
paper's mini-batch size 1024; all of a smaller group) and the map is the exact optimal *coupling*
``pi`` between the two samples' empirical measures, whatever their sizes: a record of the smaller
group is split over several partners, each with its share of its mass. Between two equal-size
samples of distinct points the coupling is a permutation (Birkhoff), the assignment of the paper's
equal mini-batches, so for two large groups nothing changes. A map that pairs equal-size
subsamples and snaps the rest of the larger group onto them is not a transport map even on its own
training data (the snapped records pile onto the subsample): the bound ``W1(f_s, f_s') <= MDP`` of
Theorem 3.7 then fails. The coupling keeps it exactly on the fitted points, for any scorer ``f``:
``(f(x), f(x'))`` under ``pi`` is a coupling of the two groups' score distributions. Identical
records are merged into one point with their total mass before solving. The coupling is solved
exactly (:func:`exact_coupling`): by the Hungarian algorithm between equal-size samples of distinct
points, else by POT's network simplex (``ot.emd``) on integer masses, with an iteration cap high
enough that it reaches the optimum (it raises if it does not: at POT's default cap it stops early at
m = 2048 with only a warning). Either takes 0.1 to 0.2 s at 1024 x 1024 points on one core (POT is
imported on the first fit only: it imports torch when installed, about 2 s).

**Features are min-max scaled** (the paper's preprocessing) with the fit data's range before any cost
is computed, so a column in dollars does not drown the one-hot columns; counterparts are returned in
the original units.

**More than two groups.** Every group is coupled with one *reference* group (by default the largest
at fit time; ``reference=`` picks another). That needs K - 1 couplings instead of K(K-1)/2 for all
pairs, and it still bounds every pair: by the triangle inequality for W1 and Theorem 3.7 of the
paper, ``W1(f_a, f_b) <= MDP(a, r) + MDP(b, r)``, so keeping each MDP(g, r) small keeps every pair's
score distributions within twice that. A record of a non-reference group has counterparts in the
reference group; a record of the reference group has counterparts in every other group, so
:meth:`GroupTransportMap.counterparts` returns ``rows`` saying which input row each counterpart
belongs to and ``weights``, each counterpart's share (they sum to one per row and other group).

**Out-of-sample extension** (nearest fitted point's coupled partners). A new record ``x`` of group
``g`` is snapped to its nearest fitted point of ``g`` (in the scaled feature space); that point's
partners under ``pi``, with weights ``pi(i, j) / pi(i, .)``, are its counterparts
(``extension="nearest"``, the default). Exact ties between distinct fitted points are spread
round-robin over the tied points. The counterparts are real records of the other group, so a scorer
is evaluated on the data's support (one-hot columns stay one-hot): what the training penalty
compares. ``extension="shift"`` instead carries ``x`` by each partner's displacement,
``x + (x'_j - x_i)`` (POT's ``EMDTransport`` rule), exact for a translation between the groups but
off the support for one-hot data. Both reproduce the coupling on the fitted points. The joint
map's coupling used labels; a new record's label is usually unknown, so by default the snap ignores
it (a point fitted with both labels carries the partners of both); pass ``y`` to snap to a fitted
point with the same label. The reverse direction (reference -> g) snaps to the reference group's
fitted points and returns their partners: the transposed coupling, so one plan serves both ways.

>>> import numpy as np
>>> X = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0]])
>>> s = np.array([0, 0, 0, 1, 1, 1])
>>> gmap = GroupTransportMap().fit(X, s)
>>> matched = gmap.counterparts([[0.9], [11.8]], [0, 1])
>>> matched.X.ravel().tolist(), matched.s.tolist(), matched.rows.tolist(), matched.weights.tolist()
([11.0, 2.0], [1, 0], [0, 1], [1.0, 1.0])

Unequal groups: the lone record of group 1 is everyone's partner, and each of its counterparts
carries a third of it.

>>> gmap = GroupTransportMap().fit([[0.0], [1.0], [2.0], [5.0]], [0, 0, 0, 1])
>>> back = gmap.counterparts([[5.0]], [1])
>>> back.X.ravel().tolist(), back.weights.round(3).tolist()
([0.0, 1.0, 2.0], [0.333, 0.333, 0.333])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from . import artifacts
from .array_layout import (
    ArrayLayout,
    ArraySpec,
    Check,
    above,
    at_least,
    below,
    check_arrays,
    finite,
    nonempty,
    one_of,
    sorted_labels,
)
from .estimator import Estimator
from .measure.metrics import as_binary
from .validation import RepairInputError, as_2d, as_labels, check_finite, column_names, normalise_labels

__all__ = ["Counterparts", "GroupTransportMap", "exact_coupling", "exact_matching", "reference_index",
           "squared_distances"]

METHODS = ("marginal", "joint")
EXTENSIONS = ("nearest", "shift")
_CHUNK_ROWS = 4096  # rows snapped per pass: bounds the (rows x fitted points) distance block
_LABEL_PENALTY = 1e30  # added to the distance of a fitted point with another label (a finite "never")
_EMD_ITERATIONS = 100_000_000  # the network simplex's cap: far above what 1024 x 1024 points need
_WEIGHT_TOLERANCE = 1e-9  # a stored coupling's mass per pair must be 1 within this


class Counterparts(NamedTuple):
    """Each matched row's counterpart ``X``, the counterpart's group ``s``, the input row it belongs to, and its
    ``weights``: its share of that row under the coupling (they sum to one per row and other group)."""

    X: np.ndarray
    s: np.ndarray
    rows: np.ndarray
    weights: np.ndarray


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``||a_i - b_j||^2`` for every pair of rows, (len(A), len(B)), by one matrix product (clipped at 0).

    >>> squared_distances(np.array([[0.0, 0.0]]), np.array([[3.0, 4.0], [0.0, 1.0]])).tolist()
    [[25.0, 1.0]]
    """
    D = np.einsum("ij,ij->i", A, A)[:, None] + np.einsum("ij,ij->i", B, B)[None, :]
    D -= 2.0 * (A @ B.T)
    return np.maximum(D, 0.0, out=D)


_TREE_NEIGHBOURS = 8  # candidates a k-d tree returns per row; rows whose 8 are all tied get every distance


_FIRST_NEIGHBOURS = 2  # the first query's candidates: enough to tell a row without ties, about half the cost of 8


def _nearest_by_tree(Z: np.ndarray, tree, first: int = _FIRST_NEIGHBOURS) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """The nearest fitted point of each row by a k-d tree (O(log m) per row, not m distances), the rows with
    ties, and their tied points.

    The tree gives each row its nearest ``_TREE_NEIGHBOURS`` points; ties are those within the same
    relative tolerance of the nearest squared distance as the dense path. A row tied with all of
    them may tie with more, so its distances to every point are taken the dense way. The tree is first
    asked for ``first`` points only: a row whose second is not tied with its first has no tie (the
    others are further), and only the rows that do are asked again for all ``_TREE_NEIGHBOURS``.
    """
    P = tree.data
    k = min(_TREE_NEIGHBOURS, len(P))
    head = min(first, k)
    distance, index = _query(tree, Z, head)
    if head < k:
        low = distance[:, 0] ** 2
        again = np.flatnonzero((distance ** 2 <= (low + 1e-12 * (1.0 + low))[:, None]).sum(axis=1) > 1)
        distance = np.concatenate([distance, np.full((len(Z), k - head), np.inf)], axis=1)
        index = np.concatenate([index, np.zeros((len(Z), k - head), dtype=index.dtype)], axis=1)
        if again.size:
            distance[again], index[again] = _query(tree, Z[again], k)
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


def _query(tree, Z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The distances and indices of each row's ``k`` nearest points, shape (len(Z), k) however many ``k`` is."""
    distance, index = tree.query(Z, k=k)
    return distance.reshape(len(Z), k), index.reshape(len(Z), k)


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


def _round_robin(ties: np.ndarray, distinct_of_row: np.ndarray, draws: np.ndarray | None = None) -> np.ndarray:
    """For rows in order, each tied between the fitted points ``ties[distinct_of_row[i]]``: the k-th row with a
    given set of tied points takes the k-th of them (cyclically). With ``draws`` (a uniform in [0, 1) per row, e.g.
    from the record's key) a row takes the tied point its draw picks instead: its counterpart then does not depend on
    the other rows of its batch, and the choice is still uniform over the tied points."""
    packed = np.packbits(ties, axis=1)  # 1024 booleans -> 128 bytes per row, compared exactly
    _, set_of_distinct = _unique_rows(packed)
    sets = ties[np.unique(set_of_distinct, return_index=True)[1]]
    set_of_row = set_of_distinct[distinct_of_row]
    order = np.argsort(set_of_row, kind="stable")  # rows grouped by tie set, in row order within a set
    first = np.searchsorted(set_of_row[order], set_of_row[order], side="left")
    turn = np.empty(len(order), dtype=np.int64)
    turn[order] = np.arange(len(order)) - first
    counts = sets.sum(axis=1)
    if draws is not None:
        turn = np.minimum((np.asarray(draws) * counts[set_of_row]).astype(np.int64), counts[set_of_row] - 1)
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


def exact_coupling(A, B, count_a=None, count_b=None, y_a=None, y_b=None, alpha: float = 0.0):
    """The optimal coupling between two samples' empirical measures, any sizes: its entries ``(i, j, mass)``.

    Point ``A[i]`` has mass ``count_a[i] / sum(count_a)`` (default: one each), likewise ``B``; the
    coupling minimises ``sum pi_ij (||A_i - B_j||^2 + alpha |y_a[i] - y_b[j]|)`` exactly. Masses are
    scaled to integers (``count_a * n_b`` against ``count_b * n_a``), so the network simplex moves
    whole units and the plan has no round-off; the entries are its non-zero cells, summing to one.
    Two equal-size samples of distinct points are coupled by a permutation (Birkhoff): the Hungarian
    algorithm finds it about ten times faster than the simplex (0.15 s against 1.8 s at 1024).

    >>> i, j, mass = exact_coupling(np.array([[0.0], [1.0]]), np.array([[0.0], [1.0], [2.0]]))
    >>> [(int(a), int(b), round(float(m), 4)) for a, b, m in zip(i, j, mass)]
    [(0, 0, 0.3333), (0, 1, 0.1667), (1, 1, 0.1667), (1, 2, 0.3333)]
    """
    import ot  # POT: only needed to fit a map, not to use one

    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1] or not len(A) or not len(B):
        raise RepairInputError(f"a coupling needs two non-empty samples with the same columns, got {A.shape} and "
                               f"{B.shape}")
    count_a = np.ones(len(A), dtype=np.int64) if count_a is None else np.asarray(count_a, dtype=np.int64)
    count_b = np.ones(len(B), dtype=np.int64) if count_b is None else np.asarray(count_b, dtype=np.int64)
    cost = squared_distances(A, B)
    if alpha:
        if y_a is None or y_b is None:
            raise RepairInputError("the joint map's cost needs the labels of both samples (y_a, y_b)")
        cost += alpha * np.abs(np.asarray(y_a, dtype=np.float64)[:, None] - np.asarray(y_b, dtype=np.float64)[None, :])
    n_a, n_b = int(count_a.sum()), int(count_b.sum())
    if len(A) == len(B) == n_a == n_b:  # equal-size distinct points: an assignment, solved faster (Birkhoff)
        perm = linear_sum_assignment(cost)[1]
        return np.arange(n_a), perm, np.full(n_a, 1.0 / n_a)
    supply, demand = (count_a * n_b).astype(np.float64), (count_b * n_a).astype(np.float64)
    plan, log = ot.emd(supply, demand, cost, numItermax=_EMD_ITERATIONS, log=True)
    flows = np.rint(plan)
    if log["result_code"] != 1 or not (np.array_equal(flows.sum(axis=1), supply)
                                       and np.array_equal(flows.sum(axis=0), demand)):
        raise RepairInputError(f"the OT solver did not reach an exact optimal coupling ({log['warning']})")
    i, j = np.nonzero(flows)
    return i, j, flows[i, j] / (float(n_a) * n_b)


def reference_index(counts: np.ndarray, groups: np.ndarray, reference=None) -> int:
    """Index (in ``groups``) of the reference group: the given label, else the largest group (first on ties)."""
    if reference is None:
        return int(np.argmax(counts))
    label = normalise_labels(np.asarray([reference]))[0]
    hits = np.flatnonzero(groups.astype(str) == str(label))
    if hits.size == 0:
        raise RepairInputError(f"reference group {reference!r} is not among the groups {groups.tolist()}")
    return int(hits[0])


class _Side(NamedTuple):
    """One side of one group pair's coupling, as the snap needs it: the distinct fitted points and, per point,
    its coupling entries (``entries[starts[p]:starts[p] + counts[p]]``) with their shares of its mass."""

    points: np.ndarray  # distinct fitted points (original units)
    labels: np.ndarray | None  # their labels, when points are told apart by label too
    entries: np.ndarray  # entry indices, grouped by point
    starts: np.ndarray
    counts: np.ndarray
    shares: np.ndarray  # per entry in ``entries`` order: its mass over its point's mass


class GroupTransportMap(Estimator):
    """Frozen OT couplings from every group to a reference group (and back), in input space.

    A scikit-learn style estimator (``get_params``, ``set_params``, ``sklearn.base.clone``, a repr of the
    changed parameters) whose ``fit(X, s, y=None)`` takes the protected attribute ``s`` (and, for the joint
    map, the labels ``y``); the constructor only stores the parameters, ``fit`` checks them.

    Parameters
    ----------
    method:
        ``"marginal"`` (cost ``||x - x'||^2``) or ``"joint"`` (plus ``alpha |y - y'|``; needs ``y``).
    alpha:
        The joint map's label weight (the paper's 100: with min-max scaled features it dominates).
    n_points:
        At most this many records per group enter each coupling (the paper's mini-batch size m is
        1024); a smaller group enters whole. The two samples' sizes may differ.
    reference:
        The reference group's label; None picks the largest group at fit time.
    extension:
        How a new record finds its counterparts: ``"nearest"`` (the nearest fitted point's partners)
        or ``"shift"`` (the nearest fitted point's displacements). See the module docstring.
    seed:
        Seeds the samples.

    Fitted state: ``groups_``, ``reference_index_``, ``offset_`` and ``scale_`` (min-max scaling),
    and the couplings' non-zero entries: ``pair_`` (the non-reference group of each entry),
    ``source_`` (its point of that group), ``target_`` (its reference-group partner), ``weight_``
    (its mass; each pair's sum to one) and, for the joint map, ``source_y_`` and ``target_y_``.
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
        """Fit the couplings on records ``X`` (n, d) of groups ``s`` (labels ``y`` for the joint map). Returns self.

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

    def _sample(self, rng, X: np.ndarray, rows: np.ndarray, labels: np.ndarray | None):
        """At most ``n_points`` of ``rows``, identical records merged: (points, labels or None, multiplicities)."""
        rows = rng.choice(rows, min(int(self.n_points), len(rows)), replace=False)
        keys = X[rows] if labels is None else np.column_stack([X[rows], labels[rows]])
        distinct, inverse = _unique_rows(keys)
        d = X.shape[1]
        return (distinct[:, :d], None if labels is None else distinct[:, d].astype(np.int8),
                np.bincount(inverse, minlength=len(distinct)))

    def _fit_pairs(self, X: np.ndarray, codes: np.ndarray, labels: np.ndarray | None) -> None:
        rng = np.random.default_rng(self.seed)
        ref = self.reference_index_
        target, target_y, target_count = self._sample(rng, X, np.flatnonzero(codes == ref), labels)
        alpha = float(self.alpha) if labels is not None else 0.0
        parts = []
        for k in range(len(self.groups_)):
            if k == ref:
                continue
            source, source_y, source_count = self._sample(rng, X, np.flatnonzero(codes == k), labels)
            i, j, mass = exact_coupling(self._unit(source), self._unit(target), source_count, target_count,
                                        source_y, target_y, alpha)
            parts.append((np.full(len(i), k), source[i], target[j], mass,
                          None if labels is None else source_y[i], None if labels is None else target_y[j]))
        pair, source, target, weight, source_y, target_y = zip(*parts)
        self.pair_ = np.concatenate(pair).astype(np.int64)
        self.source_, self.target_ = np.concatenate(source), np.concatenate(target)
        self.weight_ = np.concatenate(weight)
        self.source_y_ = None if labels is None else np.concatenate(source_y)
        self.target_y_ = None if labels is None else np.concatenate(target_y)

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
        """The coupling's mean squared distance (scaled features) between partners, per non-reference group."""
        self._check_fitted()
        gaps = self.weight_ * np.sum((self._unit(self.source_) - self._unit(self.target_)) ** 2, axis=1)
        return {self.groups_[k].item(): float(gaps[self.pair_ == k].sum()) for k in np.unique(self.pair_)}

    def counterparts(self, X, s, y=None, draws=None) -> Counterparts:
        """Every row's counterparts in the other group(s), weighted: vectorised, one nearest-point pass per pair.

        Rows of a non-reference group get counterparts in the reference group; rows of the reference
        group in every other group. Rows with a group the map was not fitted on or a non-finite
        feature get none (they are absent from ``rows``). ``y`` (optional, joint map) snaps each row
        to a fitted point with its own label. ``draws`` (optional, one uniform in [0, 1) per row) breaks exact ties
        between fitted points by the row's own draw rather than round-robin over the batch's tied rows: a caller that
        derives them from the record keys gets each record's counterparts whatever batch it comes in.
        """
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_, columns=self.columns_)
        s = normalise_labels(as_labels(s, len(X), "s"))
        y = None if y is None or self.source_y_ is None else np.asarray(as_labels(y, len(X), "y"), dtype=np.float64)
        codes = self._codes(s)
        valid = (codes >= 0) & np.isfinite(X).all(axis=1)
        Z = np.where(valid[:, None], self._unit(X), 0.0)
        parts = []
        for k in np.unique(self.pair_):
            for forward, from_group, to_group in ((True, k, self.reference_index_), (False, self.reference_index_, k)):
                rows = np.flatnonzero(valid & (codes == from_group))
                if rows.size:
                    side = self._side(int(k), forward, y is not None)
                    nearest = self._nearest(Z[rows], side, None if y is None else y[rows], (int(k), forward),
                                            None if draws is None else np.asarray(draws)[rows])
                    parts.append((*self._partners(X, rows, side, nearest, forward), to_group))
        if not parts:
            return Counterparts(np.empty((0, self.n_features_in_)), self.groups_[:0], np.empty(0, dtype=np.int64),
                                np.empty(0))
        moved, rows, weights, to_groups = zip(*[(m, r, w, np.full(len(r), g)) for m, r, w, g in parts])
        rows = np.concatenate(rows)
        order = np.argsort(rows, kind="stable")
        return Counterparts(np.concatenate(moved)[order], self.groups_[np.concatenate(to_groups)[order]], rows[order],
                            np.concatenate(weights)[order])

    def _partners(self, X: np.ndarray, rows: np.ndarray, side: _Side, nearest: np.ndarray, forward: bool):
        """The counterparts of ``rows`` snapped to the side's points ``nearest``: (X, rows, weights), one per entry."""
        n = side.counts[nearest]
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        position = np.repeat(side.starts[nearest], n) + within
        entry = side.entries[position]
        partner = (self.target_ if forward else self.source_)[entry]
        rows = np.repeat(rows, n)
        if self.extension == "shift":
            partner = X[rows] + (partner - side.points[np.repeat(nearest, n)])
        return partner, rows, side.shares[position]

    def _side(self, k: int, forward: bool, by_label: bool) -> _Side:
        """The points of pair ``k``'s group (``forward``) or of the reference group, with their entries; cached."""
        sides = self.__dict__.setdefault("_sides", {})
        key = (k, forward, by_label)
        if key not in sides:
            entries = np.flatnonzero(self.pair_ == k)
            fitted = (self.source_ if forward else self.target_)[entries]
            labels = (self.source_y_ if forward else self.target_y_) if by_label else None
            keys = fitted if labels is None else np.column_stack([fitted, labels[entries]])
            distinct, inverse = _unique_rows(keys)
            order = np.argsort(inverse, kind="stable")
            counts = np.bincount(inverse, minlength=len(distinct))
            mass = np.bincount(inverse, weights=self.weight_[entries], minlength=len(distinct))
            shares = self.weight_[entries[order]] / mass[inverse[order]]
            d = self.n_features_in_
            sides[key] = _Side(distinct[:, :d], None if labels is None else distinct[:, d], entries[order],
                               np.cumsum(counts) - counts, counts, shares)
        return sides[key]

    def _codes(self, s: np.ndarray) -> np.ndarray:
        """Index of each row's group in ``groups_``; -1 for a group the map does not know."""
        if self.groups_.dtype.kind in "iu" and s.dtype.kind in "iu":  # numbers: equal as numbers, as their text is
            keys, probe = self.groups_, s
        else:
            keys, probe = self.groups_.astype(str), s.astype(str)
        order = np.argsort(keys)
        pos = np.clip(np.searchsorted(keys[order], probe), 0, len(keys) - 1)
        return np.where(keys[order][pos] == probe, order[pos], -1)

    def _nearest(self, Z: np.ndarray, side: _Side, y, direction, draws: np.ndarray | None = None) -> np.ndarray:
        """Index of the nearest of the side's points (scaled space) for each row of ``Z``.

        Exact ties between distinct points are broken round-robin: the k-th row tied between the
        same points takes the k-th of them. Distances are taken once per *distinct* row (integer
        and one-hot data repeat a lot), through a k-d tree built once per ``direction`` (pair and
        side) when no labels are involved.
        """
        keys = Z if y is None else np.column_stack([Z, y])
        distinct, inverse = _unique_rows(keys)
        if y is None:
            best, tied, ties = _nearest_by_tree(distinct, self._tree(direction, side.points))
        else:  # the label penalty needs every distance
            best, tied, ties = self._nearest_distinct(distinct[:, :Z.shape[1]], self._unit(side.points), side.labels,
                                                      distinct[:, -1])
        out = best[inverse]
        position = np.full(len(distinct), -1)
        position[tied] = np.arange(len(tied))
        rows = np.flatnonzero(position[inverse] >= 0)
        if rows.size:
            out[rows] = _round_robin(ties, position[inverse[rows]], None if draws is None else draws[rows])
        return out

    def _tree(self, direction, points: np.ndarray):
        """The k-d tree of one side's points (scaled), built on first use; the map is frozen."""
        from scipy.spatial import cKDTree

        trees = self.__dict__.setdefault("_trees", {})
        if direction not in trees:
            trees[direction] = cKDTree(self._unit(points))
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

    def artifact_parameters(self) -> dict:
        """The constructor parameters, JSON-ready, with the reference as fitted (so a reload keeps it): the artifact's.

        ``get_params`` gives the parameters as set (the reference as given, None by default)."""
        reference = self.reference if not hasattr(self, "groups_") else self.reference_group
        return {"method": self.method, "alpha": float(self.alpha), "n_points": int(self.n_points),
                "reference": reference, "extension": self.extension, "seed": int(self.seed)}

    def to_arrays(self, prefix: str = "group_map.") -> dict[str, np.ndarray]:
        """The fitted state as plain arrays (names prefixed), for an artifact payload."""
        self._check_fitted()
        arrays = {"groups": self.groups_, "reference_index": np.array(self.reference_index_), "offset": self.offset_,
                  "scale": self.scale_, "pair": self.pair_, "source": self.source_, "target": self.target_,
                  "weight": self.weight_}
        if self.source_y_ is not None:
            arrays.update(source_y=self.source_y_, target_y=self.target_y_)
        return {prefix + name: np.asarray(value) for name, value in arrays.items()}

    @classmethod
    def from_arrays(cls, arrays: Mapping, params: dict, columns: Sequence[str] | None,
                    prefix: str = "group_map.") -> GroupTransportMap:
        """Rebuild a fitted map from :meth:`to_arrays` and :meth:`artifact_parameters` (bit-exact), every array checked.

        Raises :class:`~fairstream.repair.artifacts.ArtifactError` naming the first array that is
        missing, undeclared, or has the wrong dtype, shape (against each other and ``columns``) or
        values (finite, scale > 0, indices in range, every group coupled, weights > 0 summing to one
        per pair, labels 0/1). Maps stored before couplings (no ``weight``: one equal-size
        assignment per pair) load as uniform couplings.
        """
        try:
            gmap = cls(**params)
            gmap._check_params()
        except (TypeError, RepairInputError) as err:
            raise artifacts.ArtifactError(f"the group map is malformed: its parameters {params!r}: {err}") from None
        state = _checked_state(arrays, prefix, gmap.method, None if columns is None else len(columns))
        for name, value in state.items():
            setattr(gmap, name, value)
        gmap.n_features_in_ = gmap.source_.shape[1]
        gmap.columns_ = column_names(gmap.n_features_in_, columns)
        return gmap


# ---------------------------------------------------------------------------------- checking stored arrays


def _two_or_more() -> Check:
    return Check("two or more labels", lambda a, ctx: (np.array(a.size < 2), np.array(a.size)))


def _not_the_reference() -> Check:
    return Check("a non-reference group index", lambda a, ctx: (a == ctx.arrays["reference_index"], a))


def _every_other_group() -> Check:
    """Each non-reference group has entries (a group without any would silently get no counterparts)."""
    def bad(a, ctx):
        counts = np.bincount(a, minlength=len(ctx.arrays["groups"]))
        missing = counts == 0
        missing[int(ctx.arrays["reference_index"])] = False
        return missing, counts
    return Check("used by every non-reference group (entries per group)", bad)


def _sums_to_one_per_pair() -> Check:
    def bad(a, ctx):
        pair = ctx.arrays["pair"]
        totals = np.bincount(pair, weights=a, minlength=len(ctx.arrays["groups"]))
        others = np.arange(len(totals)) != int(ctx.arrays["reference_index"])
        return others & ~(np.abs(totals - 1.0) <= _WEIGHT_TOLERANCE), totals
    return Check("summing to 1 per group pair", bad)


def _layout(stored: Mapping, method: str, n_features: int | None) -> ArrayLayout:
    """The arrays of a stored map: dtype, shape and value domain, as :mod:`~fairstream.repair.artifacts` specs."""
    entries = ("n_entries",)
    specs = [ArraySpec("groups", "iufU", ("n_groups",), (_two_or_more(), sorted_labels())),
             ArraySpec("reference_index", "iu", (), (at_least(0), below("n_groups"))),
             ArraySpec("offset", "f", ("n_features",), (finite(),)),
             ArraySpec("scale", "f", ("n_features",), (finite(), above(0.0))),
             ArraySpec("pair", "iu", entries, (nonempty(), at_least(0), below("n_groups"), _not_the_reference(),
                                               _every_other_group())),
             ArraySpec("source", "f", (*entries, "n_features"), (finite(),)),
             ArraySpec("target", "f", (*entries, "n_features"), (finite(),))]
    if "weight" in stored:  # absent: a map stored before couplings (uniform, see _uniform)
        specs.append(ArraySpec("weight", "f", entries, (finite(), above(0.0), _sums_to_one_per_pair())))
    if method == "joint":
        specs += [ArraySpec(name, "iu", entries, (one_of(0, 1),)) for name in ("source_y", "target_y")]
    return ArrayLayout(tuple(specs), {} if n_features is None else {"n_features": n_features})


def _checked_state(arrays: Mapping, prefix: str, method: str, n_features: int | None) -> dict:
    """The fitted attributes from stored arrays, every array checked against its spec and the others."""
    stored = {name[len(prefix):]: np.asarray(a) for name, a in arrays.items() if name.startswith(prefix)}
    check_arrays(stored, _layout(stored, method, n_features), f"the group map is malformed ({prefix}*)")
    get = (lambda name: np.array(stored[name]) if name in stored else None)
    pair = get("pair").astype(np.int64)
    labels = [None if get(name) is None else get(name).astype(np.int8) for name in ("source_y", "target_y")]
    return {"groups_": get("groups"), "reference_index_": int(get("reference_index")), "offset_": get("offset"),
            "scale_": get("scale"), "pair_": pair, "source_": get("source"), "target_": get("target"),
            "weight_": _uniform(pair) if get("weight") is None else get("weight"),
            "source_y_": labels[0], "target_y_": labels[1]}


def _uniform(pair: np.ndarray) -> np.ndarray:
    """The masses of a map stored before couplings: each pair's equal-size assignment, 1/m per entry."""
    return 1.0 / np.bincount(pair)[pair]
