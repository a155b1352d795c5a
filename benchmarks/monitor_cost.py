"""CPU cost of a worker's fairness monitor per record, next to the record agent's own work, in one run.

Both run on 1000-record batches of real Adult records. The record agent's batch logic (decode, apply the chain,
encode: ``RecordRepairer.process``) with a plan, and with a plan then a scorer (the scorer carries its frozen group
map, so the monitor also measures MDP; labels on; ``monitor.statistic = dependence_e, dp_difference, mdp``). The
monitor's work is what ``WorkerHooks.records_delivered`` does with the arrays the agent hands over after delivery,
since issue 32: ``FairnessMonitor.observe_batch`` of a monitor built with ``detect=False, sink=PartialAggregates.add``
(every batch counted into the accumulators of its records' event-time slices; with a scorer: the chain's own
scores, the classifier alone and MDP on the key-hashed sample), the worker's own gauges (diagnostics,
``export_fairness`` at most once a second) and, once per ``monitor.stats_seconds``, the partial aggregates taken and
encoded as stats messages (``PartialAggregates.take``: MDP's waiting samples matched, ``encode_partial``).

The records carry event times at ``--rate`` records/s per worker and the worker's clock follows them, so exports and
stats messages come once per second of the worker's records: at a low rate their fixed cost weighs more on each
record. Times are CPU time of this thread (stable on a busy machine), totals over ``--seconds`` of event time per
rate after a first batch. The share printed is of the agent's batch logic plus the monitor only, an upper bound: a
live worker also spends CPU in the Kafka clients (``benchmarks/stream_throughput.py`` measures the monitor's share
of a live worker from ``fairstream_monitor_cpu_seconds_total``; that counter leaves out the stats messages, counted
here). Target with a scorer: <= 10% (issue 32; 14.1% in a live worker before it). The baseline, in the same run:
the same monitor run as a worker ran it before issue 32 (detectors in the worker, no partials). At each rate where
the target is missed, or with ``--profile`` at every rate, the monitor's hot spots are printed (cProfile).

    .venv/bin/python benchmarks/monitor_cost.py [--batches 30] [--rate 5000 60000] [--seconds 10] [--profile]

``benchmarks/monitor_agent.py`` reuses this module: the same chain, the same worker steps.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from dataclasses import dataclass, fields, replace

import numpy as np

from adult_chain import adult_chain
from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import AgentConfig, PipelineConfig, adult_config
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.app import EXPORT_SECONDS
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import FairnessMonitor, export_fairness
from fairstream.streams.worker.partials import PartialAggregates
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

BATCH = 1000
STATISTICS = ("dependence_e", "dp_difference", "mdp")
TARGET_SHARE = 0.10
START = 1.7e9  # event time of a stream's first record
REPEATS = 3  # each CPU time is the least of this many runs
FULL_SPEED = 60_000.0  # records/s: about a plan + scorer worker at full speed (benchmarks/stream_throughput.py)
PARTS = ("observe", "export", "stats")


@dataclass
class Chain:
    """A chain as the benchmarks run it: its config, modules, the records it delivers and its batch logic's cost."""

    name: str
    config: PipelineConfig
    modules: tuple
    inputs: list  # batches of records.in messages its batch logic is timed on
    pool: RepairedBatch  # every archive record as the agent hands it to the monitor after delivery
    input_bytes: float  # mean key + value bytes of a records.in message
    batch_logic_us: float = 0.0  # RecordRepairer.process, CPU us per record (least of REPEATS runs)

    def batch_logic(self, repeats: int = REPEATS) -> float:
        """CPU us per record of the batch logic on the inputs (the least of ``repeats`` runs)."""
        repairer = RecordRepairer(self.config)
        return per_record_us(lambda batch: repairer.process(batch, self.modules), self.inputs, repeats)


def chains(batches: int, plan_only: bool = True) -> list[Chain]:
    """[plan -> scorer, plan only (with ``plan_only``)] on the Adult archive; the batch logic timed on ``batches``
    batches of 1000."""
    archive, plan, scorer = adult_chain()
    scored = adult_config(records=AgentConfig(artifact=("plan", "scorer"))).with_monitor(statistic=STATISTICS)
    return [measured_chain("plan + scorer", scored, (plan, scorer), archive, batches),
            *([measured_chain("plan", adult_config(), (plan,), archive, batches)] if plan_only else [])]


def measured_chain(name: str, config: PipelineConfig, modules: tuple, archive, batches: int) -> Chain:
    """The archive's records through ``modules`` in 1000-record batches: what it delivers, what it costs."""
    pairs = record_messages(archive, config, id_prefix="m")
    inputs = in_batches([SimpleMessage(v, k) for k, v in pairs])
    repairer = RecordRepairer(config)
    pool = concat([repairer.process(batch, modules).monitor_batch for batch in inputs])
    chain = Chain(name, config, modules, inputs[:batches], pool, float(np.mean([len(k) + len(v) for k, v in pairs])))
    chain.batch_logic_us = chain.batch_logic()
    return chain


def per_record_us(fn, batches, repeats: int = 1) -> float:
    """CPU microseconds per record over all the batches (the least of ``repeats`` runs: this machine may be busy)."""
    totals = []
    for _ in range(repeats):
        start = time.thread_time()
        for batch in batches:
            fn(batch)
        totals.append(time.thread_time() - start)
    return min(totals) / sum(len(batch) for batch in batches) * 1e6


def in_batches(items, size: int = BATCH) -> list:
    """Consecutive batches of ``size`` (the last may be shorter): of a list, or a RepairedBatch's records."""
    cut = items.take if isinstance(items, RepairedBatch) else items.__getitem__
    return [cut(slice(i, i + size)) for i in range(0, len(items), size)]


def concat(batches: list[RepairedBatch]) -> RepairedBatch:
    """The batches' records as one batch, in order."""
    def joined(name: str):
        parts = [getattr(batch, name) for batch in batches]
        if name == "unreadable":
            return sum(parts)
        return None if parts[0] is None else np.concatenate(parts)
    return RepairedBatch(**{f.name: joined(f.name) for f in fields(RepairedBatch)})


def stream(pool: RepairedBatch, records: int, rate: float) -> RepairedBatch:
    """``records`` records at ``rate`` records/s of event time from :data:`START`: the pool's, repeated once it runs
    out, each with a key of its own like the demo's ids (``r-<n>``: the key decides MDP's sample, and the cost of
    hashing it grows with its length)."""
    rows = np.arange(records)
    return replace(pool.take(rows % len(pool)), keys=np.char.add("r-", rows.astype(str)), ts=START + rows / rate)


class WorkerMonitor:
    """A worker's monitor as ``WorkerHooks.records_delivered`` runs it, on a clock that follows the records' event time.

    Each delivered batch is observed (counted into its slices' partial aggregates and the worker's own windows), the
    worker's gauges exported at most once per ``EXPORT_SECONDS`` and, when ``PartialAggregates.due``, the partials
    taken as stats messages. ``cpu`` holds the CPU seconds of each part; ``sent`` each message with its send time.
    With ``agent=False``, the monitor as a worker ran it before issue 32 (the baseline): detectors in the worker,
    no partials.
    """

    def __init__(self, chain: Chain, name: str, agent: bool = True):
        self.now = START
        clock = self.clock
        self.chain = chain
        self.partials = PartialAggregates(chain.config, name, clock=clock)
        self.monitor = (FairnessMonitor(chain.config, clock=clock, detect=False, sink=self.partials.add) if agent
                        else FairnessMonitor(chain.config, clock=clock))
        self.metrics = PipelineMetrics(f"{chain.config.name}-{name}")
        self.exported: float | None = None
        self.cpu = dict.fromkeys(PARTS, 0.0)
        self.sent: list[tuple[float, bytes]] = []
        self.slices: list[int] = []  # slices in each message

    def clock(self) -> float:
        return self.now

    def step(self, batch: RepairedBatch) -> None:
        """One delivered batch."""
        self.now = float(batch.ts.max())
        self._timed("observe", self.monitor.observe_batch, batch, *self.chain.modules)
        if self.exported is None or self.now - self.exported >= EXPORT_SECONDS:
            self.exported = self.now
            self._timed("export", export_fairness, self.monitor, self.metrics)
        if self.partials.due():
            self.send()

    def send(self) -> None:
        """Take the partials as stats messages (what ``send_partials`` sends; at a stop, whatever is counted)."""
        slices = sum(len(held) for held in self.partials.pending.values())
        for value in self._timed("stats", self.partials.take):
            self.sent.append((self.now, value))
            self.slices.append(slices)

    def _timed(self, part: str, fn, *args):
        start = time.thread_time()
        result = fn(*args)
        self.cpu[part] += time.thread_time() - start
        return result


def monitor_us(chain: Chain, rate: float, seconds: float, name: str, profile: cProfile.Profile | None = None,
               agent: bool = True) -> tuple[dict, float]:
    """CPU us per record of each part of one worker's monitor (``agent``: see :class:`WorkerMonitor`) at ``rate``
    records/s, over ``seconds`` of event time after its first batch (which starts the chain's windows), and of the
    batch logic timed between its runs (the machine may be busy: both see the same conditions). Each the least of
    :data:`REPEATS` runs; ``profile``: one run, profiled."""
    records = max(2 * BATCH, int(rate * seconds))
    batches = in_batches(stream(chain.pool, records, rate))
    runs, batch_logic = [], []
    for repeat in range(1 if profile is not None else REPEATS):
        batch_logic.append(chain.batch_logic())
        worker = WorkerMonitor(chain, f"{name}-{repeat}", agent)
        worker.step(batches[0])
        worker.cpu = dict.fromkeys(PARTS, 0.0)
        if profile is not None:
            profile.enable()
        for batch in batches[1:]:
            worker.step(batch)
        if profile is not None:
            profile.disable()
        runs.append(worker.cpu)
    counted = records - len(batches[0])
    least = min(runs, key=lambda cpu: sum(cpu.values()))
    return {part: cpu / counted * 1e6 for part, cpu in least.items()}, min(batch_logic)


def share(parts: dict, batch_logic_us: float) -> float:
    """The monitor's share of the batch logic plus the monitor."""
    total = sum(parts.values())
    return total / (batch_logic_us + total)


def report_shares(chains_: list[Chain], rates: list[float], seconds: float) -> dict[float, float]:
    """Print each chain's monitor cost at each rate; the target applies to the first chain, also measured as a worker
    ran its monitor before issue 32 (the baseline). Returns the first chain's share per rate."""
    shares: dict[float, float] = {}
    print(f"monitor of one worker, CPU us per record (batches of {BATCH}, records at each rate of event time, "
          f"{seconds:g} s of it; gauges exported and partials sent once a second):")
    print(f"  {'chain':<24} {'rec/s':>7} {'observe':>8} {'gauges':>7} {'stats msgs':>10} {'monitor':>8} "
          f"{'batch logic':>11} {'share':>6}")
    for chain in chains_:
        for agent in (True, False) if chain is chains_[0] else (True,):
            for rate in rates:
                parts, batch_logic_us = monitor_us(chain, rate, seconds, f"cost-{chain.name}-{rate:g}-{agent}",
                                                   agent=agent)
                verdict = ""
                if chain is chains_[0] and agent:
                    shares[rate] = share(parts, batch_logic_us)
                    verdict = "  target <= 10%: " + ("met" if shares[rate] <= TARGET_SHARE else "MISSED")
                label = chain.name + ("" if agent else ", detectors")
                print(f"  {label:<24} {rate:>7,.0f} {parts['observe']:>8.2f} {parts['export']:>7.2f} "
                      f"{parts['stats']:>10.2f} {sum(parts.values()):>8.2f} {batch_logic_us:>11.2f} "
                      f"{share(parts, batch_logic_us):>6.1%}{verdict}")
    print("  (observe: observe_batch into the slices' partials and the worker's windows; gauges: the worker's own, "
          "export_fairness; stats msgs: PartialAggregates.take, MDP matched + encode_partial; detectors: the same "
          "monitor run as before issue 32, detectors in the worker and no partials; batch logic: timed between the "
          "monitor's runs; share: monitor / (batch logic + monitor), an upper bound of its share of a live worker)")
    return shares


def where(filename: str) -> str:
    """A profiled function's file, short: its path below src/ or site-packages/, else its name (the standard
    library's; "~" for built-ins)."""
    for marker in (f"{os.sep}src{os.sep}", f"{os.sep}site-packages{os.sep}"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.basename(filename)


def report_profile(chain: Chain, rate: float, seconds: float, top: int = 14) -> None:
    """The monitor's hot spots at ``rate`` (over ``seconds`` of event time, at most 200,000 records): fairstream's
    functions by inclusive time, and all by own time, each as a share of the monitor's profiled CPU."""
    profile = cProfile.Profile(time.thread_time)
    monitor_us(chain, rate, min(seconds, 200_000 / rate), f"profile-{rate:g}", profile)
    stats = pstats.Stats(profile).stats
    total = sum(entry[2] for entry in stats.values())
    ours = [(entry[3], key) for key, entry in stats.items()
            if f"{os.sep}fairstream{os.sep}" in key[0] and not key[2].startswith("<")]  # no comprehensions
    print(f"profile of the monitor ({chain.name}, {rate:,.0f} records/s, cProfile; {total * 1e3:.0f} ms profiled):")
    print("  inclusive time, fairstream's functions:")
    for cumulative, (filename, _, function) in sorted(ours, reverse=True)[:top]:
        print(f"    {cumulative / total:6.1%}  {where(filename)}:{function}")
    print("  own time, every function:")
    for (filename, _, function), entry in sorted(stats.items(), key=lambda item: -item[1][2])[:top]:
        print(f"    {entry[2] / total:6.1%}  {where(filename)}:{function}")


def monitor_report(chains_: list[Chain], rates: list[float], seconds: float, profile: bool = False) -> None:
    """The monitor's cost per chain and rate (:func:`report_shares`), and the first chain's hot spots at each rate
    where it misses the target (every rate with ``profile``)."""
    for rate, value in report_shares(chains_, rates, seconds).items():
        if profile or value > TARGET_SHARE:
            report_profile(chains_[0], rate, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30, help="batches of 1000 the batch logic is timed on")
    parser.add_argument("--rate", type=float, nargs="+", default=[5000.0, FULL_SPEED],
                        help="records/s of event time per worker (60,000: about a plan + scorer worker at full "
                             "speed, benchmarks/stream_throughput.py)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of event time measured per rate")
    parser.add_argument("--profile", action="store_true", help="print the monitor's hot spots even if on target")
    args = parser.parse_args()
    scored, plan_only = chains(args.batches)
    print(f"record agent batch logic (RecordRepairer.process), CPU us/record: plan {plan_only.batch_logic_us:.2f}, "
          f"plan + scorer {scored.batch_logic_us:.2f}")
    monitor_report([scored, plan_only], args.rate, args.seconds, args.profile)


if __name__ == "__main__":
    main()
