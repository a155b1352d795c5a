"""The batch repair job: fit plans on a research split, repair the archive, report E, save the artifact.

This is the offline half of the product (and the main job until the stream runs): the same
:class:`~fairstream.models.plan.DistributionalRepair` the workers apply, fitted on a
labelled research window and frozen into an artifact.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fairstream.repair import artifacts, datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.geometric import geometric_repair
from fairstream.repair.measure.evaluation import evaluate_repair

from .plots import plot_group_distributions


@dataclass
class BatchRepairConfig:
    """What the offline batch job (``fairstream repair``) fits and repairs."""
    dataset: str = "adult"
    features: tuple[str, ...] | None = None
    n_research: int | None = None  # None: DEFAULT_RESEARCH rows, or half of a smaller data set
    n_q: int = 250
    repair_amount: float = 1.0
    seed: int = 0
    bins: int = 30
    out: Path = field(default_factory=lambda: Path("runs/adult-repair"))


def load_split(config: BatchRepairConfig):
    """The configured data set, split into research and archive parts."""
    kwargs = {"features": tuple(config.features)} if config.features else {}
    if config.dataset == "simulation":
        kwargs = {"seed": config.seed}  # the simulation draws its data: same seed, same job
    data = datasets.load(config.dataset, **kwargs)
    n_research = default_research_rows(len(data)) if config.n_research is None else config.n_research
    if n_research >= len(data):
        raise ValueError(f"--n-research {n_research} leaves no archive: {config.dataset} has {len(data)} rows")
    return data.split(n_research, seed=config.seed)


DEFAULT_RESEARCH = 10_000


def default_research_rows(n_rows: int) -> int:
    """The research split a data set gets by default: 10,000 rows, or half of a smaller data set (COMPAS: 3,083).

    >>> default_research_rows(48_842), default_research_rows(6_167)
    (10000, 3083)
    """
    return min(DEFAULT_RESEARCH, n_rows // 2)


def fit_plan(research, config: BatchRepairConfig) -> DistributionalRepair:
    """Fit the batch job's plan on the research split."""
    return DistributionalRepair(n_q=config.n_q, repair_amount=config.repair_amount,
                                columns=research.feature_names).fit(research.X, research.s, research.u)


def run_batch_repair(config: BatchRepairConfig, progress: bool = True) -> dict:
    """Run the whole job; returns the report that is also written to ``<out>/report.json``."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=6, desc="batch repair", disable=not progress, unit="step")
    research, archive = load_split(config)
    steps.update()
    plan = fit_plan(research, config)
    steps.update()
    research_repaired = plan.transform(research.X, research.s, research.u, keys=np.arange(len(research)))
    archive_result = plan.repair(archive.X, archive.s, archive.u, keys=np.arange(len(research), len(research) + len(archive)))
    steps.update()
    evaluations = {
        "research": evaluate_repair(research.X, research_repaired, research.s, research.u, bins=config.bins),
        "archive": evaluate_repair(archive.X, archive_result.values, archive.s, archive.u, bins=config.bins),
        "research_geometric": evaluate_repair(research.X, geometric_repair(research.X, research.s, research.u),
                                              research.s, research.u, bins=config.bins),
    }
    steps.update()
    fit_metrics = {"E_research_after": evaluations["research"].e_after.total,
                   "E_archive_after": evaluations["archive"].e_after.total}
    artifact = plan.to_artifact(version=1, metrics=fit_metrics,
                                data_fingerprint=artifacts.fingerprint_arrays(research.X, research.s, research.u))
    manifest_path = artifacts.save(artifact, out / "plan-v1")
    steps.update()
    plot = plot_group_distributions(out / "distributions.png", archive.X, archive_result.values, archive.s, archive.u,
                                    archive.feature_names, archive.s_labels, archive.u_labels,
                                    title=f"{config.dataset} archive: group-conditional distributions before/after repair")
    steps.update()
    steps.close()
    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "features": list(research.feature_names),
        "n_research": len(research), "n_archive": len(archive),
        "out_of_range_archive_rows": archive_result.n_out_of_range,
        "evaluations": {name: ev.as_dict() for name, ev in evaluations.items()},
        "artifact": {"manifest": str(manifest_path), "sha256": artifact.sha256, "kind": artifact.kind, "version": artifact.version},
        "plot": str(plot),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def format_report(report: dict) -> str:
    """The E table the job prints: per feature, before/after, with the estimator's noise floor."""
    names = report["features"]
    rows = [f"{'set':<20}{'repair':<15}" + "".join(f"{n:>16}" for n in names) + f"{'total':>10}"]
    for set_name, key, method in (("research", "research", "none"), ("research", "research", "distributional"),
                                  ("research", "research_geometric", "geometric"), ("archive", "archive", "none"),
                                  ("archive", "archive", "distributional")):
        ev = report["evaluations"][key]
        values = ev["E_before"] if method == "none" else ev["E_after"]
        total = ev["E_before_total"] if method == "none" else ev["E_after_total"]
        rows.append(f"{set_name:<20}{method:<15}" + "".join(f"{v:>16.4f}" for v in values) + f"{total:>10.4f}")
    for set_name in ("research", "archive"):
        ev = report["evaluations"][set_name]
        rows.append(f"{set_name:<20}{'noise floor':<15}" + "".join(f"{v:>16.4f}" for v in ev["E_floor"]) + f"{ev['E_floor_total']:>10.4f}")
    ev = report["evaluations"]["archive"]
    rows.append(f"archive E reduced {ev['reduction']:.1f}x (total); damage mean |x'-x| per feature: "
                + ", ".join(f"{n}={d:.2f}" for n, d in zip(names, ev["damage"])))
    rows.append(f"archive rows outside the plan range (clamped): {report['out_of_range_archive_rows']}")
    rows.append(f"artifact: {report['artifact']['manifest']} (sha256 {report['artifact']['sha256'][:12]}...)")
    rows.append(f"plot: {report['plot']}")
    return "\n".join(rows)
