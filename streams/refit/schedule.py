"""Scheduled re-fits: ``fairstream refit --every 6h`` runs a job on a fixed period in one process.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from typing import TYPE_CHECKING, Callable

from .job import RefitJob, RefitOutcome
from .sources import Source

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
# =============================================================================== scheduling


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"5m"``, ``"1h"``, ``"1h30m"``, ``"2d"``, ``"500ms"`` or a bare number of seconds.

    >>> parse_duration("90s"), parse_duration("5m"), parse_duration("1h30m"), parse_duration("2.5")
    (90.0, 300.0, 5400.0, 2.5)
    """
    cleaned = str(text).strip().lower().replace(" ", "")
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _DURATION.findall(cleaned)
        if not parts or "".join(number + unit for number, unit in parts) != cleaned:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 1h, 1h30m, 2d)") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return seconds


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
            outcome = job.run_once(source)
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
