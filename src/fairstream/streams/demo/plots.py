"""PNG plots of group-conditional feature distributions and of statistics over time (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: workers and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fairstream.models.kinds import DEFAULT_KIND  # noqa: E402


def _edges(values: np.ndarray, bins: int = 40) -> np.ndarray:
    """Histogram edges; integer data get edges between integers, so no bin is empty by construction."""
    lo, hi = float(values.min()), float(values.max())
    if np.all(values == np.round(values)) and hi > lo:
        width = max(1.0, np.ceil((hi - lo + 1) / bins))
        return np.arange(lo - 0.5, hi + width, width)
    return np.histogram_bin_edges(values, bins=bins)


def plot_group_distributions(path: Path, X: np.ndarray, X_repaired: np.ndarray, s: np.ndarray, u: np.ndarray,
                             feature_names, s_labels: dict, u_labels: dict, title: str = "") -> Path:
    """One panel per (feature, stratum): each group's histogram before (dashed) and after (solid)."""
    strata = np.unique(u)
    fig, axes = plt.subplots(len(feature_names), len(strata), figsize=(5 * len(strata), 3.2 * len(feature_names)),
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, name in enumerate(feature_names):
        for j, a in enumerate(strata):
            ax = axes[k, j]
            in_u = u == a
            edges = _edges(np.concatenate([X[in_u, k], X_repaired[in_u, k]]))
            for i, g in enumerate(np.unique(s[in_u])):
                rows = in_u & (s == g)
                label = s_labels.get(int(g), g) if isinstance(s_labels, dict) else g
                ax.hist(X[rows, k], edges, density=True, histtype="step", linestyle="--", color=colours[i], label=f"{label} before")
                ax.hist(X_repaired[rows, k], edges, density=True, histtype="step", linewidth=1.8, color=colours[i], label=f"{label} after")
            ax.set_title(f"{name} | {u_labels.get(int(a), a) if isinstance(u_labels, dict) else a}")
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(path: Path, series: list[tuple[float, float, int]], events: list[tuple[float, str, str]],
                  threshold: float, statistic: str = "dependence E after repair", kind: str = DEFAULT_KIND,
                  candidate_series: list[tuple[float, float, int]] = ()) -> Path:
    """The monitored statistic over time, coloured by the re-fitted ``kind``'s version, with the loop's events marked;
    a shadow candidate's statistic (``candidate_series``) dashed."""
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for version in sorted({v for _, _, v in series}):
        points = [(t, y) for t, y, v in series if v == version]
        ax.plot(*zip(*points), marker=".", linewidth=1.2, label=f"{kind} version {version}")
    for version in sorted({v for _, _, v in candidate_series}):
        points = [(t, y) for t, y, v in candidate_series if v == version]
        ax.plot(*zip(*points), linestyle="--", linewidth=1.2, label=f"{kind} version {version} (candidate, shadow)")
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold}")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    unmarked = (f"{kind} version in use", "pipeline running", "re-fit requested")  # in the report's timeline only
    marked = [(t, e) for t, e, _ in events if e not in unmarked]
    for i, (t, event) in enumerate(marked):
        ax.axvline(t, color=colours[(i + 2) % len(colours)], linewidth=1, alpha=0.8)
        ax.annotate(event, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    va="top", ha="right")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(statistic)
    ax.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
