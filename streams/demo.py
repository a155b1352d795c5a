"""``fairstream demo``: the streaming product end to end on the embedded default.

Broker, topics, a worker process, an initial plan fitted on the Adult research split and
published on the control topic, the archive replayed through the stream (with some bad records
mixed in), a live summary while it runs, then a report with E before/after computed from what
the repaired topic actually holds. Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairstream.repair import datasets
from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.evaluation import evaluate_repair

from .collect import TopicReader, collect_until
from .config import PipelineConfig
from .plots import plot_group_distributions
from .registry import ArtifactStore, ControlClient
from .replay import bad_messages, interleave, record_messages, replay
from .supervise import WorkerProcess
from .topics import ensure_topics


@dataclass
class DemoOptions:
    run_dir: Path = Path("runs/demo")
    n_research: int = 10_000
    n_q: int = 250
    seed: int = 0
    bad: int = 100
    rate: float | None = None
    timeout: float = 300.0
    progress: bool = True
    # Out-of-range values are refused (dead-lettered with a reason) rather than clamped, so a
    # corrupted measurement never turns into a plausible repaired value.
    out_of_range: str = "reject"


def fit_initial_plan(config: PipelineConfig, options: DemoOptions):
    data = datasets.load(config.name, features=config.features)
    research, archive = data.split(options.n_research, seed=options.seed)
    plan = DistributionalRepair(n_q=options.n_q, columns=list(config.features), out_of_range=options.out_of_range)
    plan.fit(research.X, research.s, research.u)
    return plan, research, archive


def run_demo(config: PipelineConfig, bootstrap: str, options: DemoOptions, say=print) -> dict:
    """Run the demo against the broker at ``bootstrap``; returns (and saves) the report."""
    run_dir = Path(options.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ensure_topics(bootstrap, config.topics)
    say(f"topics ready under prefix {config.topics.prefix!r} on {bootstrap}")
    with WorkerProcess(config, bootstrap, run_dir) as worker:
        say(f"worker started (pid log {worker.log_path}); a Faust worker takes about 30 s to join its group")
        plan, research, archive = fit_initial_plan(config, options)
        control = ControlClient(bootstrap, config.topics, ArtifactStore(config.artifact_dir))
        record = control.publish_sync(plan.to_artifact(metrics={"n_research": len(research)}))
        say(f"published plan version {record.version} (sha256 {record.sha256[:12]}) fitted on {len(research)} research rows")
        good = record_messages(archive, config, id_prefix=f"{config.name}-archive")
        messages = interleave(good, bad_messages(config, options.bad, id_prefix="bad"), seed=options.seed)
        summary = _live_summary(bootstrap, config, messages, options, worker, say)
    report = _report(config, archive, summary, run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _live_summary(bootstrap, config, messages, options, worker, say) -> dict:
    sender = threading.Thread(target=replay, args=(bootstrap, config.topics.records_in, messages, options.rate, False),
                              daemon=True)
    readers = {"repaired": TopicReader(bootstrap, config.topics.records_repaired), "dlq": TopicReader(bootstrap, config.topics.dlq)}
    start = time.monotonic()
    sender.start()
    state = {"last": 0.0, "first_output": None}

    def show(collected):
        done = len(collected["repaired"]) + len(collected["dlq"])
        if done and state["first_output"] is None:
            state["first_output"] = time.monotonic()
        if time.monotonic() - state["last"] >= 1.0:
            state["last"] = time.monotonic()
            versions = sorted({json.loads(m.value)["provenance"]["version"] for m in collected["repaired"][-200:]})
            elapsed = time.monotonic() - (state["first_output"] or start)
            say(f"[{time.monotonic() - start:5.0f}s] in {len(messages)}  repaired {len(collected['repaired'])}  "
                f"dead-lettered {len(collected['dlq'])}  {done / max(elapsed, 1e-9):,.0f} rec/s  version {versions or '-'}")
        if not worker.running:
            raise RuntimeError(f"the worker exited; last lines of its log:\n{worker.log_tail()}")

    try:
        collected = collect_until(readers, lambda c: len(c["repaired"]) + len(c["dlq"]) >= len(messages),
                                  options.timeout, on_poll=show)
    finally:
        for reader in readers.values():
            reader.close()
    sender.join(timeout=5)
    seconds = time.monotonic() - (state["first_output"] or start)
    return {"collected": collected, "sent": len(messages), "seconds": seconds}


def _report(config: PipelineConfig, archive, summary: dict, run_dir: Path) -> dict:
    repaired = [json.loads(m.value) for m in summary["collected"]["repaired"]]
    letters = [json.loads(m.value) for m in summary["collected"]["dlq"]]
    unique = {r["id"]: r for r in repaired}.values()  # at-least-once: de-duplicate by id
    X = np.array([[r["original"][f] for f in config.features] for r in unique])
    Xr = np.array([[r["features"][f] for f in config.features] for r in unique])
    s = np.array([r["s"] for r in unique])
    u = np.array([r["u"] for r in unique])
    evaluation = evaluate_repair(X, Xr, s, u)
    plot = plot_group_distributions(run_dir / "stream_distributions.png", X, Xr, s, u, list(config.features),
                                    archive.s_labels, archive.u_labels, title="records.repaired: before/after")
    return {
        "sent": summary["sent"], "repaired": len(repaired), "repaired_unique": len(X), "dead_lettered": len(letters),
        "records_per_second": (len(repaired) + len(letters)) / max(summary["seconds"], 1e-9),
        "versions": dict(Counter(r["provenance"]["version"] for r in repaired)),
        "dead_letter_reasons": dict(Counter(_reason_kind(d["reason"]) for d in letters).most_common()),
        "evaluation": evaluation.as_dict(), "features": list(config.features), "plot": str(plot),
    }


def _reason_kind(reason: str) -> str:
    """A short category for a dead-letter reason (its text up to the first detail)."""
    for marker in (":", "(", "["):
        reason = reason.split(marker)[0]
    return " ".join(w for w in reason.split() if not any(c.isdigit() for c in w) and "'" not in w)


def format_report(report: dict) -> str:
    ev = report["evaluation"]
    lines = [
        f"records in: {report['sent']}  repaired: {report['repaired']} ({report['repaired_unique']} unique ids)  "
        f"dead-lettered: {report['dead_lettered']}  (in = repaired + dead-lettered: "
        f"{report['sent'] == report['repaired_unique'] + report['dead_lettered']})",
        f"throughput: {report['records_per_second']:,.0f} records/s end to end; versions in use: {report['versions']}",
        "dead-letter reasons: " + ", ".join(f"{k} x{v}" for k, v in report["dead_letter_reasons"].items()),
        f"{'E from records.repaired':<26}" + "".join(f"{f:>16}" for f in report["features"]) + f"{'total':>10}",
        f"{'before (original)':<26}" + "".join(f"{v:>16.4f}" for v in ev["E_before"]) + f"{ev['E_before_total']:>10.4f}",
        f"{'after (repaired)':<26}" + "".join(f"{v:>16.4f}" for v in ev["E_after"]) + f"{ev['E_after_total']:>10.4f}",
        f"{'noise floor':<26}" + "".join(f"{v:>16.4f}" for v in ev["E_floor"]) + f"{ev['E_floor_total']:>10.4f}",
        f"E reduced {ev['reduction']:.1f}x; plot: {report['plot']}",
    ]
    return "\n".join(lines)
