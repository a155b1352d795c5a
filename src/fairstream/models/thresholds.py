"""Group-specific decision thresholds after the scorer (artifact kind ``thresholds``).

Post-processing for demographic parity, equal opportunity or equalized odds (Hardt, Price and Srebro,
"Equality of Opportunity in Supervised Learning", 2016; the reference implementation is Fairlearn's
``ThresholdOptimizer``). The scorer stays as it is; per (stratum, group) cell the decision is a
randomised threshold rule on its score.

**The rule.** A cell holds ``n_rules`` threshold rules ``(t_j, inclusive_j)`` with weights ``w_j``
(summing to 1). Rule j decides ``1`` where ``score > t_j``, or ``score == t_j`` when ``inclusive_j``;
so ``(0, inclusive)`` always says 1 and ``(1, exclusive)`` never does. A record picks rule j with
probability ``w_j`` by one uniform ``v`` keyed by ``(seed, record key)`` (:func:`~fairstream.repair.hashing.uniforms`):
the first j with ``v * sum(w) < w_1 + ... + w_j``. A record's decision is therefore a function of
(artifact, key, score, s, u), the same in any batch, and for a given key never lower at a higher score.

**The fit.** Per cell, every distinct fit score is a candidate threshold (plus "never"), placed midway
between it and the next lower fit score so that a score a few ulps away decides alike; their points
(positive rate for ``dp``, true-positive rate for ``eopp``, (FPR, TPR) for ``eo``, against the cell's
correct decisions) have an upper convex hull, and mixing two adjacent hull thresholds reaches every point
between them. Within each stratum the groups share one operating point, the one maximising the number of
correct decisions on the fit data: a common positive rate (``dp``), a common TPR (``eopp``), or a common
(FPR, TPR) on the upper boundary of the intersection of the cells' ROC hulls (``eo``), found exactly (the
objective is concave and piecewise linear: its maximum is at a hull vertex or, for ``eo``, where two
hulls cross). Each cell reaches it with the two adjacent hull thresholds (``dp``, ``eopp``: two rules);
for ``eo`` a cell whose hull lies above the common point also mixes in the constant rules "always" and
"never" in the ratio FPR : 1 - FPR, which moves its point straight down to the diagonal, as Fairlearn
does (four rules). On the fit data the expected rates of every cell equal the common point exactly.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.integers(0, 2, 2000); y = rng.integers(0, 2, 2000)
>>> score = np.clip(0.3 * y + 0.2 * s + rng.uniform(0, 0.5, 2000), 0, 1)  # the scorer favours s = 1
>>> post = fit_thresholds(score, s, y, constraint="dp")
>>> decision = post.decide(score, s, keys=np.arange(2000))
>>> before = abs((score[s == 1] >= 0.5).mean() - (score[s == 0] >= 0.5).mean())
>>> after = abs(decision[s == 1].mean() - decision[s == 0].mean())
>>> bool(before > 0.3 and after < 0.05)
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fairstream.repair import artifacts
from fairstream.repair.array_layout import ArrayLayout, ArraySpec, any_true, at_least, at_most, check_arrays, \
    finite, int_parameter, nonempty, sorted_labels, sums_to_one
from fairstream.repair.estimator import Estimator
from fairstream.repair.hashing import keys_to_uint64, uniforms
from fairstream.repair.measure.metrics import as_binary
from fairstream.repair.posterior import missing_mask
from fairstream.repair.protocol import Applied, Batch, Capabilities, PipelineSchema, check_labels_cover
from fairstream.repair.validation import RepairInputError, as_labels, encode_mask, normalise_labels

__all__ = ["CONSTRAINTS", "GroupThresholds", "fit_thresholds"]

ARTIFACT_KIND = "thresholds"
CONSTRAINTS = ("dp", "eopp", "eo")
"""``dp``: equal positive rates; ``eopp``: equal true-positive rates; ``eo``: equal true- and false-positive rates."""
RULES = {"dp": 2, "eopp": 2, "eo": 4}
"""Rules per cell: two adjacent hull thresholds, and for ``eo`` the constant rules "always" and "never" too."""
NEVER = (1.0, False)   # score > 1: no valid score passes
ALWAYS = (0.0, True)   # score >= 0: every valid score passes
_WEIGHT_TOLERANCE = 1e-9  # a cell's weights sum to 1 up to the rounding of their products


class GroupThresholds(Estimator):
    """Randomised per-(stratum, group) thresholds on a score, fitted for ``dp``, ``eopp`` or ``eo`` (see the module).

    A scikit-learn style estimator (``get_params``, ``set_params``, ``clone``); ``fit(score, s, y, u)``
    takes the scores the published chain gave a labelled window.

    Parameters
    ----------
    constraint:
        ``"dp"`` (equal positive rates), ``"eopp"`` (equal true-positive rates) or ``"eo"`` (equal
        true- and false-positive rates), within each stratum.
    random_state:
        Keys the per-record draw that picks a cell's rule (with the record key); the module's ``seed``
        (provenance) is its text.

    Learned state: ``groups_``, ``strata_`` (labels; one stratum ``0`` when fitted without u),
    ``stratified_``, ``fitted_`` (cells that had fit rows), ``threshold_``, ``inclusive_`` and ``weight_``
    (n_strata, n_groups, n_rules).
    """

    kind = ARTIFACT_KIND
    capabilities = Capabilities(agent="records", reads=frozenset({"score"}), writes=frozenset({"decision"}),
                                place="post", needs_s=True, needs_labels=True)

    def __init__(self, constraint: str = "dp", random_state: int = 0):
        self.constraint = constraint
        self.random_state = random_state

    @property
    def seed(self) -> str:
        """What the draws are keyed by (with the record key), as every kind's provenance states it: text."""
        return str(int(self.random_state))

    # ------------------------------------------------------------------ fit

    def fit(self, score, s, y, u=None, groups: Sequence | None = None,
            strata: Sequence | None = None) -> GroupThresholds:
        """Fit on a labelled window: scores in [0, 1], protected attribute ``s``, labels ``y``, strata ``u``.

        ``groups`` / ``strata``: the labels the pipeline serves (default: those in the data); a cell
        without fit rows gets no thresholds, and its records are refused with a reason. An empty list is none given.
        """
        self._check_parameters()
        groups, strata = (None if labels is not None and len(labels) == 0 else labels for labels in (groups, strata))
        score = _fit_scores(score)
        n = len(score)
        y = as_binary(y, n)
        self.stratified_ = u is not None
        if strata is not None and u is None:
            raise RepairInputError("strata were given but no u: pass each row's stratum as u")
        self.groups_, s_codes = _labels(s, n, "s", groups)
        self.strata_, u_codes = _labels(np.zeros(n, dtype=np.int64) if u is None else u, n, "u", strata)
        shape = (len(self.strata_), len(self.groups_), RULES[self.constraint])
        self.threshold_ = np.full(shape, NEVER[0])
        self.inclusive_ = np.full(shape, NEVER[1])
        self.weight_ = np.zeros(shape)
        self.weight_[..., 0] = 1.0  # a cell without fit rows: "never", and its records are refused anyway
        cell = u_codes * len(self.groups_) + s_codes
        self.fitted_ = np.bincount(cell, minlength=shape[0] * shape[1]).reshape(shape[:2]) > 0
        for a in np.flatnonzero(self.fitted_.any(axis=1)):  # a declared stratum without fit rows has no thresholds
            cells = [_CellCurve.of(score[cell == a * shape[1] + b], y[cell == a * shape[1] + b])
                     for b in np.flatnonzero(self.fitted_[a])]
            for curve, b in zip(cells, np.flatnonzero(self.fitted_[a])):
                self._check_labels_present(curve, a, b)
            for b, (rules, weights) in zip(np.flatnonzero(self.fitted_[a]), self._solve(cells)):
                self.threshold_[a, b] = [threshold for threshold, _ in rules]
                self.inclusive_[a, b] = [inclusive for _, inclusive in rules]
                self.weight_[a, b] = weights
        return self

    def _solve(self, cells: list[_CellCurve]) -> list[tuple[list, np.ndarray]]:
        """Each cell's (rules, weights) at the stratum's common operating point."""
        if self.constraint == "eo":
            return _solve_odds(cells)
        metric = "positive_rate" if self.constraint == "dp" else "tpr"
        return _solve_rate(cells, metric)

    def _check_labels_present(self, curve: _CellCurve, a: int, b: int) -> None:
        needs = {"dp": (), "eopp": (1,), "eo": (1, 0)}[self.constraint]
        for label in needs:
            if (curve.positives if label else curve.negatives) == 0:
                raise RepairInputError(
                    f"{self._cell_name(a, b)} has no fit rows with y = {label}: constraint {self.constraint!r} "
                    f"needs {'both labels' if len(needs) == 2 else 'positives'} in every cell "
                    "(give the window more rows of it, drop the strata, or fit 'dp')")

    def _cell_name(self, a: int, b: int) -> str:
        group = f"s={self.groups_[b].item()!r}"
        return f"cell u={self.strata_[a].item()!r}, {group}" if self.stratified_ else f"group {group}"

    def _check_parameters(self) -> None:
        if self.constraint not in CONSTRAINTS:
            raise RepairInputError(f"constraint must be one of {CONSTRAINTS}, got {self.constraint!r}")
        seed = self.random_state
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise RepairInputError(f"random_state must be an integer in [0, 2**64), got {seed!r}")

    def _check_fitted(self) -> None:
        if not hasattr(self, "weight_"):
            raise RepairInputError("this GroupThresholds is not fitted yet: call fit(score, s, y, u) first")

    # ------------------------------------------------------------------ deciding

    def decide(self, score, s, u=None, keys=None) -> np.ndarray:
        """0/1 decisions (int64); raises :class:`RepairInputError` naming the first row that cannot be decided.

        With ``keys``, a record's decision is a function of (artifact, key, score, s, u), whatever batch it
        is in; without, each row is keyed by its position in this call.
        """
        self._check_fitted()
        score = np.asarray(score)
        n = 1 if score.ndim == 0 else len(score)
        outcome = self._outcome(score.reshape(n), s, u, np.arange(n) if keys is None else keys, n)
        if not outcome.ok.all():
            raise RepairInputError(outcome.reasons[int(np.argmin(outcome.ok))])
        return outcome.columns["decision"]

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: the batch's values unchanged, plus the column ``decision``.

        Reads the score an earlier module of the chain added (``batch.added["score"]``); a row with a
        missing, NaN or out-of-[0, 1] score, a missing or unseen s, an unseen u, or a cell without
        thresholds is refused with a reason (decision -1); the others are decided as they would be alone.
        """
        self._check_fitted()
        n = len(batch)
        if "score" not in batch.added:
            reason = ("no score to threshold: the thresholds read the score column a scorer earlier in the chain "
                      "adds, and this batch has none")
            return Applied(X=batch.X.copy(), ok=np.zeros(n, dtype=bool), reasons=[reason] * n,
                           out_of_range=np.zeros(n, dtype=bool), columns={"decision": np.full(n, -1, np.int64)})
        outcome = self._outcome(batch.added["score"], batch.s, batch.u, batch.keys, n)
        outcome.X = batch.X.copy()
        return outcome

    def _outcome(self, score, s, u, keys, n: int) -> Applied:
        """Decisions of the rows that can be decided, reasons for the others (X left empty for the caller)."""
        score, usable = _score_column(score, n)
        if s is None:
            s = np.full(n, None, dtype=object)
        s_in = as_labels(s, n, "s")
        missing = missing_mask(s_in)
        s_codes, s_unseen = encode_mask(normalise_labels(np.where(missing, self.groups_[0], s_in) if missing.any()
                                                         else s_in), self.groups_)
        s_unseen &= ~missing
        if self.stratified_:
            u_in = as_labels(np.full(n, None, dtype=object) if u is None else u, n, "u")
            u_missing = missing_mask(u_in)
            u_codes, u_unseen = encode_mask(normalise_labels(np.where(u_missing, self.strata_[0], u_in)
                                                             if u_missing.any() else u_in), self.strata_)
            u_unseen |= u_missing
        else:
            u_in, u_codes, u_unseen = None, np.zeros(n, dtype=np.intp), np.zeros(n, dtype=bool)
        known = ~missing & ~s_unseen & ~u_unseen
        fitted = known & self.fitted_[u_codes, s_codes]
        ok = usable & fitted
        decision = np.full(n, -1, dtype=np.int64)
        rows = np.flatnonzero(ok)
        if rows.size:
            draws = uniforms(int(self.random_state), keys_to_uint64(as_labels(keys, n, "keys"))[rows], 1)[:, 0]
            decision[rows] = self._decide(np.where(usable, score, 0.0)[rows], u_codes[rows], s_codes[rows], draws)
        reasons = [None] * n
        if not ok.all():
            reasons = self._reasons(score, s_in, u_in, ok, usable, missing, s_unseen, u_unseen)
        return Applied(X=np.empty((n, 0)), ok=ok, reasons=reasons, out_of_range=np.zeros(n, dtype=bool),
                       columns={"decision": decision})

    def _decide(self, score: np.ndarray, u_codes: np.ndarray, s_codes: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """The rule each row's draw picks in its cell, applied to its score (valid rows only)."""
        cumulative = np.cumsum(self.weight_[u_codes, s_codes], axis=1)
        level = draws * cumulative[:, -1]  # below the total: never a rule past the last with weight
        rule = (level[:, None] >= cumulative).sum(axis=1)
        threshold = self.threshold_[u_codes, s_codes, rule]
        inclusive = self.inclusive_[u_codes, s_codes, rule]
        return ((score > threshold) | (inclusive & (score == threshold))).astype(np.int64)

    def _reasons(self, score, s_in, u_in, ok, usable, missing, s_unseen, u_unseen) -> list:
        """Messages for the refused rows only (rare by construction)."""
        reasons: list = [None] * len(ok)
        for i in np.flatnonzero(~ok):
            if missing[i]:
                reasons[i] = "s is missing: the thresholds are per group"
            elif s_unseen[i]:
                reasons[i] = f"s value {_item(s_in[i])!r} was not seen at fit time (known: {self.groups_.tolist()})"
            elif u_unseen[i] and missing_mask(u_in[i:i + 1])[0]:
                reasons[i] = "u is missing: the thresholds are per stratum"
            elif u_unseen[i]:
                reasons[i] = f"u value {_item(u_in[i])!r} was not seen at fit time (known: {self.strata_.tolist()})"
            elif not usable[i]:
                reasons[i] = f"the score {_item(score[i])!r} is not a number in [0, 1]"
            else:
                where = f"u={_item(u_in[i])!r}, s={_item(s_in[i])!r}" if self.stratified_ else f"s={_item(s_in[i])!r}"
                reasons[i] = f"no thresholds for {where}: the fit window had no rows of that cell"
        return reasons

    # ------------------------------------------------------------------ module protocol

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse thresholds fitted without one of the pipeline's groups (or strata, when fitted per stratum)."""
        self._check_fitted()
        check_labels_cover("thresholds", "groups", self.groups_.tolist(), schema.groups)
        if self.stratified_:
            check_labels_cover("thresholds", "strata", self.strata_.tolist(), schema.strata)

    def probe(self) -> Batch:
        """The module protocol's load-time probe: scores 0, 0.5 and 1 in every fitted cell."""
        self._check_fitted()
        cells = np.argwhere(self.fitted_)
        a, b = np.repeat(cells[:, 0], 3), np.repeat(cells[:, 1], 3)
        score = np.tile([0.0, 0.5, 1.0], len(cells))
        keys = np.array([f"probe-{i}" for i in range(len(score))], dtype=object)
        return Batch(X=np.zeros((len(score), 0)), keys=keys, s=self.groups_[b],
                     u=self.strata_[a] if self.stratified_ else None, added={"score": score})

    # ------------------------------------------------------------------ artifacts

    def artifact_parameters(self) -> dict:
        """The constructor parameters and whether the thresholds are per stratum, JSON-ready."""
        return {"constraint": self.constraint, "seed": int(self.random_state), "stratified": bool(self.stratified_)}

    def to_artifact(self, version: int = 1, metrics: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the thresholds into an artifact of kind ``thresholds``: arrays only.

        >>> import numpy as np
        >>> post = fit_thresholds([0.2, 0.7, 0.4, 0.9], [0, 0, 1, 1], [0, 1, 0, 1], constraint="eo", seed=3)
        >>> copy = GroupThresholds.from_artifact(post.to_artifact(version=2))
        >>> decide = (lambda module: module.decide([0.5, 0.5], [0, 1], keys=["a", "b"]).tolist())
        >>> decide(copy) == decide(post)
        True
        """
        self._check_fitted()
        arrays = {"groups": self.groups_, "strata": self.strata_, "fitted": self.fitted_,
                  "threshold": self.threshold_, "inclusive": self.inclusive_, "weight": self.weight_}
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters=self.artifact_parameters(), metrics=metrics or {},
                              data_fingerprint=data_fingerprint, version=version)

    @staticmethod
    def array_layout(parameters: dict) -> ArrayLayout:
        """The arrays of a ``thresholds`` artifact: dtype, shape and value domain, checked at load.

        ``groups`` and ``strata`` label the cells (one stratum when not ``stratified``); per cell,
        ``n_rules`` (2, or 4 for ``eo``) thresholds in [0, 1], their ``inclusive`` flags and weights
        in [0, 1] summing to 1; ``fitted`` marks the cells that have thresholds.
        """
        what = "thresholds artifact"
        constraint = parameters.get("constraint")
        if constraint not in CONSTRAINTS:
            raise artifacts.ArtifactError(f"{what}: parameter 'constraint' must be one of {CONSTRAINTS}, "
                                          f"got {constraint!r}")
        stratified = parameters.get("stratified")
        if not isinstance(stratified, bool):
            raise artifacts.ArtifactError(f"{what}: parameter 'stratified' must be true or false, got {stratified!r}")
        int_parameter(parameters, "seed", what, low=0)
        cells = ("n_strata", "n_groups")
        rules = (*cells, "n_rules")
        dims = {"n_rules": RULES[constraint], **({} if stratified else {"n_strata": 1})}
        return ArrayLayout((
            ArraySpec("groups", "iufU", ("n_groups",), (nonempty(), sorted_labels())),
            ArraySpec("strata", "iufU", ("n_strata",), (nonempty(), sorted_labels())),
            ArraySpec("fitted", "b", cells, (any_true(),)),
            ArraySpec("threshold", "f", rules, (finite(), at_least(0.0), at_most(1.0))),
            ArraySpec("inclusive", "b", rules),
            ArraySpec("weight", "f", rules, (finite(), at_least(0.0), at_most(1.0),
                                             sums_to_one(tol=_WEIGHT_TOLERANCE))),
        ), dims)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> GroupThresholds:
        """Rebuild the thresholds of a ``thresholds`` artifact (bit-exact: the same decisions), every array checked."""
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        check_arrays(artifact.arrays, cls.array_layout(artifact.parameters), "thresholds artifact")
        params = artifact.parameters
        module = cls(constraint=params["constraint"], random_state=params["seed"])
        try:
            module._check_parameters()
        except RepairInputError as err:
            raise artifacts.ArtifactError(f"thresholds artifact: {err}") from None
        a = artifact.arrays
        module.stratified_ = params["stratified"]
        module.groups_, module.strata_ = np.array(a["groups"]), np.array(a["strata"])
        module.fitted_, module.threshold_ = np.array(a["fitted"]), np.array(a["threshold"])
        module.inclusive_, module.weight_ = np.array(a["inclusive"]), np.array(a["weight"])
        return module


def fit_thresholds(score, s, y, u=None, constraint: str = "dp", groups: Sequence | None = None,
                   strata: Sequence | None = None, seed: int = 0) -> GroupThresholds:
    """Fit :class:`GroupThresholds` on a scored, labelled window (see the module's example).

    >>> post = fit_thresholds([0.1, 0.8, 0.3, 0.6], ["a", "a", "b", "b"], [0, 1, 0, 1], constraint="eopp")
    >>> post.decide([0.8, 0.6], ["a", "b"], keys=[1, 2]).tolist()
    [1, 1]
    """
    return GroupThresholds(constraint=constraint, random_state=seed).fit(score, s, y, u, groups=groups, strata=strata)


# ---------------------------------------------------------------------------------------------
# the operating points of one cell, and the common point of a stratum


class _CellCurve:
    """One cell's candidate rules ("never", then ``score >= v`` for each distinct fit score v, highest first)
    with their true and false positives, and the cell's label counts."""

    def __init__(self, rules: list, tp: np.ndarray, fp: np.ndarray, positives: int, negatives: int):
        self.rules, self.tp, self.fp = rules, tp, fp
        self.positives, self.negatives = positives, negatives

    @classmethod
    def of(cls, score: np.ndarray, y: np.ndarray) -> _CellCurve:
        values, code = np.unique(score, return_inverse=True)
        positives = np.bincount(code, weights=y, minlength=len(values))[::-1]
        rows = np.bincount(code, minlength=len(values))[::-1]
        tp = np.concatenate([[0.0], np.cumsum(positives)])
        fp = np.concatenate([[0.0], np.cumsum(rows - positives)])
        return cls([NEVER] + _midway(values)[::-1], tp, fp, int(tp[-1]), int(fp[-1]))

    @property
    def correct(self) -> np.ndarray:
        """Correct decisions of each candidate rule on the cell's fit rows."""
        return self.tp + (self.negatives - self.fp)

    def rate(self, metric: str) -> np.ndarray:
        """Each candidate's positive rate, true-positive rate or false-positive rate on the fit rows."""
        if metric == "positive_rate":
            return (self.tp + self.fp) / (self.positives + self.negatives)
        return self.tp / self.positives if metric == "tpr" else self.fp / self.negatives


def _midway(values: np.ndarray) -> list:
    """For each distinct fit score v (ascending), a rule passing exactly the fit scores >= v: ``score >`` the
    midpoint between v and the next lower fit score (or 0), exclusive; ``score >= 0`` for a v of 0.

    Midway, not at v: a score a few ulps from a fit score (the same scorer under another BLAS kernel
    in the worker than in the re-fit) gets the decision of that fit score, instead of flipping.

    >>> _midway(np.array([0.0, 0.5, 1.0]))
    [(0.0, True), (0.25, False), (0.75, False)]
    """
    below = np.concatenate([[0.0], values[:-1]])
    middle = below + (values - below) / 2
    rules = []
    for v, m in zip(values.tolist(), middle.tolist()):
        if v == 0.0:
            rules.append(ALWAYS)
        elif m < v:
            rules.append((m, False))
        else:  # v and the score below are adjacent floats: no number between them
            rules.append((v, True))
    return rules


def upper_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the upper concave hull of the points (x, y), by increasing x.

    Of points with the same x only the highest counts. Andrew's monotone chain: one pass over the
    points (a cell's distinct fit scores), at fit time only.

    >>> upper_hull(np.array([0.0, 0.5, 0.5, 1.0, 0.25]), np.array([0.0, 0.2, 0.8, 1.0, 0.1])).tolist()
    [0, 2, 3]
    """
    order = np.lexsort((-y, x))
    first = np.concatenate([[True], np.diff(x[order]) > 0])
    hull: list[int] = []
    xs, ys = x.tolist(), y.tolist()
    for i in order[first].tolist():
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b stays only if it lies strictly above the chord from a to i (a clockwise turn)
            if (xs[b] - xs[a]) * (ys[i] - ys[a]) - (ys[b] - ys[a]) * (xs[i] - xs[a]) < 0:
                break
            hull.pop()
        hull.append(i)
    return np.array(hull, dtype=np.int64)


def _between(xs: np.ndarray, target: float) -> tuple[int, float]:
    """The hull segment (k, k + 1) holding ``target`` and the weight of vertex k + 1 that interpolates it."""
    k = int(np.clip(np.searchsorted(xs, target, side="right") - 1, 0, len(xs) - 2))
    weight = (target - xs[k]) / (xs[k + 1] - xs[k])
    return k, float(np.clip(weight, 0.0, 1.0))


def _solve_rate(cells: list[_CellCurve], metric: str) -> list[tuple[list, np.ndarray]]:
    """``dp`` / ``eopp``: the common rate maximising the stratum's correct decisions, and each cell's pair."""
    hulls = []
    for curve in cells:
        x, correct = curve.rate(metric), curve.correct
        vertices = upper_hull(x, correct)
        hulls.append((vertices, x[vertices], correct[vertices]))
    # Each cell's best accuracy at a rate is concave and piecewise linear in it: the sum peaks at a vertex.
    candidates = np.unique(np.concatenate([xs for _, xs, _ in hulls]))
    total = sum(np.interp(candidates, xs, ys) for _, xs, ys in hulls)
    target = candidates[int(np.argmax(total))]
    solved = []
    for curve, (vertices, xs, _) in zip(cells, hulls):
        k, weight = _between(xs, target)
        solved.append(([curve.rules[vertices[k]], curve.rules[vertices[k + 1]]], np.array([1.0 - weight, weight])))
    return solved


def _solve_odds(cells: list[_CellCurve]) -> list[tuple[list, np.ndarray]]:
    """``eo``: the common (FPR, TPR) on the upper boundary of the intersection of the cells' ROC hulls that
    maximises the stratum's correct decisions, and each cell's four rules."""
    hulls = []
    for curve in cells:
        fpr, tpr = curve.rate("fpr"), curve.rate("tpr")
        vertices = upper_hull(fpr, tpr)
        hulls.append((vertices, fpr[vertices], tpr[vertices]))
    grid = np.unique(np.concatenate([xs for _, xs, _ in hulls]))
    candidates = np.unique(np.concatenate([grid, _crossings(grid, [np.interp(grid, xs, ys) for _, xs, ys in hulls])]))
    # The lowest hull bounds the common TPR; accuracy P * TPR + N * (1 - FPR) is concave along it.
    lowest = np.min([np.interp(candidates, xs, ys) for _, xs, ys in hulls], axis=0)
    positives = sum(curve.positives for curve in cells)
    negatives = sum(curve.negatives for curve in cells)
    best = int(np.argmax(positives * lowest + negatives * (1.0 - candidates)))
    fpr, tpr = float(candidates[best]), float(lowest[best])
    solved = []
    for curve, (vertices, xs, ys) in zip(cells, hulls):
        k, weight = _between(xs, fpr)
        on_hull = (1.0 - weight) * ys[k] + weight * ys[k + 1]
        # Mix in the constant rate fpr (always : never = fpr : 1 - fpr), which sits on the diagonal (fpr, fpr).
        down = float(np.clip((on_hull - tpr) / (on_hull - fpr), 0.0, 1.0)) if on_hull > fpr else 0.0
        rules = [curve.rules[vertices[k]], curve.rules[vertices[k + 1]], ALWAYS, NEVER]
        solved.append((rules, np.array([(1 - down) * (1 - weight), (1 - down) * weight, down * fpr,
                                        down * (1 - fpr)])))
    return solved


def _crossings(grid: np.ndarray, curves: list[np.ndarray]) -> np.ndarray:
    """The x where two piecewise-linear curves (values on ``grid``, linear between its points) cross."""
    values = np.array(curves)
    gap = values[:, None, :] - values[None, :, :]  # (curve, curve, grid point)
    left, right = gap[..., :-1], gap[..., 1:]
    crossing = (left * right) < 0
    with np.errstate(divide="ignore", invalid="ignore"):
        where = grid[:-1] + (grid[1:] - grid[:-1]) * left / (left - right)
    return where[crossing]


# ---------------------------------------------------------------------------------------------
# inputs


def _fit_scores(score) -> np.ndarray:
    """Fit scores: a 1-D array of numbers in [0, 1]; an error names the first other value."""
    arr = np.asarray(score)
    if arr.ndim != 1:
        raise RepairInputError(f"score must be a 1-D array, got shape {arr.shape}")
    values, usable = _score_column(arr, len(arr))
    if not usable.all():
        i = int(np.argmin(usable))
        raise RepairInputError(f"score has the value {_item(arr[i])!r} at row {i}; scores are numbers in [0, 1]")
    if len(values) == 0:
        raise RepairInputError("cannot fit thresholds on 0 rows")
    return values


def _score_column(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The scores as float64 (NaN where not a number) and which are numbers in [0, 1]; a wrong length raises."""
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise RepairInputError(f"score must have one value per row ({n}), got shape {arr.shape}")
    if arr.dtype.kind in "fiub":
        floats = arr.astype(np.float64)
    else:  # text or objects (None): numbers where they convert, NaN elsewhere
        floats = np.array([_as_float(v) for v in arr.tolist()], dtype=np.float64).reshape(n)
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(floats) & (floats >= 0.0) & (floats <= 1.0)
    return floats, usable


def _as_float(value) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _labels(values, n: int, name: str, declared: Sequence | None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted labels (the declared ones, else those present) and each row's code; a missing or undeclared one raises."""
    labels = as_labels(values, n, name)
    missing = missing_mask(labels)
    if missing.any():
        raise RepairInputError(f"{name} is missing at row {int(np.argmax(missing))}; every fit row needs its {name}")
    labels = normalise_labels(labels)
    known = np.unique(labels) if declared is None else np.unique(normalise_labels(np.asarray(list(declared))))
    codes, unseen = encode_mask(labels, known)
    if unseen.any():
        raise RepairInputError(f"{name} has the value {_item(labels[np.argmax(unseen)])!r}, which is not among the "
                               f"declared {name} labels {known.tolist()}")
    return known, codes


def _item(value):
    return value.item() if isinstance(value, np.generic) else value
