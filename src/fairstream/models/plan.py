"""Distributional OT repair (Langbridge, Quinn and Shorten 2024, Algorithms 1 and 2).

``fit`` designs, for every stratum u of the unprotected attribute and every repaired feature k, a
grid, a source pmf per protected group s, their W2 barycentre and the exact OT plan from each
group to it (Algorithm 1). ``transform`` applies the frozen plans to any number of new rows: a
record picks the plan row below or above its value with probability linear in the distance, then
a target grid node from that row (Algorithm 2). The draws are counter-based hashes of (plan
fingerprint, record key, feature), so a record's output never depends on its batch.

Where research strata are thin (a planned group with fewer than ``pool_below`` research rows), each
group's source pmf borrows from its whole stratum (see :mod:`fairstream.repair.density`); elsewhere
each group is estimated alone, which needs no posterior fit. A plan also carries Pr[s | x, u] (see
:mod:`fairstream.repair.posterior`), so a record whose s is missing can, on request
(``impute_s=True``), be repaired under a draw of s keyed by its record hash.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.integers(0, 2, 2000); u = rng.integers(0, 2, 2000)
>>> X = rng.normal(s[:, None] * 1.0, 1.0, size=(2000, 2))
>>> repair = DistributionalRepair(n_q=50).fit(X, s, u)
>>> Xr = repair.transform(X, s, u, keys=np.arange(2000))
>>> gap_before = abs(X[s == 1, 0].mean() - X[s == 0, 0].mean())
>>> gap_after = abs(Xr[s == 1, 0].mean() - Xr[s == 0, 0].mean())
>>> bool(gap_after < 0.1 * gap_before)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from fairstream.repair import artifacts
from fairstream.repair.array_layout import (
    ArrayLayout,
    ArraySpec,
    Check,
    above,
    any_true,
    at_least,
    at_most,
    below,
    check_arrays,
    finite,
    int_parameter,
    names_parameter,
    nonempty,
    sorted_labels,
)
from fairstream.repair.density import bin_position, group_pmfs_stack
from fairstream.repair.estimator import Estimator
from fairstream.repair.hashing import keys_to_uint64, uniforms
from fairstream.repair.posterior import GroupPosterior, missing_mask
from fairstream.repair.protocol import Applied, Batch, Capabilities, IncompatibleArtifact, PipelineSchema, check_labels_cover
from fairstream.repair.transport import MonotonePlan, barycenter
from fairstream.repair.validation import (
    RepairInputError,
    as_2d,
    as_labels,
    check_finite,
    column_names,
    encode_mask,
    normalise_labels,
)

ARTIFACT_KIND = "plan"
OUT_OF_RANGE_POLICIES = ("clamp", "reject")
POOLING = ("tilt", "none")
# Salt of the imputed-s draw: independent of the repair's draws, which use the plain plan seed.
_IMPUTE_SALT = 0x5EED_0F_5
# A stored pmf sums to 1 up to the rounding of its construction (about 1e-15); anything further off is not a pmf.
_PMF_TOLERANCE = 1e-9
# A grid step must be at least this many machine epsilons of the grid's largest |node| (and a normal float), so
# consecutive nodes stay distinct after rounding and a record's bin position means something.
_NODE_SEPARATION = 16


@dataclass
class RepairResult:
    """Per-row outcome of :meth:`DistributionalRepair.repair`.

    ``values`` holds the repaired rows where ``ok`` is true and the original rows elsewhere;
    ``reasons[i]`` says why row i was not repaired (None when it was); ``out_of_range[i, k]``
    marks repaired feature k of row i as outside its stratum's grid (clamped or rejected);
    ``imputed[i]`` says row i had no s and was repaired under the drawn ``s[i]`` (``s`` holds
    the s each row was repaired under, or its input value when it was not repaired).

    Parameters
    ----------
    values : ndarray of shape (n_rows, n_features)
        Repaired rows where ``ok``, the original rows elsewhere.
    ok : ndarray of bool, shape (n_rows,)
        Which rows were repaired.
    reasons : list of (str or None), length n_rows
        Why each row was not repaired; None for repaired rows.
    out_of_range : ndarray of bool, shape (n_rows, n_features)
        Repaired values outside their stratum's grid (clamped or rejected).
    imputed : ndarray of bool, shape (n_rows,), or None, default=None
        Rows repaired under a drawn s; None when ``impute_s`` was off.
    s : ndarray of shape (n_rows,) or None, default=None
        The s each row was repaired under (its input value when not repaired).
    """

    values: np.ndarray
    ok: np.ndarray
    reasons: list
    out_of_range: np.ndarray
    imputed: np.ndarray | None = None
    s: np.ndarray | None = None

    @property
    def n_repaired(self) -> int:
        """How many rows were repaired."""
        return int(self.ok.sum())

    @property
    def n_out_of_range(self) -> int:
        """How many rows had a value outside the plan's grid."""
        return int(self.out_of_range[self.ok].any(axis=1).sum())

    @property
    def n_imputed(self) -> int:
        """How many repaired rows had their s imputed."""
        return 0 if self.imputed is None else int((self.imputed & self.ok).sum())


class DistributionalRepair(Estimator):
    """Frozen, off-sample distributional OT repair of ``X`` so that ``X`` is independent of ``s`` given ``u``.

    A scikit-learn style estimator (``get_params``, ``set_params``, ``sklearn.base.clone``, a repr of the
    changed parameters), except that ``fit(X, s, u)`` takes the protected attribute ``s`` and the strata
    ``u`` (the unprotected attribute) where scikit-learn's ``fit(X, y)`` takes labels; ``transform(X, s, u,
    keys)`` likewise. The constructor only stores the parameters; ``fit`` checks them.

    Parameters
    ----------
    n_q : int, default=250
        Grid nodes per (stratum, feature). Integer-valued features whose range fits in ``n_q``
        nodes get the integer lattice instead, so repaired values stay integers.
    repair_amount : float, default=1.0
        0 leaves data unchanged, 1 moves every group onto the barycentre; values in between move
        each record part of the way along its transport geodesic, ``x + t * (T(x) - x)``.
    group_weights : mapping of group to float or None, default=None
        Weight of each protected group in the barycentre, ``{s_value: weight}``; equal by default
        (the paper's t = 1/2 for two groups).
    smoothing : {"auto", "kde", "empirical"} or float, default="auto"
        How the source pmfs are estimated (see :mod:`fairstream.repair.density`): ``"auto"``
        (Dirichlet-process blends that keep atoms where the data support them), ``"kde"`` (KDE
        only: the paper's estimator with ``pooling="none"``), ``"empirical"`` (each group's own
        values), or a fixed weight in [0, 1] of the ``"kde"`` estimate against the own values.
    prior_strength : float or "auto", default="auto"
        Strength of the Dirichlet-process blends (the smooth part's weight is ``n0 / (n0 + n)``),
        or ``"auto"``: chosen per stratum and feature by empirical Bayes.
    pooling : {"tilt", "none"}, default="tilt"
        ``"tilt"``: in a thin stratum (see ``pool_below``) a group's pmf is the stratum's pooled
        research sample reweighted by Pr[s | x_k, u], so thin groups borrow their stratum's shape;
        ``"none"``: each group alone everywhere.
    pool_below : int or None, default=2000
        A stratum is thin, and pooled, when its smallest planned group has fewer research rows
        than this; in the others each group is estimated alone, which costs no posterior fit. None
        pools every stratum (as plans written before this parameter were fitted). At 2,000 rows a
        group gains nothing from pooling: on Adult's research splits (n_R = 10,000) pooled pmfs of
        groups with 1,000-2,000 rows are 11% closer (L1) to the archive's than each group's own,
        of groups above 2,000 rows 0.4%.
    bandwidth_scale : float, default=1.5
        Multiplies Silverman's bandwidth (1.5: best excess-E reduction on the paper's simulation;
        empirical Bayes returns to the data's own values where smoothing does not fit them).
    posterior : bool, default=True
        Fit and keep Pr[s | x, u] (all columns of X, per stratum), which ``impute_s`` draws from.
        It is most of a fit's time (its cross-validated calibration check refits it per fold): pass
        False where the pipeline does not impute s; pipelines that do refuse a plan without it.
    pad : float, default=0.0
        Grid padding on each side, as a fraction of the research range.
    out_of_range : {"clamp", "reject"}, default="clamp"
        ``"clamp"``: values outside the grid use the end row and are flagged in the result;
        ``"reject"``: such rows are not repaired and get a reason (the stream dead-letters them).
    features : sequence of int or None, default=None
        Indices of the columns to repair; the other columns pass through. Default: all.
    discrete : "auto" or sequence of bool, default="auto"
        ``"auto"`` (integer-valued research data), or one bool per repaired feature.
    min_group_size : int, default=2
        A (u, s) cell with fewer research rows gets no plan; its records are refused with a reason.
    columns : sequence of str or None, default=None
        Column names, used in error messages and reports.
    """

    def __init__(
        self,
        n_q: int = 250,
        repair_amount: float = 1.0,
        group_weights: Mapping | None = None,
        smoothing: str | float = "auto",
        prior_strength: float | str = "auto",
        pooling: str = "tilt",
        pool_below: int | None = 2000,
        bandwidth_scale: float = 1.5,
        posterior: bool = True,
        pad: float = 0.0,
        out_of_range: str = "clamp",
        features: Sequence[int] | None = None,
        discrete: str | Sequence[bool] = "auto",
        min_group_size: int = 2,
        columns: Sequence[str] | None = None,
    ):
        self.n_q = n_q
        self.repair_amount = repair_amount
        self.group_weights = group_weights
        self.smoothing = smoothing
        self.prior_strength = prior_strength
        self.pooling = pooling
        self.pool_below = pool_below
        self.bandwidth_scale = bandwidth_scale
        self.posterior = posterior
        self.pad = pad
        self.out_of_range = out_of_range
        self.features = features
        self.discrete = discrete
        self.min_group_size = min_group_size
        self.columns = columns

    # ------------------------------------------------------------------ fit (Algorithm 1)

    def fit(self, X, s, u) -> "DistributionalRepair":
        """Design the grids, barycentres and plans on research data.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Research features.
        s : array-like of shape (n_rows,)
            Protected attribute of each row.
        u : array-like of shape (n_rows,)
            Unprotected attribute (stratum) of each row.

        Returns
        -------
        self : DistributionalRepair
            The fitted estimator.
        """
        self._check_parameters()
        X = as_2d(X, columns=self.columns)
        names = column_names(X.shape[1], self.columns)
        check_finite(X, names)
        s = normalise_labels(as_labels(s, len(X), "s"))
        u = normalise_labels(as_labels(u, len(X), "u"))
        self.n_features_in_ = X.shape[1]
        self.columns_ = names
        self.features_ = self._feature_indices(X.shape[1])
        self.groups_, s_codes = labels_and_codes(s)
        self.strata_, u_codes = labels_and_codes(u)
        n_cells = len(self.strata_) * len(self.groups_)
        self.n_research_ = np.bincount(u_codes * len(self.groups_) + s_codes, minlength=n_cells).reshape(
            len(self.strata_), len(self.groups_))
        self.has_plan_ = self.n_research_ >= self.min_group_size
        self.pooled_ = self._pooled_strata()
        self._design(X, s_codes, u_codes)
        self.posterior_ = (GroupPosterior().fit_codes(X, s_codes, u_codes, self.groups_, self.strata_)
                           if self.posterior else None)
        self._prepare()
        return self

    def _design(self, X: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray) -> None:
        n_u, n_s, n_k = len(self.strata_), len(self.groups_), len(self.features_)
        # Per feature: each stratum's distinct values and each group's research rows at each.
        tables = [distinct_values(X[:, col], s_codes, u_codes, n_s, n_u) for col in self.features_]
        self.discrete_ = self._discrete_mask([table.values for table in tables])
        grids = [[self._grid(*table.range(a), self.discrete_[k], self.columns_[col])
                  for k, (col, table) in enumerate(zip(self.features_, tables))] for a in range(n_u)]
        n_max = max(len(g) for row in grids for g in row)
        self.grid_start_ = np.array([[g[0] for g in row] for row in grids])
        self.grid_step_ = np.array([[g[1] - g[0] if len(g) > 1 else 0.0 for g in row] for row in grids])
        self.grid_size_ = np.array([[len(g) for g in row] for row in grids], dtype=np.int64)
        self.source_pmf_ = np.zeros((n_u, n_s, n_k, n_max))
        self.barycenter_ = np.zeros((n_u, n_k, n_max))
        planned = np.flatnonzero(self.has_plan_.any(axis=1))
        if planned.size == 0:
            return
        self._source_pmfs(tables, planned)
        weights = self._weights()
        for a in planned:
            groups = np.flatnonzero(self.has_plan_[a])
            for k in range(n_k):
                m = int(self.grid_size_[a, k])
                self.barycenter_[a, k, :m] = barycenter(self.source_pmf_[a, groups, k, :m], grids[a][k],
                                                        weights[groups])

    def _source_pmfs(self, tables: list, planned: np.ndarray) -> None:
        """The source pmfs of every planned (u, s) cell and feature, as one :func:`group_pmfs_stack`.

        A thin stratum is one problem per feature (its pooled sample, tilted by Pr[s | x_k, u]); in
        the others each planned group is a problem of its own.
        """
        problems, cells = [], []  # (stratum, feature, group or None for pooled); (problem, stratum, group, feature)
        for a in planned:
            groups = np.flatnonzero(self.has_plan_[a])
            for k in range(len(self.features_)):
                if self.pooled_[a]:
                    cells += [(len(problems), a, b, k) for b in groups]
                    problems.append((a, k, None))
                else:
                    cells += [(len(problems) + j, a, b, k) for j, b in enumerate(groups)]
                    problems += [(a, k, b) for b in groups]
        samples = [tables[k].stratum(a) for a, k, _ in problems]
        weights = [counts if b is None else np.where(np.arange(counts.shape[1]) == b, counts, 0.0)
                   for (_, _, b), (_, counts) in zip(problems, samples)]
        a, k = (np.array([p[i] for p in problems]) for i in (0, 1))
        alone = np.array([b is not None for _, _, b in problems])
        size = self.grid_size_[a, k]
        pmfs = group_pmfs_stack(np.concatenate([v for v, _ in samples]), np.concatenate(weights),
                                np.repeat(np.arange(len(problems)), [len(v) for v, _ in samples]),
                                self.grid_start_[a, k], self.grid_step_[a, k], size, float(self.bandwidth_scale),
                                self._tilts(samples, a, k, alone), alone, self.smoothing, self.prior_strength)
        p, a, b, k = np.array(cells).T
        self.source_pmf_[a, b, k, :pmfs.shape[-1]] = pmfs[p, b]

    def _tilts(self, samples: list, a: np.ndarray, k: np.ndarray, alone: np.ndarray) -> np.ndarray | None:
        """The groups' shares per node of each pooled problem, the 1-D posterior Pr[s | x_k, u] (ones elsewhere):
        every pooled (stratum, feature) is a stratum of one :class:`GroupPosterior` fit."""
        pooled = np.flatnonzero(~alone)
        if pooled.size == 0:
            return None
        values = [samples[p][0][:, None] for p in pooled]
        counts = [samples[p][1] for p in pooled]
        records = [c.sum(axis=1) for c in counts]
        mean = np.array([[r @ v[:, 0] / r.sum()] for v, r in zip(values, records)])
        sd = np.array([[np.sqrt(r @ (v[:, 0] - m[0]) ** 2 / r.sum())] for v, r, m in zip(values, records, mean)])
        scale = np.where(sd > 0, sd, 1.0)  # a constant column stays 0 after standardising
        posterior = GroupPosterior(n_folds=0).fit_distinct(values, counts, mean, scale, self.groups_,
                                                           np.arange(len(pooled)))
        size = self.grid_size_[a, k]
        n_nodes = int(size.max())
        node = np.concatenate([np.arange(size[p]) for p in pooled])
        owner = np.repeat(np.arange(len(pooled)), size[pooled])
        nodes = self.grid_start_[a[pooled], k[pooled]][owner] + self.grid_step_[a[pooled], k[pooled]][owner] * node
        shares = np.ones((len(a), len(self.groups_), n_nodes))
        shares[pooled[owner], :, node] = posterior.proba_codes(nodes[:, None], owner)
        return shares

    def _grid(self, lo: float, hi: float, discrete: bool, name: str) -> np.ndarray:
        """Uniform grid over the (padded) research range [lo, hi] of one (stratum, feature)."""
        lo, hi = float(lo), float(hi)
        margin = self.pad * (hi - lo) if self.pad else 0.0  # 0 * inf would be NaN: a range of +-1.7e308 overflows
        lo, hi = lo - margin, hi + margin
        if discrete:
            lo, hi = float(np.floor(lo)), float(np.ceil(hi))
            if hi - lo + 1 <= self.n_q and separates(lo, 1.0, int(hi - lo) + 1):
                return lo + np.arange(int(hi - lo) + 1, dtype=np.float64)
        if hi == lo:
            return np.array([lo])
        step = (hi - lo) / (self.n_q - 1)
        if not separates(lo, step, self.n_q):  # what a plan could not load with (see array_layout)
            raise RepairInputError(f"column {name!r} spans [{float(lo)!r}, {float(hi)!r}], which float64 cannot split "
                                   f"into {self.n_q} distinct grid nodes at its magnitude; rescale it or lower n_q")
        return lo + step * np.arange(self.n_q)

    def _pooled_strata(self) -> np.ndarray:
        """Which strata are thin, and so pooled: the smallest planned group has fewer than ``pool_below`` rows."""
        if self.pooling == "none":
            return np.zeros(len(self.strata_), dtype=bool)
        if self.pool_below is None:
            return np.ones(len(self.strata_), dtype=bool)
        smallest = np.where(self.has_plan_, self.n_research_, np.iinfo(np.int64).max).min(axis=1)
        return smallest < self.pool_below

    def _weights(self) -> np.ndarray:
        if self.group_weights is None:
            return np.ones(len(self.groups_))
        missing = [g for g in self.groups_.tolist() if g not in self.group_weights]
        if missing:
            raise RepairInputError(f"group_weights has no weight for s value {missing[0]!r}")
        return np.array([float(self.group_weights[g]) for g in self.groups_.tolist()])

    def _feature_indices(self, n_columns: int) -> np.ndarray:
        if self.features is None:
            return np.arange(n_columns)
        idx = np.asarray(self.features, dtype=np.int64)
        if idx.size == 0 or idx.min() < 0 or idx.max() >= n_columns:
            raise RepairInputError(f"features must index the {n_columns} columns of X, got {list(self.features)}")
        return idx

    def _discrete_mask(self, values: list) -> np.ndarray:
        """Which repaired features are discrete, given each one's distinct research ``values``."""
        if isinstance(self.discrete, str):
            if self.discrete != "auto":
                raise RepairInputError(f"discrete must be 'auto' or a list of bools, got {self.discrete!r}")
            return np.array([bool(np.all(v == np.round(v))) for v in values])
        mask = np.asarray(self.discrete, dtype=bool)
        if mask.shape != (len(values),):
            raise RepairInputError(f"discrete needs one bool per repaired feature ({len(values)}), got {mask.shape}")
        return mask

    def _check_parameters(self) -> None:
        if not (isinstance(self.n_q, (int, np.integer)) and self.n_q >= 2):
            raise RepairInputError(f"n_q must be an integer >= 2, got {self.n_q!r}")
        if not 0.0 <= float(self.repair_amount) <= 1.0:
            raise RepairInputError(f"repair_amount must be in [0, 1], got {self.repair_amount!r}")
        if self.out_of_range not in OUT_OF_RANGE_POLICIES:
            raise RepairInputError(f"out_of_range must be one of {OUT_OF_RANGE_POLICIES}, got {self.out_of_range!r}")
        if self.pad < 0:
            raise RepairInputError(f"pad must be >= 0, got {self.pad!r}")
        if isinstance(self.smoothing, str):
            if self.smoothing not in ("auto", "kde", "empirical"):
                raise RepairInputError(f"smoothing must be 'auto', 'kde', 'empirical' or a float, got {self.smoothing!r}")
        elif not 0.0 <= float(self.smoothing) <= 1.0:
            raise RepairInputError(f"smoothing weight must be in [0, 1], got {self.smoothing!r}")
        if self.prior_strength != "auto" and not (isinstance(self.prior_strength, (int, float, np.number))
                                                   and float(self.prior_strength) >= 0):
            raise RepairInputError(f"prior_strength must be 'auto' or a number >= 0, got {self.prior_strength!r}")
        if self.pooling not in POOLING:
            raise RepairInputError(f"pooling must be one of {POOLING}, got {self.pooling!r}")
        if self.pool_below is not None and not (isinstance(self.pool_below, (int, np.integer))
                                                and not isinstance(self.pool_below, bool) and self.pool_below >= 0):
            raise RepairInputError(f"pool_below must be None or an integer >= 0, got {self.pool_below!r}")
        if not (isinstance(self.bandwidth_scale, (int, float, np.number)) and float(self.bandwidth_scale) > 0):
            raise RepairInputError(f"bandwidth_scale must be a number > 0, got {self.bandwidth_scale!r}")

    def _prepare(self) -> None:
        """Derive the apply-time state from the learned arrays (also after loading an artifact)."""
        posterior = [] if self.posterior_ is None else list(self.posterior_.to_arrays().values())
        # A plan without a posterior keeps the fingerprint (and so the draws) of older versions.
        self.fingerprint_ = artifacts.fingerprint_arrays(self.grid_start_, self.grid_step_, self.grid_size_,
                                                         self.source_pmf_, self.barycenter_, self.has_plan_, *posterior)
        self._seed = int(self.fingerprint_[:16], 16)
        self.grid_stop_ = self.grid_start_ + self.grid_step_ * (self.grid_size_ - 1)
        self._plans = {(a, b, k): self.plan(a, b, k) for a, b in zip(*np.nonzero(self.has_plan_))
                       for k in range(len(self.features_))}

    def plan(self, a: int, b: int, k: int) -> MonotonePlan:
        """The frozen plan of stratum index ``a``, group index ``b`` and repaired feature index ``k``."""
        size = int(self.grid_size_[a, k])
        return MonotonePlan.between(self.source_pmf_[a, b, k, :size], self.barycenter_[a, k, :size])

    # ------------------------------------------------------------------ apply (Algorithm 2)

    kind = ARTIFACT_KIND
    capabilities = Capabilities(agent="records", reads=frozenset({"features"}), writes=frozenset({"features"}),
                                place="repair", needs_s=True, fitted_range=True)

    def fitted_range(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(strata, lowest, highest): the range of each feature the plan's grids cover, per stratum."""
        return self.strata_, self.grid_start_, self.grid_stop_

    @property
    def seed(self) -> str:
        """The plan's fingerprint prefix that keys its draws (with the record key); provenance."""
        self._check_fitted()
        return self.fingerprint_[:16]

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a plan whose features, groups or strata do not match the pipeline's, or that cannot impute s when asked to."""
        self._check_fitted()
        if getattr(schema, "impute_s", False) and self.posterior_ is None:
            raise IncompatibleArtifact("the pipeline imputes missing s, but the plan has no posterior Pr[s | x, u] "
                                       "(fitted with posterior=False or by an older version); re-fit it")
        if schema.features and self.n_features_in_ != len(schema.features):
            raise IncompatibleArtifact(f"the plan repairs {self.n_features_in_} features {list(self.columns_)}, "
                                       f"the pipeline has {len(schema.features)} {list(schema.features)}")
        # A plan fitted without column names (x0, x1, ...) is matched by position only.
        named = list(self.columns_) != column_names(self.n_features_in_, None)
        if schema.features and named and tuple(self.columns_) != tuple(schema.features):
            raise IncompatibleArtifact(f"the plan was fitted on features {list(self.columns_)}, "
                                       f"the pipeline names {list(schema.features)}")
        check_labels_cover("plan", "groups", self.groups_.tolist(), schema.groups)
        check_labels_cover("plan", "strata", self.strata_.tolist(), schema.strata)

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: :meth:`repair` on a decoded batch (missing s imputed if ``batch.impute_s``)."""
        result = self.repair(batch.X, batch.s, batch.u, keys=batch.keys, impute_s=getattr(batch, "impute_s", False))
        return Applied(X=result.values, ok=result.ok, reasons=result.reasons,
                       out_of_range=result.out_of_range.any(axis=1), imputed=result.imputed, s=result.s)

    def probe(self) -> Batch:
        """The module protocol's load-time probe: per planned (u, s) cell, a record at its grids' starts and ends."""
        self._check_fitted()
        cells = np.argwhere(self.has_plan_)
        a, b = np.repeat(cells[:, 0], 2), np.repeat(cells[:, 1], 2)
        X = np.zeros((len(a), self.n_features_in_))
        X[:, self.features_] = np.where(np.arange(len(a))[:, None] % 2 == 0, self.grid_start_[a], self.grid_stop_[a])
        return Batch(X=X, keys=np.array([f"probe-{i}" for i in range(len(X))], dtype=object),
                     s=self.groups_[b], u=self.strata_[a], columns=tuple(self.columns_))

    def repair(self, X, s, u, keys=None, impute_s: bool = False) -> RepairResult:
        """Repair what can be repaired and say, per row, why the rest could not.

        Shape errors raise (they concern the batch); NaN/inf, unseen groups or strata, cells
        without a plan and (with ``out_of_range="reject"``) out-of-range values are per-row reasons.
        ``keys`` identify records for the deterministic draws. With keys, a record's output is a
        deterministic function of (plan, key), whatever batch it comes in; without, each row is keyed
        by its position in this call, so the same row in another batch may come out differently.
        A missing s (None or NaN) is a reason too, unless ``impute_s``: then s is drawn from the
        plan's Pr[s | x, u] with the record's key, and ``imputed`` marks the row.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features, in the fitted column order.
        s : array-like of shape (n_rows,)
            Protected attribute of each row.
        u : array-like of shape (n_rows,)
            Unprotected attribute (stratum) of each row.
        keys : array-like of shape (n_rows,) or None, default=None
            Record keys that seed the per-record draws; None keys each row by its position in this call.
        impute_s : bool, default=False
            Repair rows without s under an s drawn from the plan's Pr[s | x, u] instead of refusing them.

        Returns
        -------
        RepairResult
            The repaired values and, per row, whether it was repaired and why not.
        """
        self._check_fitted()
        X = as_2d(X, n_features=self.n_features_in_, columns=self.columns_)
        n = len(X)
        s_in = as_labels(s, n, "s")
        missing = missing_mask(s_in)
        # Missing entries get a placeholder label so the others normalise as usual (NaN would turn
        # a float column of codes into non-integers).
        s_known = np.where(missing, self.groups_[0], s_in) if missing.any() else s_in
        s_codes, s_unseen = encode_mask(normalise_labels(s_known), self.groups_)
        u_codes, u_unseen = encode_mask(normalise_labels(as_labels(u, n, "u")), self.strata_)
        key_hash = keys_to_uint64(np.arange(n) if keys is None else as_labels(keys, n, "keys"))
        finite = np.isfinite(X).all(axis=1)
        imputed = missing & finite & ~u_unseen if impute_s and self.posterior_ is not None else np.zeros(n, dtype=bool)
        if imputed.any():
            drawn, drawable = self._draw_s(X[imputed], u_codes[imputed], key_hash[imputed])
            s_codes[imputed] = drawn
            imputed[np.flatnonzero(imputed)[~drawable]] = False  # values that overflow Pr[s | x, u]: refused
        s_unseen &= ~missing
        planned = ~s_unseen & ~u_unseen & (~missing | imputed) & self.has_plan_[u_codes, s_codes]
        runnable = finite & planned
        out_of_range = np.zeros((n, len(self.features_)), dtype=bool)
        with np.errstate(over="ignore"):  # a value of 1e308 overflows its bin position, which is then clamped
            if runnable.all():  # the common case: no masked copies
                values, out_of_range = self._apply(X, s_codes, u_codes, key_hash)
            else:
                values = X.copy()
                values[runnable], out_of_range[runnable] = self._apply(X[runnable], s_codes[runnable],
                                                                       u_codes[runnable], key_hash[runnable])
        ok = runnable
        if self.out_of_range == "reject":
            ok = runnable & ~out_of_range.any(axis=1)
            values[~ok] = X[~ok]
        reasons = self._reasons(X, s_in, u, ok, finite, s_unseen, u_unseen, planned, out_of_range, missing,
                                impute_s, imputed)
        s_used = s_in.astype(object)
        s_used[planned] = self.groups_.astype(object)[s_codes[planned]]
        return RepairResult(values=values, ok=ok, reasons=reasons, out_of_range=out_of_range, imputed=imputed, s=s_used)

    def _draw_s(self, X: np.ndarray, u_codes: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Group codes drawn from Pr[s | x, u] restricted to the groups with a plan, keyed by record, and which
        rows had a finite Pr[s | x, u] to draw from (values far outside the research range overflow it)."""
        with np.errstate(over="ignore", invalid="ignore"):
            proba = self.posterior_.proba_codes(X, u_codes) * self.has_plan_[u_codes]
        cum = np.cumsum(proba, axis=1)
        level = uniforms(self._seed ^ _IMPUTE_SALT, keys, 1)[:, 0] * cum[:, -1]
        return np.minimum((level[:, None] >= cum).sum(axis=1), len(self.groups_) - 1), np.isfinite(cum[:, -1])

    def transform(self, X, s, u, keys=None) -> np.ndarray:
        """Repaired copy of ``X``; raises :class:`RepairInputError` naming the first bad value.

        The draws are keyed by ``keys``: with keys, a record's output is a deterministic function of
        (plan, key), bit for bit, whatever batch it comes in. Without keys, the draws are per call (each
        row is keyed by its position in this call), so the same row in another batch may come out differently.

        Parameters
        ----------
        X : array-like of shape (n_rows, n_features)
            Features, in the fitted column order.
        s : array-like of shape (n_rows,)
            Protected attribute of each row.
        u : array-like of shape (n_rows,)
            Unprotected attribute (stratum) of each row.
        keys : array-like of shape (n_rows,) or None, default=None
            Record keys that seed the per-record draws; None keys each row by its position in this call.

        Returns
        -------
        ndarray of shape (n_rows, n_features)
            The repaired rows, in the units of ``X``.
        """
        result = self.repair(X, s, u, keys)
        if not result.ok.all():
            raise RepairInputError(result.reasons[int(np.argmin(result.ok))])
        return result.values

    def fit_transform(self, X, s, u, keys=None) -> np.ndarray:
        """Fit on the research data and repair it (``keys`` as in :meth:`transform`)."""
        return self.fit(X, s, u).transform(X, s, u, keys)

    def _apply(self, X: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray, keys: np.ndarray):
        """Vectorised Algorithm 2 on valid rows: one pass per (u, s) cell and feature, none per row.

        Returns the repaired rows and the (row, feature) mask of values outside the stratum's grid.
        """
        out = X.copy()
        out_of_range = np.zeros((len(X), len(self.features_)), dtype=bool)
        draws = uniforms(self._seed, keys, 2 * len(self.features_))
        # Small integer codes let numpy's stable sort use radix sort: O(n) grouping by cell.
        cell = (u_codes * len(self.groups_) + s_codes).astype(np.int16 if self.has_plan_.size < 2**15 else np.int64)
        order = np.argsort(cell, kind="stable")
        bounds = np.flatnonzero(np.diff(cell[order])) + 1
        for rows in np.split(order, bounds):
            if rows.size == 0:
                continue
            a, b = divmod(int(cell[rows[0]]), len(self.groups_))
            for k, col in enumerate(self.features_):
                x = X[rows, col]
                out_of_range[rows, k] = (x < self.grid_start_[a, k]) | (x > self.grid_stop_[a, k])
                out[rows, col] = self._move(x, a, b, k, draws[rows, 2 * k], draws[rows, 2 * k + 1])
        return out, out_of_range

    def _move(self, x: np.ndarray, a: int, b: int, k: int, u_row: np.ndarray, u_col: np.ndarray) -> np.ndarray:
        start, step, size = self.grid_start_[a, k], self.grid_step_[a, k], int(self.grid_size_[a, k])
        q, tau = bin_position(x, start, step, size)
        row = q + (u_row < tau) if size > 1 else q
        target = start + step * self._plans[a, b, k].sample(row, u_col)
        t = float(self.repair_amount)
        if t == 1.0:
            return target
        return x + t * (target - x)

    def _reasons(self, X, s, u, ok, finite, s_unseen, u_unseen, planned, out_of_range, missing, impute_s,
                 imputed) -> list:
        """Messages for the refused rows only (a loop over bad rows, which are rare by construction)."""
        reasons: list = [None] * len(X)
        if ok.all():
            return reasons
        s_all = as_labels(s, len(X), "s").tolist()
        u_all = as_labels(u, len(X), "u").tolist()
        for i in np.flatnonzero(~ok):
            if not finite[i]:
                k = int(np.argmin(np.isfinite(X[i])))
                reasons[i] = f"column {self.columns_[k]!r} has a non-finite value {float(X[i, k])!r}"
            elif s_unseen[i]:
                reasons[i] = f"s value {s_all[i]!r} was not seen at fit time (known: {self.groups_.tolist()})"
            elif u_unseen[i]:
                reasons[i] = f"u value {u_all[i]!r} was not seen at fit time (known: {self.strata_.tolist()})"
            elif missing[i] and not impute_s:
                reasons[i] = "s is missing and this input does not impute it"
            elif missing[i] and self.posterior_ is None:
                reasons[i] = "s is missing and the plan has no posterior Pr[s | x, u] to impute it from; re-fit it"
            elif missing[i] and not imputed[i]:
                reasons[i] = "s is missing and Pr[s | x, u] is not finite at the row's values (far outside the " \
                             "research range), so it cannot be imputed"
            elif not planned[i]:
                reasons[i] = f"no plan for u={u_all[i]!r}, s={s_all[i]!r}: fewer than {self.min_group_size} research rows"
            else:
                k = int(np.argmax(out_of_range[i]))
                col = self.features_[k]
                a = int(np.flatnonzero(self.strata_ == normalise_labels(np.array(u_all[i:i + 1]))[0])[0])
                lo, hi = self.grid_start_[a, k], self.grid_stop_[a, k]
                reasons[i] = f"column {self.columns_[col]!r} value {float(X[i, col])!r} is outside the plan range [{lo:g}, {hi:g}] of u={u_all[i]!r}"
        return reasons

    def _check_fitted(self) -> None:
        if not hasattr(self, "source_pmf_"):
            raise RepairInputError("this DistributionalRepair is not fitted yet: call fit(X, s, u) first")

    # ------------------------------------------------------------------ transport maps (monitoring)

    def transport_map(self, x: np.ndarray, stratum, source, target) -> np.ndarray:
        """Deterministic monotone map of feature values from group ``source`` to group ``target``.

        ``x`` has one column per repaired feature. Used by the monitor's matched DP (Kim et al., Fairness Through Matching (2024)):
        ``T = F_target^-1 o F_source`` per feature on the stratum's grid, frozen at fit time.
        """
        self._check_fitted()
        a = int(np.searchsorted(self.strata_, normalise_labels(np.array([stratum]))[0]))
        b0, b1 = (int(np.searchsorted(self.groups_, normalise_labels(np.array([g]))[0])) for g in (source, target))
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        out = np.empty_like(x)
        for k in range(len(self.features_)):
            start, step, size = self.grid_start_[a, k], self.grid_step_[a, k], int(self.grid_size_[a, k])
            nodes = start + step * np.arange(size)
            cdf_src = np.cumsum(self.source_pmf_[a, b0, k, :size])
            cdf_dst = np.cumsum(self.source_pmf_[a, b1, k, :size])
            level = np.interp(x[:, k], nodes, cdf_src)
            out[:, k] = np.interp(level, cdf_dst, nodes)
        return out

    # ------------------------------------------------------------------ artifacts

    _LEARNED = ("features_", "discrete_", "groups_", "strata_", "n_research_", "has_plan_", "grid_start_",
                "grid_step_", "grid_size_", "source_pmf_", "barycenter_")

    def artifact_parameters(self) -> dict:
        """The constructor parameters, JSON-ready, with the fitted column names: sealed into the artifact."""
        return {
            "n_q": int(self.n_q),
            "repair_amount": float(self.repair_amount),
            "group_weights": None if self.group_weights is None else {str(k): float(v) for k, v in self.group_weights.items()},
            "smoothing": self.smoothing,
            "prior_strength": self.prior_strength if self.prior_strength == "auto" else float(self.prior_strength),
            "pooling": self.pooling,
            "pool_below": None if self.pool_below is None else int(self.pool_below),
            "bandwidth_scale": float(self.bandwidth_scale),
            "posterior": bool(self.posterior),
            "pad": float(self.pad),
            "out_of_range": self.out_of_range,
            "features": None if self.features is None else [int(i) for i in self.features],
            "discrete": self.discrete if isinstance(self.discrete, str) else [bool(v) for v in self.discrete],
            "min_group_size": int(self.min_group_size),
            "columns": list(self.columns_ if hasattr(self, "columns_") else self.columns or []) or None,
        }

    def to_artifact(self, version: int = 1, metrics: dict | None = None, data_fingerprint: str | None = None):
        """Freeze the fitted plans into an :class:`~fairstream.repair.artifacts.Artifact` of kind ``plan``.

        Parameters
        ----------
        version : int, default=1
            The artifact's version number.
        metrics : dict or None, default=None
            Fit-time metrics to record in the manifest (JSON numbers).
        data_fingerprint : str or None, default=None
            Fingerprint of the fit data (see :func:`~fairstream.repair.artifacts.fingerprint_arrays`).

        Returns
        -------
        Artifact
            An artifact of kind ``plan``.
        """
        self._check_fitted()
        arrays = {name.rstrip("_"): np.asarray(getattr(self, name)) for name in self._LEARNED}
        arrays["n_features_in"] = np.array(self.n_features_in_)
        if self.posterior_ is not None:
            arrays.update(self.posterior_.to_arrays())
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters=self.artifact_parameters(), metrics=metrics or {},
                              data_fingerprint=data_fingerprint, version=version)

    @classmethod
    def array_layout(cls, parameters: Mapping) -> ArrayLayout:
        """The arrays of a plan artifact: dtype, shape and value domain of each, checked at load.

        Dimensions: ``n_strata``, ``n_groups`` (the labels), ``n_repaired`` (repaired features),
        ``n_nodes`` (the longest grid) and ``n_features`` (the column names, and ``n_features_in``).
        """
        what = "plan artifact"
        enough = int_parameter(parameters, "min_group_size", what, low=0)
        weights = parameters.get("group_weights")
        cells, grids = ("n_strata", "n_groups"), ("n_strata", "n_repaired")
        pmf = (finite(), at_least(0.0))
        specs = (
            ArraySpec("n_features_in", "iu", (), (at_least(1),), binds="n_features"),
            ArraySpec("features", "iu", ("n_repaired",), (nonempty(), at_least(0), below("n_features"))),
            ArraySpec("discrete", "b", ("n_repaired",)),
            ArraySpec("groups", "iufU", ("n_groups",), (nonempty(), sorted_labels(), *_weighted(weights))),
            ArraySpec("strata", "iufU", ("n_strata",), (nonempty(), sorted_labels())),
            ArraySpec("n_research", "iu", cells, (at_least(0),)),
            ArraySpec("has_plan", "b", cells, (any_true(), _planned_where_enough(enough))),
            ArraySpec("grid_start", "f", grids, (finite(),)),
            ArraySpec("grid_size", "iu", grids, (at_least(1), at_most("n_nodes"))),
            ArraySpec("grid_step", "f", grids, (finite(), at_least(0.0), above(0.0, where=_MULTI_NODE),
                                                _finite_grid_end(), _separating_step())),
            ArraySpec("source_pmf", "f", (*cells, "n_repaired", "n_nodes"), (*pmf, _pmfs_on_grid(source=True))),
            ArraySpec("barycenter", "f", (*grids, "n_nodes"), (*pmf, _pmfs_on_grid(source=False))),
        )
        if parameters.get("posterior"):  # plans written before the posterior existed have no such parameter
            specs += GroupPosterior.array_specs()
        return ArrayLayout(specs, dims=names_parameter(parameters, "columns", what))

    @classmethod
    def from_artifact(cls, artifact) -> "DistributionalRepair":
        """Rebuild a fitted estimator from an artifact (bit-exact: same draws, same outputs).

        Every array is checked against :meth:`array_layout` and the parameters as ``fit`` checks
        them, so a plan that could not serve a batch is refused here, not on every batch.

        Parameters
        ----------
        artifact : Artifact
            An artifact of kind ``plan``.

        Returns
        -------
        DistributionalRepair
            The frozen module.
        """
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        check_arrays(artifact.arrays, cls.array_layout(artifact.parameters), "plan artifact")
        params = dict(artifact.manifest.parameters)
        columns = params.pop("columns")
        weights = params.pop("group_weights")
        params.setdefault("pool_below", None)  # plans written before the thin-strata rule pooled every stratum
        est = cls(**params, columns=columns)
        try:
            est._check_parameters()
        except RepairInputError as err:
            raise artifacts.ArtifactError(f"plan artifact: {err}") from None
        arrays = artifact.arrays
        for name in cls._LEARNED:
            setattr(est, name, arrays[name.rstrip("_")])
        est.group_weights = None if weights is None else dict(zip(est.groups_.tolist(), [weights[str(g)] for g in est.groups_.tolist()]))
        est.n_features_in_ = int(arrays["n_features_in"])
        est.pooled_ = est._pooled_strata()
        est.columns_ = column_names(est.n_features_in_, columns)
        # Plans written before the posterior existed load without one (and cannot impute s).
        has_posterior = bool(params.get("posterior"))
        est.posterior = has_posterior
        est.posterior_ = GroupPosterior.from_arrays(arrays, est.groups_, est.strata_) if has_posterior else None
        est._prepare()
        return est


def labels_and_codes(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ``labels`` and each row's index into them (``np.unique`` with ``return_inverse``).

    Small non-negative integer labels (the common case) are counted instead of sorted.
    """
    if labels.dtype.kind == "i" and len(labels) and 0 <= labels.min() and labels.max() < len(labels):
        seen = np.bincount(labels) > 0
        return np.flatnonzero(seen).astype(labels.dtype), (np.cumsum(seen) - 1)[labels]
    return np.unique(labels, return_inverse=True)


@dataclass(frozen=True)
class DistinctValues:
    """One feature's distinct research values in each stratum, sorted, with each group's research rows at each:
    stratum a's are ``values[bounds[a]:bounds[a + 1]]`` and the same rows of ``counts`` (n, n_groups).

    What the fit needs of a (stratum, feature) sample (range, binned counts, quartiles, the posterior's
    likelihood) depends on its rows only through these counts, and integer features have few values.
    """

    values: np.ndarray
    counts: np.ndarray
    bounds: np.ndarray

    def stratum(self, a: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratum ``a``'s distinct values and group counts."""
        rows = slice(self.bounds[a], self.bounds[a + 1])
        return self.values[rows], self.counts[rows]

    def range(self, a: int) -> tuple[float, float]:
        """Stratum ``a``'s smallest and largest value."""
        return self.values[self.bounds[a]], self.values[self.bounds[a + 1] - 1]


def distinct_values(x: np.ndarray, s_codes: np.ndarray, u_codes: np.ndarray, n_groups: int,
                    n_strata: int) -> DistinctValues:
    """The :class:`DistinctValues` of the feature column ``x`` (every stratum has at least one row)."""
    lo = x.min()
    with np.errstate(over="ignore"):  # a range of +-1.7e308 overflows: not a short one
        short = x.max() - lo < len(x)
    offset = x - lo if short else None
    code = offset.astype(np.int64) if short else None
    if short and np.array_equal(code, offset):  # integers in a short range: their offsets are codes
        lattice = lo + np.arange(int(code.max()) + 1, dtype=np.float64)
    else:  # other values: their codes by sorting them
        lattice, code = np.unique(x, return_inverse=True)
    key = u_codes * len(lattice) + code  # (stratum, value)
    if n_strata * len(lattice) <= 4 * len(x):  # a table of every (stratum, value) is small: count into it
        table = np.bincount(key * n_groups + s_codes, minlength=n_strata * len(lattice) * n_groups)
        table = table.reshape(-1, n_groups)
        row_key = np.flatnonzero(table.any(axis=1))
        counts = table[row_key].astype(np.float64)
    else:  # sort the rows' (stratum, value) keys instead
        row_key, row = np.unique(key, return_inverse=True)
        counts = np.bincount(row * n_groups + s_codes, minlength=len(row_key) * n_groups).reshape(-1, n_groups)
        counts = counts.astype(np.float64)
    bounds = np.searchsorted(row_key // len(lattice), np.arange(n_strata + 1))
    return DistinctValues(lattice[row_key % len(lattice)], counts, bounds)


# ---------------------------------------------------------------------------------------------
# value domains of a plan's arrays (see DistributionalRepair.array_layout)

_MULTI_NODE = ("grid_size > 1", lambda ctx: ctx.arrays["grid_size"] > 1)


def grid_end(start, step, size) -> np.ndarray:
    """The last node of each grid, as a plan computes it (inf when it overflows)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(start) + np.asarray(step) * (np.asarray(size) - 1)


def separates(start, step, size) -> np.ndarray:
    """Whether a grid of ``size`` nodes from ``start`` by ``step`` has a finite end and distinct nodes.

    The step must be a normal float and at least ``_NODE_SEPARATION`` epsilons of the grid's largest |node|:
    a step of 5e-324, or of 1 on nodes near 1e17, would round consecutive nodes together.

    >>> separates([0.0, 1e17, 0.0, 1e308], [0.5, 1.0, 5e-324, 1e308], 3).tolist()
    [True, False, False, False]
    """
    end = grid_end(start, step, size)
    magnitude = np.maximum(np.abs(start), np.abs(end))
    smallest = np.maximum(np.finfo(np.float64).tiny, _NODE_SEPARATION * np.finfo(np.float64).eps * magnitude)
    with np.errstate(invalid="ignore"):
        return np.isfinite(end) & (np.asarray(step) >= smallest)


def _finite_grid_end() -> Check:
    """A multi-node grid ends at a finite value: start 1e308 by 1e308 would repair records to inf."""
    def bad(step, ctx):
        end = grid_end(ctx.arrays["grid_start"], step, ctx.arrays["grid_size"])
        return ~np.isfinite(end) & (ctx.arrays["grid_size"] > 1), end
    return Check("such that each grid ends at a finite value (grid_start + grid_step * (grid_size - 1))", bad)


def _separating_step() -> Check:
    """A multi-node grid's step separates its nodes (see :func:`separates`)."""
    def bad(step, ctx):
        size = ctx.arrays["grid_size"]
        return ~separates(ctx.arrays["grid_start"], step, size) & (size > 1), step
    return Check(f"a normal float of at least {_NODE_SEPARATION} epsilons of the grid's largest |node| "
                 "(consecutive nodes distinct) where grid_size > 1", bad)


def _pmfs_on_grid(source: bool) -> Check:
    """Each pmf a plan samples sums to 1 over its grid's first ``grid_size`` nodes: the source pmf of
    every cell with a plan, the barycentre of every stratum with one."""
    def bad(pmf, ctx):
        size, has_plan = ctx.arrays["grid_size"], ctx.arrays["has_plan"]
        nodes = np.arange(pmf.shape[-1])
        if source:
            on_grid, used = nodes < size[:, None, :, None], has_plan[:, :, None]
        else:
            on_grid, used = nodes < size[:, :, None], has_plan.any(axis=1)[:, None]
        total = np.where(on_grid, pmf, 0.0).sum(axis=-1)
        return ~(np.abs(total - 1.0) <= _PMF_TOLERANCE) & used, total
    return Check("a pmf summing to 1 on the first grid_size nodes of every planned cell", bad)


def _planned_where_enough(min_group_size: int) -> Check:
    """A cell has a plan exactly when it had ``min_group_size`` research rows (as ``fit`` decides)."""
    return Check(f"true exactly where n_research >= min_group_size ({min_group_size})",
                 lambda has_plan, ctx: (has_plan != (ctx.arrays["n_research"] >= min_group_size), has_plan))


def _weighted(weights: Mapping | None) -> tuple[Check, ...]:
    """With ``group_weights``, every group label must have a weight (the barycentre was built with them)."""
    if weights is None:
        return ()
    if not isinstance(weights, dict):
        raise artifacts.ArtifactError(f"plan artifact: parameter 'group_weights' must be an object, got {weights!r}")
    return (Check(f"labels group_weights weighs ({sorted(weights)})",
                  lambda groups, ctx: (~np.isin(groups.astype(str), list(weights)), groups)),)
