"""CPU cost of the fairness monitor per record, next to the record agent's own work, in one run.

Both run on the same 1000-record batches of real Adult records: the record agent's batch logic
(decode, repair, encode: `RecordRepairer.process`) and the monitor's on the arrays the agent hands
over after delivery (`FairnessMonitor.observe_batch`: scorer and transport map for MDP, both sliding
windows, drift detector), plus the gauge export (once a second). Times are CPU time of this thread
(stable on a busy machine). The share printed here is of the agent's batch logic plus the monitor
only, an upper bound: a live worker also spends CPU in the Kafka clients, and
``benchmarks/stream_throughput.py`` measures the monitor's share of a live worker's CPU.

    .venv/bin/python benchmarks/monitor_cost.py [--batches 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.app import export_fairness
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage


def per_record_us(fn, batches) -> float:
    """Median CPU microseconds per record over the batches."""
    times = []
    for batch in batches:
        start = time.thread_time()
        fn(batch)
        times.append((time.thread_time() - start) / len(batch))
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    args = parser.parse_args()
    config = adult_config()
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = Active("plan", 1, "0" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    # The scorer carries its frozen group map (what MDP matches with), fitted on the features it reads.
    repaired = plan.module.transform(research.X, research.s, research.u, keys=[str(i) for i in range(len(research))])
    scorer = Active("scorer", 1, "1" * 64, None, LogisticScorer().fit(repaired, research.y).attach_group_map(
        GroupTransportMap(seed=0).fit(repaired, research.s)))
    messages = [SimpleMessage(v, k) for k, v in record_messages(archive, config, id_prefix="m")]
    inputs = [messages[i:i + 1000] for i in range(0, 1000 * args.batches, 1000)]
    agent = RecordRepairer(config)
    delivered = [agent.process(batch, plan).monitor_batch for batch in inputs]  # what a worker hands over

    agent_us = per_record_us(lambda batch: agent.process(batch, plan), inputs)
    monitor = FairnessMonitor(config)
    # Gauges are exported at most once a second; at full throughput that is every ~6 batches.
    monitor_us = per_record_us(lambda batch: monitor.observe_batch(batch, plan, scorer), delivered)
    plain = FairnessMonitor(config)
    no_scorer_us = per_record_us(lambda batch: plain.observe_batch(batch, plan), delivered)
    export_us = per_record_us(lambda batch: export_fairness(monitor), delivered) / 6
    print(f"record agent batch logic (decode + repair + encode): {agent_us:7.1f} us/record")
    print(f"monitor with scorer (DP, MDP, E, W1, out-of-range):   {monitor_us:7.1f} us/record")
    print(f"monitor without scorer:                               {no_scorer_us:7.1f} us/record")
    print(f"gauge export (once a second, ~6 batches):             {export_us:7.1f} us/record")
    with_scorer, without = monitor_us + export_us, no_scorer_us + export_us
    print(f"monitor share of (agent batch logic + monitor): {with_scorer / (agent_us + with_scorer):.1%} with scorer, "
          f"{without / (agent_us + without):.1%} without (an upper bound of its share of a worker; "
          "make bench-stream measures it in a live worker; target <= 10%)")

if __name__ == "__main__":
    main()
