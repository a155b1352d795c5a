"""``fairstream demo``: the product end to end on the embedded default (what ``make run`` runs).

Broker, topics, ``--workers`` workers (record agent, /metrics; default one), the pipeline's monitoring agent
(``fairstream monitor``: the workers' counts merged into the pipeline's statistics, drift detected once), a re-fit
service, and a Prometheus server with the production alert rules, scraping every worker and the agent, when the
``prometheus`` binary is installed. The plan is fitted on the Adult research split (read back from the research
topic) and published; the archive is replayed with invalid records mixed in; half way the distribution shifts (in
the college stratum, women's hours-per-week rise by 15) while labelled records of the new distribution reach the
research topic. The monitoring agent detects the drift over every worker's records and asks one re-fit, Prometheus
fires the alert, the re-fit service publishes a new plan, every worker swaps it, and the pipeline's statistic comes
back under the threshold. A live line shows progress; the report gives the accounting (in = repaired +
dead-lettered), E before/after per plan version computed from what the repaired topic holds, the timeline, and two
plots. With one worker or three the story is the same.

The second act (``fairstream demo --act flow``) runs the same loop on the record chain ``flow``
then ``scorer``: a frozen logistic classifier with an AdapFair flow in front of it, monitored on the
DP gap of its decisions. Half way men's hours-per-week rise by 15 (every stratum); the deployed
flow no longer equalises the groups' scores, the DP gap crosses the threshold, and the re-fit
service trains a new flow (warm-started, the classifier frozen) that brings the gap back down.

The third act (``fairstream demo --act approve``) is the first act under ``promotion = "approve"``:
the re-fit after the drift publishes a *candidate* that the worker applies in shadow beside the
serving plan; once the candidate's live statistics over the pipeline (the monitoring agent's,
``role="candidate"``, ``scope="pipeline"``) show it would bring the statistic under the threshold, the demo
approves it as a named operator (``fairstream artifacts approve``), the workers promote it, and the timeline marks
the candidate, the approval and the promotion.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fairstream.repair import datasets
from fairstream.repair.measure.evaluation import evaluate_repair
from fairstream.streams.codec.repaired import repaired_arrays
from fairstream.streams.config import PipelineConfig

from .acts import ACTS, DEFAULT_ACT
from .collect import TopicReader, collect_until
from .loop import LoopReport, run_fairness_loop, shift_group
from .plots import plot_group_distributions, plot_timeline
from .replay import bad_messages


@dataclass
class DemoOptions:
    """The demo's knobs: rates, sizes, drift, Prometheus."""
    run_dir: Path = Path("runs/demo")
    n_research: int = 10_000
    n_stable: int = 15_000
    n_drifted_research: int = 6_000
    shift: float = 15.0
    seed: int = 0
    bad: int = 100
    rate: float = 2000.0
    timeout: float = 300.0
    act: str = DEFAULT_ACT  # "plan": a repair plan re-fitted; "flow": a flow in front of a frozen classifier (ACTS)
    workers: int = 1  # worker processes (beside the one monitoring agent)


def act_config(config: PipelineConfig, act: str) -> PipelineConfig:
    """The pipeline of an act: the plan as configured, or the chain flow -> scorer monitored on the decisions' DP gap;
    under the act's promotion policy."""
    chosen = ACTS[act]
    if chosen.chain is not None:
        config = replace(config, records=replace(config.records, artifact=chosen.chain))
    if chosen.promotion != config.promotion:
        config = replace(config, promotion=chosen.promotion)
    return config if chosen.statistic is None else config.with_monitor(statistic=chosen.statistic, threshold=0.1)


def run_demo(config: PipelineConfig, bootstrap: str, options: DemoOptions, say=print) -> dict:
    """Run the demo against the broker at ``bootstrap``; returns (and saves) the report."""
    run_dir = Path(options.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = act_config(config, options.act)
    data = datasets.load(config.name, features=config.features)
    research, archive = data.split(options.n_research, seed=options.seed)
    hours = list(config.features).index("hours-per-week")
    act = ACTS[options.act]
    shifted = shift_group(archive.subset(slice(options.n_stable, None)), feature=hours, group=act.shifted_group,
                          stratum=act.shifted_stratum, amount=options.shift, lo=1, hi=99)
    prometheus = shutil.which("prometheus") is not None
    if not prometheus:
        say("(no prometheus binary: the alerting step is skipped; `make setup` installs it)")
    loop = run_fairness_loop(
        config, bootstrap, run_dir, research, archive.subset(slice(0, options.n_stable)),
        shifted.subset(slice(options.n_drifted_research, None)), shifted.subset(slice(0, options.n_drifted_research)),
        rate=options.rate, recovery_timeout=options.timeout, prometheus=prometheus,
        extra=bad_messages(config, options.bad, id_prefix="bad", seed=options.seed), live=True, say=say,
        refit_params=act.refit_params, workers=options.workers)
    outputs = _collect(bootstrap, config, loop.sent, options.timeout)
    report = _report(config, archive, loop, outputs, run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _collect(bootstrap: str, config: PipelineConfig, expected: int, timeout: float) -> dict[str, list]:
    readers = {"repaired": TopicReader(bootstrap, config.topics.records_repaired),
               "dlq": TopicReader(bootstrap, config.topics.dlq)}
    ids: set[str] = set()  # the repaired ids read so far (at least once: a record may come out twice)
    read = 0

    def done(collected: dict[str, list]) -> bool:
        nonlocal read
        ids.update(json.loads(m.value)["id"] for m in collected["repaired"][read:])
        read = len(collected["repaired"])
        return len(ids) + len(collected["dlq"]) >= expected

    try:
        collected = collect_until(readers, done, timeout)
    finally:
        for reader in readers.values():
            reader.close()
    return {name: [json.loads(m.value) for m in messages] for name, messages in collected.items()}


def _report(config: PipelineConfig, archive, loop: LoopReport, outputs: dict, run_dir: Path) -> dict:
    repaired = list({r["id"]: r for r in outputs["repaired"]}.values())  # at-least-once: de-duplicate by id
    letters = outputs["dlq"]
    by_version = {}
    for version, phase in sorted({(r["provenance"]["version"], _phase(r)) for r in repaired},
                                 key=lambda vp: (vp[0], vp[1] != "before the drift")):
        rows = [r for r in repaired if r["provenance"]["version"] == version and _phase(r) == phase]
        if len(rows) >= 100:
            X, Xr, s, u = _arrays(rows, config)
            by_version[f"v{version}, {phase}"] = {"records": len(rows), **evaluate_repair(X, Xr, s, u).as_dict()}
    stable = [r for r in repaired if r["id"].startswith("stable-")]
    X, Xr, s, u = _arrays(stable, config)
    plot = plot_group_distributions(run_dir / "stream_distributions.png", X, Xr, s, u, list(config.features),
                                    archive.s_labels, archive.u_labels, title="records.repaired before the drift: before/after")
    timeline = plot_timeline(run_dir / "timeline.png", loop.series, loop.events, loop.threshold,
                             statistic=f"{loop.statistic} after the chain (pipeline)", kind=loop.kind,
                             candidate_series=loop.candidate_series)
    return {
        "sent": loop.sent, "repaired_unique": len(repaired), "repaired_messages": len(outputs["repaired"]),
        "dead_lettered": len(letters),
        "dead_letter_reasons": dict(Counter(_reason_kind(d["reason"]) for d in letters).most_common()),
        "by_version": by_version, "features": list(config.features), "threshold": loop.threshold,
        "kind": loop.kind, "decision_dp": _decision_dp(repaired),
        "workers": loop.workers,
        "timeline": [{"seconds": round(t, 1), "event": e, "detail": d} for t, e, d in loop.events],
        "refit_requests": loop.refit_requests, "refits": loop.refit_outcomes, "plots": [str(plot), str(timeline)],
    }


def _decision_dp(repaired: list[dict]) -> dict:
    """The DP gap of the records' decisions per (version, phase), for chains that end in a scorer."""
    gaps = {}
    for version, phase in sorted({(r["provenance"]["version"], _phase(r)) for r in repaired if "decision" in r},
                                 key=lambda vp: (vp[0], vp[1] != "before the drift")):
        rows = [r for r in repaired if r["provenance"]["version"] == version and _phase(r) == phase and "decision" in r]
        rates = {s: np.mean([r["decision"] for r in rows if r["s"] == s]) for s in {r["s"] for r in rows}}
        if len(rows) >= 100 and len(rates) >= 2:
            gaps[f"v{version}, {phase}"] = {"records": len(rows), "dp_gap": float(max(rates.values()) - min(rates.values()))}
    return gaps


def _phase(record: dict) -> str:
    return "before the drift" if record["id"].startswith("stable-") else "after the drift"


def _arrays(rows: list[dict], config: PipelineConfig):
    batch = repaired_arrays(rows, config)
    return batch.before, batch.after, batch.s, batch.u


def _reason_kind(reason: str) -> str:
    """A short category for a dead-letter reason (its text up to the first detail)."""
    for marker in (":", "(", "["):
        reason = reason.split(marker)[0]
    return " ".join(w for w in reason.split() if not any(c.isdigit() for c in w) and "'" not in w)


def format_report(report: dict) -> str:
    """The report as text."""
    lines = [
        f"records in: {report['sent']}  repaired: {report['repaired_unique']} unique ids "
        f"({report['repaired_messages']} messages)  dead-lettered: {report['dead_lettered']}  "
        f"(in = repaired + dead-lettered: {report['sent'] == report['repaired_unique'] + report['dead_lettered']})",
        "dead-letter reasons: " + ", ".join(f"{k} x{v}" for k, v in report["dead_letter_reasons"].items()),
        f"{'E from records.repaired':<30}" + "".join(f"{f:>16}" for f in report["features"]) + f"{'total':>10}",
    ]
    for version, ev in report["by_version"].items():
        lines.append(f"{report['kind']} {version} ({ev['records']} records)")
        for label, key in (("  before (original)", "E_before"), ("  after (repaired)", "E_after"), ("  noise floor", "E_floor")):
            lines.append(f"{label:<30}" + "".join(f"{v:>16.4f}" for v in ev[key]) + f"{ev[key + '_total']:>10.4f}")
    for version, ev in report["decision_dp"].items():
        lines.append(f"decisions' DP gap under {report['kind']} {version}: {ev['dp_gap']:.3f} ({ev['records']} records)")
    workers = report.get("workers", 1)
    lines.append(f"timeline (threshold {report['threshold']}; {workers} worker{'s' if workers != 1 else ''} "
                 f"and the monitoring agent):")
    lines += [f"  {e['seconds']:7.1f}s  {e['event']}  {e['detail']}" for e in report["timeline"]]
    lines += [f"re-fit request {r}" for r in report.get("refit_requests", [])]
    lines += [f"re-fit: {r}" for r in report["refits"]]
    lines.append("plots: " + ", ".join(report["plots"]))
    return "\n".join(lines)
