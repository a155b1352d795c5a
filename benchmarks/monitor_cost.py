"""CPU cost of the fairness monitor per record, next to the record agent's own work, in one run.

Both run on the same 1000-record batches of real Adult records. The record agent's batch logic (decode,
apply the chain, encode: `RecordRepairer.process`) with a plan, and with a plan then a scorer (the scorer
carries its frozen group map, so the monitor also measures MDP). The monitor's work on the arrays the
agent hands over after delivery (`FairnessMonitor.observe_batch`: with a scorer the chain's own scores,
the classifier alone and MDP on a sample of each batch, both sliding windows, the drift detector), plus
the gauge export (once a second in a worker; here every 6th batch by default, more often than a
worker at full speed; it also matches MDP's waiting samples). Times are CPU time of this thread (stable on a busy machine), totals over all batches. The
share printed here is of the agent's batch logic plus the monitor only, an upper bound: a live worker
also spends CPU in the Kafka clients, and ``benchmarks/stream_throughput.py`` measures the monitor's
share of a live worker's CPU.

    .venv/bin/python benchmarks/monitor_cost.py [--batches 30] [--export-every 6]

The archive holds 38 batches of 1000: with ``--export-every 60 --batches 38`` (a worker at 60,000 records/s) no
export falls in the 37 measured batches, so one export's own cost is printed apart (after the run, matching the MDP
samples still waiting).
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace

from adult_chain import adult_chain
from fairstream.streams.config import adult_config
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import FairnessMonitor, export_fairness
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage


def per_record_us(fn, batches) -> float:
    """CPU microseconds per record over all the batches (a total: a gauge export every few batches counts)."""
    start = time.thread_time()
    for batch in batches:
        fn(batch)
    return (time.thread_time() - start) / sum(len(batch) for batch in batches) * 1e6


def steady_us(step, batches) -> float:
    """:func:`per_record_us` of ``step`` after its first batch (which sets up the chain version's windows)."""
    step(batches[0])
    return per_record_us(step, batches[1:])


def monitored(monitor: FairnessMonitor, chain: tuple, every: int = 6):
    """One delivered batch through the monitor as a worker does it: observed, and the gauges exported every
    ``every`` batches."""
    seen, metrics = itertools.count(1), PipelineMetrics("monitor-cost")

    def step(batch) -> None:
        monitor.observe_batch(batch, *chain)
        if next(seen) % every == 0:
            export_fairness(monitor, metrics)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--export-every", type=int, default=6,
                        help="batches between gauge exports (a worker exports once a second: at 60,000 records/s "
                             "in batches of 1000, every 60)")
    args = parser.parse_args()
    config = adult_config()
    archive, plan, scorer = adult_chain()
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive, config, id_prefix="m")]
    inputs = [messages[i:i + 1000] for i in range(0, min(1000 * args.batches, len(messages) - 999), 1000)]
    agent = RecordRepairer(config)
    scored = RecordRepairer(replace(config, records=replace(config.records, artifact=("plan", "scorer"))))
    # What a worker hands over after delivery: the chain's arrays, with its scores when it ends in a scorer.
    delivered = [agent.process(batch, plan).monitor_batch for batch in inputs]
    delivered_scored = [scored.process(batch, (plan, scorer)).monitor_batch for batch in inputs]

    agent_us = per_record_us(lambda batch: agent.process(batch, plan), inputs)
    scored_us = per_record_us(lambda batch: scored.process(batch, (plan, scorer)), inputs)
    every = args.export_every
    monitor = FairnessMonitor(config)
    monitor_us = steady_us(monitored(monitor, (plan, scorer), every), delivered_scored)
    no_scorer_us = steady_us(monitored(FairnessMonitor(config), (plan,), every), delivered)
    metrics = PipelineMetrics("monitor-cost")
    start = time.thread_time()
    export_fairness(monitor, metrics)  # one more export, with whatever MDP samples wait: its cost whatever --export-every
    export_ms = (time.thread_time() - start) * 1e3
    print(f"record agent batch logic, plan (decode + repair + encode):  {agent_us:7.2f} us/record")
    print(f"record agent batch logic, plan + scorer:                    {scored_us:7.2f} us/record")
    print(f"monitor with scorer (DP, EOpp, MDP, E, W1, out-of-range):   {monitor_us:7.2f} us/record")
    print(f"monitor without scorer (E, W1, label DP, out-of-range):     {no_scorer_us:7.2f} us/record")
    print(f"(each monitor with its gauge export every {every} batches; target with a scorer at --export-every 60: "
          "<= 1.2 us/record)")
    print(f"one gauge export of the monitor with scorer (both windows, MDP's waiting samples matched): "
          f"{export_ms:.1f} ms (a worker exports once a second: {export_ms / 10:.2f}% of a core)")
    print(f"monitor share of (agent batch logic + monitor): {monitor_us / (scored_us + monitor_us):.1%} with scorer, "
          f"{no_scorer_us / (agent_us + no_scorer_us):.1%} without (an upper bound of its share of a worker; "
          "make bench-stream measures it in a live worker; target <= 10%)")


if __name__ == "__main__":
    main()
