"""Reproduce the main claim of Centroid Fairness on synthetic face-recognition embeddings, and time it.

Conti and Clémençon, "Mitigating Bias in Facial Recognition Systems: Centroid Fairness Loss
Optimization" (2024): a residual module trained on frozen embeddings lowers BFAR at a global
threshold on held-out identities while keeping FNMR. Face images and backbones are not available
here, so the embeddings are synthetic (``fairstream.repair.embedding_datasets``: four groups with
per-group identity concentration and image noise, d = 64, imbalanced training identities
300/250/600/200 x 20 images, balanced held-out identities 400 per group x 10 images).

Evaluation: all same-group pairs of the held-out identities, one global threshold per FAR level,
FNMR (%), BFAR and BFRR before and after, plus a score-level baseline (per-group quantile
normalisation of pair scores onto the reference group's impostor distribution, fitted on the
training pairs; it needs each pair's group at test time). The number of false accepts behind the
smallest group's FAR is printed next to every threshold. Then: training time, and vectors/s of
applying the module at d = 512 against the identity (numpy, one BLAS thread).

    .venv/bin/python benchmarks/reproduce_centroid.py [--quick] [--seeds 3] [--sampling balanced]

Writes runs/centroid_fairness_curves.png (per-group FAR and FNMR against the threshold, before
and after).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a reproducible single-core figure on a shared machine
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import time
from pathlib import Path

import numpy as np

from fairstream.models.centroid import CentroidFairness
from fairstream.models.centroid_targets import GroupQuantileScoreNormaliser
from fairstream.models.embedding import FairnessModule
from fairstream.repair.embedding_datasets import simulate_train_test
from fairstream.repair.measure.verification import l2_normalise, same_group_pair_scores

ROOT = Path(__file__).resolve().parent.parent
FARS = (1e-3, 1e-4, 1e-5)
METHODS = ("pre-trained", "+ CF", "score baseline")


def one_run(seed: int, args) -> tuple[dict, dict]:
    """Rates per (method, FAR) for one seed, plus what the plot and the timing need."""
    sizes = {"train_identities": (60, 50, 120, 40), "test_identities": (150,) * 4} if args.quick else {}
    train, test = simulate_train_test(seed=seed, **sizes)
    start = time.perf_counter()
    cf = CentroidFairness(epochs=args.epochs, batch_size=args.batch_size, sampling=args.sampling, seed=seed)
    cf.fit(train.vectors, train.identities, train.groups)
    train_seconds = time.perf_counter() - start
    baseline = GroupQuantileScoreNormaliser(reference=cf.reference_).fit(train.vectors, train.identities,
                                                                         train.groups)
    pairs = {
        "pre-trained": same_group_pair_scores(l2_normalise(test.vectors), test.identities, test.groups),
        "+ CF": same_group_pair_scores(cf.transform(test.vectors), test.identities, test.groups),
        "score baseline": same_group_pair_scores(test.vectors, test.identities, test.groups,
                                                 score_map=baseline.transform_scores),
    }
    rates = {(m, far): p.rates_at_far(far) for m, p in pairs.items() for far in FARS}
    extra = {"pairs": pairs, "train_seconds": train_seconds, "steps": cf.n_steps_, "n_train": len(train),
             "reference": cf.reference_, "history": cf.history_}
    return rates, extra


def print_table(runs: list[dict], extra: dict) -> None:
    """FNMR, BFAR and BFRR per FAR level and method, mean (sd) over seeds, with the false-accept counts."""
    n_imp = extra["pairs"]["pre-trained"].n_impostor
    print(f"\nHeld-out identities: {n_imp:,} same-group impostor pairs, "
          f"{extra['pairs']['pre-trained'].genuine.size:,} genuine pairs; {len(runs)} seed(s), mean (sd)")
    print(f"{'FAR':>7} {'method':<15}{'FNMR %':>15}{'BFAR':>15}{'BFRR':>15}   false accepts, seed 0: "
          "smallest group / all groups")
    for far in FARS:
        for m in METHODS:
            cells = []
            for key in ("fnmr", "bfar", "bfrr"):
                v = np.array([getattr(r[(m, far)], key) for r in runs]) * (100 if key == "fnmr" else 1)
                cells.append(f"{v.mean():>8.2f} ({v.std():.2f})" if np.all(np.isfinite(v)) else f"{'inf':>15}")
            fa = runs[0][(m, far)].false_accepts
            print(f"{far:>7.0e} {m:<15}{''.join(f'{c:>15}' for c in cells)}   {fa.min()} / {fa.sum()}")


def print_claim(runs: list[dict]) -> None:
    """The reproduction target at FAR 1e-4: BFAR reduction, FNMR change and BFRR change."""
    before = np.array([r[("pre-trained", 1e-4)].bfar for r in runs])
    after = np.array([r[("+ CF", 1e-4)].bfar for r in runs])
    fnmr = np.array([r[("+ CF", 1e-4)].fnmr - r[("pre-trained", 1e-4)].fnmr for r in runs]) * 100
    bfrr = np.array([r[("+ CF", 1e-4)].bfrr / r[("pre-trained", 1e-4)].bfrr - 1 for r in runs]) * 100
    reduction = (1 - after / before) * 100
    ok = reduction.min() >= 30 and np.abs(fnmr).max() <= 1.0
    print(f"\nAt FAR 1e-4: BFAR reduced by {reduction.mean():.1f}% (min over seeds {reduction.min():.1f}%), "
          f"FNMR change {fnmr.mean():+.2f} pt (max |change| {np.abs(fnmr).max():.2f}), BFRR change {bfrr.mean():+.1f}%")
    print(f"Target (BFAR -30% or more, FNMR within 1 pt): {'met' if ok else 'NOT met'}")


def apply_speed(dimension: int = 512, batch: int = 1000, repeats: int = 20) -> dict:
    """Vectors per second of the d=512 module (hidden 1024) and of the identity, numpy on batches."""
    rng = np.random.default_rng(0)
    module = FairnessModule(rng.normal(size=(2 * dimension, dimension)) * 0.02, np.zeros(2 * dimension),
                            rng.normal(size=(dimension, 2 * dimension)) * 0.02, np.zeros(dimension))
    X = rng.normal(size=(batch, dimension))
    identity = FairnessModule.identity(dimension)
    speeds = {}
    for name, m, dtype in (("module float64", module, np.float64), ("module float32", module, np.float32),
                           ("identity", identity, np.float64)):
        m.transform(X, dtype=dtype)
        speeds[name] = batch / min(_timed(m.transform, X, dtype) for _ in range(repeats))
    return speeds


def _timed(fn, X, dtype) -> float:
    start = time.perf_counter()
    fn(X, dtype=dtype)
    return time.perf_counter() - start


def plot(extra: dict, path: Path) -> None:
    """Per-group FAR(t) and FNMR(t), before and after, with the global thresholds at FAR 1e-4."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex="col")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, method in enumerate(("pre-trained", "+ CF")):
        pairs = extra["pairs"][method]
        t_star = pairs.threshold(1e-4)
        grid = np.linspace(t_star - 0.25, t_star + 0.15, 400)
        for g, label in enumerate(pairs.groups):
            gen, imp = pairs.curves(g)
            mark = " (reference)" if label == extra["reference"] else ""
            axes[row, 0].semilogy(grid, np.maximum(imp.far(grid), 1e-8), color=colours[g], label=f"group {label}{mark}")
            axes[row, 1].plot(grid, gen.frr(grid) * 100, color=colours[g], label=f"group {label}{mark}")
        for ax, title in zip(axes[row], ("FAR per group", "FNMR per group (%)")):
            ax.axvline(t_star, color="grey", linestyle="--", linewidth=1)
            ax.set_title(f"{method}: {title}  (dashed: global threshold at FAR 1e-4)", fontsize=9)
            ax.grid(alpha=0.3)
        axes[row, 0].set_ylim(1e-7, 1e-1)
        axes[row, 0].axhline(1e-4, color="grey", linewidth=0.5)
        axes[row, 1].set_ylim(0, 40)
        axes[row, 0].legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("threshold t (cosine)")
    fig.suptitle("Centroid Fairness on synthetic embeddings: held-out identities, all same-group pairs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    """Run the seeds, print the tables and timings, write the plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data and 5 epochs (a smoke run, ~1 minute)")
    parser.add_argument("--seeds", type=int, default=1, help="independent data sets and fits")
    parser.add_argument("--epochs", type=int, default=None, help="default 20 (5 with --quick)")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--sampling", choices=("balanced", "uniform"), default="balanced")
    args = parser.parse_args()
    args.epochs = args.epochs or (5 if args.quick else 20)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        raise SystemExit("training needs torch (pip install -e '.[models]')") from None
    runs, extras = [], []
    for seed in range(args.seeds):
        rates, extra = one_run(seed, args)
        runs.append(rates)
        extras.append(extra)
        print(f"seed {seed}: trained {args.epochs} epochs ({extra['steps']} steps of {args.batch_size}, "
              f"{args.sampling} sampling) on {extra['n_train']:,} vectors in {extra['train_seconds']:.1f} s; "
              f"reference group {extra['reference']}; loss {extra['history'][0]['loss']:.2e} -> "
              f"{extra['history'][-1]['loss']:.2e}")
    print_table(runs, extras[0])
    print_claim(runs)
    seconds = np.array([e["train_seconds"] for e in extras])
    print(f"\nTraining time ({args.epochs} epochs, 1 CPU thread, includes building targets): "
          f"{seconds.mean():.1f} s (sd {seconds.std():.1f})")
    speed = apply_speed()
    print("Apply, numpy, d=512 (hidden 1024), batches of 1000, 1 BLAS thread, vectors/s: "
          + ", ".join(f"{name} {v:,.0f}" for name, v in speed.items()))
    path = ROOT / "runs" / "centroid_fairness_curves.png"
    plot(extras[0], path)
    print(f"Plot: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
