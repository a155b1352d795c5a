"""Run ``fairstream worker`` as a child process: for the demo, the integration tests and benchmarks.

The worker runs exactly as in production (its own process, its own event loop); the parent only
writes its pipeline TOML, starts it in its own process group with logs in a file, and stops it
with SIGTERM (Faust shuts down cleanly on it), then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fairstream.streams.config import PipelineConfig

from .processes import ManagedProcess, dies_with_owner


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
        command = [*dies_with_owner([sys.executable]), "-m", "fairstream.streams.cli", "worker", "--config",
                   str(self.config_path), "--broker", f"kafka://{self.bootstrap}", "--run-dir", str(self.run_dir)]
        return command + (["--app-id", self.app_id] if self.app_id else [])

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
