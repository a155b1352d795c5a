"""Child processes the CLI, the demo and the tests run: the broker, Prometheus, fairstream workers.

One place for what they all need: a free loopback port, a command prefix that makes the child
die with its owner (Linux parent-death signal), and stopping a process group (SIGTERM, then
SIGKILL) without leaving zombies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

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
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
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
