"""One record from the far future must not freeze the monitor's time window (the count window never cared).

The time window files each batch under its latest event time: a record with ``ts = 1e15`` moved the
window 30 million years ahead, and every batch after it was older than the window and left out.
The batches go the worker's way: the record agent's batch logic, then the monitor's public API. A worker's monitor
also cuts each batch at the event-time slices its partial aggregates are counted in: such a record must not open a
slice 30 million years ahead (the pipeline's monitoring agent would wait for it) or overflow the slice index.
"""

import json
import time

import numpy as np
import pytest

from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.streams.config import adult_config
from fairstream.streams.control.registry import Active
from fairstream.streams.demo.replay import record_messages
from fairstream.streams.codec.partials import decode_partial
from fairstream.streams.worker.monitor import FairnessMonitor
from fairstream.streams.worker.partials import PartialAggregates
from fairstream.streams.worker.processing import RecordRepairer, SimpleMessage

CONFIG = adult_config()  # window_seconds 120, min_records 500, max_event_time_skew 60


@pytest.fixture(scope="module")
def adult():
    research, archive = datasets.load("adult").split(3_000, seed=0)
    plan = DistributionalRepair(n_q=50, out_of_range="clamp").fit(research.X, research.s, research.u)
    return archive, Active("plan", 1, "b" * 64, None, plan)


def batches(archive, start: int, n_batches: int, size: int) -> list[list[SimpleMessage]]:
    """Batches of records stamped now, as a producer on the wall clock sends them."""
    pairs = record_messages(archive.subset(slice(start, start + n_batches * size)), CONFIG, id_prefix=f"b{start}")
    messages = [SimpleMessage(value, key) for key, value in pairs]
    return [messages[i:i + size] for i in range(0, len(messages), size)]


@pytest.mark.parametrize("ts", [1e15, -1e15, 1.7976931348623157e308], ids=["future", "past", "largest"])
def test_the_time_window_keeps_filling_after_a_record_with_an_implausible_event_time(adult, ts):
    archive, plan = adult
    partials = PartialAggregates(CONFIG, "worker-1")
    monitor, repairer = FairnessMonitor(CONFIG), RecordRepairer(CONFIG)
    worker = FairnessMonitor(CONFIG, detect=False, sink=partials.add)
    (first,), *_ = batches(archive, 0, 1, 1)
    stray = json.loads(first.value())
    odd = SimpleMessage(json.dumps({**stray, "ts": ts}).encode(), first.key())
    started = time.time()
    for batch in [[odd], *batches(archive, 1, 6, 100)]:
        outcome = repairer.process(batch, plan)
        monitor.observe_batch(outcome.monitor_batch, plan)
        worker.observe_batch(outcome.monitor_batch, plan)
    assert monitor.windows["count"].n_records == monitor.windows["time"].n_records == 601
    assert monitor.rows("time") and monitor.statistic("time") == pytest.approx(monitor.statistic("count"))
    assert worker.windows["time"].n_records == 601
    (partial,) = [decode_partial(value, CONFIG.groups, CONFIG.strata) for value in partials.take()]
    assert partial.records == 601
    assert all(np.floor(started) - 1 <= index <= time.time() + 1 for index in partial.slices)  # slices of now
