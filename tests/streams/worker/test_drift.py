"""Drift detection of the monitor's statistics: chunks cut from the records, detectors with hysteresis."""

import tomllib
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from fairstream.streams.codec.repaired import RepairedBatch
from fairstream.streams.config import AgentConfig, PipelineConfig, adult_config
from fairstream.streams.worker.drift import Chunker, DriftTracker
from fairstream.streams.worker.monitor import FairnessMonitor, slice_of

CONFIG = adult_config(records=AgentConfig(artifact="scorer")).with_monitor(
    statistic=("dp_difference", "eopp"), window_records=8000, threshold=0.1, cooldown_seconds=3600.0)


@pytest.mark.parametrize("sizes", [[1000, 1000], [997, 1000, 3, 500, 1], [499, 2, 1500]])
def test_batches_are_cut_only_at_chunk_boundaries(sizes):
    chunker, filled, seen = Chunker(8000), 0, []
    for n in sizes:
        pieces = chunker.pieces(n)
        assert pieces[0].start == 0 and pieces[-1].stop == n and len(pieces) <= 2 + n // chunker.size
        for piece in pieces:
            full = chunker.add({}, piece.stop - piece.start)
            filled += piece.stop - piece.start
            seen.append(full is not None)
            assert (full is not None) == (filled % chunker.size == 0)
    assert sum(seen) == sum(sizes) // chunker.size


def dp_chunk(difference):
    """A chunk's accumulators as a tracker of dp_difference reads them."""
    return {("dp", "after"): SimpleNamespace(value=lambda: SimpleNamespace(difference=difference))}


def events_of(tracker, chunk_values, window):
    """Feed one chunk at a time; the window is the mean of the last 16 chunks. Returns the chunks that fired."""
    fired = []
    for i, value in enumerate(chunk_values):
        window.append(value)
        tracker.feed_chunk(dp_chunk(value))
        if tracker.confirm(500, lambda: sum(window) / len(window)):
            fired.append(i)
    return fired


def test_one_shift_gives_one_event_and_the_tracker_rearms_below_the_threshold():
    now = [0.0]
    tracker = DriftTracker("dp_difference", CONFIG.monitor, clock=lambda: now[0])
    window = deque(maxlen=16)
    assert events_of(tracker, [0.05] * 40, window) == []
    fired = events_of(tracker, [0.25] * 40, window)
    assert len(fired) == 1 and tracker.value > 0.1 and not tracker.armed  # one shift, one event
    assert events_of(tracker, [0.05] * 40, window) == [] and tracker.armed  # back below: re-armed, no event
    assert len(events_of(tracker, [0.25] * 40, window)) == 1  # a second shift within the cooldown: re-armed


def test_a_detector_hit_the_window_does_not_confirm_is_no_event():
    tracker = DriftTracker("dp_difference", CONFIG.monitor, clock=lambda: 0.0)
    window = deque([0.05], maxlen=1)  # the window stays below the threshold while the chunks jump
    hits, fired = 0, []
    for i, value in enumerate([0.05] * 40 + [0.25] * 40):
        tracker.feed_chunk(dp_chunk(value))
        hits += tracker.detector.drift_detected
        fired += [i] if tracker.confirm(500, lambda: window[0]) else []
    assert hits >= 1 and fired == []


def test_a_chunk_without_the_statistic_or_with_nan_is_not_fed():
    tracker = DriftTracker("eopp", CONFIG.monitor, clock=lambda: 0.0)
    tracker.feed_chunk({})  # e.g. a chunk of unlabelled records
    tracker.feed_chunk({("eopp", "after"): SimpleNamespace(value=lambda: SimpleNamespace(difference=float("nan")))})
    assert tracker.detector.width == 0
    tracker.feed_chunk({("eopp", "after"): SimpleNamespace(value=lambda: SimpleNamespace(difference=0.05))})
    assert tracker.detector.width == 1


# ------------------------------------------------------------------------ a worker's monitor counts, the agent detects


def own_decisions(n: int, rates, start: int, rng) -> RepairedBatch:
    """``n`` records of a monitor-only pipeline carrying their own model's decisions (group g positive at
    ``rates[g]``), ``start`` the first's number; event times 0.01 s apart, one record of the batch a second late."""
    s = rng.integers(0, 2, n)
    X = np.column_stack([rng.uniform(17, 90, n), rng.uniform(1, 99, n)])
    ts = 1.7e9 + (start + np.arange(n)) * 0.01
    ts[n // 2] -= 1.0
    return RepairedBatch(X, X, s, rng.integers(0, 2, n), None, np.array([f"r{start + i}" for i in range(n)]), ts,
                         out_of_range=np.zeros(n, dtype=bool),
                         decision=(rng.random(n) < np.asarray(rates)[s]).astype(np.int64))


def test_a_workers_monitor_detects_nothing_and_hands_each_batchs_slices_to_its_sink():
    data = tomllib.loads(adult_config(records=AgentConfig(artifact=())).to_toml())  # a monitor-only pipeline
    data["mapping"] = {"id": "id", "s": "s", "u": "u", "features": {"age": "age", "hours-per-week": "hours"},
                       "decision": "decision"}
    config = PipelineConfig.from_dict(data).with_monitor(
        statistic="dp_difference", window_records=2000, min_records=500, threshold=0.1, cooldown_seconds=3600.0)
    rng = np.random.default_rng(0)
    stream = [own_decisions(250, [0.4, 0.4] if b < 24 else [0.2, 0.7], 250 * b, rng) for b in range(48)]
    agent_like = FairnessMonitor(config)  # detect defaults to True: what the monitoring agent runs
    events = sum((agent_like.observe_batch(batch) for batch in stream), [])
    assert [e.statistic for e in events] == ["dp_difference"]  # the shift is there to detect
    pieces = []
    worker = FairnessMonitor(config, detect=False, sink=lambda *piece: pieces.append(piece))
    for batch in stream:
        assert worker.observe_batch(batch) == []
    assert worker.trackers == []
    assert worker.statistic("count", "dp_difference") == pytest.approx(agent_like.statistic("count", "dp_difference"))
    # One call per slice of each batch, in slice order, with that slice's records and what they count.
    expected = []
    for batch in stream:
        slices = slice_of(batch.ts, config.monitor.slice_seconds)
        expected += [(index, batch.s[slices == index], batch.decision[slices == index]) for index in np.unique(slices)]
    assert len(pieces) == len(expected) > 2 * len(stream)
    for (monitor, index, records, accumulators), (slice_index, s, decision) in zip(pieces, expected):
        assert monitor is worker and (index, records) == (slice_index, len(s))
        dp = accumulators["dp", "after"]
        assert dp.totals_.sum(axis=0).tolist() == np.bincount(s, minlength=2).tolist()
        assert dp.positives_.sum(axis=0).tolist() == np.bincount(s, decision, minlength=2).tolist()
        assert accumulators["dependence_e", "after"].counts_[0].sum() == len(s)
