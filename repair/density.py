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

>>> import numpy as np
>>> nodes = np.linspace(0.0, 4.0, 5)
>>> linear_binning(np.array([1.25]), nodes)
array([0.  , 0.75, 0.25, 0.  , 0.  ])
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, ndtr

# Candidate Dirichlet-process strengths n0 for empirical Bayes: 1 to 10^6 records, log-spaced.
STRENGTHS = 10.0 ** np.arange(0.0, 6.01, 0.25)
_SQRT_2PI = np.sqrt(2.0 * np.pi)


def silverman_bandwidth(x: np.ndarray) -> float:
    """Silverman's rule ``0.9 * min(sd, IQR / 1.34) * n^(-1/5)``.

    Features with a large atom (half of Adult works exactly 40 hours) have IQR = 0; the rule then
    falls back to ``1.06 * sd * n^(-1/5)``; a constant sample gets bandwidth 0 (a point mass).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size < 2:
        return 0.0
    sd = float(np.std(x, ddof=1))
    iqr = float(np.subtract(*np.percentile(x, [75, 25])))
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    factor = 0.9 if iqr > 0 else 1.06
    return factor * spread * x.size ** (-0.2)


def binned_bandwidth(nodes: np.ndarray, mass: np.ndarray, n_effective: float) -> float:
    """Silverman's rule for a sample given as ``mass`` on ``nodes`` with ``n_effective`` records.

    >>> nodes = np.arange(-40, 41) / 10.0
    >>> mass = np.exp(-0.5 * nodes ** 2)
    >>> round(binned_bandwidth(nodes, mass, 100.0) / (0.9 * 100 ** -0.2), 1)
    1.0
    """
    total = mass.sum()
    if total <= 0 or n_effective < 2:
        return 0.0
    mean = mass @ nodes / total
    sd = float(np.sqrt(max(mass @ (nodes - mean) ** 2 / total, 0.0)))
    cdf = np.cumsum(mass) / total
    q25, q75 = nodes[np.searchsorted(cdf, [0.25, 0.75])]
    iqr = float(q75 - q25)
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    factor = 0.9 if iqr > 0 else 1.06
    return factor * spread * n_effective ** (-0.2)


def bin_position(x: np.ndarray, start: float, step: float, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower node index q and interpolation ratio tau in [0, 1] of each x on a uniform grid.

    Values are clamped to the grid, and the top node is reached as (q = n - 2, tau = 1), so row
    q + 1 always exists (the paper leaves x equal to the top node undefined).
    """
    if n_nodes < 2 or step <= 0:
        return np.zeros(np.shape(x), dtype=np.intp), np.zeros(np.shape(x))
    f = np.clip((np.asarray(x, dtype=np.float64) - start) / step, 0.0, n_nodes - 1.0)
    q = np.minimum(np.floor(f).astype(np.intp), n_nodes - 2)
    return q, f - q


def binned_counts(x: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """(Weighted) counts of the sample ``x`` spread onto the two neighbouring nodes, not normalised."""
    n = len(nodes)
    step = float(nodes[1] - nodes[0]) if n > 1 else 0.0
    q, tau = bin_position(x, float(nodes[0]), step, n)
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64)
    mass = np.bincount(q, w * (1.0 - tau), minlength=n)
    if n > 1:
        mass += np.bincount(q + 1, w * tau, minlength=n)
    return mass


def linear_binning(x: np.ndarray, nodes: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Mass of the sample ``x`` spread onto the two neighbouring nodes, normalised to sum 1."""
    mass = binned_counts(x, nodes, weights)
    total = mass.sum()
    return mass / total if total > 0 else mass


def _ramp(t: np.ndarray, h: float) -> np.ndarray:
    """E[(Y + t)^+] for Y ~ N(0, h^2): the integral of the normal CDF, whose second differences are hats."""
    z = t / h
    return t * ndtr(z) + h * np.exp(-0.5 * z * z) / _SQRT_2PI


def _row_weights(nodes: np.ndarray, bandwidth: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The distinct values of :func:`row_kernel`: on a uniform grid an interior entry depends only on
    the lag i - j (``hat[i - j + n - 1]``), and every entry, the two end rows included, is a difference
    of the ramp at multiples of the step, so 2n + 1 kernel integrals replace n^2. None where the kernel
    is the identity."""
    n = len(nodes)
    step = float(nodes[1] - nodes[0]) if n > 1 else 0.0
    # A kernel a million times narrower than the spacing moves no measurable mass off its node.
    if n < 2 or bandwidth <= 1e-6 * step:
        return None
    ramp = _ramp(step * np.arange(-n, n + 1, dtype=np.float64), bandwidth)  # ramp[n + k] at k steps
    hat = (ramp[2:] - 2.0 * ramp[1:-1] + ramp[:-2]) / step  # lags -(n - 1) .. n - 1
    # End rows: the half hat inside the grid plus everything beyond it.
    first = (ramp[n + 1:1:-1] - ramp[n:0:-1]) / step  # source i: ramp(step - i step) - ramp(-i step)
    last = (ramp[2:n + 2] - ramp[1:n + 1]) / step  # source i: ramp((i - n + 2) step) - ramp((i - n + 1) step)
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
    weights = _row_weights(nodes, bandwidth)
    if weights is None:
        return np.eye(n)
    hat, first, last = weights
    K = hat[np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1]
    K[0], K[-1] = first, last
    return K


def spread(nodes: np.ndarray, bandwidth: float, mass: np.ndarray) -> np.ndarray:
    """``row_kernel(nodes, bandwidth) @ mass`` as a convolution with the lag weights: O(n) kernel integrals.

    >>> nodes, mass = np.arange(30.0), np.random.default_rng(0).random(30)
    >>> bool(np.allclose(spread(nodes, 2.5, mass), row_kernel(nodes, 2.5) @ mass))
    True
    """
    mass = np.asarray(mass, dtype=np.float64)
    weights = _row_weights(nodes, bandwidth)
    if weights is None:
        return mass.copy()
    hat, first, last = weights
    n = len(nodes)
    out = np.convolve(mass, hat[::-1])[n - 1:2 * n - 1]  # out[j] = sum_i hat[i - j + n - 1] * mass[i]
    out[0], out[-1] = first @ mass, last @ mass
    return out


def kde_pmf(x: np.ndarray, nodes: np.ndarray, bandwidth: float) -> np.ndarray:
    """Rows used by records drawn from the Gaussian KDE of ``x`` (Eq. 11-12), computed binned.

    The sample is linearly binned onto the grid and the bins are spread by :func:`row_kernel`
    (see :func:`spread`): exact when the data sit on the nodes (integer data on the integer lattice).
    """
    dens = spread(nodes, bandwidth, binned_counts(x, nodes))
    total = dens.sum()
    return dens / total if total > 0 else dens


def dirichlet_log_evidence(counts: np.ndarray, base: np.ndarray, strength: float | np.ndarray) -> float | np.ndarray:
    """log Pr[counts | DP(strength, base)]: the Dirichlet-multinomial marginal likelihood.

    Fractional counts (from linear binning) are allowed: the gamma functions interpolate. An array
    of strengths gives one evidence each.
    """
    strength = np.asarray(strength, dtype=np.float64)
    alpha = strength[..., None] * base
    evidence = (gammaln(strength) - gammaln(strength + counts.sum())
                + np.sum(gammaln(alpha + counts) - gammaln(alpha), axis=-1))
    return float(evidence) if evidence.ndim == 0 else evidence


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
    # A base with (numerically) zero mass where data lie would make the evidence -inf for all n0.
    base = np.maximum(base, 1e-12)
    base = base / base.sum()
    return float(STRENGTHS[int(np.argmax(dirichlet_log_evidence(counts, base, STRENGTHS)))])


def proportion_strength(counts: np.ndarray, proportions: np.ndarray) -> float:
    """Empirical-Bayes strength m of a Dirichlet prior ``m * proportions`` on the groups' shares per node.

    ``counts`` and ``proportions`` are (n_groups, n_nodes): the groups' binned counts and a smooth
    model of Pr[s = g | x = node]. Shares that scatter around the model no more than sampling
    noise allows (thin groups) give a large m, so the model is trusted; a node whose share is far
    off with many records behind it (an atom such as 40 hours a week) pulls m down, so the
    groups keep their own shares where the data are strong.
    """
    pi = np.maximum(proportions, 1e-12)
    pi = pi / pi.sum(axis=0, keepdims=True)
    total = counts.sum(axis=0)
    m = STRENGTHS[:, None, None]  # every candidate at once: candidates x groups x nodes
    evidence = (np.sum(gammaln(m[:, 0]) - gammaln(m[:, 0] + total), axis=1)
                + np.sum(gammaln(m * pi + counts) - gammaln(m * pi), axis=(1, 2)))
    return float(STRENGTHS[int(np.argmax(evidence))])


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
    pmf against the group's own binning.
    """
    own = np.array([binned_counts(x[codes == g], nodes) for g in range(n_groups)])
    present = own.sum(axis=1) > 0
    own_pmf = own / np.where(present, own.sum(axis=1), 1.0)[:, None]
    alone = proportions is None and n_groups == 1
    if proportions is None:  # no pooling: one group's rows are the whole "stratum"
        proportions = np.ones((n_groups, len(nodes)))
    if smoothing == "empirical":
        return own_pmf
    pooled = own.sum(axis=0)
    atom_share, shares = 0.0, proportions
    if smoothing == "auto":
        smooth = kde_pmf(x, nodes, bandwidth_scale * silverman_bandwidth(x))
        n0 = dirichlet_strength(pooled, smooth) if strength == "auto" else float(strength)
        if alone:
            m = 1.0  # any m: the group's share is 1 at every node
        elif strength == "auto":
            m = proportion_strength(own[present], proportions[present])
        else:
            m = float(strength)
        atom_share = pooled.sum() / (pooled.sum() + n0)
        # Where no research record fell (or with m = 0 and no data) the model's share stands.
        denominator = pooled + m
        shares = np.divide(own + m * proportions, denominator, out=proportions.astype(np.float64).copy(),
                           where=denominator > 0)
    pmfs = np.zeros((n_groups, len(nodes)))
    for g in np.flatnonzero(present):
        # Reweight the pooled counts towards the group, then smooth with the group's own spread.
        tilted = pooled * shares[g]
        n_effective = tilted.sum() ** 2 / max(float(pooled @ shares[g] ** 2), 1e-300)
        smoothed = spread(nodes, bandwidth_scale * binned_bandwidth(nodes, tilted, n_effective), tilted)
        pmf = atom_share * tilted + (1.0 - atom_share) * smoothed
        # A model share that underflowed to 0 everywhere leaves the group's own values.
        pmfs[g] = pmf / pmf.sum() if pmf.sum() > 0 else own_pmf[g]
    if isinstance(smoothing, (int, float, np.number)):
        return (1.0 - float(smoothing)) * own_pmf + float(smoothing) * pmfs
    return pmfs
