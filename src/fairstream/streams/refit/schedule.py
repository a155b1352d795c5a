"""Scheduled re-fits: ``fairstream refit --every 6h`` runs a job on a fixed period in one process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

from .job import RefitJob, RefitOutcome
from .sources import Source

log = logging.getLogger(__name__)
# =============================================================================== scheduling


def run_every(job: RefitJob, source: Source, every_seconds: float, stop_event: threading.Event,
              on_outcome: Callable[[RefitOutcome], None] | None = None, max_runs: int | None = None) -> int:
    """Re-fit now and then every ``every_seconds`` until ``stop_event`` is set; returns the runs done.

    Runs start on a fixed grid (start + k * every), so they do not drift; a run that overruns its
    slot skips the slots it missed. A failed run (broker down, unreadable file) is logged and the
    schedule goes on: the next slot may succeed, and the workers keep serving the current plan.
    """
    if every_seconds <= 0:
        raise ValueError(f"every_seconds must be positive, got {every_seconds!r}")
    start, runs = time.monotonic(), 0
    while not stop_event.is_set() and (max_runs is None or runs < max_runs):
        try:
            outcome = job.run_once(source, trigger="schedule")
        except Exception:
            log.exception("scheduled re-fit of %s failed; next attempt in at most %.0fs", job.kind, every_seconds)
        else:
            if on_outcome is not None:
                on_outcome(outcome)
        runs += 1
        if max_runs is not None and runs >= max_runs:
            break
        elapsed = time.monotonic() - start
        stop_event.wait(every_seconds * (math.floor(elapsed / every_seconds) + 1) - elapsed)
    return runs
