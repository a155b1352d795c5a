"""The slices of one chain still open in the agent: every worker's partials added, slice by slice, until closed.

A slice is ``monitor.slice_seconds`` of event time (``floor(ts / slice_seconds)``). Workers count their records in
the slice of each record and send the counts every second or so; the agent adds them up here. A slice *closes* (its
counts go to the pipeline's windows and detectors, in slice order) once no partial for it arrived for
``monitor.lateness_seconds``, and every slice before it has closed: the records of a slice come from every worker
whose partitions hold records of that second, and they are all in once the slice has been quiet for a while. A
partial for a slice already closed is *late*: its counts still join the windows (nothing is lost), not the detectors'
chunks, and they are counted (``fairstream_agent_late_records``). At most :data:`MAX_OPEN` slices wait (a
backlog replayed faster than it was written spans many seconds of event time): past that the oldest closes.

The counts of a closed slice are the sum of every worker's counts of its records, so they do not depend on how
the records were spread over workers and partitions.
"""

from __future__ import annotations

import time
from typing import Callable

MAX_OPEN = 600
"""Open slices at most, per chain (a replayed backlog): past that the oldest closes at once."""


class OpenSlices:
    """The open slices of one chain (role and versions), added from every worker's partials.

    Parameters
    ----------
    lateness : float
        Seconds a slice stays open after its last partial.
    clock : callable, default=time.monotonic
        The agent's clock (for the quiet time only: the slices themselves are event time).
    """

    def __init__(self, lateness: float, clock: Callable[[], float] = time.monotonic):
        self.lateness, self.clock = lateness, clock
        self.open: dict[int, list] = {}  # slice -> [records, accumulators, last arrival]
        self.closed_through: int | None = None  # the highest slice closed

    def add(self, slices: dict) -> list[tuple[int, int, dict]]:
        """Add a partial's slices (slice -> (records, accumulators)); returns the late ones (slice, records, counts)."""
        now, late = self.clock(), []
        for index, (records, accumulators) in sorted(slices.items()):
            if self.closed_through is not None and index <= self.closed_through:
                late.append((index, records, accumulators))
                continue
            held = self.open.get(index)
            if held is None:
                self.open[index] = [records, dict(accumulators), now]
                continue
            held[0] += records
            held[2] = now
            for key, accumulator in accumulators.items():
                held[1][key] = accumulator if key not in held[1] else held[1][key].merge(accumulator)
        return late

    def close(self, everything: bool = False) -> list[tuple[int, int, dict]]:
        """The slices that close now, in slice order: (slice, records, accumulators); ``everything`` closes all."""
        now, closed = self.clock(), []
        for index in sorted(self.open):
            records, accumulators, last = self.open[index]
            if not (everything or now - last >= self.lateness or len(self.open) > MAX_OPEN):
                break  # a later slice waits for this one: slices close in order
            del self.open[index]
            self.closed_through = index
            closed.append((index, records, accumulators))
        return closed
