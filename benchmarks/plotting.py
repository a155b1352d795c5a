"""What every reproduction's trade-off plot ends with: grid, legend, layout, saved next to the run's logs."""

from __future__ import annotations

from pathlib import Path


def save_tradeoff_plot(fig, ax, path: Path) -> None:
    """Grid and legend on ``ax``, then ``fig`` written to ``path`` (folders made) and closed; the path printed."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"  plot: {path}")
