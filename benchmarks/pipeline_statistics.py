"""Per-worker fairness figures against the pipeline's: the table of issue 32, re-measured.

Three workers share six partitions of a stream of Adult records repaired by a plan and scored (chain plan ->
scorer). Before the monitoring agent, each worker measured its own partitions and the alert rule took the ``max``
over the workers' figures; now the agent merges every worker's counts into the pipeline's. This script measures,
on the same records:

- the **truth**: the statistic over every record (one monitor, every record);
- the **old alert expression**: the max over the three workers' own windows, with random keys and with keys
  correlated with the group (each partition holds one (group, stratum) cell mostly, as a topic keyed by branch,
  region or occupation does);
- the **agent**: the pipeline's value merged from the workers' partial aggregates (the same code path as
  ``fairstream monitor``).

Then, over many random partitionings of correlated keys, how often the old expression would page
(``> threshold``) while the truth is below it, and how often it reads below the truth.

Run: ``.venv/bin/python benchmarks/pipeline_statistics.py [--records 24000] [--partitionings 400]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.streams.agent.service import MonitoringAgent
from fairstream.streams.codec.repaired import decode_repaired
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.partials import PartialAggregates
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

WORKERS, PARTITIONS = 3, 6
ROWS = {"DP gap (all)": ("dp_difference", "after", "all"), "DP gap (u=1)": ("dp_difference", "after", "1"),
        "E": ("dependence_e", "after", "all")}


def stream(n: int):
    research, archive = datasets.load("adult").split(10_000, seed=0)
    window = max(n, 1000)
    config = adult_config(records=AgentConfig(artifact=("plan", "scorer")),
                          monitor=MonitorConfig(window_records=window, buckets=1, min_records=100,
                                                window_seconds=3600.0, max_event_time_skew=3600.0,
                                                statistic=("dependence_e", "dp_difference"), threshold=0.1,
                                                lateness_seconds=0.0, min_group_records=1))
    plan = Active("plan", 1, "p" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y))
    data = archive.subset(slice(0, n))
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, config, id_prefix="b")]
    batch = decode_repaired([v for _, v in RecordRepairer(config).process(messages, plan).repaired], config)
    return config, plan, scorer, batch


def figures(rows: list[tuple]) -> dict[str, float]:
    found = {(r[0], r[1], r[2]): r[5] for r in rows if r[3] == "all" and r[4] == "all"}
    return {name: found.get(key, np.nan) for name, key in ROWS.items()}


def per_worker(config, plan, scorer, batch, worker_of: np.ndarray) -> list[dict]:
    out = []
    for w in range(WORKERS):
        monitor = FairnessMonitor(config, detect=False)
        mine = np.flatnonzero(worker_of == w)
        for start in range(0, len(mine), 1000):
            monitor.observe_batch(batch.take(mine[start:start + 1000]), plan, scorer)
        out.append(figures(monitor.rows("count")))
    return out


def agent_value(config, plan, scorer, batch, worker_of: np.ndarray) -> tuple[dict, float]:
    agent = MonitoringAgent(config, metrics=PipelineMetrics(f"bench-{time.monotonic_ns()}", process="agent"))
    spent = 0.0
    for w in range(WORKERS):
        partials = PartialAggregates(config, f"w{w}")
        monitor = FairnessMonitor(config, detect=False, sink=partials.add)
        mine = np.flatnonzero(worker_of == w)
        for start in range(0, len(mine), 1000):
            monitor.observe_batch(batch.take(mine[start:start + 1000]), plan, scorer)
        started = time.thread_time()
        for message in partials.take():
            agent.take(message)
        spent += time.thread_time() - started
    agent.tick(everything=True)
    return figures(agent.statistics.active.monitor.rows("count")), spent


def workers_of(partition: np.ndarray) -> np.ndarray:
    return partition % WORKERS  # six partitions, two per worker


def correlated(batch, rng) -> np.ndarray:
    """A partition per (group, stratum) cell and a random share: a topic keyed by something correlated with s."""
    cell = batch.s.astype(int) * 2 + batch.u.astype(int)
    home = rng.permutation(PARTITIONS)[:4][cell]
    return np.where(rng.random(len(batch)) < 0.8, home, rng.integers(0, PARTITIONS, len(batch)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=24_000)
    parser.add_argument("--partitionings", type=int, default=400)
    args = parser.parse_args()
    config, plan, scorer, batch = stream(args.records)
    truth_monitor = FairnessMonitor(config, detect=False)
    truth_monitor.observe_batch(batch, plan, scorer)
    truth = figures(truth_monitor.rows("count"))
    rng = np.random.default_rng(0)
    random_keys = workers_of(rng.integers(0, PARTITIONS, len(batch)))
    grouped = workers_of(correlated(batch, np.random.default_rng(1)))
    table = {"pipeline truth, every record": truth}
    for name, owner in (("max over workers, random keys", random_keys),
                        ("max over workers, keys correlated with the group", grouped)):
        table[name] = {k: float(np.nanmax([w[k] for w in per_worker(config, plan, scorer, batch, owner)]))
                       for k in ROWS}
    agent_random, _ = agent_value(config, plan, scorer, batch, random_keys)
    agent_grouped, _ = agent_value(config, plan, scorer, batch, grouped)
    table["agent (pipeline), random keys"], table["agent (pipeline), correlated keys"] = agent_random, agent_grouped
    print(f"{args.records} Adult records, chain plan -> scorer, {WORKERS} workers, {PARTITIONS} partitions\n")
    print(f"{'':52s}" + "".join(f"{name:>14s}" for name in ROWS))
    for name, row in table.items():
        print(f"{name:52s}" + "".join(f"{row[k]:14.4f}" for k in ROWS))
    print("\nthe agent equals the truth: " + ", ".join(
        f"{k} {abs(agent_grouped[k] - truth[k]):.1e}" for k in ROWS) + " (absolute difference, correlated keys)")
    threshold = config.monitor.thresholds["dp_difference"]
    false_alerts, below = {k: 0 for k in ROWS}, {k: 0 for k in ROWS}
    for _ in range(args.partitionings):
        workers = per_worker(config, plan, scorer, batch, workers_of(correlated(batch, rng)))
        for k in ROWS:
            worst = np.nanmax([w[k] for w in workers])
            false_alerts[k] += worst > threshold >= truth[k]
            below[k] += worst < truth[k] - 1e-12
    print(f"\nover {args.partitionings} partitionings with correlated keys, the old expression (max over workers):")
    for k in ROWS:
        print(f"  {k:14s} false alert (> {threshold} while the truth is {truth[k]:.3f}) in "
              f"{false_alerts[k] / args.partitionings:6.1%}; below the truth in {below[k] / args.partitionings:6.1%}")
    print("  the agent: the truth in every partitioning (same counts, merged)")


if __name__ == "__main__":
    main()
