"""Candidates and decisions on the control topic: the ledger's rules, the registry's shadowed candidates, the
announcements of live figures, and the client that publishes candidates and writes decisions."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import uuid
from dataclasses import replace

import pytest
from aiokafka import AIOKafkaProducer

from fairstream.streams.config import adult_config
from fairstream.streams.control import client as client_module
from fairstream.streams.control.client import ControlClient, ControlLog, _activation_stacks, publish_mode
from fairstream.streams.control.records import (
    IMPLIED_KEY,
    RECORD,
    ControlError,
    VersionLedger,
    WorkerStatus,
    control_key,
    decision_record,
    encode_announcement,
    encode_control,
    parse_announcement,
    parse_control,
    read_message,
    shadow_figures,
)
from fairstream.streams.control.registry import (
    SHADOW_ANNOUNCE_EVERY,
    Announcer,
    Served,
    WorkerIdentity,
    follow_control,
    module_loaders,
)
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.kafka import aiokafka_options
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import TopicConfig, ensure_topics

from .test_registry import (
    FOLLOW_TIMEOUT,
    LOADERS,
    SCHEMA,
    ArtifactRegistry,
    catch_up,
    compact,
    fit_plan,
    message,
    own_key,
    read_log,
    served_version,
    write_log,
)
from .test_versions import fake_messages, wait_until

SHA, OTHER = "ab" * 32, "cd" * 32


@pytest.fixture(scope="module")
def artifacts():
    return [fit_plan(seed).to_artifact() for seed in (21, 22, 23)]


# --------------------------------------------------------------------------- the message format


def test_a_record_without_the_candidate_field_keeps_its_exact_bytes_and_key():
    old = json.dumps({"kind": "plan", "version": 1, "sha256": SHA, "action": "publish", "blob_b64": None,
                      "path": "p", "published_at": 1.0, "actor": "alice"}, sort_keys=True).encode()
    record = parse_control(old)
    assert record.candidate is None and encode_control(record) == old
    assert read_message(IMPLIED_KEY, old).record == record
    assert control_key(record, encode_control(record)) == control_key(parse_control(old), old)
    candidate = ControlRecord(**{**record.asdict(), "candidate": True})
    value = encode_control(candidate)
    assert json.loads(value)["candidate"] is True and parse_control(value) == candidate
    assert control_key(candidate, value) != control_key(record, old)  # a candidate is another record


@pytest.mark.parametrize("fields, refusal", [
    ({"candidate": "yes"}, "field 'candidate' must be true, false or left out, got 'yes'"),
    ({"action": "rollback", "candidate": True}, "only a publish may be a candidate, not a rollback"),
    ({"action": "approve"}, "an approve decision decides a candidate already published and carries no artifact, got "
                            "['path']"),
    ({"action": "reject"}, "a reject decision decides a candidate already published"),
    ({"action": "retire", "path": None, "blob_b64": "AAAA"}, "carries no artifact, got ['blob_b64']"),
    ({"action": "publish", "path": None}, "exactly one of blob_b64 or path, got neither"),
    ({"action": "demote"}, "action must be one of ('publish', 'rollback', 'configure', 'promote', 'approve', 'reject', 'retire')"),
])
def test_malformed_candidates_and_decisions_are_refused_with_the_reason(fields, refusal):
    data = {"kind": "plan", "version": 2, "sha256": SHA, "path": "p", **fields}
    with pytest.raises(ControlError) as caught:
        parse_control(json.dumps(data).encode())
    assert refusal in str(caught.value)


@pytest.mark.parametrize("action", ["publish", "rollback"])
def test_a_record_saying_candidate_false_is_no_candidate_and_keeps_its_own_key(action):
    value = json.dumps({"kind": "plan", "version": 2, "sha256": SHA, "action": action, "path": "p",
                        "candidate": False}, sort_keys=True).encode()
    record = parse_control(value)
    assert record == ControlRecord("plan", 2, SHA, action=action, path="p")  # encoded as before: no "candidate"
    assert "candidate" not in json.loads(encode_control(record))
    read = read_message(IMPLIED_KEY, value)  # taken under the key of its own bytes, as any record
    assert read.what == RECORD and read.record == record


def test_a_decision_carries_no_artifact_and_round_trips_under_its_own_key():
    record = decision_record("plan", 3, SHA, "approve", "alice@risk", reason="closes the gap", statistics={"E": 0.1})
    value = encode_control(record)
    read = read_message(control_key(record, value), value)
    assert read.what == RECORD and read.record == record and (record.blob_b64, record.path) == (None, None)
    assert "candidate" not in json.loads(value) and control_key(record, value).startswith(b"plan/3/approve/")
    with pytest.raises(ControlError, match="a decision is one of"):
        decision_record("plan", 3, SHA, "rollback", "alice")
    with pytest.raises(ControlError, match="statistic 'E' must be a finite number"):
        decision_record("plan", 3, SHA, "promote", "shadow-policy@w", statistics={"E": math.nan})
    with pytest.raises(ControlError, match="^the retire decision's reason must be at most 1000 characters, got 1001$"):
        decision_record("plan", 3, SHA, "retire", "shadow-policy@w", reason="r" * 1001)


# --------------------------------------------------------------------------- the ledger's rules, as tables


def publish(version, sha=SHA, kind="plan", actor="refit@host"):
    return ControlRecord(kind, version, sha, path="p", actor=actor)


def candidate(version, sha=SHA, kind="plan", actor="refit@host"):
    return ControlRecord(kind, version, sha, path="p", actor=actor, candidate=True)


def decide(action, version, sha=SHA, kind="plan", actor="alice"):
    return decision_record(kind, version, sha, action, actor)


def rollback(version, sha=SHA, kind="plan"):
    return ControlRecord(kind, version, sha, action="rollback", path="p", actor="bob")


LEDGER_SEQUENCES = {
    "approved candidate serves": (
        [publish(1), candidate(2), decide("approve", 2)],
        [None, None, None], None, {1: "published", 2: "approved"}),
    "a newer candidate supersedes the pending one, without a retire record": (
        [publish(1), candidate(2), candidate(3), decide("approve", 2)],
        [None, None, None, "plan version 2 was already superseded by the publish of candidate version 3 at offset 2 "
                           "(pending: version 3)"], (3, SHA), {2: "superseded", 3: "candidate"}),
    "rejected candidate can neither be rolled back to nor decided again": (
        [candidate(1), decide("reject", 1), rollback(1), decide("promote", 1, actor="shadow-policy@w")],
        [None, None, "rollback to plan version 1, which never served (a candidate rejected by alice at offset 1): "
         "a rollback names a version that served",
         "plan version 1 was already rejected by alice at offset 1 (no candidate of plan is pending)"],
        None, {1: "rejected"}),
    "a pending candidate cannot be rolled back to, a decision must name its artifact": (
        [publish(1), candidate(2), rollback(2), decide("retire", 2, sha=OTHER), decide("retire", 2), rollback(2)],
        [None, None, "rollback to plan version 2, which never served (a pending candidate): "
         "a rollback names a version that served",
         f"retire of plan version 2 names sha256 {OTHER[:12]}, but candidate version 2 is {SHA[:12]}", None,
         "rollback to plan version 2, which never served (a candidate retired by alice at offset 4): "
         "a rollback names a version that served"],
        None, {2: "retired"}),
    "a promoted candidate served: a rollback may name it": (
        [publish(1), candidate(2), decide("promote", 2, actor="shadow-policy@w"), rollback(1), rollback(2)],
        [None, None, None, None, None], None, {1: "published", 2: "promoted"}),
    "a decision names only the pending candidate": (
        [publish(1), decide("approve", 1), candidate(2), decide("approve", 9), decide("approve", 1)],
        [None, "plan version 1 is not a pending candidate (no candidate of plan is pending)", None,
         "plan version 9 is not a pending candidate (pending: version 2)",
         "plan version 1 is not a pending candidate (pending: version 2)"], (2, SHA), {1: "published"}),
    "a candidate claims its version: the next publish takes the one after it, and supersedes it": (
        [publish(1), candidate(2), publish(2, sha=OTHER), publish(3, sha=OTHER)],
        [None, None, f"version collision: plan version 2 already names sha256 {SHA[:12]}, an earlier publish took it",
         None], None, {2: "superseded", 3: "published"}),
    "a version published to serve supersedes the pending candidate: approving it later cannot downgrade": (
        [publish(1), candidate(2), publish(3, sha=OTHER), decide("approve", 2), rollback(2), candidate(4),
         decide("approve", 4)],
        [None, None, None, "plan version 2 was already superseded by version 3, published to serve at offset 2 (no "
                           "candidate of plan is pending)",
         "rollback to plan version 2, which never served (a candidate superseded by version 3, published to serve at "
         "offset 2): a rollback names a version that served", None, None],
        None, {1: "published", 2: "superseded", 3: "published", 4: "approved"}),
    "kinds are independent": (
        [candidate(1, kind="scorer"), candidate(1), decide("approve", 1, kind="scorer")],
        [None, None, None], (1, SHA), {1: "candidate"}),
}


@pytest.mark.parametrize("records, verdicts, pending, states", LEDGER_SEQUENCES.values(), ids=LEDGER_SEQUENCES)
def test_the_ledger_decides_candidates_by_one_rule(records, verdicts, pending, states):
    ledger = VersionLedger()
    assert [ledger.admit(record, offset) for offset, record in enumerate(records)] == verdicts
    assert ledger.pending("plan") == pending
    assert {version: ledger.state("plan", version) for version in states} == states


# --------------------------------------------------------------------------- the registry


def encoded(record: ControlRecord) -> bytes:
    return encode_control(record)


def candidate_message(artifact, version: int) -> bytes:
    return message(artifact, version=version, candidate=True, actor="refit@host")


def decision_message(artifact, version: int, action: str, actor: str = "alice") -> bytes:
    return encoded(decision_record(artifact.kind, version, artifact.sha256, action, actor, reason="because"))


def test_a_candidate_is_built_beside_the_active_version_and_serves_once_approved(artifacts):
    a, b, _ = artifacts
    changes, candidates = [], []
    registry = ArtifactRegistry(LOADERS, on_change=changes.append,
                                on_candidate=lambda kind, built: candidates.append((kind, built and built.version)))
    assert registry.apply(message(a, version=1)) and registry.apply(candidate_message(b, 2))
    served = registry.served()
    assert isinstance(served, Served) and served.active["plan"].version == 1 and served.candidates["plan"].version == 2
    assert registry.snapshot() is served.active and served_version(registry) == 1
    assert [active.version for active in changes] == [1] and candidates == [("plan", 2)]
    assert registry.apply(decision_message(b, 2, "approve"))
    assert served_version(registry) == 2 and registry.current("plan").sha256 == b.sha256
    assert registry.candidate("plan") is None and not registry.served().candidates
    assert [active.version for active in changes] == [1, 2] and candidates == [("plan", 2), ("plan", None)]
    assert served.candidates["plan"].version == 2 and served.active["plan"].version == 1  # the old state is intact


def test_rejected_retired_and_superseded_candidates_leave_and_the_active_version_keeps_serving(artifacts):
    a, b, c = artifacts
    candidates = []
    registry = ArtifactRegistry(LOADERS, on_candidate=lambda kind, built: candidates.append(built and built.version))
    registry.apply(message(a, version=1))
    for value in [candidate_message(b, 2), candidate_message(c, 3), decision_message(b, 2, "approve"),
                  decision_message(c, 3, "reject"), candidate_message(b, 4), decision_message(b, 4, "retire",
                                                                                                "shadow-policy@w")]:
        registry.apply(value)
    assert candidates == [2, None, 3, None, 4, None]  # superseded by 3; the approval of 2 came too late
    assert served_version(registry) == 1 and registry.refused_total["plan"] == 1
    assert registry.ledger.state("plan", 2) == "superseded" and registry.ledger.state("plan", 4) == "retired"


def test_a_version_published_to_serve_drops_the_pending_candidate_and_a_late_approval_changes_nothing(artifacts):
    a, b, c = artifacts
    candidates = []
    registry = ArtifactRegistry(LOADERS, on_candidate=lambda kind, built: candidates.append(built and built.version))
    for value in [message(a, version=1), candidate_message(b, 2), message(c, version=3)]:
        assert registry.apply(value)
    assert candidates == [2, None] and registry.candidate("plan") is None and served_version(registry) == 3
    assert not registry.apply(decision_message(b, 2, "approve"))  # it would have downgraded v3 to v2
    assert served_version(registry) == 3 and registry.ledger.state("plan", 2) == "superseded"


def test_a_first_candidate_waits_for_approval_and_the_worker_says_how_to_give_it(artifacts):
    a, _, _ = artifacts
    registry = ArtifactRegistry(LOADERS)
    assert registry.apply(candidate_message(a, 1)) and registry.current("plan") is None
    assert registry.explain_missing("plan") == (logging.WARNING, (
        "no plan serves yet: candidate version 1 awaits approval (fairstream artifacts approve plan 1 --by NAME "
        "--reason TEXT)"))
    assert registry.apply(decision_message(a, 1, "approve")) and served_version(registry) == 1


def test_a_candidate_that_does_not_load_is_refused_and_its_approval_changes_nothing(artifacts, caplog):
    a, b, _ = artifacts
    registry = ArtifactRegistry(LOADERS)
    registry.apply(message(a, version=1))
    assert not registry.apply(message(b, version=2, candidate=True, sha256=OTHER))  # the payload is not OTHER
    assert registry.candidate("plan") is None and registry.ledger.pending("plan") == (2, OTHER)
    approval = encoded(decision_record("plan", 2, OTHER, "approve", "alice"))
    assert not registry.apply(approval)
    assert "candidate plan version 2 was never built here (its load was refused)" in caplog.text
    assert served_version(registry) == 1 and registry.refused_total["plan"] == 2


def shadow_log(artifacts) -> list[tuple[bytes, bytes]]:
    a, b, c = artifacts
    values = [message(a, version=1), candidate_message(b, 2), candidate_message(c, 3)]
    return [(own_key(value), value) for value in values]


def replayed(log) -> ArtifactRegistry:
    registry = ArtifactRegistry(LOADERS)
    for msg in fake_messages(log):
        registry.apply(msg.value, msg.key, msg.offset)
    return registry


@pytest.mark.parametrize("compacted", [False, True], ids=["as written", "compacted"])
def test_a_worker_restarted_mid_shadow_ends_with_the_same_candidate_pending(artifacts, compacted):
    a, b, c = artifacts
    log = shadow_log(artifacts)
    running = replayed(log)
    restarted = replayed(compact(log) if compacted else log)  # a fresh registry replays the same messages
    for registry in (running, restarted):
        served = registry.served()
        assert (served.active["plan"].version, served.candidates["plan"].version) == (1, 3)
        assert served.candidates["plan"].sha256 == c.sha256 and registry.ledger.pending("plan") == (3, c.sha256)
    approval = decision_message(c, 3, "approve")
    assert running.apply(approval, own_key(approval), len(log))
    assert restarted.apply(approval, own_key(approval), len(log))
    assert served_version(running) == served_version(restarted) == 3


# --------------------------------------------------------------------------- announcements


def test_announcements_carry_what_a_worker_shadows_and_old_ones_still_parse(artifacts):
    old = {"announcement": "worker", "worker": "app@host:1", "app_id": "app", "host": "host", "pid": 1, "at": 1.0,
           "every": 300.0, "kinds": ["plan"], "serving": [{"kind": "plan", "version": 1, "sha256": SHA}],
           "state": "serving"}
    status = parse_announcement(json.dumps(old).encode())
    assert status.shadowing == () and status.shadow is None
    assert encode_announcement(status)[1] == json.dumps(old, sort_keys=True).encode()  # written as before
    shadowing = replace(status, shadowing=(("plan", 2, OTHER),), shadow={"records": 2500.0, "candidate.E": 0.01})
    assert parse_announcement(encode_announcement(shadowing)[1]) == shadowing
    for bad in ({"E": math.inf}, {f"f{i}": 1.0 for i in range(65)}, {"": 1.0}, [1.0]):
        value = json.loads(encode_announcement(shadowing)[1])
        value["shadow"] = bad
        assert parse_announcement(json.dumps(value).encode()) is None, bad  # bounded and finite, or not one
    figures = {**{f"f{i}": float(i) for i in range(70)}, "nan": math.nan, "x" * 101: 1.0}
    assert shadow_figures(figures) == {f"f{i}": float(i) for i in range(64)}


class RecordingAnnouncer(Announcer):
    """An announcer on a clock the test sets, keeping what it would send."""

    def __init__(self, figures):
        super().__init__(WorkerIdentity("app", ("plan",), "host", 1), "unused", "control", every=300.0,
                         shadow_figures=self.read)
        self.figures, self.reads = figures, 0
        self.now, self.sent = 0.0, []
        self.clock = lambda: self.now

    def read(self):
        self.reads += 1
        return self.figures["now"]

    async def _send(self, status: WorkerStatus) -> bool:
        self.sent.append(status)
        return True


def test_shadow_figures_are_announced_when_they_change_at_most_every_five_seconds(artifacts):
    a, b, _ = artifacts
    registry = ArtifactRegistry(LOADERS)
    registry.apply(message(a, version=1))
    figures = {"now": None}
    announcer = RecordingAnnouncer(figures)

    def step(seconds: float, value=None, *records) -> int:
        for record in records:
            registry.apply(record)
        figures["now"], announcer.now = value, announcer.now + seconds
        before = len(announcer.sent)
        asyncio.run(announcer.update(registry.served()))
        return len(announcer.sent) - before

    assert step(0) == 1 and announcer.sent[-1].shadowing == () and announcer.sent[-1].shadow is None
    assert step(1, {"records": 10}, candidate_message(b, 2)) == 1  # shadowing changed: announced at once
    assert announcer.sent[-1].shadowing == (("plan", 2, b.sha256),) and announcer.sent[-1].shadow == {"records": 10.0}
    reads = announcer.reads
    assert step(1, {"records": 20}) == 0  # changed, but within 5 s of the last figures
    assert announcer.reads == reads  # nothing was due: the comparison was not even asked
    assert step(SHADOW_ANNOUNCE_EVERY, {"records": 30}) == 1 and announcer.sent[-1].shadow == {"records": 30.0}
    assert step(SHADOW_ANNOUNCE_EVERY, {"records": 30}) == 0  # unchanged: nothing to say
    assert step(1, None, decision_message(b, 2, "approve")) == 1  # serving and shadowing changed
    assert announcer.sent[-1].serving == (("plan", 2, b.sha256),) and announcer.sent[-1].shadowing == ()
    assert announcer.sent[-1].shadow is None


# --------------------------------------------------------------------------- the client's view of the log


def test_the_log_names_the_pending_candidate_its_decisions_and_the_workers_latest_figures(artifacts):
    a, b, c = artifacts
    status = WorkerStatus("app@host:1", "app", "host", 1, 5.0, 300.0, ("plan",), (("plan", 1, a.sha256),),
                          shadowing=(("plan", 3, c.sha256),), shadow={"records": 100.0})
    later = replace(status, at=9.0, shadow={"records": 400.0})
    values = [message(a, version=1), candidate_message(b, 2), decision_message(b, 2, "reject"),
              decision_message(b, 2, "approve"), candidate_message(c, 3)]
    log = [(own_key(value), value) for value in values] + [encode_announcement(status), encode_announcement(later)]
    control = ControlLog()
    for msg in fake_messages(log):
        control.add(msg)
    assert control.pending("plan").version == 3 and control.pending("plan").sha256 == c.sha256
    assert control.pending("scorer") is None
    decisions = control.decisions("plan", 2)
    assert [(e.record.action, e.refusal is None) for e in decisions] == [("reject", True), ("approve", False)]
    assert "already rejected by alice" in decisions[1].refusal
    assert control.shadow_figures("plan", 3) == {"app@host:1": later} and control.shadow_figures("plan", 2) == {}
    assert [r.version for r in _activation_stacks(control.history())["plan"]] == [1]  # no candidate served


def test_activation_stacks_push_the_promoted_candidates_publish():
    history = [publish(1), candidate(2, sha=OTHER), decide("promote", 2, sha=OTHER), candidate(3), decide("retire", 3)]
    stack = _activation_stacks(history)["plan"]
    assert [(r.version, r.action, r.candidate) for r in stack] == [(1, "publish", None), (2, "publish", True)]


# --------------------------------------------------------------------------- candidate or not: the one decision


def served_ledger(*records) -> VersionLedger:
    ledger = VersionLedger()
    for offset, record in enumerate(records):
        assert ledger.admit(record, offset) is None
    return ledger


PUBLISH_MODES = {  # (promotion, the log before, kind) -> a candidate?, and what the caller is told
    "auto never": ("auto", [publish(1), candidate(2)], "plan", False, "promotion is 'auto': it serves at once"),
    "approve always, the first version too": (
        "approve", [], "plan", True, "promotion is 'approve': it serves once a person approves it"),
    "shadow with nothing served yet: no active chain to compare with": (
        "shadow", [candidate(1)], "plan", False, "promotion is 'shadow', but no plan version served yet (there is no "
                                                 "active chain to compare it with): it serves at once, as under 'auto'"),
    "shadow once a version served": (
        "shadow", [candidate(1), decide("approve", 1)], "plan", True, "promotion is 'shadow': the workers shadow it "
                                                                      "until the shadow policy promotes or retires it"),
    "shadow measures only the record chain": (
        "shadow", [publish(1, kind="embedding")], "embedding", False,
        "promotion is 'shadow', but the shadow policy measures only the record chain, not the embedding: it serves at "
        "once, as under 'auto'"),
}


@pytest.mark.parametrize("promotion, records, kind, is_candidate, why", PUBLISH_MODES.values(), ids=PUBLISH_MODES)
def test_one_function_decides_from_the_promotion_and_the_log_whether_a_publish_is_a_candidate(
        promotion, records, kind, is_candidate, why):
    mode = publish_mode(promotion, served_ledger(*records), kind)
    assert (mode.candidate, mode.why) == (is_candidate, why)


def test_an_unknown_promotion_is_refused_in_one_line():
    with pytest.raises(ControlError, match="^promotion must be one of auto, shadow, approve, got 'manual'$"):
        publish_mode("manual", VersionLedger(), "plan")


# --------------------------------------------------------------------------- over the broker


@pytest.fixture
def topics(broker):
    return TopicConfig(prefix=f"candidates-{uuid.uuid4().hex[:10]}", partitions=1)


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "store")


@pytest.mark.integration
def test_the_client_supersedes_decides_and_refuses_what_the_ledger_would(broker, topics, store, artifacts):
    a, b, c = artifacts
    client = ControlClient(broker.bootstrap, topics, store)
    assert client.publish_sync(a, actor="refit@host").candidate is None
    assert client.publish_sync(b, actor="refit@host", reason="drift", candidate=True).version == 2
    third = client.publish_sync(c, actor="carol", candidate=True)
    assert (third.version, third.candidate) == (3, True)
    # The newer candidate supersedes the pending one: no retire record (retiring is the shadow policy's role).
    assert [record.action for record in client.history_sync()] == ["publish"] * 3
    with pytest.raises(ControlError) as refused:
        client.decide_sync("plan", 2, "approve", actor="alice", reason="looks good")
    assert str(refused.value) == ("refusing to approve: plan version 2 was already superseded by the publish of "
                                  "candidate version 3 at offset 2 (pending: version 3)")
    with pytest.raises(ControlError, match="^a decision is one of promote, approve, reject, retire, got 'rollback'$"):
        client.decide_sync("plan", 3, "rollback", actor="alice")
    with pytest.raises(ControlError, match=r"^refusing to roll back: rollback to plan version 3, which never served "
                                           r"\(a pending candidate\)"):
        client.rollback_sync("plan", 3)
    approved = client.decide_sync("plan", 3, "approve", actor="alice", reason="closes the gap")
    assert (approved.action, approved.sha256, approved.actor) == ("approve", c.sha256, "alice")
    rows = client.listing_sync()
    assert [(r["version"], r["action"], r["candidate"], r["state"], r["active"], r["actor"]) for r in rows] == [
        (1, "publish", False, "published", False, "refit@host"),
        (2, "publish", True, "superseded", False, "refit@host"), (3, "publish", True, "active", False, "carol"),
        (3, "approve", False, "active", True, "alice")]
    assert rows[3]["reason"] == "closes the gap" and rows[3]["via"] == "-" and rows[3]["refused"] is None
    assert client.rollback_sync("plan", actor="bob").version == 1  # back to the version before the approval
    assert len(client.history_sync()) == 5  # the refused decisions and rollback were never written


@pytest.mark.integration
def test_candidates_and_decisions_survive_compaction(broker, topics, store, artifacts):
    a, b, c = artifacts
    client = ControlClient(broker.bootstrap, topics, store)
    client.publish_sync(a)
    client.publish_sync(b, candidate=True)
    client.decide_sync("plan", 2, "promote", actor="shadow-policy@w", reason="E 0.02 < 0.10", statistics={"E": 0.02})
    client.publish_sync(c, candidate=True)
    client.decide_sync("plan", 3, "reject", actor="alice", reason="accuracy dropped")
    client.rollback_sync("plan", 1, actor="bob", reason="back to the audited plan")
    log = asyncio.run(read_log(broker.bootstrap, topics.control))
    assert len({key for key, _ in log}) == len(log) == 6, "every record has its own key"
    surviving = [(key, value) for _, key, value in compact(log, drop_tombstones=True)]
    assert surviving == log  # per-record keys: compaction drops nothing
    compacted_topics = TopicConfig(prefix=f"{topics.prefix}-compacted", partitions=1)
    ensure_topics(broker.bootstrap, compacted_topics)
    asyncio.run(write_log(broker.bootstrap, compacted_topics.control, surviving))
    before, after = (ControlClient(broker.bootstrap, t, store).read_sync() for t in (topics, compacted_topics))
    assert [(e.record, e.refusal) for e in after.entries] == [(e.record, e.refusal) for e in before.entries]
    assert [after.ledger.state("plan", v) for v in (1, 2, 3)] == ["published", "promoted", "rejected"]
    registry = ArtifactRegistry(module_loaders(SCHEMA), store)
    asyncio.run(catch_up(registry, broker.bootstrap, compacted_topics.control))
    assert served_version(registry) == 1 and registry.candidate("plan") is None
    assert ControlClient(broker.bootstrap, compacted_topics, store).rollback_sync("plan", 2).version == 2


def with_candidate(broker, topics, store, artifacts):
    """A control topic serving plan version 1 (``a``) with version 2 (``b``) pending as a candidate; the client."""
    a, b, _ = artifacts
    ensure_topics(broker.bootstrap, topics)
    client = ControlClient(broker.bootstrap, topics, store)
    client.publish_sync(a)
    client.publish_sync(b, candidate=True)
    return client, a, b


@pytest.mark.integration
def test_the_follower_announces_the_candidate_it_shadows_and_its_figures(broker, topics, store, artifacts):
    client, a, b = with_candidate(broker, topics, store, artifacts)
    registry = ArtifactRegistry(LOADERS, store)
    worker = WorkerIdentity.of("app", adult_config())

    async def announced(condition) -> WorkerStatus:
        statuses = []

        async def latest():
            statuses[:] = await client.workers()
            return statuses and condition(statuses[0])

        deadline = asyncio.get_running_loop().time() + FOLLOW_TIMEOUT
        while not await latest():
            assert asyncio.get_running_loop().time() < deadline, f"no such announcement: {statuses}"
            await asyncio.sleep(0.1)
        return statuses[0]

    async def scenario():
        task = asyncio.create_task(follow_control(registry, broker.bootstrap, topics.control, poll_ms=50,
                                                  worker=worker, shadow_figures=lambda: {"records": 42.0}))
        try:
            status = await announced(lambda s: s.shadowing)
            assert status.shadowing == (("plan", 2, b.sha256),) and status.shadow == {"records": 42.0}
            assert status.serving == (("plan", 1, a.sha256),)
            assert (await client.read()).shadow_figures("plan", 2) == {worker.name: status}
            approval = await client.decide("plan", 2, "approve", actor="alice", reason="closes the gap")
            assert approval.statistics == {"records": 42.0}  # what alice saw: the figures the worker announced
            status = await announced(lambda s: s.serving == (("plan", 2, b.sha256),))
            assert status.shadowing == () and status.shadow is None
            await wait_until(lambda: served_version(registry) == 2)
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)

    asyncio.run(scenario())



@pytest.mark.integration
def test_under_shadow_the_first_version_serves_and_the_next_is_a_candidate(broker, topics, store, artifacts):
    a, b, _ = artifacts
    client = ControlClient(broker.bootstrap, topics, store)
    first = client.publish_under_sync(a, "shadow", actor="refit@host")
    assert first.record.candidate is None and "no plan version served yet" in first.mode.why
    second = client.publish_under_sync(b, "shadow", actor="refit@host")
    assert (second.record.version, second.record.candidate, second.mode.candidate) == (2, True, True)
    registry = ArtifactRegistry(module_loaders(SCHEMA), store)
    asyncio.run(catch_up(registry, broker.bootstrap, topics.control))
    assert served_version(registry) == 1 and registry.candidate("plan").version == 2


@pytest.mark.integration
def test_a_decision_another_decision_beat_to_the_log_is_reported_refused(broker, topics, store, artifacts,
                                                                          monkeypatch):
    a, b, _ = artifacts
    ControlClient(broker.bootstrap, topics, store).publish_sync(a)
    ControlClient(broker.bootstrap, topics, store).publish_sync(b, candidate=True)
    real_record = client_module.decision_record

    def alice_approves_first(*args, **kwargs):  # bob has read and checked the log when alice's approval lands
        monkeypatch.setattr(client_module, "decision_record", real_record)
        alice = threading.Thread(target=ControlClient(broker.bootstrap, topics, store).decide_sync,
                                 args=("plan", 2, "approve", "alice", "closes the gap"))
        alice.start()
        alice.join()
        return real_record(*args, **kwargs)

    monkeypatch.setattr(client_module, "decision_record", alice_approves_first)
    with pytest.raises(ControlError) as refused:
        ControlClient(broker.bootstrap, topics, store).decide_sync("plan", 2, "reject", actor="bob", reason="gap")
    assert str(refused.value) == ("the reject of plan version 2 did not take effect (every reader ignores it): plan "
                                  "version 2 was already approved by alice at offset 2 (no candidate of plan is "
                                  "pending)")
    control = ControlClient(broker.bootstrap, topics, store).read_sync()
    assert [(e.record.actor, e.refusal is None) for e in control.decisions("plan", 2)] == [("alice", True),
                                                                                        ("bob", False)]


@pytest.mark.integration
def test_approving_a_candidate_whose_chain_failed_in_shadow_is_refused_unless_forced(broker, topics, store, artifacts):
    """The workers announced that the candidate's code failed on live records: serving it would fail on them too."""
    client, a, b = with_candidate(broker, topics, store, artifacts)
    figures = {"records": 0.0, "candidate.refused": 300.0, "candidate.failed": 1.0}
    status = WorkerStatus("app@host:1", "app", "host", 1, 1.0, 300.0, ("plan",), (("plan", 1, a.sha256),),
                          shadowing=(("plan", 2, b.sha256),), shadow=figures)

    async def announce():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, **aiokafka_options())
        await producer.start()
        try:
            key, value = encode_announcement(status)
            await producer.send_and_wait(topics.control, value, key=key, partition=0)
        finally:
            await producer.stop()

    asyncio.run(announce())
    with pytest.raises(ControlError, match=r"refusing to approve plan version 2: its chain failed in shadow on the "
                                           r"workers' live records \(it refused 300 of them\); --force"):
        client.decide_sync("plan", 2, "approve", actor="alice", reason="looks fine")
    approval = client.decide_sync("plan", 2, "approve", actor="alice", reason="fixed upstream", force=True)
    assert approval.statistics == figures  # the figures she overrode are on the record


@pytest.mark.integration
def test_a_decision_written_but_not_read_back_says_so_in_one_line(broker, topics, store, artifacts, monkeypatch):
    client, _, _ = with_candidate(broker, topics, store, artifacts)

    async def never_read_back(self, control, offset):
        raise TimeoutError("could not read up to its end")

    monkeypatch.setattr(client_module._Reader, "read_through", never_read_back)
    with pytest.raises(ControlError, match=r"^the approve of plan version 2 was written at offset \d+ of "
                                           r".*, but it could not be read back to confirm it took effect: see "
                                           r"`fairstream artifacts history`$"):
        client.decide_sync("plan", 2, "approve", actor="alice", reason="closes the gap")
    monkeypatch.undo()
    assert client.read_sync().ledger.state("plan", 2) == "approved"  # it was written, and it took effect
