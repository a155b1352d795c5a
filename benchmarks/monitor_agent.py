"""The monitoring agent's cost per record merged and the stats topic's bytes, with 1 and 3 workers, in one run.

Issue 32, item 6. A stream of Adult records through the chain plan -> scorer (labels on, the scorer carrying its
frozen group map, ``monitor.statistic = dependence_e, dp_difference, mdp``), event times at ``--rate`` records/s per
worker, spread over the workers at random (random keys). Each worker runs its monitor as ``fairstream worker`` does
(``benchmarks/monitor_cost.py``'s ``WorkerMonitor``: 1000-record batches counted into 1 s event-time slices, the
partial aggregates sent once per ``monitor.stats_seconds`` (1 s) of its clock, which follows event time). The agent
(``MonitoringAgent``) takes every worker's messages in the order they were sent and ticks every ``TICK_SECONDS`` of
the same clock, as ``fairstream monitor`` does. No broker: a message's bytes are its key and value as the worker
produces them (the ``.npz`` deflates each array; the stats producer adds no compression; Kafka's own record and
batch headers are not counted).

Printed, with baselines measured in the same run (a worker's batch logic per record, ``RecordRepairer.process``; the
bytes of the same records on ``records.in``):

1. the agent's CPU (thread time of ``take`` + ``tick``) per record merged and per message, and its share of one core
   at the run's pipeline rate next to what the workers spend on the same records. Runs: 1 worker and N workers at
   ``--rate`` each (``--records`` each); N workers splitting the 1-worker stream (each a 1/N of its records in the
   same slices: the agent must export the 1-worker run's statistics); N workers at ``--share-rate`` each for
   ``--seconds``;
2. the stats topic's bytes per worker per second and per 1,000 records, and the slices a message spans;
3. the monitor's share of a worker's CPU with a scorer (``monitor_cost.monitor_report``, target <= 10%) at
   ``--rate`` and at a worker's full speed, with the monitor's hot spots where it misses.

    .venv/bin/python benchmarks/monitor_agent.py [--records 150000] [--workers 1 3] [--rate 5000]
        [--share-rate 20000] [--seconds 10]

About 45 s of CPU (1-2 minutes on a busy machine): fitting the chain, the runs, the monitor's repeated runs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from fairstream.streams.agent.service import TICK_SECONDS, MonitoringAgent
from fairstream.streams.worker.metrics import PipelineMetrics
from monitor_cost import FULL_SPEED, STATISTICS, Chain, WorkerMonitor, chains, in_batches, monitor_report, stream


@dataclass
class Run:
    """One pipeline: its workers' stats messages and CPU, and the agent's CPU merging them."""

    label: str
    workers: int
    rate: float  # records/s of the pipeline
    records: int
    worker_records: list[int] = field(default_factory=list)
    sent: list[tuple[float, bytes]] = field(default_factory=list)  # (send time, value), every worker's, as sent
    sizes: list[list[int]] = field(default_factory=list)  # per worker: key + value bytes of each message
    slices: list[int] = field(default_factory=list)  # slices in each message
    covered: list[int] = field(default_factory=list)  # per worker: slices its records fall in
    worker_cpu: float = 0.0  # the workers' monitors, seconds
    agent_cpu: dict = field(default_factory=lambda: {"take": 0.0, "tick": 0.0})
    merged: int = 0  # records in the agent's closed slices
    late: int = 0
    rows: dict = field(default_factory=dict)  # (window, row labels) -> value the agent exports

    @property
    def seconds(self) -> float:
        """Event time the stream spans."""
        return self.records / self.rate

    @property
    def agent_total(self) -> float:
        return sum(self.agent_cpu.values())


def run_pipeline(chain: Chain, label: str, workers: int, records: int, rate: float) -> Run:
    """``records`` at ``rate`` records/s of the pipeline, each to one of ``workers`` at random: every worker's monitor
    and stats messages, then the agent on them (:func:`merge`)."""
    data = stream(chain.pool, records, rate)
    run = Run(label, workers, rate, records)
    owner = np.random.default_rng(0).integers(0, workers, records)
    for worker in range(workers):
        mine = np.flatnonzero(owner == worker)
        monitor = WorkerMonitor(chain, f"{label}-w{worker}".replace(" ", "").replace(",", ""))
        for rows in in_batches(mine):
            monitor.step(data.take(rows))
        monitor.send()  # at its stop: whatever it counted since its last message
        key = len(monitor.partials.worker.encode())
        run.worker_records.append(len(mine))
        run.sent += [(at, value) for at, value in monitor.sent]
        run.sizes.append([key + len(value) for _, value in monitor.sent])
        run.slices += monitor.slices
        run.covered.append(len(np.unique(np.floor(data.ts[mine] / chain.config.monitor.slice_seconds))))
        run.worker_cpu += sum(monitor.cpu.values())
    run.sent.sort(key=lambda message: message[0])  # the stats topic's order (stable: a worker's own order kept)
    merge(chain, run)
    return run


def merge(chain: Chain, run: Run) -> None:
    """The agent takes the run's messages when they were sent, ticking every TICK_SECONDS of the same clock, until
    every slice closed (``monitor.lateness_seconds`` after the last message)."""
    now = run.sent[0][0]

    def clock() -> float:
        return now

    agent = MonitoringAgent(chain.config, metrics=PipelineMetrics(f"agent-{run.label}".replace(" ", ""),
                                                                  process="agent"), clock=clock, monotonic=clock)

    def timed(part: str, fn, *args) -> None:
        start = time.thread_time()
        fn(*args)
        run.agent_cpu[part] += time.thread_time() - start

    tick = now + TICK_SECONDS
    for at, value in [*run.sent, (run.sent[-1][0] + chain.config.monitor.lateness_seconds + TICK_SECONDS, None)]:
        while tick <= at:
            now = tick
            timed("tick", agent.tick)
            tick += TICK_SECONDS
        if value is not None:
            now = at
            timed("take", agent.take, value)
    active = agent.statistics.active
    run.merged, run.late = active.records, active.late
    run.rows = {(window, row[:5]): row[5] for window in ("count", "time") for row in active.monitor.rows(window)}


def difference(run: Run, reference: Run) -> str:
    """How the statistics the agent exports in ``run`` differ from ``reference``'s."""
    if run.rows.keys() != reference.rows.keys():
        return f"DIFFERENT rows ({len(run.rows)} against {len(reference.rows)})"
    gap = max(abs(float(run.rows[key]) - float(reference.rows[key])) for key in run.rows)
    return f"the same {len(run.rows)} rows (count and time windows), largest difference {gap:.1e}"


def report_agent(chain: Chain, runs: list[Run]) -> None:
    print(f"agent (MonitoringAgent.take per message + tick every {TICK_SECONDS:g} s), CPU; the workers' CPU on the "
          f"same records = batch logic + monitor:")
    print(f"  {'run':<22} {'pipeline rec/s':>14} {'records':>8} {'msgs':>5} {'take us/rec':>11} {'tick us/rec':>11} "
          f"{'agent us/rec':>12} {'x batch logic':>13} {'ms/msg':>7} {'core share':>10} {'x workers CPU':>13}")
    for run in runs:
        per_record = run.agent_total / run.merged * 1e6
        workers_cpu = run.worker_cpu + run.records * chain.batch_logic_us / 1e6
        print(f"  {run.label:<22} {run.rate:>14,.0f} {run.records:>8,} {len(run.sent):>5} "
              f"{run.agent_cpu['take'] / run.merged * 1e6:>11.2f} {run.agent_cpu['tick'] / run.merged * 1e6:>11.2f} "
              f"{per_record:>12.2f} {per_record / chain.batch_logic_us:>12.2f}x "
              f"{run.agent_total / len(run.sent) * 1e3:>7.1f} {run.agent_total / run.seconds:>10.2%} "
              f"{run.agent_total / workers_cpu:>12.2f}x")
        if run.merged != run.records or run.late:
            print(f"    MERGED {run.merged:,} of {run.records:,} records ({run.late:,} late)")
    print("  (us/rec: per record merged, every record once whatever the workers; core share: the agent's CPU over the "
          "event time the stream spans, at its pipeline rate)")


def report_bytes(chain: Chain, runs: list[Run]) -> None:
    print("stats topic, per worker (key + value as produced):")
    print(f"  {'run':<22} {'rec/s/worker':>12} {'rec/worker':>10} {'msgs/worker':>11} {'slices/msg':>10} "
          f"{'slices':>6} {'bytes/msg':>9} {'bytes/s':>8} {'bytes/1000 rec':>14} {'x records.in':>12}")
    for run in runs:
        sizes = [size for worker in run.sizes for size in worker]
        per_second = sum(sizes) / run.workers / run.seconds
        per_worker_rate = run.rate / run.workers
        print(f"  {run.label:<22} {per_worker_rate:>12,.0f} {np.mean(run.worker_records):>10,.0f} "
              f"{len(sizes) / run.workers:>11.1f} {np.mean(run.slices):>10.2f} {np.mean(run.covered):>6.0f} "
              f"{np.mean(sizes):>9,.0f} {per_second:>8,.0f} {sum(sizes) / run.records * 1000:>14,.0f} "
              f"{per_second / (per_worker_rate * chain.input_bytes):>11.1%}")
    print(f"  (slices: event-time slices a worker's records fall in, each of its messages spanning 'slices/msg' of "
          f"them; x records.in: of the worker's input bytes at its rate, {chain.input_bytes:.0f} bytes a record)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=150_000,
                        help="records per worker at --rate (the Adult archive repeated, each record with a key of its "
                             "own); the split runs share the 1-worker stream")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rate", type=float, default=5000.0, help="records/s of event time per worker")
    parser.add_argument("--share-rate", type=float, default=20000.0,
                        help="records/s per worker of the agent's core-share run (with the most workers)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="event time of the core-share run, and of the monitor's runs per rate")
    args = parser.parse_args()
    (scored,) = chains(batches=30, plan_only=False)
    print(f"plan -> scorer on Adult records (labels, statistics {', '.join(STATISTICS)}), batches of 1000, slices and "
          f"stats messages of {scored.config.monitor.stats_seconds:g} s, workers at {args.rate:,.0f} records/s each")
    print(f"baselines: worker batch logic (RecordRepairer.process) {scored.batch_logic_us:.2f} us/record; "
          f"records.in {scored.input_bytes:.0f} bytes/record")
    runs = [run_pipeline(scored, f"{n} x {args.rate:,.0f}", n, args.records * n, args.rate * n)
            for n in args.workers]
    first = runs[0]
    split = [run_pipeline(scored, f"{n} x {first.rate / n:,.0f} (split)", n, first.records, first.rate)
             for n in args.workers if n > first.workers]
    most = max(args.workers)
    runs += split + [run_pipeline(scored, f"{most} x {args.share_rate:,.0f}", most,
                                  int(most * args.share_rate * args.seconds), most * args.share_rate)]
    report_agent(scored, runs)
    for run in split:
        print(f"  {run.label} against {first.label}: {difference(run, first)}")
    report_bytes(scored, runs)
    monitor_report([scored], [args.rate, FULL_SPEED], args.seconds)


if __name__ == "__main__":
    main()
