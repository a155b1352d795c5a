"""Group thresholds after the scorer on Adult, next to Fairlearn's ThresholdOptimizer on the same splits.

Hardt, Price and Srebro (2016) post-process a frozen scorer with group-specific, randomised
thresholds; Fairlearn's ``ThresholdOptimizer`` is the reference implementation. Here both
post-process the same scorer, fitted on the same training split, for demographic parity, equal
opportunity and equalized odds, and are measured on the same test split:

- data: the bundled Adult CSV (45,222 rows); s = sex; y = income above 50K; features: every column
  but fnlwgt, sex and the label (101), min-max scaled on the training split;
- scorer: the product's :class:`~fairstream.models.scorer.LogisticScorer` (IRLS) on the training split;
  "scorer at 0.5" is its own decision;
- fairstream: :func:`~fairstream.models.thresholds.fit_thresholds` on the training split's scores
  (no strata), decisions drawn by record key (the row's index in the data set);
- Fairlearn: ``ThresholdOptimizer(estimator=<the same scorer as a prefit classifier>, constraints=...,
  predict_method="predict_proba", prefit=True)`` fitted on the training split (objective accuracy,
  its default grid of 1,000 points), ``predict(..., random_state=split)`` on the test split.

Gaps are spreads between the two groups on the test split: DP of positive decisions, TPR (equal
opportunity), FPR, and EO = max(TPR gap, FPR gap). "train accuracy" is that of the drawn decisions
on the training split, where both maximise accuracy under the constraint (fairstream exactly, Fairlearn
on its grid). "fit (s)": the post-processor's fit alone. Mean and standard deviation over random
70/30 splits. Fairlearn is a benchmark dependency only (``pip install '.[reproduce]'``); the product never
imports it.

    .venv/bin/python benchmarks/reproduce_thresholds.py            # 5 splits, well under a minute
    .venv/bin/python benchmarks/reproduce_thresholds.py --splits 2
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: the machine is shared

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from fairstream.models.scorer import LogisticScorer  # noqa: E402
from fairstream.models.thresholds import fit_thresholds  # noqa: E402
from fairstream.repair import datasets  # noqa: E402

CONSTRAINTS = {"dp": "demographic_parity", "eopp": "true_positive_rate_parity", "eo": "equalized_odds"}
METRICS = ("accuracy", "dp_gap", "tpr_gap", "fpr_gap", "eo_gap")


def load():
    drop = {"fnlwgt", "sex_Female", "sex_Male", "salary_<=50K", "salary_>50K"}
    columns = [c for c in datasets.available_columns("adult") if c not in drop]
    ds = datasets.load_adult(features=columns)
    return ds.X, ds.s, ds.y


def minmax(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = train.min(axis=0), train.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return (train - lo) / span, (test - lo) / span


def measure(decision: np.ndarray, s: np.ndarray, y: np.ndarray) -> dict:
    def spread(mask):
        rates = [decision[mask & (s == g)].mean() for g in np.unique(s)]
        return float(max(rates) - min(rates))
    every = np.ones(len(s), dtype=bool)
    tpr, fpr = spread(y == 1), spread(y == 0)
    return {"accuracy": float((decision == y).mean()), "dp_gap": spread(every), "tpr_gap": tpr, "fpr_gap": fpr,
            "eo_gap": max(tpr, fpr)}


def prefit(scorer: LogisticScorer):
    """The product's scorer as a fitted scikit-learn classifier (what ThresholdOptimizer(prefit=True) takes)."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class Prefit(ClassifierMixin, BaseEstimator):
        def __init__(self, scorer=None):
            self.scorer = scorer

        def fit(self, X, y=None):
            return self

        def predict_proba(self, X):
            p = self.scorer.predict_proba(np.asarray(X, dtype=np.float64))
            return np.column_stack([1.0 - p, p])

        def predict(self, X):
            return (self.predict_proba(X)[:, 1] >= 0.5).astype(int)

    model = Prefit(scorer)
    model.classes_ = np.array([0, 1])
    model.n_features_in_ = scorer.n_features_in_
    return model


def run_split(X, s, y, split: int) -> dict:
    from fairlearn.postprocessing import ThresholdOptimizer

    order = np.random.default_rng(split).permutation(len(X))
    cut = int(0.7 * len(X))
    train, test = order[:cut], order[cut:]
    X_train, X_test = minmax(X[train], X[test])
    scorer = LogisticScorer().fit(X_train, y[train])
    score_train, score_test = scorer.predict_proba(X_train), scorer.predict_proba(X_test)
    rows = {"scorer at 0.5": {**measure((score_test >= 0.5).astype(int), s[test], y[test]),
                              "train_accuracy": float(((score_train >= 0.5) == y[train]).mean())}}
    for name, fairlearn_name in CONSTRAINTS.items():
        start = time.perf_counter()
        post = fit_thresholds(score_train, s[train], y[train], constraint=name, seed=split)
        seconds = time.perf_counter() - start
        ours = post.decide(score_test, s[test], keys=test)
        on_train = post.decide(score_train, s[train], keys=train)
        rows[f"fairstream thresholds, {name}"] = {**measure(ours, s[test], y[test]), "fit_seconds": seconds,
                                                  "train_accuracy": float((on_train == y[train]).mean())}
        start = time.perf_counter()
        optimizer = ThresholdOptimizer(estimator=prefit(scorer), constraints=fairlearn_name,
                                       predict_method="predict_proba", prefit=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn's notes on feature names of numpy input
            optimizer.fit(X_train, y[train], sensitive_features=s[train])
            seconds = time.perf_counter() - start
            theirs = np.asarray(optimizer.predict(X_test, sensitive_features=s[test], random_state=split))
            on_train = np.asarray(optimizer.predict(X_train, sensitive_features=s[train], random_state=split))
        rows[f"Fairlearn ThresholdOptimizer, {name}"] = {**measure(theirs, s[test], y[test]), "fit_seconds": seconds,
                                                         "train_accuracy": float((on_train == y[train]).mean())}
    return rows


def summarise(splits: list[dict]) -> dict:
    return {method: {metric: (float(np.mean([r[method][metric] for r in splits])),
                              float(np.std([r[method][metric] for r in splits])))
                     for metric in splits[0][method]} for method in splits[0]}


def table(summary: dict, n_splits: int) -> str:
    lines = [f"Adult, s = sex, test split (30%), mean ± sd over {n_splits} splits",
             "",
             "| method | accuracy | DP gap | TPR gap | FPR gap | EO gap | train accuracy | fit (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, values in summary.items():
        cells = [f"{values[m][0]:.3f} ± {values[m][1]:.3f}" for m in (*METRICS, "train_accuracy")]
        seconds = f"{values['fit_seconds'][0]:.2f}" if "fit_seconds" in values else ""
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {seconds} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--out", default="runs/thresholds")
    args = parser.parse_args()
    try:
        import fairlearn  # noqa: F401
    except ImportError:
        raise SystemExit("this comparison needs Fairlearn: .venv/bin/pip install -c constraints.txt '.[reproduce]'")
    X, s, y = load()
    splits = [run_split(X, s, y, split) for split in range(args.splits)]
    summary = summarise(splits)
    print(table(summary, args.splits))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
