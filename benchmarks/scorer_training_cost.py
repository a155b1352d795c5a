"""Per-step cost of training fair scorers on CPU: FTM's exact matching and the OTF dual, at batch 256 / 1024 / 4096.

Printed as ratios to a plain cross-entropy step measured in the same run (a benchmark prints
figures, it asserts nothing). Data: Adult rows (the bundled CSV), as the reproductions use them.

- FTM (Kim et al., TMLR 2024): a batch holds B rows of each of the two groups; the MLP is the
  paper's (two hidden layers of width d = 101). Timed: the B x B squared-distance matrix plus the
  exact assignment (scipy's Hungarian ``linear_sum_assignment``), and a whole FTM step (matching,
  forward, backward, Adam); the baseline is a cross-entropy step on the same 2B rows. Reg's step
  (a mean-score gap) for reference.
- OTF (Buyl and De Bie, NeurIPS 2022): a batch of B rows, logistic regression on 96 standardised
  features, PEO on sex and race (8 constraint rows). Timed: the cost matrix, the dual solve of
  OTF_eps and OTFR_eps from zero and warm-started from the previous batch's duals (L-BFGS on the
  semi-dual), and a whole OTF step; the baseline is a cross-entropy step of the logistic regression
  on the same B rows. The norm penalty's step for reference. Steps are timed cold (a fresh
  penalty: no cached assignment, duals from zero); the cheap baselines are the best of 5 calls.
- The dual solver against the paper's coordinate ascent (its Eqs. 9-10, with the closed-form
  update of a binary constraint's dual), at B = 256: sweeps / iterations and seconds to the same
  constraint residual max |G f| <= 1e-6.

    .venv/bin/python benchmarks/scorer_training_cost.py             # about 3 minutes (4096 is slow)
    .venv/bin/python benchmarks/scorer_training_cost.py --sizes 256,1024
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import time

import numpy as np
import torch
from scipy.special import logsumexp

from fairstream.models.ftm import GapPenalty, MatchingPenalty
from fairstream.models.otf_training import NormPenalty, OTFPenalty
from fairstream.models.scorer_training import ScorerNet, TrainingData
from fairstream.repair import datasets
from fairstream.repair.group_maps import exact_matching
from fairstream.repair.measure.otf import constraint_matrix, cost_matrix, one_hot, otf0


def best_of(call, repeats: int) -> float:
    """Smallest wall time of ``repeats`` calls (seconds)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def adult():
    drop = {"fnlwgt", "sex_Female", "sex_Male", "salary_<=50K", "salary_>50K"}
    columns = [c for c in datasets.available_columns("adult") if c not in drop]
    ds = datasets.load_adult(features=columns)
    X = ds.X
    lo, hi = X.min(axis=0), X.max(axis=0)
    Z = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    race = [k for k, c in enumerate(columns) if c.startswith("race_")]
    white = ds.X[:, columns.index("race_White")].astype(int)
    kept = [k for k in range(len(columns)) if k not in race]
    standardised = (X[:, kept] - X[:, kept].mean(0)) / np.where(X[:, kept].std(0) > 0, X[:, kept].std(0), 1.0)
    S = np.column_stack([one_hot(ds.s)[0], one_hot(white)[0]])
    return Z, standardised, ds.s, ds.y, S


def step_timer(net: ScorerNet, X: torch.Tensor, y: torch.Tensor, penalty=None, rows=None, blocks=None):
    """One training step (forward, loss, backward, Adam) as a callable."""
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step():
        logits = net(X)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
        if penalty is not None:
            loss = loss + penalty(torch.sigmoid(logits), rows, blocks)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()

    return step


def ftm_costs(Z, s, y, size: int, rng, repeats: int) -> dict:
    rows = np.concatenate([rng.choice(np.flatnonzero(s == g), size, replace=False) for g in (0, 1)])
    blocks = [np.arange(size), np.arange(size, 2 * size)]
    data = TrainingData(X=Z, Z=Z, standardised=Z, codes=s, y=y, S=one_hot(s)[0], reference=1, groups=np.array([0, 1]))
    d = Z.shape[1]
    torch.manual_seed(0)
    net = ScorerNet(np.zeros(d), np.ones(d), (d, d))
    X, labels = torch.as_tensor(Z[rows], dtype=torch.float32), torch.as_tensor(y[rows], dtype=torch.float32)
    ce = best_of(step_timer(net, X, labels), 5)
    matching = best_of(lambda: exact_matching(Z[rows[:size]], Z[rows[size:]]), repeats)
    # A fresh penalty (empty cache) per call: every timed step solves its assignment.
    ftm_step = best_of(lambda: step_timer(net, X, labels, MatchingPenalty(cache={}).bind(data), rows, blocks)(),
                       repeats)
    reg_step = best_of(step_timer(net, X, labels, GapPenalty().bind(data), rows, blocks), 5)
    return {"ce": ce, "matching": matching, "ftm": ftm_step, "reg": reg_step}


def otf_costs(standardised, s, y, S, size: int, rng, repeats: int) -> dict:
    rows, previous = rng.choice(len(y), size, replace=False), rng.choice(len(y), size, replace=False)
    d = standardised.shape[1]
    torch.manual_seed(0)
    net = ScorerNet(np.zeros(d), np.ones(d), ())
    X, labels = torch.as_tensor(standardised[rows], dtype=torch.float32), torch.as_tensor(y[rows], dtype=torch.float32)
    with torch.no_grad():
        h = torch.sigmoid(net(X)).double().numpy()
        h_previous = torch.sigmoid(net(torch.as_tensor(standardised[previous], dtype=torch.float32))).double().numpy()
    G = constraint_matrix(S[rows], y[rows], "eo")
    ce = best_of(step_timer(net, X, labels), 5)
    cost = best_of(lambda: cost_matrix(standardised[rows]), repeats)
    C = cost_matrix(standardised[rows])
    cold = otf0(h, C, G, 1e-3, tol=1e-9)
    solve_cold = best_of(lambda: otf0(h, C, G, 1e-3, tol=1e-9), repeats)
    start = otf0(h_previous, cost_matrix(standardised[previous]), constraint_matrix(S[previous], y[previous], "eo"),
                 1e-3, tol=1e-9)  # the previous batch's duals: what a training loop warm-starts from
    warm = otf0(h, C, G, 1e-3, mu0=start.mu, nu0=start.nu, tol=1e-9)
    solve_warm = best_of(lambda: otf0(h, C, G, 1e-3, mu0=start.mu, nu0=start.nu, tol=1e-9), repeats)
    data = TrainingData(X=standardised, Z=standardised, standardised=standardised, codes=s, y=y, S=S, reference=1,
                        groups=np.array([0, 1]))
    # A fresh penalty per call: the duals start from zero (a step warm-started from this very batch's
    # optimum would need almost no iterations and flatter the step).
    otf_step = best_of(lambda: step_timer(net, X, labels, OTFPenalty("eo").bind(data), rows)(), repeats)
    norm_step = best_of(step_timer(net, X, labels, NormPenalty("eo").bind(data), rows), 5)
    return {"ce": ce, "cost": cost, "solve_cold": solve_cold, "solve_warm": solve_warm, "otf": otf_step,
            "norm": norm_step, "iters_cold": cold.n_iter, "iters_warm": warm.n_iter}


def coordinate_ascent(h, C, G, eps: float, tol: float, max_sweeps: int = 20000) -> int:
    """The paper's solver for OTF_eps (Eqs. 9-10): sweeps until max |G f| <= tol (closed-form binary-row updates)."""
    mu = np.zeros(len(G))
    logh = np.log(h)
    for sweep in range(1, max_sweeps + 1):
        A = (mu @ G - C) / eps
        lam = eps * (logh - logsumexp(A, axis=1))  # Eq. 9, every row at once
        log_eta = logsumexp((lam[:, None] - C) / eps, axis=0)
        for c in range(len(G)):  # Eq. 10, one constraint at a time (Gauss-Seidel)
            log_w = log_eta + (mu @ G - mu[c] * G[c]) / eps
            a, b = G[c].max(), G[c].min()
            pos, neg = G[c] == a, G[c] == b
            mu[c] = eps * (logsumexp(log_w[neg]) + np.log(-b) - logsumexp(log_w[pos]) - np.log(a)) / (a - b)
        A = (mu @ G - C) / eps
        P = np.exp(A - logsumexp(A, axis=1)[:, None]) * h[:, None]
        if np.abs(G @ P.sum(axis=0)).max() <= tol:
            return sweep
    return max_sweeps


def solver_comparison(standardised, y, S, rng) -> None:
    rows = rng.choice(len(y), 256, replace=False)
    G = constraint_matrix(S[rows], y[rows], "eo")
    C = cost_matrix(standardised[rows])
    h = np.clip(0.3 + 0.4 * S[rows, 1] + 0.1 * rng.normal(size=256), 0.01, 1.0)  # scores leaning on sex: unfair
    started = time.perf_counter()
    result = otf0(h, C, G, 1e-3, tol=1e-6)
    lbfgs = time.perf_counter() - started
    started = time.perf_counter()
    sweeps = coordinate_ascent(h, C, G, 1e-3, 1e-6)
    ca = time.perf_counter() - started
    print(f"\nOTF_eps dual at B = 256, eps 1e-3, PEO on sex + race ({len(G)} rows), to max |G f| <= 1e-6:")
    print(f"  L-BFGS on the semi-dual: {result.n_iter[0]} iterations, {1e3 * lbfgs:.0f} ms (OTF and OTFR together)")
    print(f"  coordinate ascent (the paper's Eqs. 9-10): {sweeps} sweeps, {1e3 * ca:.0f} ms (OTF alone), "
          f"{ca / lbfgs:.0f}x slower")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,1024,4096")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(v) for v in args.sizes.split(",")]
    Z, standardised, s, y, S = adult()
    rng = np.random.default_rng(0)
    print("FTM per step (B rows per group, MLP 101-101-101-1; times are the best of repeats, 1 thread):")
    print(f"{'B':>6}{'CE step ms':>12}{'matching ms':>13}{'x CE':>8}{'FTM step ms':>13}{'x CE':>8}"
          f"{'Reg step ms':>13}{'x CE':>7}")
    for size in sizes:
        r = ftm_costs(Z, s, y, size, rng, repeats=3 if size <= 1024 else 1)
        print(f"{size:>6}{1e3 * r['ce']:>12.1f}{1e3 * r['matching']:>13.1f}{r['matching'] / r['ce']:>8.1f}"
              f"{1e3 * r['ftm']:>13.1f}{r['ftm'] / r['ce']:>8.1f}{1e3 * r['reg']:>13.1f}{r['reg'] / r['ce']:>7.1f}",
              flush=True)
    print("\nOTF per step (B rows, logistic regression on 96 features, PEO on sex + race, eps 1e-3, tol 1e-9):")
    print(f"{'B':>6}{'CE ms':>9}{'cost ms':>9}{'dual cold ms':>14}{'iters':>9}{'dual warm ms':>14}{'iters':>9}"
          f"{'OTF step ms':>13}{'x CE':>8}{'Norm step ms':>14}{'x CE':>7}")
    for size in sizes:
        r = otf_costs(standardised, s, y, S, size, rng, repeats=3 if size <= 1024 else 1)
        print(f"{size:>6}{1e3 * r['ce']:>9.1f}{1e3 * r['cost']:>9.1f}{1e3 * r['solve_cold']:>14.1f}"
              f"{r['iters_cold']!s:>9}{1e3 * r['solve_warm']:>14.1f}{r['iters_warm']!s:>9}"
              f"{1e3 * r['otf']:>13.1f}{r['otf'] / r['ce']:>8.0f}{1e3 * r['norm']:>14.1f}{r['norm'] / r['ce']:>7.1f}",
              flush=True)
    solver_comparison(standardised, y, S, rng)


if __name__ == "__main__":
    main()
