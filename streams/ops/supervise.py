"""Run ``fairstream worker`` as a child process: for the demo, the integration tests and benchmarks.

The worker runs exactly as in production (its own process, its own event loop); the parent only
writes its pipeline TOML, starts it in its own process group with logs in a file, and stops it
with SIGTERM (Faust shuts down cleanly on it), then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fairstream.streams.config import PipelineConfig

from .processes import dies_with_owner, terminate_process_group


class WorkerProcess:
    def __init__(self, config: PipelineConfig, bootstrap: str, run_dir: str | os.PathLike, name: str = "worker",
                 app_id: str | None = None, env: dict | None = None):
        self.run_dir = Path(run_dir)
        self.config_path = self.run_dir / f"{name}.toml"
        self.log_path = self.run_dir / f"{name}.log"
        self.bootstrap = bootstrap
        self.config = config
        self.app_id = app_id
        self.env = env or {}
        self._process: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config.to_toml())
        command = [*dies_with_owner([sys.executable]), "-m", "fairstream.streams.cli", "worker", "--config", str(self.config_path),
                   "--broker", f"kafka://{self.bootstrap}", "--run-dir", str(self.run_dir)]
        if self.app_id:
            command += ["--app-id", self.app_id]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, env={**os.environ, **self.env})
        return self

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait_for_log(self, text: str, timeout: float = 90.0) -> bool:
        """True once ``text`` appears in the worker log (False on timeout or if the worker died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running:
            if self.log_path.exists() and text in self.log_path.read_text(errors="replace"):
                return True
            time.sleep(0.25)
        return False

    def stop(self, timeout: float = 20.0) -> int | None:
        if self._process is None or self._process.poll() is not None:
            return None if self._process is None else self._process.returncode
        terminate_process_group(self._process.pid, timeout, self._process)
        return self._process.wait()

    def kill(self) -> None:
        """Simulate a crash: SIGKILL, no clean shutdown, no final commit."""
        if self.running:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> "WorkerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
