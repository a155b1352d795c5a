"""``fairstream worker`` as a child process: for the demo, the tests and benchmarks, and ``--supervise``.

The worker runs exactly as in production (its own process, its own event loop); the parent only
writes its pipeline TOML, starts it in its own process group with logs in a file, and stops it
with SIGTERM (Faust shuts down cleanly on it), then SIGKILL if it does not exit in time.

:class:`Supervisor` is ``fairstream worker --supervise``: a worker exits non-zero on an error it
cannot recover from in place, and the supervisor starts a new one, after a back-off that doubles
with each restart, at most ``max_restarts`` times in ``window`` seconds (then it gives up with the
worker's status). SIGTERM or SIGINT to the supervisor is passed on as SIGTERM to the worker, which
finishes its batch, commits and leaves its groups; the supervisor then exits with the worker's
status: 0 after a clean stop.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Sequence

from fairstream.streams.config import PipelineConfig

from .processes import ManagedProcess, dies_with_owner

RESTART_WINDOW_SECONDS = 600.0
MAX_RESTARTS = 10  # in RESTART_WINDOW_SECONDS: with the back-off, a broker away for about 5 minutes is outlasted
FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
WORKER_STOP_SECONDS = 60.0  # the worker's own bound on a clean stop is 30 s for the batch in flight plus the flush


def worker_argv(config: str | os.PathLike | None, broker_url: str, run_dir: str | os.PathLike,
                app_id: str | None = None, metrics_port: int | str | None = None, loglevel: str | None = None,
                debug: bool = False, command: str = "worker") -> list[str]:
    """The ``fairstream worker`` (or ``monitor``: ``command``) command line (run with this Python) for these options."""
    argv = [sys.executable, "-m", "fairstream.streams.cli", command, "--broker", broker_url, "--run-dir", str(run_dir)]
    options = {"--config": config, "--app-id": app_id, "--metrics-port": metrics_port, "--loglevel": loglevel}
    for name, value in options.items():
        if value is not None:
            argv += [name, str(value)]
    return argv + (["--debug"] if debug else [])


class WorkerProcess(ManagedProcess):
    """One ``fairstream worker`` process for a pipeline, with its TOML and log in ``run_dir``."""

    stop_timeout = 20.0

    def __init__(self, config: PipelineConfig, bootstrap: str, run_dir: str | os.PathLike, name: str = "worker",
                 app_id: str | None = None, env: dict | None = None):
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / f"{name}.log")
        self.config_path = self.run_dir / f"{name}.toml"
        self.bootstrap = bootstrap
        self.config = config
        self.app_id = app_id
        self.env = env or {}

    def _command(self) -> list[str]:
        argv = worker_argv(self.config_path, f"kafka://{self.bootstrap}", self.run_dir, app_id=self.app_id)
        return dies_with_owner(argv[:1]) + argv[1:]

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def start(self) -> "WorkerProcess":
        """Start the worker without waiting for it to join its group (see :meth:`wait_for_log`)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config.to_toml())
        self._spawn()
        return self

    def wait_for_log(self, text: str, timeout: float = 90.0) -> bool:
        """True once ``text`` appears in the worker log (False on timeout or if the worker died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running:
            if self.log_path.exists() and text in self.log_path.read_text(errors="replace"):
                return True
            time.sleep(0.25)
        return False


class AgentProcess(WorkerProcess):
    """One ``fairstream monitor`` process: the pipeline's monitoring agent, with its TOML and log in ``run_dir``."""

    def __init__(self, config: PipelineConfig, bootstrap: str, run_dir: str | os.PathLike, name: str = "monitor",
                 app_id: str | None = None, metrics_port: int | None = None, env: dict | None = None):
        super().__init__(config, bootstrap, run_dir, name=name, app_id=app_id, env=env)
        self.metrics_port = metrics_port

    def _command(self) -> list[str]:
        argv = worker_argv(self.config_path, f"kafka://{self.bootstrap}", self.run_dir, app_id=self.app_id,
                           metrics_port=self.metrics_port, command="monitor")
        return dies_with_owner(argv[:1]) + argv[1:]


class _Child(ManagedProcess):
    """The supervised command, writing to the supervisor's own stdout and stderr."""

    def __init__(self, argv: Sequence[str], stop_timeout: float):
        super().__init__(None)
        self.argv, self.stop_timeout = list(argv), stop_timeout

    def _command(self) -> list[str]:
        return dies_with_owner(self.argv[:1]) + self.argv[1:]

    def start(self) -> "_Child":
        self._spawn()
        return self


def _say(text: str) -> None:
    print(f"fairstream supervisor: {text}", file=sys.stderr, flush=True)


class Supervisor:
    """Run ``argv`` and start it again whenever it exits non-zero (see the module docstring)."""

    def __init__(self, argv: Sequence[str], max_restarts: int = MAX_RESTARTS, window: float = RESTART_WINDOW_SECONDS,
                 first_backoff: float = FIRST_BACKOFF_SECONDS, max_backoff: float = MAX_BACKOFF_SECONDS,
                 stop_timeout: float = WORKER_STOP_SECONDS, say: Callable[[str], None] = _say):
        self.argv, self.max_restarts, self.window = list(argv), max_restarts, window
        self.first_backoff, self.max_backoff, self.stop_timeout = first_backoff, max_backoff, stop_timeout
        self.say = say
        self.restarts: deque[float] = deque()  # monotonic times of the restarts within the window
        self._stop_signal: int | None = None

    def run(self) -> int:
        """Supervise until a clean exit, a stop signal or too many restarts; the exit status to return."""
        previous = {sig: signal.signal(sig, self._on_stop_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_stop_signal(self, signum: int, _frame) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        while True:
            child = _Child(self.argv, self.stop_timeout).start()
            self.say(f"started the worker (pid {child.pid})")
            code = self._wait(child)
            if self._stop_signal is not None:
                self.say(f"stopped the worker on {signal.Signals(self._stop_signal).name}: exit status {code}")
                return _status(code)
            if code == 0:
                self.say("the worker stopped cleanly (exit status 0)")
                return 0
            delay = self._next_delay()
            if delay is None:
                self.say(f"the worker exited with status {code}; giving up after {self.max_restarts} restarts "
                         f"within {self.window:.0f} s")
                return _status(code)
            self.say(f"the worker exited with status {code}; restarting it in {delay:g} s "
                     f"(restart {len(self.restarts)} of at most {self.max_restarts} within {self.window:.0f} s)")
            if self._sleep(delay):
                self.say(f"stopped on {signal.Signals(self._stop_signal).name} while waiting to restart")
                return 0

    def _wait(self, child: _Child) -> int:
        """The child's exit status; a stop signal meanwhile is passed on (SIGTERM, then SIGKILL after stop_timeout)."""
        while True:
            code = child.wait(timeout=0.2)
            if code is not None:
                child.stop()  # reaps it and forgets it
                return code
            if self._stop_signal is not None:
                code = child.stop()
                return code if code is not None else 1

    def _next_delay(self) -> float | None:
        """The back-off before the next restart, or None if the window's restarts are used up."""
        now = time.monotonic()
        while self.restarts and now - self.restarts[0] > self.window:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            return None
        self.restarts.append(now)
        return min(self.first_backoff * 2 ** (len(self.restarts) - 1), self.max_backoff)

    def _sleep(self, seconds: float) -> bool:
        """Sleep, or return True at once on a stop signal."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop_signal is not None:
                return True
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        return self._stop_signal is not None


def _status(code: int) -> int:
    """A process's exit status as a shell reports it: killed by signal N is 128 + N."""
    return code if code >= 0 else 128 - code
