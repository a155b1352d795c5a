"""``fairstream worker --supervise``: restarts on a non-zero exit, with back-off and a bound; SIGTERM passed on.

The supervised command here is a small Python program that stands in for the worker (its exit
status and its answer to SIGTERM are what the supervisor sees of a worker);
tests/streams/worker/test_liveness.py supervises a real worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from fairstream.streams.ops.processes import is_alive
from fairstream.streams.ops.supervise import Supervisor, worker_argv

# Exits with the status listed for its n-th run (counted in a file), the last one from then on.
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    counter, statuses, seconds = Path(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], float(sys.argv[3])
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    time.sleep(seconds)
    sys.exit(statuses[min(runs, len(statuses)) - 1])
""")


def child(tmp_path, statuses: str, seconds: float = 0.0) -> list[str]:
    return [sys.executable, "-c", CHILD, str(tmp_path / "runs"), statuses, str(seconds)]


def runs(tmp_path) -> int:
    return int((tmp_path / "runs").read_text())


def supervise(argv, **options) -> tuple[int, list[str]]:
    said: list[str] = []
    options = {"first_backoff": 0.05, "say": said.append} | options
    return Supervisor(argv, **options).run(), said


def test_a_clean_exit_is_not_restarted(tmp_path):
    status, said = supervise(child(tmp_path, "0"))
    assert status == 0 and runs(tmp_path) == 1 and said[-1] == "the worker stopped cleanly (exit status 0)"


def test_a_crash_is_restarted_with_a_doubling_back_off_until_the_worker_runs_cleanly(tmp_path):
    started = time.monotonic()
    status, said = supervise(child(tmp_path, "1,70,0"))
    assert status == 0 and runs(tmp_path) == 3
    restarts = [line for line in said if "restarting it in" in line]
    assert restarts == [
        "the worker exited with status 1; restarting it in 0.05 s (restart 1 of at most 10 within 600 s)",
        "the worker exited with status 70; restarting it in 0.1 s (restart 2 of at most 10 within 600 s)"]
    assert time.monotonic() - started >= 0.05 + 0.1  # the back-off doubled


def test_restarts_are_bounded_within_the_window_and_the_last_status_is_returned(tmp_path):
    status, said = supervise(child(tmp_path, "3"), max_restarts=2)
    assert status == 3 and runs(tmp_path) == 3  # the first run and two restarts
    assert said[-1] == "the worker exited with status 3; giving up after 2 restarts within 600 s"


def test_restarts_older_than_the_window_are_forgotten(tmp_path):
    status, _ = supervise(child(tmp_path, "3,3,3,0", seconds=0.3), max_restarts=1, window=0.2)
    assert status == 0 and runs(tmp_path) == 4  # each crash came more than a window after the previous restart


# A supervisor in its own process, as `fairstream worker --supervise` runs: signals go to it.
SUPERVISOR = textwrap.dedent("""
    import sys
    from fairstream.streams.ops.supervise import Supervisor
    sys.exit(Supervisor(sys.argv[2:], stop_timeout=float(sys.argv[1])).run())
""")

# A worker that prints its pid, then on SIGTERM finishes its work (0.3 s) and exits 0, or ignores it.
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    if sys.argv[1] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.3), sys.exit(0)))
    print(os.getpid(), flush=True)
    time.sleep(60)
""")


def supervised_worker(on_sigterm: str, stop_timeout: float = 10.0):
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(stop_timeout), sys.executable, "-c", WORKER,
                                   on_sigterm], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return supervisor, int(supervisor.stdout.readline())


def test_sigterm_is_passed_on_and_a_clean_stop_exits_zero():
    supervisor, worker = supervised_worker("exit")
    try:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0
        assert not is_alive(worker)
        assert "stopped the worker on SIGTERM: exit status 0" in supervisor.stderr.read()
    finally:
        supervisor.kill()


def test_a_worker_that_ignores_sigterm_is_killed_after_the_stop_timeout_and_the_status_says_so():
    supervisor, worker = supervised_worker("ignore", stop_timeout=0.5)
    try:
        supervisor.send_signal(signal.SIGINT)  # Ctrl-C in a terminal: passed on as SIGTERM too
        assert supervisor.wait(timeout=30) == 128 + signal.SIGKILL
        assert not is_alive(worker)
    finally:
        supervisor.kill()


def test_the_worker_command_line_carries_every_option_but_supervise():
    argv = worker_argv("p.toml", "kafka://k:9092", "runs", app_id="a", metrics_port=0, loglevel="warning", debug=True)
    assert argv == [sys.executable, "-m", "fairstream.streams.cli", "worker", "--broker", "kafka://k:9092", "--run-dir",
                    "runs", "--config", "p.toml", "--app-id", "a", "--metrics-port", "0", "--loglevel", "warning",
                    "--debug"]
    assert "--config" not in worker_argv(None, "kafka://k:9092", "runs")  # the built-in pipeline
