"""Drift detection of the monitor's statistics: chunks cut from the records, detectors with hysteresis."""

from collections import deque
from types import SimpleNamespace

import pytest

from fairstream.streams.config import AgentConfig, adult_config
from fairstream.streams.worker.drift import Chunker, DriftTracker

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
