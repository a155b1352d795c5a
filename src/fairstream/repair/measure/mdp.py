"""Matched demographic parity (MDP): batch metric, streaming accumulator, fair matching and its transport cost.

Kim, Kong, Lee, Chae, Park and Kim, "Fairness Through Matching" (TMLR 2024), Definition 3.2: for a
transport map ``T`` from group ``s`` to group ``s'``,

    MDP(f, T) = E_s | f(X) - f(T(X)) |,

the mean score gap between a record and its counterpart. Theorem 3.7: whenever ``T`` is a true
transport map (it carries one group's distribution onto the other's), ``W1(f_s, f_s') <= MDP`` and
so the mean-score DP gap ``|E_s f - E_s' f| <= MDP``: a small MDP certifies demographic parity. With
a *frozen* map on drifted data ``T`` is no longer a transport map and the bound loosens by
``TV(T#P_s, P_s')``; compare MDP with the directly measured W1 and read a growing gap as a stale map.

The counterparts come from a :class:`~fairstream.repair.group_maps.GroupTransportMap` (the scorer's
frozen map, ``scorer.matched_counterparts(X, s)``). The map is an optimal-transport *coupling*: a
record may have several counterparts, each with its share of the record's mass (``weights``, summing
to one per record and other group), and MDP is the weighted mean ``E sum_j pi(j | x) |f(x) - f(x'_j)|``.
On the map's own points that is exactly a coupling of the two groups, so Theorem 3.7's bound
``W1(f_s, f_s') <= MDP`` holds there for any ``f``. Rows may carry a sampling weight too (the monitor
measures a sample of each batch and weights it by the batch's sampling stride); pass the product.
With more than two groups every group is matched to a reference group (see that module for why), and
MDP is kept per *pair* of groups: a record and its counterpart belong to the pair {s, s'}, whichever
direction they were matched in. The headline value is the worst pair's MDP.

The **fair matching function** of a scorer (Definition 3.4, Proposition 3.5) is the map with the
smallest MDP; between equal-size samples it matches equal score ranks, and its MDP is then the W1
distance between the two score samples. Its transport cost ``E ||x - T^f(x)||^2`` (Remark 3.6) is an
audit metric: among models equally fair and accurate, prefer the one whose fairness matches similar
people (a rising cost means fairness achieved by pairing dissimilar people, a leading indicator of
unfairness on subsets, Theorem 4.2). :func:`fair_matching_cost` estimates it on random equal-size
mini-batches, as the paper does (100 batches of 1024).

>>> import numpy as np
>>> f = np.array([0.9, 0.6, 0.2, 0.4])          # scores of four records
>>> f_matched = np.array([0.6, 0.9, 0.4, 0.2])  # scores of their counterparts
>>> result = matched_dp(f, f_matched, s=[0, 1, 0, 1], s_matched=[1, 0, 1, 0])
>>> round(result.overall, 3), result.pairs
(0.25, [(0, 1)])
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from fairstream.repair.group_maps import reference_index
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    as_scores,
    check_finite,
    encode,
    normalise_labels,
)

from .accumulators import Mergeable, configured_labels, label_codes, stratum_weights
from .metrics import ALL_STRATA, encode_observed, safe_ratio

__all__ = ["FairMatchingCost", "MatchedDPAccumulator", "MatchedDPResult", "fair_matching", "fair_matching_cost",
           "matched_dp"]


@dataclass(frozen=True, eq=False)
class MatchedDPResult:
    """MDP per (stratum, pair of groups), per pair, per stratum (worst pair) and overall (worst pair).

    ``per_pair[j, p]`` is the weighted mean |f(x) - f(T(x))| of the matched rows of pair ``pairs[p]``
    in stratum ``strata[j]`` (NaN where none); ``pair_values[p]`` pools the strata; ``per_stratum[j]``
    is the largest ``per_pair[j, :]`` (NaN where the stratum saw no row); ``overall`` the largest
    ``pair_values`` (0 before any row). ``n_rows`` counts the matched rows measured, ``weights`` are
    Pr[u] over their weighted mass.
    """

    per_pair: np.ndarray
    pair_values: np.ndarray
    per_stratum: np.ndarray
    overall: float
    n_rows: np.ndarray
    weights: np.ndarray
    pairs: list
    strata: np.ndarray


class MatchedDPAccumulator(Mergeable):
    """Sums of |f(x) - f(T(x))| and counts per (stratum, pair of groups): MDP over a stream, mergeable.

    The window protocol of :mod:`fairstream.repair.measure.accumulators` (``update`` returns self,
    ``merge``, ``fresh``, ``reset``, ``value``), so a :class:`~fairstream.repair.measure.windows.BatchWindow`
    holds one per batch. Built without ``groups`` it pools every matched row in one pair (the
    single-pair MDP); with ``groups`` each row's pair is {s, s_matched}.

    Each matched row may carry a weight (its coupling share times its sampling weight; default 1):
    the sums are of ``weight * |f(x) - f(T(x))|`` and of ``weight``, so a row standing for ten
    records counts ten times. Pairs no row was matched across read NaN (with a reference group "a",
    pair ("b", "c") never is):

    >>> acc = MatchedDPAccumulator(groups=["a", "b", "c"])
    >>> _ = acc.update([0.9, 0.5, 0.3], [0.7, 0.5, 0.6], s=["a", "b", "c"], s_matched=["b", "a", "a"])
    >>> result = acc.value()
    >>> result.pairs, result.pair_values.round(2).tolist(), round(result.overall, 2)
    ([('a', 'b'), ('a', 'c'), ('b', 'c')], [0.1, 0.3, nan], 0.3)
    """

    _counts = ("abs_sums_", "masses_", "totals_")

    def __init__(self, groups=None, strata=None):
        self.groups = None if groups is None else configured_labels(groups, "groups")
        if self.groups is not None and len(self.groups) < 2:
            raise RepairInputError(f"MDP needs two or more groups, got {self.groups.tolist()}")
        self.strata = configured_labels(strata, "strata")
        self._has_strata = strata is not None
        n_groups = 2 if self.groups is None else len(self.groups)
        pairs = list(combinations(range(n_groups), 2))
        self._pair_of = np.full((n_groups, n_groups), -1, dtype=np.intp)
        for p, (a, b) in enumerate(pairs):
            self._pair_of[a, b] = self._pair_of[b, a] = p
        self.pairs = [(ALL_STRATA, ALL_STRATA)] if self.groups is None else \
            [(self.groups[a].item(), self.groups[b].item()) for a, b in pairs]
        shape = (len(self.strata), len(pairs))
        self.abs_sums_ = np.zeros(shape)
        self.masses_ = np.zeros(shape)  # summed weights: the denominators
        self.totals_ = np.zeros(shape, dtype=np.int64)  # matched rows measured

    def _settings(self) -> tuple:
        return (self.groups, self.strata, self._has_strata)

    def update(self, scores, matched_scores, s=None, s_matched=None, u=None, weights=None) -> MatchedDPAccumulator:
        """Add f(x) (``scores``) and f(T(x)) (``matched_scores``) of matched rows, their groups, strata and weights."""
        scores = as_scores(scores, "scores")
        n = scores.shape[0]
        matched = as_scores(matched_scores, "matched_scores", n_rows=n)
        weight = np.ones(n) if weights is None else _weights(weights, n)
        pair = self._pair_codes(s, s_matched, n)
        u_codes = label_codes(u, self.strata, n, "u", configured=self._has_strata)
        cell = u_codes * self.abs_sums_.shape[1] + pair
        size, shape = self.abs_sums_.size, self.abs_sums_.shape
        self.abs_sums_ = self.abs_sums_ + np.bincount(cell, weight * np.abs(scores - matched), size).reshape(shape)
        self.masses_ = self.masses_ + np.bincount(cell, weight, size).reshape(shape)
        self.totals_ = self.totals_ + np.bincount(cell, minlength=size).reshape(shape)
        return self

    def runs(self, scores, matched_scores, s, s_matched, u, weights, bounds) -> list[MatchedDPAccumulator]:
        """Fresh accumulators (this one's settings), the i-th fed the rows ``bounds[i]:bounds[i + 1]``: each equals
        ``self.fresh().update(...)`` of its run, validated and counted for every run at once."""
        scores = as_scores(scores, "scores")
        n = scores.shape[0]
        matched = as_scores(matched_scores, "matched_scores", n_rows=n)
        weight = _weights(weights, n)
        cell = label_codes(u, self.strata, n, "u", configured=self._has_strata) * self.abs_sums_.shape[1] + \
            self._pair_codes(s, s_matched, n)
        bounds = np.asarray(bounds, dtype=np.intp)
        size, shape = self.abs_sums_.size, self.abs_sums_.shape
        key = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds)) * size + cell[bounds[0]:bounds[-1]]
        rows, n_runs = slice(bounds[0], bounds[-1]), len(bounds) - 1
        abs_sums = np.bincount(key, (weight * np.abs(scores - matched))[rows], n_runs * size)
        masses = np.bincount(key, weight[rows], n_runs * size)
        totals = np.bincount(key, minlength=n_runs * size)
        return [self._of_counts(abs_sums_=abs_sums[i * size:(i + 1) * size].reshape(shape),
                                masses_=masses[i * size:(i + 1) * size].reshape(shape),
                                totals_=totals[i * size:(i + 1) * size].reshape(shape)) for i in range(n_runs)]

    def _pair_codes(self, s, s_matched, n: int) -> np.ndarray:
        if self.groups is None:
            if s is not None or s_matched is not None:
                raise RepairInputError("s was given but the accumulator was built without groups")
            return np.zeros(n, dtype=np.intp)
        a = label_codes(s, self.groups, n, "s")
        b = label_codes(s_matched, self.groups, n, "s_matched")
        pair = self._pair_of[a, b]
        if (pair < 0).any():
            row = int(np.argmax(pair < 0))
            raise RepairInputError(f"row {row} is matched within its own group {self.groups[a[row]].item()!r}")
        return pair

    def value(self) -> MatchedDPResult:
        """MDP per (stratum, pair), per pair, per stratum and overall, from the sums so far."""
        per_pair = safe_ratio(self.abs_sums_, self.masses_, empty=np.nan)
        pair_values = safe_ratio(self.abs_sums_.sum(axis=0), self.masses_.sum(axis=0), empty=np.nan)
        seen = self.masses_ > 0
        per_stratum = np.where(seen.any(axis=1), np.where(seen, per_pair, -np.inf).max(axis=1), np.nan)
        overall = float(np.nanmax(pair_values)) if np.isfinite(pair_values).any() else 0.0
        return MatchedDPResult(per_pair=per_pair, pair_values=pair_values, per_stratum=per_stratum, overall=overall,
                               n_rows=self.totals_.copy(), weights=stratum_weights(self.masses_.sum(axis=1)),
                               pairs=list(self.pairs), strata=self.strata)


def _weights(values, n: int) -> np.ndarray:
    """Row weights: one finite number >= 0 per row."""
    weight = as_scores(values, "weights", n_rows=n)
    if (weight < 0).any():
        row = int(np.argmax(weight < 0))
        raise RepairInputError(f"weights has a negative value {weight[row]!r} at row {row}")
    return weight


def matched_dp(f_x, f_matched, s=None, s_matched=None, u=None, groups=None, weights=None) -> MatchedDPResult:
    """MDP of a batch: weighted mean |f(x) - f(T(x))| per pair of groups (and stratum ``u``), worst pair overall.

    The same numbers as a :class:`MatchedDPAccumulator` fed the batch. ``s``/``s_matched`` are the
    groups of each row and of its counterpart (omit both for one pair); ``groups`` defaults to the
    labels seen; ``weights`` are the counterparts' coupling shares (``Counterparts.weights``; default
    1 each). Hand-checkable: rows 0.9 vs 0.6 and 0.2 vs 0.4 give (0.3 + 0.2) / 2.

    Parameters
    ----------
    f_x : array-like of shape (n_pairs,)
        Score of each row, in [0, 1].
    f_matched : array-like of shape (n_pairs,)
        Score of each row's counterpart in the other group.
    s : array-like of shape (n_pairs,) or None, default=None
        Group of each row; omit with ``s_matched`` for one pair of groups.
    s_matched : array-like of shape (n_pairs,) or None, default=None
        Group of each counterpart.
    u : array-like of shape (n_pairs,) or None, default=None
        Stratum of each row; None is one stratum.
    groups : sequence or None, default=None
        The groups to report, in order; None takes the labels seen.
    weights : array-like of shape (n_pairs,) or None, default=None
        Coupling share of each counterpart; None weighs every pair 1.

    Returns
    -------
    MatchedDPResult
        Mean |f(x) - f(T(x))| per pair of groups (and stratum), in score units, and the worst pair
        (``overall``).

    Examples
    --------
    >>> round(matched_dp([0.9, 0.2], [0.6, 0.4]).overall, 3)
    0.25
    >>> # a row with two half counterparts, then a whole one: (0.5 * 0.3 + 0.5 * 0.1 + 0.2) / 2
    >>> round(matched_dp([0.9, 0.9, 0.2], [0.6, 0.8, 0.4], weights=[0.5, 0.5, 1.0]).overall, 3)
    0.2
    """
    if groups is None and s is not None:
        groups = np.unique(normalise_labels(np.asarray([*np.asarray(s).tolist(), *np.asarray(s_matched).tolist()])))
    n = as_scores(f_x, "f_x").shape[0]
    strata = None if u is None else encode_observed(u, n, "u")[0]
    return MatchedDPAccumulator(groups, strata).update(f_x, f_matched, s, s_matched, u, weights).value()


# ---------------------------------------------------------------------------------------------
# the fair matching function and its transport cost


def fair_matching(f_a, f_b) -> tuple[np.ndarray, np.ndarray]:
    """The fair matching of two equal-size score samples: index pairs ``(i, j)`` matching equal ranks.

    Proposition 3.5 of the paper: among all one-to-one matchings it minimises the mean |f_a - f_b|,
    which then equals the W1 distance between the two samples.

    Parameters
    ----------
    f_a : array-like of shape (n,)
        Scores of the first sample.
    f_b : array-like of shape (n,)
        Scores of the second sample, of the same size.

    Returns
    -------
    i : ndarray of int, shape (n,)
        Indices into ``f_a``.
    j : ndarray of int, shape (n,)
        Indices into ``f_b``; ``f_a[i[k]]`` is matched with ``f_b[j[k]]``.

    Examples
    --------
    >>> i, j = fair_matching([0.9, 0.1, 0.5], [0.2, 0.8, 0.3])
    >>> [(int(a), int(b)) for a, b in zip(i, j)]
    [(1, 0), (2, 2), (0, 1)]
    """
    f_a, f_b = as_scores(f_a, "f_a"), as_scores(f_b, "f_b")
    if f_a.shape != f_b.shape:
        raise RepairInputError(f"fair matching needs equal-size samples, got {f_a.size} and {f_b.size} scores")
    return np.argsort(f_a, kind="stable"), np.argsort(f_b, kind="stable")


@dataclass(frozen=True, eq=False)
class FairMatchingCost:
    """The fair matching function's transport cost and MDP per non-reference group (paired with the reference).

    ``cost[p]`` is the mean over mini-batches of mean ||x - T^f(x)||^2 between group ``pairs[p][0]``
    and the reference group, ``cost_sd[p]`` its standard deviation across mini-batches, ``mdp[p]`` the
    mean MDP of the fair matching (the minimal MDP: the W1 between the two score samples).
    """

    pairs: list
    cost: np.ndarray
    cost_sd: np.ndarray
    mdp: np.ndarray
    n_batches: int
    batch_size: np.ndarray


def fair_matching_cost(X, scores, s, groups=None, reference=None, n_batches: int = 100, batch_size: int = 1024,
                       seed: int = 0) -> FairMatchingCost:
    """Transport cost ``E ||x - T^f(x)||^2`` of a scorer's fair matching function, over random mini-batches.

    Per mini-batch, equal-size samples of a group and of the reference group (the largest unless
    ``reference`` names one) are rank-matched by score (:func:`fair_matching`). The cost is in the
    units of ``X``: pass features scaled as the model's group map scales them (``group_map.scaled(X)``).

    Parameters
    ----------
    X : array-like of shape (n_rows, n_features)
        Features, scaled as the model's group map scales them.
    scores : array-like of shape (n_rows,)
        The scorer's score of each row.
    s : array-like of shape (n_rows,)
        Group of each row.
    groups : sequence or None, default=None
        The groups to match, in order; None takes the labels seen.
    reference : group label or None, default=None
        The group every other group is matched to; None takes the largest.
    n_batches : int, default=100
        Number of random mini-batches.
    batch_size : int, default=1024
        Rows drawn per group and mini-batch (at most the smaller group's size).
    seed : int, default=0
        Seed of the draws.

    Returns
    -------
    FairMatchingCost
        The mean squared displacement per matched group, in squared units of ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [0.0], [1.0]]); s = [0, 0, 1, 1]
    >>> fair_matching_cost(X, [0.1, 0.9, 0.2, 0.8], s, n_batches=1).cost.tolist()  # like is matched with like
    [0.0]
    >>> fair_matching_cost(X, [0.1, 0.9, 0.8, 0.2], s, n_batches=1).cost.tolist()  # opposite people matched
    [1.0]
    """
    X = as_2d(X)
    check_finite(X, [f"x{k}" for k in range(X.shape[1])])
    scores = as_scores(scores, "scores", n_rows=len(X))
    s = normalise_labels(as_labels(s, len(X), "s"))
    labels = np.unique(s) if groups is None else np.unique(normalise_labels(np.asarray(list(groups))))
    codes = encode(s, labels, "s")
    counts = np.bincount(codes, minlength=len(labels))
    ref = reference_index(counts, labels, reference)
    rng = np.random.default_rng(seed)
    others = [k for k in range(len(labels)) if k != ref and counts[k] > 0]
    costs, gaps, sizes = np.zeros((len(others), n_batches)), np.zeros((len(others), n_batches)), []
    for p, k in enumerate(others):
        rows_k, rows_r = np.flatnonzero(codes == k), np.flatnonzero(codes == ref)
        m = min(batch_size, len(rows_k), len(rows_r))
        sizes.append(m)
        for b in range(n_batches):
            a, r = rng.choice(rows_k, m, replace=False), rng.choice(rows_r, m, replace=False)
            i, j = fair_matching(scores[a], scores[r])
            costs[p, b] = np.mean(np.sum((X[a[i]] - X[r[j]]) ** 2, axis=1))
            gaps[p, b] = np.mean(np.abs(scores[a[i]] - scores[r[j]]))
    return FairMatchingCost(pairs=[(labels[k].item(), labels[ref].item()) for k in others], cost=costs.mean(axis=1),
                            cost_sd=costs.std(axis=1), mdp=gaps.mean(axis=1), n_batches=int(n_batches),
                            batch_size=np.array(sizes))
