"""The embedded broker: start, readiness, addresses, clean stop, pid files, no orphans.

Tansu only: these tests are about the embedded broker process itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer

from fairstream.streams.kafka import KAFKA_API_VERSION
from fairstream.streams.ops.broker import (
    BrokerError,
    EmbeddedBroker,
    ExternalBroker,
    broker_from_option,
    free_port,
    is_kafka_ready,
    kafka_metadata,
    BrokerState,
    read_pid_file,
    running_broker,
    runtime_dir,
    state_path,
    stop_broker_from_pid_file,
    stop_running_broker,
    write_state,
)

pytestmark = pytest.mark.integration


def _wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _fake_binary(tmp_path: Path, script: str) -> str:
    path = tmp_path / "fake-tansu"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return str(path)


def test_external_option_starts_nothing(tmp_path):
    with broker_from_option("kafka://kafka.example:9092", tmp_path) as chosen:
        assert isinstance(chosen, ExternalBroker)
        assert chosen.bootstrap == "kafka.example:9092"
        assert chosen.url == "kafka://kafka.example:9092"
    assert not (tmp_path / "broker.pid").exists()


# --------------------------------------------------------------------------- a running broker


@pytest.fixture(scope="module")
def broker(embedded_broker):
    return embedded_broker


def test_broker_answers_metadata_with_its_advertised_address(broker):
    assert broker.running
    assert kafka_metadata("127.0.0.1", broker.port) == [("127.0.0.1", broker.port)]
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"
    assert broker.url == f"kafka://127.0.0.1:{broker.port}"


def test_pid_file_and_log_are_written(broker):
    assert read_pid_file(broker.pid_path) == broker.pid
    args = Path(f"/proc/{broker.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
    assert "tansu" in args[0] and args[1:] == ["broker"]  # the wrapper exec()ed the binary, same pid
    assert "listening on" in broker.log_path.read_text()


def test_broker_leads_its_own_process_group(broker):
    # Ctrl-C in the owner's terminal must not reach the broker before the owner stops it.
    assert os.getpgid(broker.pid) == broker.pid != os.getpgid(0)


def test_second_broker_in_same_run_dir_is_refused(broker):
    with pytest.raises(BrokerError, match="already runs"):
        EmbeddedBroker(broker.run_dir).start()
    assert broker.running


def test_nothing_kafka_listens_on_a_free_port():
    assert not is_kafka_ready("127.0.0.1", free_port(), timeout=0.5)


# --------------------------------------------------------------------------- start and stop


def test_embedded_option_starts_and_stops_a_broker(tmp_path):
    with broker_from_option(None, tmp_path) as chosen:
        assert isinstance(chosen, EmbeddedBroker)
        pid, port = chosen.pid, chosen.port
        assert is_kafka_ready("127.0.0.1", port)
    assert _wait_dead(pid, timeout=1.0)
    assert not (tmp_path / "broker.pid").exists()
    assert not is_kafka_ready("127.0.0.1", port, timeout=0.5)


def test_requested_port_is_used(tmp_path):
    port = free_port()
    with EmbeddedBroker(tmp_path, port=port) as embedded:
        assert embedded.bootstrap == f"127.0.0.1:{port}"


def test_requested_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(BrokerError, match="already in use"):
            EmbeddedBroker(tmp_path, port=taken.getsockname()[1]).start()


def test_a_killed_broker_restarts_on_its_port_at_once_though_its_connections_linger(tmp_path):
    embedded = EmbeddedBroker(tmp_path).start()
    port = embedded.port
    try:
        client = KafkaProducer(bootstrap_servers=embedded.bootstrap, api_version=KAFKA_API_VERSION)
        client.send("restart", b"x").get(timeout=30)  # a connection the broker serves
        embedded.kill()  # kill -9: the broker's end of it closes first ...
        client.close(timeout=1)  # ... so it lingers in TIME_WAIT on the broker's port for a minute
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # what refused the port before (a bind without SO_REUSEADDR)
        started = time.monotonic()
        embedded.restart()
        assert time.monotonic() - started < 10
        assert embedded.port == port and kafka_metadata("127.0.0.1", port) == [("127.0.0.1", port)]
        assert read_pid_file(embedded.pid_path) == embedded.pid
    finally:
        embedded.stop()


def test_stop_twice_is_harmless(tmp_path):
    embedded = EmbeddedBroker(tmp_path).start()
    embedded.stop()
    embedded.stop()
    assert not embedded.running


def test_stop_from_pid_file(tmp_path):
    embedded = EmbeddedBroker(tmp_path).start()
    pid = embedded.pid
    assert stop_broker_from_pid_file(tmp_path) is True
    assert embedded.wait(timeout=5) is not None
    assert not (tmp_path / "broker.pid").exists()
    embedded.stop()  # the owner's own stop still works after an outside stop
    assert _wait_dead(pid, timeout=1.0)


def test_stale_pid_file_is_removed_without_killing_anything(tmp_path):
    pid_file = tmp_path / "broker.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a broker: pid reused
    assert stop_broker_from_pid_file(pid_file) is False
    assert not pid_file.exists()
    assert stop_broker_from_pid_file(pid_file) is False  # no file at all


def test_broker_that_exits_early_reports_its_log(tmp_path):
    binary = _fake_binary(tmp_path, 'echo "boom: cannot open storage" >&2; exit 3')
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*boom: cannot open storage"):
        EmbeddedBroker(tmp_path / "run", port=free_port(), binary=binary).start()
    assert not (tmp_path / "run" / "broker.pid").exists()


def test_broker_that_never_answers_times_out_and_is_killed(tmp_path):
    binary = _fake_binary(tmp_path, 'echo "starting slowly"; exec sleep 60')
    embedded = EmbeddedBroker(tmp_path / "run", binary=binary, start_timeout=0.5)
    with pytest.raises(BrokerError, match=r"(?s)did not answer.*starting slowly"):
        embedded.start()
    assert not embedded.running
    assert not (tmp_path / "run" / "broker.pid").exists()


# --------------------------------------------------------------------------- no orphans

_OWNER = textwrap.dedent(
    """
    import sys, time
    from fairstream.streams.ops.broker import EmbeddedBroker
    broker = EmbeddedBroker(sys.argv[1]).start()
    print(broker.pid, flush=True)
    time.sleep(120)
    """
)


def _start_owner(run_dir: Path) -> tuple[subprocess.Popen, int]:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    broker_pid = int(owner.stdout.readline())
    return owner, broker_pid


@pytest.mark.parametrize("owner_signal", [signal.SIGTERM, signal.SIGKILL])
def test_broker_dies_with_its_owner(tmp_path, owner_signal):
    owner, broker_pid = _start_owner(tmp_path)
    try:
        owner.send_signal(owner_signal)
        owner.wait(timeout=15)
        assert _wait_dead(broker_pid), "broker outlived its owner"
    finally:
        owner.kill()
        owner.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(broker_pid, signal.SIGKILL)
    if owner_signal == signal.SIGTERM:
        # A catchable signal goes through the cleanup hook, which also removes the pid file.
        assert owner.returncode == -signal.SIGTERM
        assert not (tmp_path / "broker.pid").exists()
    else:
        # SIGKILL leaves a stale pid file behind; it must not block the next broker.
        with EmbeddedBroker(tmp_path) as restarted:
            assert restarted.running


# --------------------------------------------------------------------------- finding a running broker


def test_the_runtime_dir_is_fairstreams_own_then_the_users_runtime_dir_then_tmp(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert runtime_dir() == tmp_path / "own" and state_path() == tmp_path / "own" / "broker.json"
    monkeypatch.delenv("FAIRSTREAM_RUNTIME_DIR")
    assert runtime_dir() == tmp_path / "xdg" / "fairstream"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert runtime_dir() == Path(f"/tmp/fairstream-{os.getuid()}")


def test_an_announced_broker_is_found_until_it_stops(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path / "runtime"))
    with EmbeddedBroker(tmp_path / "run", announce=True) as announced:
        found = running_broker()
        assert (found.url, found.pid, found.log) == (announced.url, announced.pid, str(announced.log_path.resolve()))
        assert (tmp_path / "runtime").stat().st_mode & 0o777 == 0o700
    assert not state_path().exists() and running_broker() is None
    with EmbeddedBroker(tmp_path / "quiet"):  # one started for its owner alone stays unannounced
        assert running_broker() is None


def test_stop_running_broker_stops_the_announced_one(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path))
    embedded = EmbeddedBroker(tmp_path / "run", announce=True).start()
    try:
        stopped = stop_running_broker()
        assert stopped is not None and stopped.pid == embedded.pid
        assert embedded.wait(timeout=5) is not None and not state_path().exists()
        assert stop_running_broker() is None
    finally:
        embedded.stop()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


@pytest.mark.parametrize("pid", ["dead", "not a broker"])
def test_a_stale_state_file_is_ignored_and_removed(pid, monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path))
    # Its broker died with an owner killed outright, or its pid was reused by an unrelated process.
    with subprocess.Popen(["sleep", "60"]) as unrelated:
        try:
            write_state(BrokerState("kafka://127.0.0.1:1", _dead_pid() if pid == "dead" else unrelated.pid, "broker.log"))
            assert state_path().exists()
            assert running_broker() is None
            assert not state_path().exists()
            write_state(BrokerState("kafka://127.0.0.1:1", unrelated.pid, "broker.log"))
            assert stop_running_broker() is None and unrelated.poll() is None  # not stopped: not a broker
        finally:
            unrelated.kill()


def test_a_pid_reused_by_another_process_named_like_a_broker_is_neither_found_nor_stopped(monkeypatch, tmp_path):
    # The broker died unannounced and the system gave its pid to a process whose last argument is "broker" too.
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "broker"]) as lookalike:
        try:
            state_path().write_text(json.dumps({"url": "kafka://127.0.0.1:1", "pid": lookalike.pid, "log": "x"}))
            assert running_broker() is None and not state_path().exists()  # written by hand: no start time
            write_state(BrokerState("kafka://127.0.0.1:1", lookalike.pid, "x", started="1"))  # another process's
            assert stop_running_broker() is None and lookalike.poll() is None  # not stopped
        finally:
            lookalike.kill()


@pytest.mark.parametrize("text", ["{", "[]", '{"url": "kafka://127.0.0.1:1"}'])
def test_an_unreadable_state_file_is_ignored_and_removed(text, monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path))
    state_path().write_text(text)
    assert running_broker() is None and not state_path().exists()


def test_a_stopped_broker_removes_only_its_own_announcement(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path / "runtime"))
    with EmbeddedBroker(tmp_path / "first", announce=True) as first:
        with EmbeddedBroker(tmp_path / "second", announce=True) as second:  # the newer announcement wins
            assert running_broker().pid == second.pid
            first.stop()
            assert running_broker().pid == second.pid


def test_a_broker_that_cannot_be_announced_is_not_left_running(monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("FAIRSTREAM_RUNTIME_DIR", str(tmp_path / "a-file"))
    embedded = EmbeddedBroker(tmp_path / "run", announce=True)
    with pytest.raises(BrokerError, match=r"cannot announce the broker in .*a-file .*set FAIRSTREAM_RUNTIME_DIR"):
        embedded.start()
    assert not embedded.running and not (tmp_path / "run" / "broker.pid").exists()
