"""The pipeline's statistics: every worker's partial aggregates merged by the monitoring agent, without a broker.

The same records give the same statistics whatever the number of workers, the partition assignment (random keys,
keys correlated with the group) and a rebalance in the middle; and they equal an offline computation over the
output records, slice by slice.
"""

from dataclasses import replace

import numpy as np
import pytest

from fairstream.models.plan import DistributionalRepair
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.streams.agent.service import MonitoringAgent
from fairstream.streams.codec.partials import PartialError, decode_partial, encode_partial
from fairstream.streams.codec.repaired import decode_repaired
from fairstream.streams.config import AgentConfig, MonitorConfig, adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.worker.metrics import PipelineMetrics
from fairstream.streams.worker.monitor import FairnessMonitor, in_slices, slice_of
from fairstream.streams.worker.partials import PartialAggregates, matched
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

MONITOR = MonitorConfig(window_records=2000, buckets=4, min_records=500, window_seconds=60.0, max_event_time_skew=60.0,
                        statistic=("dependence_e", "dp_difference", "mdp"), threshold=0.1, lateness_seconds=0.0,
                        cooldown_seconds=3600.0)
CONFIG = adult_config(records=AgentConfig(artifact=("plan", "scorer")), monitor=MONITOR)
RATE = 100.0  # records per second of event time: 6,000 records span 60 slices


@pytest.fixture(scope="module")
def stream():
    research, archive = datasets.load("adult").split(10_000, seed=0)
    plan = Active("plan", 1, "p" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    scorer = Active("scorer", 1, "s" * 64, None, LogisticScorer().fit(research.X, research.y).attach_group_map(
        GroupTransportMap(seed=0).fit(research.X, research.s)))
    data = archive.subset(slice(0, 6000))
    messages = [SimpleMessage(v, k) for k, v in record_messages(data, CONFIG, id_prefix="r")]
    values = [v for _, v in RecordRepairer(CONFIG).process(messages, plan).repaired]
    batch = decode_repaired(values, CONFIG)
    batch = replace(batch, ts=1.7e9 + np.arange(len(batch)) / RATE)
    return batch, plan, scorer


def run_workers(batch, plan, scorer, owner_at, name: str, batch_size: int = 700) -> MonitoringAgent:
    """Workers (``owner_at(first_half)`` gives each record's worker) counting their records in batches, sending
    their partials every few batches; the agent merges them. Records reach the workers in order, per worker."""
    agent = MonitoringAgent(CONFIG, metrics=PipelineMetrics(name, process="agent"))
    halves = np.arange(len(batch)) >= len(batch) // 2
    owners = np.where(halves, owner_at(False), owner_at(True))  # a rebalance in the middle when they differ
    for worker in np.unique(owners):
        partials = PartialAggregates(CONFIG, f"worker-{worker}")
        monitor = FairnessMonitor(CONFIG, detect=False, sink=partials.add)
        mine = np.flatnonzero(owners == worker)
        for n, start in enumerate(range(0, len(mine), batch_size)):
            monitor.observe_batch(batch.take(mine[start:start + batch_size]), plan, scorer)
            if n % 3 == 2:
                for message in partials.take():
                    agent.take(message)
        for message in partials.take():
            agent.take(message)
    agent.tick(everything=True)
    return agent


def exported(agent: MonitoringAgent, window: str = "count") -> dict:
    return {row[:5]: row[5] for row in agent.statistics.active.monitor.rows(window)}


def offline(batch, plan, scorer) -> dict:
    """The output records read back and measured slice by slice, in order: one monitor, one batch per slice."""
    monitor = FairnessMonitor(CONFIG, detect=False)
    slices = slice_of(batch.ts, CONFIG.monitor.slice_seconds)
    for index in np.unique(slices):
        monitor.observe_batch(batch.take(np.flatnonzero(slices == index)), plan, scorer)
    return {row[:5]: row[5] for row in monitor.rows("count")}


def assert_same(found: dict, expected: dict) -> None:
    assert found.keys() == expected.keys()
    for key, value in expected.items():  # counts add exactly; only float sums (MDP's) may differ by rounding
        assert found[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def random_keys(n_workers):
    return lambda first: np.random.default_rng(int(first) + 7).integers(0, n_workers, 6000)


def by_group(n_workers, stream_batch):
    # partitions keyed by something correlated with the group: the worst case for per-worker statistics
    return lambda first: (stream_batch.s.astype(int) * 2 + stream_batch.u.astype(int) + (0 if first else 1)) % n_workers


def test_every_partitioning_gives_the_pipeline_the_same_statistics(stream):
    batch, plan, scorer = stream
    alone = run_workers(batch, plan, scorer, random_keys(1), "same-1")
    one, one_time = exported(alone), exported(alone, "time")
    assert {key[0] for key in one} >= {"dependence_e", "w1", "dp_difference", "eopp", "mdp", "out_of_range_rate"}
    assert_same(one, offline(batch, plan, scorer))
    for n_workers, name, owner in ((2, "random", random_keys(2)), (3, "random", random_keys(3)),
                                   (3, "grouped", by_group(3, batch))):
        agent = run_workers(batch, plan, scorer, owner, f"same-{n_workers}-{name}")
        assert_same(exported(agent), one)
        assert_same(exported(agent, "time"), one_time)


def test_a_group_that_stops_arriving_makes_the_statistics_unmeasurable_not_fair(stream):
    batch, plan, scorer = stream
    women = batch.take(np.flatnonzero(batch.s == 0))  # about 2,000: twice over fills the count window with them
    late = [replace(women, ts=women.ts + shift, keys=np.char.add(f"late-{shift}-", women.keys.astype(str)))
            for shift in (200.0, 330.0)]
    metrics = PipelineMetrics("unmeasurable", process="agent")
    agent = MonitoringAgent(CONFIG, metrics=metrics)
    partials = PartialAggregates(CONFIG, "w")
    monitor = FairnessMonitor(CONFIG, detect=False, sink=partials.add)
    for part in (batch.take(np.arange(3000)), *late):
        for start in range(0, len(part), 1000):
            monitor.observe_batch(part.take(np.arange(start, min(start + 1000, len(part)))), plan, scorer)
    for message in partials.take():
        agent.take(message)
    agent.tick(everything=True)
    from prometheus_client import REGISTRY

    def gauge(name, **labels):
        return REGISTRY.get_sample_value(name, {"pipeline": "unmeasurable", "role": "active", "scope": "pipeline",
                                                **labels})

    assert gauge("fairstream_fairness_unmeasurable", window="count", group="1", reason="no_records") == 1.0
    assert gauge("fairstream_window_group_records", window="count", group="1") == 0.0
    assert gauge("fairstream_fairness_dependence", statistic="dependence_e", stage="after", stratum="all",
                 feature="all", group_pair="all", window="count") is None  # not 0.0: not measured
    assert gauge("fairstream_out_of_range_ratio", statistic="out_of_range_rate", stage="before", stratum="all",
                 feature="all", group_pair="all", window="count") is not None  # not a comparison of groups


def test_partials_round_trip_every_accumulator(stream):
    """Every accumulator the worker sends comes back with the same counts (OTF's sample included)."""
    batch, plan, scorer = stream
    config = CONFIG.with_monitor(statistic=("dependence_e", "mdp", "otf"), threshold=0.1)
    partials = PartialAggregates(config, "w")
    FairnessMonitor(config, detect=False, sink=partials.add).observe_batch(batch.take(np.arange(300)), plan, scorer)
    sent = {index: {key: matched(acc) for key, acc in accumulators.items()}
            for index, (_, accumulators) in partials.pending["active", (("plan", 1), ("scorer", 1))].items()}
    (message,) = partials.take()
    decoded = decode_partial(message, config.groups, config.strata)
    assert decoded.records == 300 and decoded.chain == (("plan", 1), ("scorer", 1)) and decoded.worker == "w"
    assert decoded.slices.keys() == sent.keys()
    for index, (_, accumulators) in decoded.slices.items():
        assert accumulators.keys() == sent[index].keys()
        assert {key[0] for key in accumulators} >= {"dependence_e", "w1", "dp", "eopp", "mdp", "otf"}
        for key, accumulator in accumulators.items():
            names = getattr(accumulator, "_counts", None) or ("priority_", "scores_", "X_", "s_", "y_")
            for name in names:
                mine, theirs = getattr(sent[index][key], name), getattr(accumulator, name)
                for a, b in zip(*(x if isinstance(x, list) else [x] for x in (mine, theirs))):
                    assert np.array_equal(a, b), (key, name)


def test_a_stats_message_that_is_not_one_is_refused_in_one_line():
    from fairstream.streams.codec.partials import pack

    with pytest.raises(PartialError, match="not a readable stats message"):
        decode_partial(b"PK\x03\x04 not a stats message", ["0", "1"], ["0", "1"])
    objects = pack({"format": "fairstream.partial/1"}, {"x": np.zeros(2)}).replace(b'"<f8"', b'"|O8"')
    with pytest.raises(PartialError, match="does not fit|not a readable"):  # an object array is never read
        decode_partial(objects, ["0", "1"], ["0", "1"])
    bomb = pack({"format": "fairstream.partial/1"}, {"x": np.zeros(200_000_000, dtype=np.uint8)})
    with pytest.raises(PartialError):  # 200 MB of zeros compress to 200 kB: refused before it is inflated
        decode_partial(bomb, ["0", "1"], ["0", "1"])


def test_a_partial_of_another_layout_is_refused_not_mixed(stream):
    batch, plan, scorer = stream
    other = CONFIG.with_monitor(slice_seconds=2.0)
    partials = PartialAggregates(other, "elsewhere")
    FairnessMonitor(other, detect=False, sink=partials.add).observe_batch(batch.take(np.arange(500)), plan, scorer)
    agent = MonitoringAgent(CONFIG, metrics=PipelineMetrics("refused-layout", process="agent"))
    assert [agent.take(message) for message in partials.take()] == [False]
    assert agent.statistics.active is None


def test_slices_are_cut_from_event_time_whatever_the_batch_order(stream):
    batch, _, _ = stream
    shuffled = batch.take(np.random.default_rng(0).permutation(2000))
    ordered, slices = in_slices(shuffled, 1.0)
    assert (np.diff(slices) >= 0).all() and sorted(ordered.keys.tolist()) == sorted(shuffled.keys.tolist())


def honest_message(stream) -> bytes:
    batch, plan, scorer = stream
    partials = PartialAggregates(CONFIG, "w")
    FairnessMonitor(CONFIG, detect=False, sink=partials.add).observe_batch(batch.take(np.arange(400)), plan, scorer)
    (message,) = partials.take()
    return message


def mutated(message: bytes, change) -> bytes:
    from fairstream.streams.codec.partials import pack, unpack

    header, arrays = unpack(message)
    change(header, arrays)
    return pack(header, dict(arrays))


@pytest.mark.parametrize("change", [
    lambda h, a: h["slices"][0].__setitem__("records", float("inf")),
    lambda h, a: h["slices"][0].__setitem__("index", 10**30),
    lambda h, a: h.__setitem__("sent", 10**400),
    lambda h, a: h.__setitem__("settings", []),
    lambda h, a: h.__setitem__("refused", -1000),
    lambda h, a: h.__setitem__("chain", [["plan", float("inf")]]),
    lambda h, a: h.__setitem__("slices", h["slices"] * 601),
    lambda h, a: h["slices"][0]["keys"].__setitem__(0, [h["slices"][0]["keys"][0][0], "after", "f" * 12]),
    lambda h, a: h["slices"][0]["keys"].__setitem__(0, ["dp", "label", next(iter(h["settings"]))]),  # type confusion
    lambda h, a: a.__setitem__(next(k for k in a if k.endswith("/v")), -a[next(k for k in a if k.endswith("/v"))]),
    lambda h, a: [h["settings"][s].__setitem__("alpha", 0.25) for s in h["settings"]
                  if h["settings"][s]["type"] == "dependence"],  # settings that are not their id's
], ids=["records inf", "index huge", "sent 10**400", "settings list", "refused negative", "version inf",
        "601 slices", "unknown settings", "wrong type", "negative counts", "forged settings id"])
def test_a_malformed_or_forged_stats_message_is_refused_and_stops_nothing(stream, change):
    agent = MonitoringAgent(CONFIG, metrics=PipelineMetrics("forged", process="agent"))
    honest = honest_message(stream)
    assert agent.take(mutated(honest, change)) is False  # refused, logged, counted: never raised
    assert agent.prototypes == {} or all(not k.startswith("f" * 12) for k in agent.prototypes)
    assert agent.take(honest) is True  # the next honest message is read as if nothing happened
    agent.tick(everything=True)
    assert agent.statistics.active.records == 400


def test_a_slice_far_ahead_of_the_agents_clock_is_left_out_and_later_slices_still_reach_the_detectors(stream):
    import time as clock

    batch, plan, scorer = stream
    now = replace(batch, ts=clock.time() - 30.0 + np.arange(len(batch)) / RATE * 0.005)
    agent = MonitoringAgent(CONFIG, metrics=PipelineMetrics("ahead", process="agent"))
    ahead = PartialAggregates(CONFIG, "clock-ahead")
    FairnessMonitor(CONFIG, detect=False, sink=ahead.add).observe_batch(
        replace(now.take(np.arange(300)), ts=now.ts[:300] + 3600.0), plan, scorer)
    for message in ahead.take():
        assert agent.take(message)
    assert agent.statistics.future == 300
    honest = PartialAggregates(CONFIG, "honest")
    FairnessMonitor(CONFIG, detect=False, sink=honest.add).observe_batch(now.take(np.arange(300, 3000)), plan, scorer)
    for message in honest.take():
        agent.take(message)
    agent.tick(everything=True)
    assert agent.statistics.active.late == 0 and agent.statistics.active.records == 2700
