"""Artifact versions travel over the control topic, are verified, hot-swapped, rolled back, and refused when bad."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from fairstream.models.embedding import FairnessModule
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import artifacts
from fairstream.repair.artifacts import ArtifactError
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import PipelineSchema
from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import ControlError, control_key, encode_control, parse_control
from fairstream.streams.control.registry import (
    UNKNOWN_KIND,
    ArtifactRegistry,
    control_consumer,
    follow_control,
    module_loaders,
    open_at_beginning,
)
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.schemas import ControlRecord
from fairstream.streams.topics import TopicConfig, ensure_topics

LOADERS = {"plan": DistributionalRepair.from_artifact}
FOLLOW_TIMEOUT = 60.0


# --------------------------------------------------------------------------- helpers


def fit_plan(seed: int, n: int = 400, shift: float = 1.0) -> DistributionalRepair:
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n)
    u = rng.integers(0, 2, n)
    X = rng.normal(size=(n, 2)) + shift * s[:, None] + 0.5 * u[:, None]
    return DistributionalRepair(n_q=30).fit(X, s, u)


@pytest.fixture(scope="module")
def plans():
    return [fit_plan(seed) for seed in (1, 2, 3)]


@pytest.fixture(scope="module")
def sample():
    rng = np.random.default_rng(99)
    return rng.normal(size=(50, 2)), rng.integers(0, 2, 50), rng.integers(0, 2, 50)


def message(artifact, version=None, action="publish", **changes) -> bytes:
    """A control message carrying ``artifact`` inline, as ControlClient would send it."""
    version = artifact.version if version is None else version
    fields = dict(
        kind=artifact.kind, version=version, sha256=artifact.sha256, action=action,
        blob_b64=base64.b64encode(artifacts.encode(artifacts.with_version(artifact, version))).decode(),
        published_at=1.0,
    )
    fields.update(changes)
    return encode_control(ControlRecord(**fields))


def flip_last_byte(blob: bytes) -> bytes:
    # The payload is the tail of the blob, so this corrupts the payload, not the manifest.
    return blob[:-1] + bytes([blob[-1] ^ 0x01])


def rewrite_blob(blob_b64: str, change) -> str:
    return base64.b64encode(change(base64.b64decode(blob_b64))).decode()


def served_version(registry: ArtifactRegistry, kind: str = "plan"):
    active = registry.current(kind)
    return None if active is None else active.version


@pytest.fixture
def topics(broker):
    # A fresh prefix per test: no test sees another's control records.
    return TopicConfig(prefix=f"registry-{uuid.uuid4().hex[:10]}", partitions=1)


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "store")


def own_key(value: bytes) -> bytes:
    """The control key a record's value implies: the only key a reader takes it under."""
    return control_key(parse_control(value), value)


async def send_raw(bootstrap: str, topic: str, value: bytes, key: bytes | None = None) -> None:
    """Write ``value`` to the topic as anyone could, under its own control key unless ``key`` says otherwise."""
    key = own_key(value) if key is None else key
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


async def catch_up(registry: ArtifactRegistry, bootstrap: str, topic: str) -> None:
    """Follow the topic until caught up, then cancel the follower and check it stopped cleanly."""
    ready = asyncio.Event()
    task = asyncio.create_task(follow_control(registry, bootstrap, topic, ready=ready, poll_ms=50))
    try:
        await asyncio.wait_for(ready.wait(), FOLLOW_TIMEOUT)
    finally:
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)
    assert done and task.cancelled(), "follow_control must stop on cancellation"


def replay(broker, topics, store=None, **registry_options) -> ArtifactRegistry:
    registry = ArtifactRegistry(LOADERS, store, **registry_options)
    asyncio.run(catch_up(registry, broker.bootstrap, topics.control))
    return registry


# --------------------------------------------------------------------------- the store


def test_store_round_trip_is_idempotent(store, plans):
    artifact = plans[0].to_artifact()
    path = store.put(artifact)
    assert path == store.root / f"{artifact.sha256}.fsa"
    before = path.read_bytes()
    assert store.put(artifact) == path and path.read_bytes() == before
    assert store.get(artifact.sha256) == artifact
    assert [p.name for p in store.root.iterdir()] == [path.name]  # no temp files left behind


def test_store_keeps_the_file_when_only_the_version_differs(store, plans):
    artifact = plans[0].to_artifact()
    path = store.put(artifact)
    assert store.put(artifacts.with_version(artifact, 7)) == path
    assert store.get(artifact.sha256).version == 1


def test_other_parameters_are_another_payload_in_the_store(store, plans):
    # Parameters are sealed in the payload: the same arrays with another repair amount hash differently.
    full = plans[0].to_artifact()
    plans[0].repair_amount = 0.5
    try:
        half = plans[0].to_artifact()
    finally:
        plans[0].repair_amount = 1.0
    assert half.sha256 != full.sha256 and store.put(half) != store.put(full)
    assert store.get(half.sha256).parameters["repair_amount"] == 0.5
    assert store.get(full.sha256).parameters["repair_amount"] == 1.0


def test_store_refuses_a_file_tampered_on_disk(store, plans):
    artifact = plans[0].to_artifact()
    path = store.put(artifact)
    path.write_bytes(flip_last_byte(path.read_bytes()))
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        store.get(artifact.sha256)


def test_store_put_repairs_a_damaged_file(store, plans):
    artifact = plans[0].to_artifact()
    path = store.put(artifact)
    path.write_bytes(path.read_bytes()[:100])
    store.put(artifact)
    assert store.get(artifact.sha256) == artifact


def test_store_refuses_a_file_stored_under_another_hash(store, plans):
    first, second = plans[0].to_artifact(), plans[1].to_artifact()
    store.put(first)
    store.path_for(second.sha256).write_bytes(store.path_for(first.sha256).read_bytes())
    with pytest.raises(ArtifactError, match="not"):
        store.get(second.sha256)


@pytest.mark.parametrize("key", ["../../etc/passwd", "A" * 64, "ab", ""])
def test_store_keys_must_be_sha256_hex(store, key):
    with pytest.raises(ArtifactError, match="64 lowercase hex"):
        store.get(key)


def test_store_reports_a_missing_file(store):
    with pytest.raises(ArtifactError, match="not in the store"):
        store.get("0" * 64)


# --------------------------------------------------------------------------- parsing control messages


def test_control_message_round_trip(plans):
    artifact = plans[0].to_artifact()
    record = parse_control(message(artifact, version=3, action="rollback"))
    assert (record.kind, record.version, record.sha256, record.action) == ("plan", 3, artifact.sha256, "rollback")


@pytest.mark.parametrize(
    "value, reason",
    [
        (None, "tombstone"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"kind": "plan", "version": 1, "sha256": "' + b"a" * 64 + b'"}', "neither"),
        (b'{"kind": "plan", "version": 0, "sha256": "' + b"a" * 64 + b'", "path": "x"}', "integer from 1 to"),
        (b'{"kind": "plan", "version": true, "sha256": "' + b"a" * 64 + b'", "path": "x"}', "integer from 1 to"),
        (b'{"kind": "plan", "version": 9007199254740992, "sha256": "' + b"a" * 64 + b'", "path": "x"}',
         r"integer from 1 to 9007199254740991 \(2\*\*53 - 1"),
        (b'{"kind": "plan/1", "version": 1, "sha256": "' + b"a" * 64 + b'", "path": "x"}', "artifact kind"),
        (b'{"kind": "plan", "version": 1, "sha256": "' + b"a" * 64 + b'", "path": "x", "published_at": NaN}',
         "not JSON: ValueError: 'NaN is not a JSON number'"),  # no canonical bytes hold it, whatever the field
        (b'{"kind": "plan", "version": 1, "sha256": "' + b"a" * 64 + b'", "path": "x", "published_at": 1e999}',
         "1e999 is out of a float's range"),
        (b"[" * 5000 + b"]" * 5000, "not JSON: RecursionError"),
        (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "not JSON: RecursionError"),
        (b'{"kind": "plan", "version": 1, "sha256": "abc", "path": "x"}', "64 lowercase hex"),
        (b'{"kind": "plan", "version": 1, "sha256": "' + b"a" * 64 + b'", "path": "x", "action": "delete"}', "action"),
        (b'{"kind": "plan", "version": 1, "sha256": "' + b"a" * 64 + b'", "path": "x", "blob_b64": "eA=="}',
         "exactly one"),
    ],
)
def test_malformed_control_messages_are_explained(value, reason):
    with pytest.raises(ControlError, match=reason):
        parse_control(value)


# --------------------------------------------------------------------------- the registry, without a broker


def test_registry_activates_and_notifies(plans, sample):
    changes = []
    registry = ArtifactRegistry(LOADERS, on_change=changes.append)
    assert registry.current("plan") is None
    artifact = plans[0].to_artifact()
    assert registry.apply(message(artifact, version=1))
    active = registry.current("plan")
    assert (active.kind, active.version, active.sha256) == ("plan", 1, artifact.sha256)
    assert changes == [active] and registry.accepted_total["plan"] == 1
    X, s, u = sample
    np.testing.assert_array_equal(active.module.transform(X, s, u), plans[0].transform(X, s, u))


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (lambda m: m | {"blob_b64": rewrite_blob(m["blob_b64"], flip_last_byte)}, "sha256 mismatch"),
        (lambda m: m | {"blob_b64": rewrite_blob(m["blob_b64"], lambda blob: blob[:-10])}, "size mismatch"),
        (lambda m: m | {"blob_b64": "not base64!"}, "base64"),
        (lambda m: m | {"sha256": "f" * 64}, "names sha256"),
        (lambda m: m | {"kind": "scorer"}, "no loader"),
        (lambda m: m | {"blob_b64": None, "path": "/tmp/plan.fsa"}, "no artifact store"),
    ],
)
def test_registry_refuses_bad_records_and_keeps_serving(plans, tamper, reason, caplog):
    registry = ArtifactRegistry(LOADERS)
    assert registry.apply(message(plans[0].to_artifact(), version=1))
    good = json.loads(message(plans[1].to_artifact(), version=2))
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(json.dumps(tamper(good)).encode())
    assert reason in caplog.text
    assert served_version(registry) == 1
    assert sum(registry.refused_total.values()) == 1 and registry.accepted_total["plan"] == 1


def test_unparsable_and_unknown_kinds_share_one_label(plans):
    refusals = []
    registry = ArtifactRegistry(LOADERS, on_refuse=lambda kind, reason, category: refusals.append(kind))
    assert not registry.apply(b"garbage")
    assert not registry.apply(message(plans[0].to_artifact(), version=1, kind="scorer"))
    assert registry.refused_total == {UNKNOWN_KIND: 2} and refusals == [UNKNOWN_KIND, UNKNOWN_KIND]


def test_a_failing_loader_is_a_refusal(plans):
    def broken(artifact):
        raise RuntimeError("cannot build module")

    registry = ArtifactRegistry({"plan": broken})
    assert not registry.apply(message(plans[0].to_artifact(), version=1))
    assert registry.current("plan") is None and registry.refused_total["plan"] == 1


def test_a_failing_callback_does_not_undo_the_swap(plans):
    def broken(active):
        raise RuntimeError("metrics are down")

    registry = ArtifactRegistry(LOADERS, on_change=broken)
    assert registry.apply(message(plans[0].to_artifact(), version=1))
    assert served_version(registry) == 1


def test_stale_publish_is_refused_but_rollback_may_go_lower(plans):
    registry = ArtifactRegistry(LOADERS)
    first, second, third = (plan.to_artifact() for plan in plans)
    assert registry.apply(message(first, version=1))
    assert registry.apply(message(second, version=2))
    assert not registry.apply(message(third, version=1))  # below the highest version: stale
    assert served_version(registry) == 2 and registry.refused_total["plan"] == 1
    assert registry.apply(message(first, version=1, action="rollback"))
    assert (served_version(registry), registry.current("plan").sha256) == (1, first.sha256)


def test_version_comes_from_the_record_when_the_store_file_is_older(store, plans):
    artifact = plans[0].to_artifact()
    store.put(artifact)  # the store file says version 1
    registry = ArtifactRegistry(LOADERS, store)
    assert registry.apply(message(plans[1].to_artifact(), version=1))
    record = message(artifact, version=2, blob_b64=None, path=str(store.path_for(artifact.sha256)))
    assert registry.apply(record)
    assert registry.current("plan").version == registry.current("plan").artifact.version == 2


def test_snapshot_is_read_only_and_consistent(plans):
    registry = ArtifactRegistry(LOADERS)
    registry.apply(message(plans[0].to_artifact(), version=1))
    snapshot = registry.snapshot()
    registry.apply(message(plans[1].to_artifact(), version=2))
    assert snapshot["plan"].version == 1 and registry.snapshot()["plan"].version == 2
    with pytest.raises(TypeError):
        snapshot["plan"] = None


# --------------------------------------------------------------------------- over the broker


@pytest.mark.integration
def test_history_of_an_empty_topic_is_empty(broker, topics, store):
    client = ControlClient(broker.bootstrap, topics, store)
    assert client.history_sync() == [] and client.listing_sync() == []


@pytest.mark.integration
def test_follower_serves_the_latest_published_version(broker, topics, store, plans, sample):
    client = ControlClient(broker.bootstrap, topics, store)
    first = client.publish_sync(plans[0].to_artifact())
    second = client.publish_sync(plans[1].to_artifact(version=9))  # the client numbers versions
    assert (first.version, second.version) == (1, 2)
    assert first.blob_b64 is not None and first.path is None
    registry = replay(broker, topics)
    active = registry.current("plan")
    assert (active.version, active.sha256) == (2, second.sha256)
    assert active.artifact.version == 2 and registry.accepted_total["plan"] == 2
    X, s, u = sample
    assert isinstance(active.module, DistributionalRepair)
    np.testing.assert_array_equal(active.module.transform(X, s, u), plans[1].transform(X, s, u))
    assert store.get(second.sha256).version == 2


@pytest.mark.integration
def test_rollback_serves_the_previous_version_again(broker, topics, store, plans, sample):
    client = ControlClient(broker.bootstrap, topics, store)
    first = client.publish_sync(plans[0].to_artifact())
    client.publish_sync(plans[1].to_artifact())
    rolled = client.rollback_sync("plan")
    assert (rolled.action, rolled.version, rolled.sha256) == ("rollback", 1, first.sha256)
    history = client.history_sync()
    assert [(r.version, r.action) for r in history] == [(1, "publish"), (2, "publish"), (1, "rollback")]
    rows = client.listing_sync()
    assert [row["active"] for row in rows] == [False, False, True]
    assert rows[-1]["sha256"] == first.sha256[:12] and rows[-1]["action"] == "rollback"
    registry = replay(broker, topics)
    assert served_version(registry) == 1 and registry.current("plan").sha256 == first.sha256
    X, s, u = sample
    np.testing.assert_array_equal(registry.current("plan").module.transform(X, s, u), plans[0].transform(X, s, u))
    assert client.publish_sync(plans[2].to_artifact()).version == 3  # numbering never reuses a version


@pytest.mark.integration
def test_repeated_rollbacks_walk_back_until_nothing_is_left(broker, topics, store, plans):
    client = ControlClient(broker.bootstrap, topics, store)
    for plan in plans:
        client.publish_sync(plan.to_artifact())
    assert client.rollback_sync("plan").version == 2
    assert client.rollback_sync("plan").version == 1
    with pytest.raises(ControlError, match="nothing to roll back to"):
        client.rollback_sync("plan")
    with pytest.raises(ControlError, match="no artifact of kind 'scorer'"):
        client.rollback_sync("scorer")
    assert served_version(replay(broker, topics)) == 1


@pytest.mark.integration
@pytest.mark.parametrize("tamper", ["flipped payload byte", "wrong sha256"])
def test_tampered_record_on_the_topic_is_refused(broker, topics, store, plans, tamper):
    client = ControlClient(broker.bootstrap, topics, store)
    first = client.publish_sync(plans[0].to_artifact())
    fields = json.loads(message(plans[1].to_artifact(), version=2))
    if tamper == "flipped payload byte":
        fields["blob_b64"] = rewrite_blob(fields["blob_b64"], flip_last_byte)
    else:
        fields["sha256"] = plans[2].to_artifact().sha256
    asyncio.run(send_raw(broker.bootstrap, topics.control, json.dumps(fields).encode()))
    registry = replay(broker, topics)
    assert (served_version(registry), registry.current("plan").sha256) == (1, first.sha256)
    assert registry.refused_total["plan"] == 1 and registry.accepted_total["plan"] == 1


@pytest.mark.integration
def test_large_artifact_travels_by_store_path(broker, topics, store, plans, sample):
    client = ControlClient(broker.bootstrap, topics, store, inline_limit=16)
    record = client.publish_sync(plans[0].to_artifact())
    assert record.blob_b64 is None and record.path == str(store.path_for(record.sha256).resolve())
    registry = replay(broker, topics, store)
    X, s, u = sample
    np.testing.assert_array_equal(registry.current("plan").module.transform(X, s, u), plans[0].transform(X, s, u))


@pytest.mark.integration
def test_store_file_tampered_on_disk_is_refused(broker, topics, store, plans):
    inline = ControlClient(broker.bootstrap, topics, store)
    by_path = ControlClient(broker.bootstrap, topics, store, inline_limit=0)
    inline.publish_sync(plans[0].to_artifact())
    second = by_path.publish_sync(plans[1].to_artifact())
    path = store.path_for(second.sha256)
    path.write_bytes(flip_last_byte(path.read_bytes()))
    registry = replay(broker, topics, store)
    assert served_version(registry) == 1 and registry.refused_total["plan"] == 1


@pytest.mark.integration
def test_missing_store_file_is_refused(broker, topics, store, plans):
    by_path = ControlClient(broker.bootstrap, topics, store, inline_limit=0)
    record = by_path.publish_sync(plans[0].to_artifact())
    store.path_for(record.sha256).unlink()
    registry = replay(broker, topics, store)
    assert registry.current("plan") is None and registry.refused_total["plan"] == 1


@pytest.mark.integration
def test_rollback_refuses_to_send_a_damaged_target(broker, topics, store, plans):
    by_path = ControlClient(broker.bootstrap, topics, store, inline_limit=0)
    first = by_path.publish_sync(plans[0].to_artifact())
    by_path.publish_sync(plans[1].to_artifact())
    store.path_for(first.sha256).unlink()
    with pytest.raises(ControlError, match="cannot roll back"):
        by_path.rollback_sync("plan")
    assert [r.action for r in by_path.history_sync()] == ["publish", "publish"]


@pytest.mark.integration
def test_stale_publish_replayed_late_does_not_downgrade(broker, topics, store, plans):
    client = ControlClient(broker.bootstrap, topics, store)
    first = client.publish_sync(plans[0].to_artifact())
    second = client.publish_sync(plans[1].to_artifact())
    asyncio.run(send_raw(broker.bootstrap, topics.control, encode_control(first)))  # v1 again, after v2
    registry = replay(broker, topics)
    assert (served_version(registry), registry.current("plan").sha256) == (2, second.sha256)
    assert registry.refused_total["plan"] == 1
    assert [row["active"] for row in client.listing_sync()] == [False, True, False]
    assert client.rollback_sync("plan").version == 1


@pytest.mark.integration
def test_follower_is_ready_on_an_empty_topic_and_picks_up_later_publishes(broker, topics, store, plans):
    ensure_topics(broker.bootstrap, topics)
    client = ControlClient(broker.bootstrap, topics, store)
    changes = []
    registry = ArtifactRegistry(LOADERS, store, on_change=changes.append)

    async def scenario():
        ready = asyncio.Event()
        task = asyncio.create_task(follow_control(registry, broker.bootstrap, topics.control, ready=ready, poll_ms=50))
        try:
            await asyncio.wait_for(ready.wait(), FOLLOW_TIMEOUT)
            assert registry.current("plan") is None
            record = await client.publish(plans[0].to_artifact())
            deadline = asyncio.get_running_loop().time() + FOLLOW_TIMEOUT
            while registry.current("plan") is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            return record
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)
            assert task.cancelled()

    record = asyncio.run(scenario())
    assert served_version(registry) == 1 and registry.current("plan").sha256 == record.sha256
    assert [active.version for active in changes] == [1]


# --------------------------------------------------------------------------- compatibility at load time

SCHEMA = PipelineSchema(features=("x0", "x1"), groups=(0, 1), strata=(0, 1), dimension=8)


def test_a_plan_fitted_on_other_features_is_refused_at_load_and_the_old_one_keeps_serving(plans, sample, caplog):
    registry = ArtifactRegistry(module_loaders(SCHEMA))
    assert registry.apply(message(plans[0].to_artifact(), version=1))
    rng = np.random.default_rng(5)
    s, u = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    three = DistributionalRepair(n_q=30).fit(rng.normal(size=(400, 3)) + s[:, None], s, u)
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(message(three.to_artifact(), version=2))
    assert "the pipeline config and the artifact disagree: the plan repairs 3 features" in caplog.text
    assert "still serving version 1" in caplog.text and caplog.records[-1].levelno == logging.ERROR
    assert served_version(registry) == 1
    X, s, u = sample  # the old plan still repairs the pipeline's 2-feature records
    assert registry.current("plan").module.transform(X, s, u).shape == (50, 2)


@pytest.mark.parametrize(
    "fit, reason",
    [
        (lambda X, s, u: DistributionalRepair(n_q=30, columns=["age", "hours"]).fit(X, s, u),
         "fitted on features ['age', 'hours'], the pipeline names ['x0', 'x1']"),
        (lambda X, s, u: DistributionalRepair(n_q=30).fit(X, np.where(s == 1, 2, 0), u),
         "without the pipeline's groups ['1']"),
        (lambda X, s, u: DistributionalRepair(n_q=30).fit(X, s, np.zeros_like(u)),
         "without the pipeline's strata ['1']"),
    ],
)
def test_plans_that_do_not_fit_the_pipeline_are_refused_with_the_reason(fit, reason, caplog):
    rng = np.random.default_rng(6)
    s, u = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    plan = fit(rng.normal(size=(400, 2)), s, u)
    registry = ArtifactRegistry(module_loaders(SCHEMA))
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(message(plan.to_artifact(), version=1))
    assert reason in caplog.text and registry.current("plan") is None


def test_an_embedding_module_of_another_length_is_refused_at_load(caplog):
    registry = ArtifactRegistry(module_loaders(SCHEMA))
    assert registry.apply(message(FairnessModule.identity(8).to_artifact(), version=1))
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(message(FairnessModule.identity(4).to_artifact(), version=2))
    assert "takes vectors of length 4, the pipeline's are 8" in caplog.text
    assert served_version(registry, "embedding") == 1


def test_a_scorer_of_another_width_is_refused_at_load(caplog):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(200, 3))
    scorer = LogisticScorer().fit(X, (X[:, 0] > 0).astype(int))
    registry = ArtifactRegistry(module_loaders(SCHEMA))
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(message(scorer.to_artifact(), version=1))
    assert "the scorer takes 3 features, the pipeline has 2" in caplog.text


# --------------------------------------------------------------------------- compaction (keys, start-up rule)


def compact(log: list[tuple[bytes, bytes | None]], drop_tombstones: bool = False) -> list:
    """What Kafka's log compaction leaves of ``log``: ``(offset, key, value)`` of the last record per key.

    Offsets are kept (compaction leaves holes, it does not renumber). Tombstones (value None) are
    kept for ``delete.retention.ms`` and then removed too.
    """
    last = {key: offset for offset, (key, _) in enumerate(log)}
    kept = [(offset, key, value) for offset, (key, value) in enumerate(log) if last[key] == offset]
    return [(offset, key, value) for offset, key, value in kept if value is not None or not drop_tombstones]


def keyed(artifact, version, action="publish") -> tuple[bytes, bytes]:
    """A control message as the client sends it: (its control key, its value)."""
    value = message(artifact, version=version, action=action)
    return control_key(parse_control(value), value), value


def test_control_keys_are_unique_per_record_and_stable_for_a_resend(plans):
    artifact = plans[0].to_artifact()
    first, again = keyed(artifact, 1), keyed(artifact, 1)
    rollback = keyed(artifact, 1, action="rollback")
    other = keyed(plans[1].to_artifact(), 1)
    assert first == again  # a retried send compacts onto itself
    assert len({first[0], rollback[0], other[0], keyed(artifact, 2)[0]}) == 4
    assert first[0].startswith(b"plan/1/publish/") and rollback[0].startswith(b"plan/1/rollback/")


def test_no_single_record_can_shadow_every_version(plans):
    """Whatever key one hostile record copies, a fresh registry on the compacted log still serves a plan."""
    a, b, c = (plan.to_artifact() for plan in plans)
    log = [keyed(a, 1), keyed(b, 2), keyed(a, 1, "rollback"), keyed(c, 3)]
    hostile = {"garbage": b"\x00not a control record", "tombstone": None,
               "a record of a kind without a loader": message(a, version=9, kind="scorer")}
    for key in [b"plan", *(key for key, _ in log)]:
        for name, value in hostile.items():
            for drop in (False, True):
                registry = ArtifactRegistry(LOADERS)
                for offset, surviving_key, surviving in compact(log + [(key, value)], drop_tombstones=drop):
                    registry.apply(surviving, surviving_key, offset)
                expected = 1 if key == log[-1][0] else 3  # shadowing v3 falls back to the rollback's v1
                assert served_version(registry) == expected, (key, name, drop)


async def read_log(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    consumer = control_consumer(bootstrap)
    await consumer.start()
    try:
        partition, end = await open_at_beginning(consumer, topic)
        log = []
        while await consumer.position(partition) < end:
            batch = await consumer.getmany(partition, timeout_ms=200)
            log += [(m.key, m.value) for m in batch.get(partition, [])]
        return log
    finally:
        await consumer.stop()


async def write_log(bootstrap: str, topic: str, log: list) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in log:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


@pytest.mark.integration
@pytest.mark.parametrize("drop_tombstones", [False, True], ids=["tombstones kept", "tombstones removed"])
def test_history_survives_compaction_and_hostile_records(broker, topics, store, plans, drop_tombstones):
    client = ControlClient(broker.bootstrap, topics, store)
    for plan in plans:
        client.publish_sync(plan.to_artifact())
    client.rollback_sync("plan")  # back to version 2
    last = client.publish_sync(plans[0].to_artifact())  # version 4
    log = asyncio.run(read_log(broker.bootstrap, topics.control))
    assert len({key for key, _ in log}) == len(log) == 5, "every record has its own key"
    # Hostile: garbage and a tombstone keyed like the kind (the old key), garbage keyed like version 4.
    log += [(b"plan", b"garbage"), (b"plan", None), (log[-1][0], b"garbage")]
    compacted_topics = TopicConfig(prefix=f"{topics.prefix}-compacted", partitions=1)
    ensure_topics(broker.bootstrap, compacted_topics)
    surviving = [(key, value) for _, key, value in compact(log, drop_tombstones)]  # rewritten without holes
    asyncio.run(write_log(broker.bootstrap, compacted_topics.control, surviving))
    registry = ArtifactRegistry(module_loaders(SCHEMA), store)  # a fresh worker's registry, as the worker builds it
    asyncio.run(catch_up(registry, broker.bootstrap, compacted_topics.control))
    assert last.version == 4 and served_version(registry) == 2  # version 4 was shadowed; 2 was active before it
    assert registry.current("plan").sha256 == plans[1].to_artifact().sha256
    compacted = ControlClient(broker.bootstrap, compacted_topics, store)
    assert [(r.version, r.action) for r in compacted.history_sync()] == [
        (1, "publish"), (2, "publish"), (3, "publish"), (2, "rollback")]
    assert compacted.rollback_sync("plan").version == 1  # rollback still has its history


def test_a_worker_whose_config_disagrees_with_the_only_plan_says_why_it_holds_input(caplog):
    """A feature renamed in the config (hours-per-weak), a plan fitted on hours-per-week: an error naming both."""
    rng = np.random.default_rng(8)
    s, u = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    plan = DistributionalRepair(n_q=30, columns=["age", "hours-per-week"]).fit(rng.normal(size=(400, 2)), s, u)
    registry = ArtifactRegistry(module_loaders(PipelineSchema(features=("age", "hours-per-weak"), groups=(0, 1),
                                                              strata=(0, 1))))
    assert registry.explain_missing("plan") == (
        logging.WARNING, "no plan artifact loaded yet: holding input until one is published")
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        assert not registry.apply(message(plan.to_artifact(), version=1))
    assert caplog.records[-1].levelno == logging.ERROR
    level, why = registry.explain_missing("plan")
    assert level == logging.ERROR and "holding input (nothing is dead-lettered)" in why
    assert "the plan was fitted on features ['age', 'hours-per-week'], the pipeline names ['age', 'hours-per-weak']" in why
    assert not registry.apply(b"garbage")  # an unreadable record names no kind: the plan's reason stays
    assert "hours-per-weak" in registry.explain_missing("plan")[1]
