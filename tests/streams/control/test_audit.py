"""The audit trail: every control record says who acted, why, and the figures at that moment."""

from __future__ import annotations

import json
import socket

import pytest

from fairstream.repair import datasets
from fairstream.streams.config import adult_config
from fairstream.streams.control import client as control_client
from fairstream.streams.control.client import ControlClient, ControlLog, default_actor
from fairstream.streams.control.records import (
    IMPLIED_KEY,
    RECORD,
    ControlError,
    control_key,
    encode_control,
    parse_control,
    read_message,
)
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.refit.job import RefitJob
from fairstream.streams.refit.sources import ResearchWindow
from fairstream.streams.schemas import ControlRecord

SHA = "ab" * 32


def test_actor_reason_and_statistics_survive_the_round_trip():
    record = ControlRecord("plan", 3, SHA, action="rollback", path="p", published_at=5.0, actor="alice@risk",
                           reason="v3 raised the gap for women over 60", statistics={"E": 0.25, "n": 4000})
    value = encode_control(record)
    read = read_message(control_key(record, value), value)
    assert read.what == RECORD and read.record == record
    assert read.record.statistics == {"E": 0.25, "n": 4000.0} and isinstance(read.record.statistics["n"], float)


def test_a_record_written_before_the_audit_trail_is_read_and_keyed_as_before():
    old = json.dumps({"kind": "plan", "version": 1, "sha256": SHA, "action": "publish", "blob_b64": None,
                      "path": "p", "published_at": 1.0}, sort_keys=True).encode()
    record = parse_control(old)
    assert (record.actor, record.reason, record.statistics) == (None, None, None)
    assert encode_control(record) == old  # unchanged bytes, so an unchanged key: compaction treats it as before
    assert read_message(IMPLIED_KEY, old).record == record


def test_the_client_refuses_what_every_reader_would_refuse_before_writing():
    client = ControlClient("localhost:1", adult_config().topics, ArtifactStore("unused"))
    with pytest.raises(ControlError, match="the actor must not be empty"):
        client.publish_sync(None, actor=" ")
    with pytest.raises(ControlError, match="the reason must be at most 1000 characters, got 1001"):
        client.rollback_sync("plan", actor="alice", reason="r" * 1001)
    with pytest.raises(ControlError, match="statistic 'E' must be a finite number, got nan"):
        client.publish_sync(None, statistics={"E": float("nan")})


def test_the_default_actor_is_this_user_at_this_host():
    user, host = default_actor().rsplit("@", 1)
    assert user and host == socket.gethostname() and default_actor() is default_actor()


class RecordingClient:
    """A control client with nothing published yet that keeps what a job publishes (no broker needed)."""

    def __init__(self):
        self.published = []

    async def read(self) -> ControlLog:
        return ControlLog()

    def publish_under_sync(self, artifact, promotion, **audit) -> control_client.Published:
        self.published.append(audit)
        mode = control_client.publish_mode(promotion, ControlLog().ledger, artifact.kind)
        record = ControlRecord(artifact.kind, 1, artifact.sha256, path="p", candidate=mode.candidate or None, **audit)
        return control_client.Published(record, mode)


def test_a_refit_publishes_under_its_own_name_with_its_trigger_and_its_figures(tmp_path):
    config = adult_config(artifact_dir=str(tmp_path / "artifacts"))
    data, _ = datasets.load("adult").split(3000, seed=1)
    job = RefitJob(config, "localhost:1", kind="plan")
    job.control = RecordingClient()
    outcome = job.run_once(ResearchWindow.of(data.X, data.s, data.u), trigger="drift alert:\n E 0.31 > 0.1")
    assert outcome.published, outcome.reason
    expected = {outcome.statistic: outcome.candidate_value}
    if outcome.current_value is not None:  # the trainer's baseline: the deployment without a plan
        expected[f"current {outcome.statistic}"] = outcome.current_value
    assert job.control.published == [{"actor": f"refit@{socket.gethostname()}", "reason": "drift alert: E 0.31 > 0.1",
                                       "statistics": expected}]
    assert control_client.parse_statistics(expected) == expected  # what every reader takes
