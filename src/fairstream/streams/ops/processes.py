"""Child processes the CLI, the demo and the tests run: the broker, Prometheus, fairstream workers.

One place for what they all need: :class:`ManagedProcess` (spawn in its own process group with a
log file, wait until ready, stop with SIGTERM then SIGKILL without leaving zombies, and stop
whatever is still running when the owner exits), a free loopback port, and a command prefix that
makes the child die with its owner (Linux parent-death signal).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Callable

LOOPBACK = "127.0.0.1"
_POLL_SECONDS = 0.05

# Runs in a tiny Python process that then exec()s the real program, so it keeps the pid and the
# parent-death signal. Linux only; elsewhere it just execs. Doing this in the child instead of via
# preexec_fn keeps Popen safe in threaded parents (Faust, kafka-python run threads). Note: Linux
# sends the signal when the *thread* that started the child exits: start from a long-lived thread.
_PDEATHSIG_EXEC = """
import ctypes, os, signal, sys
owner, argv = int(sys.argv[1]), sys.argv[2:]
if sys.platform.startswith("linux"):
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != owner:  # the owner died before prctl took effect
        sys.exit(1)
os.execv(argv[0], argv)
"""


def dies_with_owner(argv: list[str]) -> list[str]:
    """``argv`` (absolute program path first) wrapped so the child gets SIGTERM when its owner dies."""
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *argv]


def port_is_free(host: str, port: int) -> bool:
    """True if a server could listen on ``host:port`` right now.

    Bound as servers bind (SO_REUSEADDR, as Tansu, Prometheus and Python's HTTP servers do): the
    connections of a server that was just killed linger in TIME_WAIT for a minute and do not stop
    a new server from listening on its port; another process listening there does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK) -> int:
    """A port that is free right now; the caller must cope with losing it to a race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_alive(pid: int) -> bool:
    """True if process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    # Every child here leads its own process group, so the group id equals its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_gone(pid: int, timeout: float, popen: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            return True
        if popen is None and not is_alive(pid):
            return True
        time.sleep(_POLL_SECONDS)
    return False


def terminate_process_group(pid: int, timeout: float = 10.0, popen: subprocess.Popen | None = None) -> bool:
    """SIGTERM the group led by ``pid``, wait up to ``timeout`` seconds, then SIGKILL it.

    Returns False if it ignored SIGTERM (and was killed); raises if it survives SIGKILL too.
    """
    _signal_group(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout, popen):
        return True
    _signal_group(pid, signal.SIGKILL)
    if not _wait_gone(pid, timeout, popen):
        raise RuntimeError(f"pid {pid} survived SIGKILL")
    return False


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing or empty."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# --------------------------------------------------------------------------- managed child processes

_LIVE: "weakref.WeakSet[ManagedProcess]" = weakref.WeakSet()
_HOOKS_LOCK = threading.Lock()
_hooks_installed = False


def stop_all() -> None:
    """Stop every managed process still running (at exit, or on a fatal signal)."""
    for process in list(_LIVE):
        with contextlib.suppress(Exception):
            process.stop()


def _on_fatal_signal(signum: int, _frame) -> None:
    stop_all()
    # Die the way the signal would have made us die, so exit status and shells stay truthful.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_exit_hooks() -> None:
    global _hooks_installed
    with _HOOKS_LOCK:
        if _hooks_installed:
            return
        _hooks_installed = True
        atexit.register(stop_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            # Only take over signals nobody handles yet: an app with its own handlers (Faust's
            # worker) shuts down through them and then reaches the atexit hook anyway.
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _on_fatal_signal)


class ManagedProcess:
    """A child process in its own process group, its output in a log file, stopped cleanly.

    Subclasses say what to run (:meth:`_command`, :meth:`_environment`) and start it with
    :meth:`_spawn` and :meth:`_wait_until`; this class does the rest the same way for the broker,
    Prometheus and workers: SIGTERM then SIGKILL to the whole group, reaping, a log tail for error
    messages, and stopping whatever is still running when the owner exits.
    """

    error: type[Exception] = RuntimeError  # what a failed start raises
    start_timeout: float = 30.0
    stop_timeout: float = 10.0

    def __init__(self, log_path: str | os.PathLike | None):
        self.log_path = Path(log_path) if log_path is not None else None  # None: the child writes to our stdout/stderr
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid while it has one."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the child runs."""
        return self._process is not None and self._process.poll() is None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> dict[str, str] | None:
        return None  # inherit ours

    def _spawn(self, banner: str = "") -> None:
        _install_exit_hooks()
        with self._output() as log_file:
            if banner and log_file is not None:
                log_file.write(f"--- fairstream: {banner}\n".encode())
                log_file.flush()
            # Its own process group: Ctrl-C in a shell does not hit it, and stop() reaches its children.
            self._process = subprocess.Popen(self._command(), stdin=subprocess.DEVNULL, stdout=log_file,
                                             stderr=subprocess.STDOUT if log_file is not None else None,
                                             env=self._environment(), start_new_session=True, close_fds=True)
        _LIVE.add(self)

    @contextlib.contextmanager
    def _output(self):
        """The log file opened for appending, or None: the child inherits our stdout and stderr."""
        if self.log_path is None:
            yield None
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            yield log_file

    def _wait_until(self, ready: Callable[[], bool], what: str, retry_if: Callable[[], bool] = lambda: False) -> bool:
        """True once ``ready()``; False if the child died and ``retry_if()`` says a new try may help; raises otherwise."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                if retry_if():
                    return False
                raise self.error(f"{what}: exited with code {code} before it was ready; log {self.log_path}:\n"
                                 f"{self.log_tail()}")
            if ready() and self._process.poll() is None:
                return True
            time.sleep(_POLL_SECONDS)
        self.stop()
        raise self.error(f"{what}: did not answer within {self.start_timeout:g}s; log {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; reaped; safe to call twice. Returns the exit code."""
        process, self._process = self._process, None
        _LIVE.discard(self)
        if process is None:
            return None
        try:
            if process.poll() is None:
                terminate_process_group(process.pid, self.stop_timeout, popen=process)
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=self.stop_timeout)  # reap it: no zombie left behind
            self._stopped(process)
        return process.returncode

    def _stopped(self, process: subprocess.Popen) -> None:
        """Clean-up after the child is gone (e.g. a pid file); nothing by default."""

    def kill(self) -> None:
        """Simulate a crash: SIGKILL to the group, no clean shutdown."""
        process = self._process
        if process is not None and process.poll() is None:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the child exits; its exit code (None on timeout or if never started)."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the child's log."""
        return tail(self.log_path, lines) if self.log_path is not None else "(output not captured: see stderr)"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self):
        """Start the child and return once it is ready (subclasses define readiness)."""
        raise NotImplementedError
