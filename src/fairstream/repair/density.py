"""Probability mass functions on a uniform grid: the source pmfs the repair plans are built from.

A plan can only be as good as its source pmf's match to the records it is applied to: the
off-sample repair (Algorithm 2) sends a record at x to the plan row below x with probability
1 - tau and to the row above with probability tau, and clamps values outside the grid to the end
rows. So the pmf that matters is *the distribution of plan rows the arriving records use*; if a
group's records use row r with probability f(r) while the plan was built for p(r), its pushed
records are the barycentre reweighted by f/p, not the barycentre. Hence:

- ``linear_binning``: the rows used by a sample (exact for the research records themselves);
- ``kde_pmf``: the rows used by records drawn from a Gaussian KDE (the paper's Eq. 11-12),
  computed with :func:`row_kernel`, which integrates the kernel against Algorithm 2's linear
  interpolation and folds the tails beyond the grid onto the end rows, where clamped records go
  (a KDE evaluated at the nodes and renormalised would move that tail mass into the interior);
- ``group_pmfs``: the estimator used by the repair, built for thin research strata. A group of
  25 rows cannot say much about its shape, its stratum of 250 can: the group's pmf is the
  stratum's *pooled* counts reweighted by the group's share at each node (a density-ratio
  model), then smoothed with the group's own spread. The share is the posterior Pr[s | x_k, u]
  of :mod:`fairstream.repair.posterior`, blended with the observed share where many records
  contradict it; the smoothing is a Dirichlet-process blend of the counts and their KDE, which
  keeps atoms (half of Adult works exactly 40 hours a week; LSAC grades come in steps of 0.1).
  Both blend strengths are chosen by empirical Bayes (:func:`dirichlet_strength`,
  :func:`proportion_strength`), so the data decide how much they are smoothed and pooled.

A plan fit has one such estimate per (stratum, feature): :func:`group_pmfs_stack` (and the other
``*_stack`` and plural functions) computes them all in one vectorised pass over the problems' samples,
given by their distinct values and counts, with every grid zero-padded to the longest; the
single-problem functions are that pass with one problem.

>>> import numpy as np
>>> nodes = np.linspace(0.0, 4.0, 5)
>>> linear_binning(np.array([1.25]), nodes)
array([0.  , 0.75, 0.25, 0.  , 0.  ])
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy.special import gammaln, ndtr

# Candidate Dirichlet-process strengths n0 for empirical Bayes: 1 to 10^6 records, log-spaced.
STRENGTHS = 10.0 ** np.arange(0.0, 6.01, 0.25)
_SQRT_2PI = np.sqrt(2.0 * np.pi)


def _silverman(sd: np.ndarray, iqr: np.ndarray, n: np.ndarray, enough: np.ndarray) -> np.ndarray:
    """Silverman's rule from a sample's sd, IQR and size; 0 where there is not ``enough`` of it.

    IQR = 0 (a large atom: half of Adult works exactly 40 hours) falls back to ``1.06 * sd * n^(-1/5)``.
    """
    spread = np.where(iqr > 0, np.minimum(sd, iqr / 1.34), sd)
    factor = np.where(iqr > 0, 0.9, 1.06)
    return np.where(enough, factor * spread * np.where(enough, n, 1.0) ** -0.2, 0.0)


def silverman_bandwidth(x: np.ndarray) -> float:
    """Silverman's rule ``0.9 * min(sd, IQR / 1.34) * n^(-1/5)``.

    Features with a large atom (half of Adult works exactly 40 hours) have IQR = 0; the rule then
    falls back to ``1.06 * sd * n^(-1/5)``; a constant sample gets bandwidth 0 (a point mass).
    """
    x = np.sort(np.asarray(x, dtype=np.float64).ravel())
    return float(sample_bandwidths(x, np.ones(len(x)), np.zeros(len(x), dtype=np.intp), 1)[0])


def sample_bandwidths(x: np.ndarray, weights: np.ndarray, problem: np.ndarray, n_problems: int) -> np.ndarray:
    """Silverman's rule for each of several samples, given as values with integer ``weights`` (repeats).

    ``x`` is sorted within each sample and the samples are contiguous, in order of ``problem``. The sd
    is the sample's (ddof=1), the quartiles interpolate linearly between order statistics, as
    :func:`numpy.percentile` does.
    """
    n = np.bincount(problem, weights, minlength=n_problems)
    enough = n >= 2
    mean = np.bincount(problem, weights * x, minlength=n_problems) / np.where(n > 0, n, 1.0)
    squares = np.bincount(problem, weights * (x - mean[problem]) ** 2, minlength=n_problems)
    sd = np.sqrt(squares / np.where(enough, n - 1.0, 1.0))
    cumulative, before = np.cumsum(weights), np.cumsum(n) - n

    def order_statistic(i):  # the i-th smallest value (0-based) of each sample
        return x[np.minimum(np.searchsorted(cumulative, before + i, side="right"), len(x) - 1)]

    def quantile(q):
        position = q * np.maximum(n - 1.0, 0.0)
        low = np.floor(position)
        a, b, t = order_statistic(low), order_statistic(np.minimum(low + 1.0, np.maximum(n - 1.0, 0.0))), position - low
        return np.where(t >= 0.5, b - (b - a) * (1.0 - t), a + (b - a) * t)  # numpy's lerp

    return _silverman(sd, quantile(0.75) - quantile(0.25), n, enough)


def binned_bandwidth(nodes: np.ndarray, mass: np.ndarray, n_effective: float) -> float:
    """Silverman's rule for a sample given as ``mass`` on ``nodes`` with ``n_effective`` records.

    >>> nodes = np.arange(-40, 41) / 10.0
    >>> mass = np.exp(-0.5 * nodes ** 2)
    >>> round(binned_bandwidth(nodes, mass, 100.0) / (0.9 * 100 ** -0.2), 1)
    1.0
    """
    return float(binned_bandwidths(np.asarray(nodes, dtype=np.float64)[None], np.asarray(mass, dtype=np.float64)[None],
                                   np.array([float(n_effective)]))[0])


def binned_bandwidths(nodes: np.ndarray, mass: np.ndarray, n_effective: np.ndarray) -> np.ndarray:
    """:func:`binned_bandwidth` of each row of ``mass`` on the same row of ``nodes`` (rows padded with mass 0)."""
    total = mass.sum(axis=-1)
    safe = np.where(total > 0, total, 1.0)
    mean = (mass * nodes).sum(axis=-1) / safe
    sd = np.sqrt(np.maximum((mass * (nodes - mean[:, None]) ** 2).sum(axis=-1) / safe, 0.0))
    cdf = np.cumsum(mass, axis=-1) / safe[:, None]
    last = nodes.shape[-1] - 1
    q25, q75 = (np.minimum((cdf < q).sum(axis=-1), last) for q in (0.25, 0.75))  # searchsorted in each row
    rows = np.arange(len(nodes))
    iqr = nodes[rows, q75] - nodes[rows, q25]
    return _silverman(sd, iqr, n_effective, (total > 0) & (n_effective >= 2))


def bin_position(x: np.ndarray, start, step, n_nodes) -> tuple[np.ndarray, np.ndarray]:
    """Lower node index q and interpolation ratio tau in [0, 1] of each x on a uniform grid.

    Values are clamped to the grid, and the top node is reached as (q = n - 2, tau = 1), so row
    q + 1 always exists (the paper leaves x equal to the top node undefined). ``start``, ``step`` and
    ``n_nodes`` may be arrays (one grid per value); a one-node grid puts every value at q = 0, tau = 0.
    """
    if np.ndim(n_nodes) == 0:
        if n_nodes < 2 or step <= 0:
            return np.zeros(np.shape(x), dtype=np.intp), np.zeros(np.shape(x))
        single = False
    else:
        single = (np.asarray(n_nodes) < 2) | (np.asarray(step) <= 0)
        step, n_nodes = np.where(single, 1.0, step), np.where(single, 2, n_nodes)
    f = np.clip((np.asarray(x, dtype=np.float64) - start) / step, 0.0, n_nodes - 1.0)
    q = np.minimum(np.floor(f).astype(np.intp), n_nodes - 2)
    if single is False:
        return q, f - q
    return np.where(single, 0, q), np.where(single, 0.0, f - q)


def binned_counts(x: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(Weighted) counts of the sample ``x`` spread onto the two neighbouring nodes, not normalised."""
    n = len(nodes)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    return binned_counts_stack(np.asarray(x, dtype=np.float64), w[:, None], np.zeros(len(x), dtype=np.intp),
                               np.array([float(nodes[0])]), np.array([float(nodes[1] - nodes[0]) if n > 1 else 0.0]),
                               np.array([n]), n)[0, 0]


def binned_counts_stack(x: np.ndarray, weights: np.ndarray, problem: np.ndarray, start: np.ndarray, step: np.ndarray,
                        size: np.ndarray, n_nodes: int) -> np.ndarray:
    """:func:`binned_counts` of several samples at once: (n_problems, n_groups, n_nodes), zero-padded.

    Value ``x[i]`` belongs to sample ``problem[i]``, whose grid has ``size`` nodes from ``start`` by
    ``step``, and stands for ``weights[i, g]`` records of group g.
    """
    n_problems, n_groups = len(start), weights.shape[1]
    grids = (start[0], step[0], int(size[0])) if n_problems == 1 else (start[problem], step[problem], size[problem])
    q, tau = bin_position(x, *grids)
    width = n_nodes + 1  # room for the upper neighbour of a one-node grid's only node (it gets tau = 0)
    index = ((problem * n_groups)[:, None] + np.arange(n_groups)) * width + q[:, None]
    mass = np.bincount(index.ravel(), (weights * (1.0 - tau)[:, None]).ravel(), minlength=n_problems * n_groups * width)
    mass += np.bincount(index.ravel() + 1, (weights * tau[:, None]).ravel(), minlength=len(mass))
    return mass.reshape(n_problems, n_groups, width)[..., :n_nodes]


def linear_binning(x: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Mass of the sample ``x`` spread onto the two neighbouring nodes, normalised to sum 1."""
    mass = binned_counts(x, nodes, weights)
    total = mass.sum()
    return mass / total if total > 0 else mass


def _ramp(t: np.ndarray, h) -> np.ndarray:
    """E[(Y + t)^+] for Y ~ N(0, h^2): the integral of the normal CDF, whose second differences are hats."""
    z = t / h
    return t * ndtr(z) + h * np.exp(-0.5 * z * z) / _SQRT_2PI


def _is_identity(step: np.ndarray, size: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
    """Where the row kernel is the identity: one node, or a kernel a million times narrower than the
    spacing (it moves no measurable mass off its node)."""
    return (size < 2) | (bandwidth <= 1e-6 * step)


def _row_weights(step: np.ndarray, size: np.ndarray, bandwidth: np.ndarray,
                 n_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of :func:`row_kernel` for each grid (``size`` <= ``n_nodes`` nodes by ``step``).

    On a uniform grid an interior entry depends only on the lag i - j (``hat[:, i - j + n_nodes - 1]``),
    and every entry, the two end rows (``first``, ``last``: per source node) included, is a difference of
    the ramp at multiples of the step, so 2n + 1 kernel integrals replace n^2.
    """
    n = n_nodes
    ramp = _ramp(step[:, None] * np.arange(-n, n + 1, dtype=np.float64), bandwidth[:, None])  # [:, n + k] at k steps
    hat = (ramp[:, 2:] - 2.0 * ramp[:, 1:-1] + ramp[:, :-2]) / step[:, None]  # lags -(n - 1) .. n - 1
    # End rows: the half hat inside the grid plus everything beyond it.
    first = (ramp[:, n + 1:1:-1] - ramp[:, n:0:-1]) / step[:, None]  # source i: ramp(step - i step) - ramp(-i step)
    at = n + np.arange(n) - size[:, None] + 1  # source i: ramp((i - size + 2) step) - ramp((i - size + 1) step)
    last = (np.take_along_axis(ramp, at + 1, axis=1) - np.take_along_axis(ramp, at, axis=1)) / step[:, None]
    # Far from the source the second difference is a cancellation of near-equal values.
    return np.clip(hat, 0.0, None), np.clip(first, 0.0, None), np.clip(last, 0.0, None)


def row_kernel(nodes: np.ndarray, bandwidth: float) -> np.ndarray:
    """``K[j, i]``: probability that a record drawn from N(nodes[i], h^2) uses plan row j.

    Algorithm 2 interpolates linearly between the two rows around a value (a hat function per
    row) and clamps values outside the grid to the end rows; integrating the Gaussian against
    those weights gives closed forms in the normal CDF. Columns sum to 1: no mass is lost at the
    edges. Bandwidth 0 gives the identity.

    >>> K = row_kernel(np.arange(5.0), 1.0)
    >>> bool(np.allclose(K.sum(axis=0), 1.0)), bool(K[0, 0] > K[1, 1])
    (True, True)
    """
    n = len(nodes)
    step = np.array([float(nodes[1] - nodes[0]) if n > 1 else 0.0])
    size, h = np.array([n]), np.array([float(bandwidth)])
    if _is_identity(step, size, h)[0]:
        return np.eye(n)
    hat, first, last = (w[0] for w in _row_weights(step, size, h, n))
    K = hat[np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1]
    K[0], K[-1] = first, last
    return K


def spread(nodes: np.ndarray, bandwidth: float, mass: np.ndarray) -> np.ndarray:
    """``row_kernel(nodes, bandwidth) @ mass`` as a convolution with the lag weights: O(n) kernel integrals.

    >>> nodes, mass = np.arange(30.0), np.random.default_rng(0).random(30)
    >>> bool(np.allclose(spread(nodes, 2.5, mass), row_kernel(nodes, 2.5) @ mass))
    True
    """
    n = len(nodes)
    step = np.array([float(nodes[1] - nodes[0]) if n > 1 else 0.0])
    return spread_stack(step, np.array([n]), np.array([float(bandwidth)]), np.asarray(mass, dtype=np.float64)[None])[0]


def spread_stack(step: np.ndarray, size: np.ndarray, bandwidth: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """:func:`spread` of each row of ``mass`` (zero-padded beyond its grid's ``size`` nodes) with its own grid
    step and bandwidth: one windowed product for all rows, no loop over them."""
    out = mass.copy()
    rows = np.flatnonzero(~_is_identity(step, size, bandwidth))
    if rows.size == 0:
        return out
    n = mass.shape[1]
    hat, first, last = _row_weights(step[rows], size[rows], bandwidth[rows], n)
    m = mass[rows]
    # windows[r, j, i] = hat[r, i - j + n - 1]: the kernel's row j, a view of the lag weights, not a copy.
    windows = sliding_window_view(hat, n, axis=1)[:, ::-1]
    spread_rows = np.einsum("rji,ri->rj", windows, m)
    spread_rows[:, 0] = (first * m).sum(axis=1)
    spread_rows[np.arange(len(rows)), size[rows] - 1] = (last * m).sum(axis=1)
    spread_rows[np.arange(n) >= size[rows, None]] = 0.0
    out[rows] = spread_rows
    return out


def kde_pmf(x: np.ndarray, nodes: np.ndarray, bandwidth: float) -> np.ndarray:
    """Rows used by records drawn from the Gaussian KDE of ``x`` (Eq. 11-12), computed binned.

    The sample is linearly binned onto the grid and the bins are spread by :func:`row_kernel`
    (see :func:`spread`): exact when the data sit on the nodes (integer data on the integer lattice).
    """
    return _normalised(spread(nodes, bandwidth, binned_counts(x, nodes)))


def _normalised(mass: np.ndarray) -> np.ndarray:
    """Each row of ``mass`` divided by its sum (rows summing to 0 stay as they are)."""
    total = mass.sum(axis=-1, keepdims=True)
    return mass / np.where(total > 0, total, 1.0)


def _log_rising_sums(scale: np.ndarray, base: np.ndarray | None, counts: np.ndarray, rows: np.ndarray,
                     n_rows: int) -> np.ndarray:
    """Per candidate ``scale`` (n_candidates,) and row r: the sum over r's entries of
    log Gamma(alpha + counts) - log Gamma(alpha), alpha = scale * base (``base`` None: 1).

    ``base`` and ``counts`` (n_entries,) belong to ``rows`` (sorted). An entry without counts adds
    exactly 0, so only the others are evaluated (most of a padded grid's). Returns (n_candidates, n_rows).
    """
    keep = np.flatnonzero(counts > 0)
    starts = np.searchsorted(rows[keep], np.arange(n_rows))
    ends = np.append(starts[1:], len(keep))
    nonempty = ends > starts
    out = np.zeros((len(scale), n_rows))
    if not nonempty.any():
        return out
    if base is None:  # alpha is the candidate itself: its log Gamma once per entry
        terms = gammaln(scale[:, None] + counts[keep])
        out -= gammaln(scale)[:, None] * (ends - starts)
    else:
        alpha = scale[:, None] * base[keep]
        terms = gammaln(alpha + counts[keep]) - gammaln(alpha)
    out[:, nonempty] += np.add.reduceat(terms, starts[nonempty], axis=1)
    return out


def dirichlet_strength(counts: np.ndarray, base: np.ndarray) -> float:
    """Empirical-Bayes prior strength n0: the candidate in :data:`STRENGTHS` with the largest evidence.

    Repeated values the smooth base does not predict (atoms) pull n0 down, so the counts keep
    them; samples the base explains well push n0 up, so the smooth base replaces their noise.

    >>> rng = np.random.default_rng(0)
    >>> nodes = np.arange(100.0)
    >>> smooth = rng.normal(50, 10, 300)
    >>> atoms = np.where(rng.random(300) < 0.5, 40.0, smooth)
    >>> base = lambda x: kde_pmf(x, nodes, silverman_bandwidth(x))
    >>> n0_smooth = dirichlet_strength(binned_counts(smooth, nodes), base(smooth))
    >>> n0_atoms = dirichlet_strength(binned_counts(atoms, nodes), base(atoms))
    >>> bool(n0_smooth > 10 * n0_atoms)
    True
    """
    counts = np.asarray(counts, dtype=np.float64)
    return float(dirichlet_strengths(counts[None], np.asarray(base, dtype=np.float64)[None],
                                     np.ones((1, counts.shape[-1]), dtype=bool))[0])


def dirichlet_strengths(counts: np.ndarray, base: np.ndarray, on_grid: np.ndarray) -> np.ndarray:
    """:func:`dirichlet_strength` of each row of ``counts`` (n_problems, n_nodes) against the same row of
    ``base``, over the nodes ``on_grid`` (the rest is padding).

    The evidence of n0 is log Pr[counts | DP(n0, base)], the Dirichlet-multinomial marginal likelihood
    log Gamma(n0) - log Gamma(n0 + n) + sum_j [log Gamma(n0 base_j + c_j) - log Gamma(n0 base_j)];
    fractional counts (from linear binning) are allowed: the gamma functions interpolate.
    """
    # A base with (numerically) zero mass where data lie would make the evidence -inf for all n0.
    base = _normalised(np.where(on_grid, np.maximum(base, 1e-12), 0.0))
    n_problems, n_nodes = counts.shape
    rows = np.repeat(np.arange(n_problems), n_nodes)
    evidence = (gammaln(STRENGTHS)[:, None] - gammaln(STRENGTHS[:, None] + counts.sum(axis=1))
                + _log_rising_sums(STRENGTHS, base.ravel(), counts.ravel(), rows, n_problems))
    return STRENGTHS[np.argmax(evidence, axis=0)]


def proportion_strength(counts: np.ndarray, proportions: np.ndarray) -> float:
    """Empirical-Bayes strength m of a Dirichlet prior ``m * proportions`` on the groups' shares per node.

    ``counts`` and ``proportions`` are (n_groups, n_nodes): the groups' binned counts and a smooth
    model of Pr[s = g | x = node]. Shares that scatter around the model no more than sampling
    noise allows (thin groups) give a large m, so the model is trusted; a node whose share is far
    off with many records behind it (an atom such as 40 hours a week) pulls m down, so the
    groups keep their own shares where the data are strong.
    """
    counts = np.asarray(counts, dtype=np.float64)
    return float(proportion_strengths(counts[None], np.asarray(proportions, dtype=np.float64)[None],
                                      np.ones(counts.shape[:1], dtype=bool)[None],
                                      np.ones((1, counts.shape[-1]), dtype=bool))[0])


def proportion_strengths(counts: np.ndarray, proportions: np.ndarray, present: np.ndarray,
                         on_grid: np.ndarray) -> np.ndarray:
    """:func:`proportion_strength` of several problems: ``counts`` and ``proportions`` (n_problems, n_groups,
    n_nodes), over the groups ``present`` (n_problems, n_groups) and the nodes ``on_grid`` (n_problems, n_nodes).

    The evidence of m: per node j, the groups' counts are Dirichlet-multinomial with parameters
    m pi_gj (pi: the proportions normalised over the present groups), so it is the sum over nodes of
    log Gamma(m) - log Gamma(m + n_j) + sum_g [log Gamma(m pi_gj + c_gj) - log Gamma(m pi_gj)].
    """
    pi = _normalised(np.where(present[..., None], np.maximum(proportions, 1e-12), 0.0).swapaxes(1, 2)).swapaxes(1, 2)
    counts = np.where(present[..., None] & on_grid[:, None], counts, 0.0)
    n_problems, n_groups, n_nodes = counts.shape
    total = counts.sum(axis=1)
    evidence = (-_log_rising_sums(STRENGTHS, None, total.ravel(), np.repeat(np.arange(n_problems), n_nodes),
                                  n_problems)
                + _log_rising_sums(STRENGTHS, pi.ravel(), counts.ravel(),
                                   np.repeat(np.arange(n_problems), n_groups * n_nodes), n_problems))
    return STRENGTHS[np.argmax(evidence, axis=0)]


def group_pmfs(x: np.ndarray, codes: np.ndarray, n_groups: int, nodes: np.ndarray, bandwidth_scale: float = 1.0,
               proportions: np.ndarray | None = None, smoothing: str | float = "auto",
               strength: str | float = "auto") -> np.ndarray:
    """Source pmfs (n_groups, n_nodes) of the groups of one stratum and feature.

    ``x`` is the stratum's pooled research sample and ``codes`` each row's group. The pooled
    counts are reweighted towards each group by the group's share per node (a blend of its
    observed share and ``proportions[g]``, a smooth model of Pr[s = g | x = node]: the
    density-ratio model of the module docstring), then blended, as a Dirichlet process, with
    their KDE, whose bandwidth is ``bandwidth_scale`` times Silverman's rule for the reweighted
    sample (its spread and effective size). Pass a single group and no ``proportions`` to
    estimate a group alone. ``smoothing``: ``"auto"`` (both blends by empirical Bayes, or with
    the fixed ``strength``), ``"kde"`` (no atoms: the reweighted counts smoothed),
    ``"empirical"`` (each group's own linear binning), or a weight in [0, 1] of the ``"kde"``
    pmf against the group's own binning. :func:`group_pmfs_stack` does the same for many strata
    and features at once.
    """
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    weights = np.zeros((len(x), n_groups))
    weights[np.arange(len(x)), np.asarray(codes)[order]] = 1.0
    n = len(nodes)
    step = float(nodes[1] - nodes[0]) if n > 1 else 0.0
    return group_pmfs_stack(x[order], weights, np.zeros(len(x), dtype=np.intp), np.array([float(nodes[0])]),
                            np.array([step]), np.array([n]), bandwidth_scale,
                            None if proportions is None else np.asarray(proportions, dtype=np.float64)[None],
                            np.array([proportions is None and n_groups == 1]), smoothing, strength)[0]


def group_pmfs_stack(x: np.ndarray, weights: np.ndarray, problem: np.ndarray, start: np.ndarray, step: np.ndarray,
                     size: np.ndarray, bandwidth_scale: float = 1.0, proportions: np.ndarray | None = None,
                     alone: np.ndarray | None = None, smoothing: str | float = "auto",
                     strength: str | float = "auto") -> np.ndarray:
    """:func:`group_pmfs` of many (stratum, feature) problems in one vectorised pass: (n_problems, n_groups, n_nodes).

    Problem p's sample is the values ``x[problem == p]`` (sorted, contiguous, problems in order),
    value i standing for ``weights[i, g]`` records of group g; its grid has ``size[p]`` nodes from
    ``start[p]`` by ``step[p]`` (pmfs are zero-padded to the longest grid). ``proportions[p]`` is its
    model of the groups' shares per node (None: 1 everywhere); an ``alone`` problem is one group
    estimated on its own (its share is 1 at every node, whatever the blend strength).
    """
    n_problems, n_groups = len(start), weights.shape[1]
    n_nodes = int(size.max())
    on_grid = np.arange(n_nodes) < size[:, None]
    own = binned_counts_stack(x, weights, problem, start, step, size, n_nodes)
    present = own.sum(axis=-1) > 0
    own_pmf = _normalised(own)
    if smoothing == "empirical":
        return own_pmf
    alone = np.zeros(n_problems, dtype=bool) if alone is None else np.asarray(alone)
    if proportions is None:
        proportions = np.ones((n_problems, n_groups, n_nodes))
    elif alone.any():
        proportions = np.where(alone[:, None, None], 1.0, proportions)
    pooled = own.sum(axis=1)
    shares, auto = proportions, smoothing == "auto"
    if auto:
        m = np.full(n_problems, 1.0 if strength == "auto" else float(strength))
        m[alone] = 1.0  # any m: the group's share is 1 at every node
        if strength == "auto" and not alone.all():
            tilt = np.flatnonzero(~alone)
            m[tilt] = proportion_strengths(own[tilt], proportions[tilt], present[tilt], on_grid[tilt])
        # Where no research record fell (or with m = 0 and no data) the model's share stands.
        denominator = (pooled + m[:, None])[:, None]
        shares = np.divide(own + m[:, None, None] * proportions, denominator, out=proportions.astype(np.float64),
                           where=denominator > 0)
    # Reweight the pooled counts towards each present group, then smooth with the group's own spread.
    p, g = np.nonzero(present)
    tilted = pooled[p] * shares[p, g]
    n_effective = tilted.sum(axis=-1) ** 2 / np.maximum((pooled[p] * shares[p, g] ** 2).sum(axis=-1), 1e-300)
    nodes = start[p, None] + step[p, None] * np.arange(n_nodes)
    bandwidth = bandwidth_scale * binned_bandwidths(nodes, tilted, n_effective)
    if not auto:
        smoothed = spread_stack(step[p], size[p], bandwidth, tilted)
        atom_share = np.zeros(len(p))
    else:  # with the KDE of each problem's sample (the smooth base of its atoms' blend): one spread for all rows
        sample = bandwidth_scale * sample_bandwidths(x, weights.sum(axis=1), problem, n_problems)
        both = spread_stack(np.concatenate([step[p], step]), np.concatenate([size[p], size]),
                            np.concatenate([bandwidth, sample]), np.vstack([tilted, pooled]))
        smoothed, smooth = both[:len(p)], _normalised(both[len(p):])
        n0 = (dirichlet_strengths(pooled, smooth, on_grid) if strength == "auto"
              else np.full(n_problems, float(strength)))
        records = pooled.sum(axis=-1)
        atom_share = (records / (records + n0))[p]
    pmf = atom_share[:, None] * tilted + (1.0 - atom_share[:, None]) * smoothed
    total = pmf.sum(axis=-1, keepdims=True)
    pmfs = np.zeros((n_problems, n_groups, n_nodes))
    # A model share that underflowed to 0 everywhere leaves the group's own values.
    pmfs[p, g] = np.where(total > 0, pmf / np.where(total > 0, total, 1.0), own_pmf[p, g])
    if isinstance(smoothing, (int, float, np.number)):
        return (1.0 - float(smoothing)) * own_pmf + float(smoothing) * pmfs
    return pmfs
