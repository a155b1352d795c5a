"""Waiting in tests for something another process does: poll until it happens, fail saying what did not."""

from __future__ import annotations

import time


def wait_for(found, timeout: float, what: str, interval: float = 0.1):
    """Poll ``found()`` until it returns something truthy, and return that; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"no {what} within {timeout:g}s")
