"""A version names one artifact: concurrent publishers, collisions, squats, rollbacks to versions never published,
messages read by key and value, and a listing that marks active what the workers activate."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fairstream.repair.protocol import PipelineSchema
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient, ControlLog, _activation_stacks
from fairstream.streams.control.records import (
    ControlError,
    VersionLedger,
    WorkerStatus,
    encode_announcement,
    parse_announcement,
    parse_control,
    parse_event,
    reembed_event,
)
from fairstream.streams.control.registry import WorkerIdentity, follow_control, module_loaders
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.topics import TopicConfig, ensure_topics

from .test_registry import (
    FOLLOW_TIMEOUT,
    LOADERS,
    ArtifactRegistry,
    catch_up,
    compact,
    fit_plan,
    keyed,
    message,
    own_key,
    send_raw,
    served_version,
)

ROUNDS = 3


@pytest.fixture(scope="module")
def artifacts():
    return [fit_plan(seed).to_artifact() for seed in (11, 12, 13)]


# --------------------------------------------------------------------------- the rule, without a broker


def test_a_second_publish_of_a_taken_version_is_a_collision_and_changes_nothing(artifacts, caplog):
    a, b, _ = artifacts
    registry = ArtifactRegistry(LOADERS)
    assert registry.apply(message(a, version=1))
    assert not registry.apply(message(b, version=1))  # another publisher proposed 1 at the same moment
    assert (served_version(registry), registry.current("plan").sha256) == (1, a.sha256)
    assert registry.refused_total["plan"] == 1 and f"plan version 1 already names sha256 {a.sha256[:12]}" in caplog.text


def test_a_rollback_names_only_a_published_version_and_its_artifact(artifacts):
    a, b, c = artifacts
    registry = ArtifactRegistry(LOADERS)
    assert registry.apply(message(a, version=1)) and registry.apply(message(b, version=2))
    assert not registry.apply(message(a, version=99, action="rollback"))  # crafted: version 99 never existed
    assert not registry.apply(message(c, version=1, action="rollback"))  # version 1 is a, not c
    assert served_version(registry) == 2 and registry.refused_total["plan"] == 2
    assert registry.apply(message(a, version=1, action="rollback"))
    assert (served_version(registry), registry.current("plan").sha256) == (1, a.sha256)


def fake_messages(log: list[tuple]) -> list:
    """Messages of ``log``: ``(key, value)`` pairs at offsets 0, 1, ..., or ``(offset, key, value)`` triples."""
    triples = [entry if len(entry) == 3 else (offset, *entry) for offset, entry in enumerate(log)]
    return [SimpleNamespace(offset=offset, key=key, value=value) for offset, key, value in triples]


def client_view(log) -> tuple[dict, list]:
    """(kind -> the version the client's listing marks active, the versions its history holds)."""
    control = ControlLog()
    for msg in fake_messages(log):
        control.add(msg)
    stacks = _activation_stacks(control.history())
    return {kind: stack[-1].version for kind, stack in stacks.items()}, [r.version for r in control.history()]


def test_registry_and_listing_resolve_a_log_with_collisions_alike_compacted_or_not(artifacts):
    a, b, c = artifacts
    loser = keyed(b, 1)
    status = WorkerStatus("app@host:1", "app", "host", 1, 1.0, 300.0, ("plan",), (("plan", 1, a.sha256),))
    previous, current = SimpleNamespace(version=1, sha256=a.sha256), SimpleNamespace(kind="plan", version=2,
                                                                                      sha256=b.sha256)
    log = [keyed(a, 1), loser, (loser[0], None),  # b lost version 1 and withdrew its record
           keyed(b, 2), keyed(a, 99, "rollback"), keyed(a, 1, "rollback"), encode_announcement(status),
           reembed_event(previous, current), keyed(c, 2), keyed(c, 3)]
    for name, surviving in [("as written", log), ("compacted", compact(log)),
                            ("compacted, tombstones removed", compact(log, drop_tombstones=True))]:
        registry = ArtifactRegistry(LOADERS)
        for message_ in fake_messages(surviving):
            registry.apply(message_.value, message_.key, message_.offset)
        active, history = client_view(surviving)
        assert served_version(registry) == active["plan"] == 3, name
        assert registry.current("plan").sha256 == c.sha256, name
        assert history == [1, 2, 1, 3], name  # the collision, the crafted rollback and v2 again are left out


def test_announcements_and_events_are_not_records_to_any_reader(artifacts):
    status = WorkerStatus("app@host:1", "app", "host", 1, 10.0, 300.0, ("plan", "scorer"),
                          (("plan", 1, artifacts[0].sha256),))
    key, value = encode_announcement(status)
    assert key == b"status/worker/app@host:1" and parse_announcement(value) == status
    assert parse_event(value) is None  # not a re-embed event either
    with pytest.raises(ControlError):
        parse_control(value)
    registry = ArtifactRegistry(LOADERS)
    assert not registry.apply(value) and not registry.refused_total
    assert client_view([(key, value)]) == ({}, [])
    assert status.serves("plan", 1, artifacts[0].sha256) and not status.serves("plan", 2, artifacts[0].sha256)
    assert not replace(status, state="stopped").serves("plan", 1, artifacts[0].sha256)
    assert status.is_stale(now=10.0 + 601) and not status.is_stale(now=10.0 + 599)


def crafted(version: int, sha256: str = "ab" * 32) -> tuple[bytes, bytes]:
    """A publish anyone could write, under its own key, naming an artifact that does not exist."""
    value = json.dumps({"kind": "plan", "version": version, "sha256": sha256, "path": "/does/not/exist"}).encode()
    return own_key(value), value


def test_a_version_cannot_be_squatted_and_compaction_changes_no_verdict(artifacts):
    a, b, c = artifacts
    spam = [(b"spam", b"garbage")] * 3  # compaction keeps the last: two holes in the offsets
    log = [keyed(a, 1), *spam, crafted(2**53 - 1), keyed(b, 2), keyed(c, 9), keyed(c, 3)]
    for name, surviving in [("as written", log), ("compacted", compact(log))]:
        registry = ArtifactRegistry(LOADERS)
        for message_ in fake_messages(surviving):
            registry.apply(message_.value, message_.key, message_.offset)
        active, history = client_view(surviving)
        assert served_version(registry) == active["plan"] == 3 and history == [1, 2, 3], name
        assert registry.ledger.next_version("plan") == 4 and registry.refused_total["plan"] == 2, name


def test_a_publish_may_skip_one_version_per_message_since_the_highest_and_no_more():
    ledger, sha = VersionLedger(), "a" * 64
    assert ledger.admit(parse_control(crafted(1, sha)[1]), offset=0) is None
    assert ledger.admit(parse_control(crafted(5, sha)[1]), offset=4) is None  # 3 messages since: 2, 3, 4 skipped
    refusal = ledger.admit(parse_control(crafted(7, sha)[1]), offset=5)
    assert refusal == ("version gap: plan version 7 skips versions after 5, the highest published: a publish takes "
                       "the next version, 6")
    assert ledger.next_version("plan") == 6


def test_readers_decide_by_key_and_value_not_by_value_alone(artifacts):
    a, b, _ = artifacts
    status = WorkerStatus("app@host:1", "app", "host", 1, 10.0, 300.0, ("plan",), (("plan", 1, a.sha256),))
    status_key, announcement = encode_announcement(status)
    previous, current = SimpleNamespace(version=1, sha256=a.sha256), SimpleNamespace(kind="embedding", version=2,
                                                                                      sha256=b.sha256)
    event_key, event = reembed_event(previous, current)
    publish_key, publish = keyed(b, 2)
    log = [keyed(a, 1),
           (b"status/worker/evil", publish), (keyed(a, 1)[0], publish), (None, publish),  # a publish, wrong keys
           (b"x", announcement), (b"status/worker/other@host:2", announcement),  # an announcement, wrong keys
           (b"x", event), (publish_key, event),  # an event under other keys
           (status_key, announcement), (event_key, event)]  # both under their own keys: taken
    registry = ArtifactRegistry(LOADERS)
    for message_ in fake_messages(log):
        registry.apply(message_.value, message_.key, message_.offset)
    assert served_version(registry) == 1 and registry.refused_total == {"_unknown": 7}
    control = ControlLog()
    for message_ in fake_messages(log):
        control.add(message_)
    assert [r.version for r in control.history()] == [1] and list(control.workers) == [status.worker]
    assert list(control.events) == [event_key] and control.events[event_key]["to_version"] == 2
    refused = [e.refusal for e in control.entries if e.refusal]
    assert len(refused) == 3 and all("the control key its value implies" in reason for reason in refused)
    assert registry.apply(publish, publish_key, len(log)) and served_version(registry) == 2  # under its own key


# --------------------------------------------------------------------------- over the broker


@pytest.fixture
def topics(broker):
    return TopicConfig(prefix=f"versions-{uuid.uuid4().hex[:10]}", partitions=1)


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "store")


def _publish_in_rounds(bootstrap: str, prefix: str, store: str, publisher: int, barrier, results) -> None:
    """One publisher process: each round, wait for the other at the barrier, then publish a new plan."""
    client = ControlClient(bootstrap, TopicConfig(prefix=prefix, partitions=1), ArtifactStore(store))
    for round_ in range(ROUNDS):
        artifact = fit_plan(100 * publisher + round_).to_artifact()
        barrier.wait(timeout=120)
        record = client.publish_sync(artifact)
        results.put((publisher, round_, record.version, record.sha256))


@pytest.mark.integration
def test_publishes_from_two_processes_at_once_get_distinct_versions(broker, topics, store):
    ensure_topics(broker.bootstrap, topics)
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    processes = [spawn.Process(target=_publish_in_rounds,
                               args=(broker.bootstrap, topics.prefix, str(store.root), p, barrier, results))
                 for p in (1, 2)]
    for process in processes:
        process.start()
    try:
        published = [results.get(timeout=180) for _ in range(2 * ROUNDS)]
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    versions = sorted(version for *_, version, _ in published)
    assert versions == list(range(1, 2 * ROUNDS + 1)), published  # two publishes, two versions, every round
    last_sha = next(sha for *_, version, sha in published if version == 2 * ROUNDS)
    registry = ArtifactRegistry(LOADERS, store)
    asyncio.run(catch_up(registry, broker.bootstrap, topics.control))
    assert (served_version(registry), registry.current("plan").sha256) == (2 * ROUNDS, last_sha)
    rows = ControlClient(broker.bootstrap, topics, store).listing_sync()
    assert [(r["version"], r["sha256"]) for r in rows if r["active"]] == [(2 * ROUNDS, last_sha[:12])]
    taken = {(r["version"], r["sha256"]) for r in rows if not r["refused"]}
    # Each version names one artifact (on failure: every row of the listing, and what each publisher was told).
    assert taken == {(version, sha[:12]) for *_, version, sha in published}, (rows, published)


async def wait_until(condition, timeout: float = FOLLOW_TIMEOUT) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.integration
def test_a_running_registry_refuses_a_crafted_rollback_and_the_client_refuses_to_send_one(broker, topics, store,
                                                                                           artifacts):
    ensure_topics(broker.bootstrap, topics)
    client = ControlClient(broker.bootstrap, topics, store)
    registry = ArtifactRegistry(LOADERS, store)

    async def scenario():
        ready = asyncio.Event()
        task = asyncio.create_task(follow_control(registry, broker.bootstrap, topics.control, ready=ready, poll_ms=50))
        try:
            await asyncio.wait_for(ready.wait(), FOLLOW_TIMEOUT)
            for artifact in artifacts[:2]:
                await client.publish(artifact)
            await wait_until(lambda: served_version(registry) == 2)
            await send_raw(broker.bootstrap, topics.control, message(artifacts[0], version=99, action="rollback"))
            await wait_until(lambda: registry.refused_total["plan"] == 1)
            assert served_version(registry) == 2
            rows = await client.listing()
            assert rows[-1]["version"] == 99 and "never published" in rows[-1]["refused"] and rows[1]["active"]
            with pytest.raises(ControlError, match="plan version 99 was never published"):
                await client.rollback("plan", 99)
            with pytest.raises(ControlError, match="plan version 2 is already active"):
                await client.rollback("plan", 2)
            assert len(await client.listing()) == 3  # nothing was written
            await client.rollback("plan", 1)
            await wait_until(lambda: served_version(registry) == 1)
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)

    asyncio.run(scenario())
    assert registry.current("plan").sha256 == artifacts[0].sha256


@pytest.mark.integration
def test_the_listing_marks_refused_what_no_worker_can_load_and_keeps_the_previous_version_active(broker, topics, store,
                                                                                                   artifacts):
    ensure_topics(broker.bootstrap, topics)
    inline, by_path = (ControlClient(broker.bootstrap, topics, store, inline_limit=limit) for limit in (512 * 1024, 0))
    inline.publish_sync(artifacts[0])
    second = by_path.publish_sync(artifacts[1])
    store.path_for(second.sha256).unlink()  # the file is gone (or the workers' store is another one)
    asyncio.run(send_raw(broker.bootstrap, topics.control, crafted(3)[1]))  # the red team's bogus path
    rows = inline.listing_sync()
    assert [(r["version"], r["active"], r["refused_at"]) for r in rows] == [(1, True, None), (2, False, "load"),
                                                                            (3, False, "load")]
    assert all("is not in the store" in row["refused"] for row in rows[1:])
    registry = ArtifactRegistry(module_loaders(PipelineSchema()), store)  # what a worker does with the same log
    asyncio.run(catch_up(registry, broker.bootstrap, topics.control))
    assert served_version(registry) == 1 and registry.refused_total["plan"] == 2
    assert inline.publish_sync(artifacts[2]).version == 4  # versions 2 and 3 were taken, though never served


@pytest.mark.integration
def test_the_follower_announces_what_its_worker_serves_and_when_it_stops(broker, topics, store, artifacts):
    ensure_topics(broker.bootstrap, topics)
    client = ControlClient(broker.bootstrap, topics, store)
    client.publish_sync(artifacts[0])
    worker = WorkerIdentity.of("app", adult_config())
    registry = ArtifactRegistry(LOADERS, store)

    async def announced(version: int) -> None:
        deadline = asyncio.get_running_loop().time() + FOLLOW_TIMEOUT
        while True:
            (status,) = await client.workers() or [None]
            if status is not None and status.serving and status.serving[0][1] == version:
                return
            assert asyncio.get_running_loop().time() < deadline, f"no announcement of version {version}"
            await asyncio.sleep(0.1)

    async def scenario():
        task = asyncio.create_task(follow_control(registry, broker.bootstrap, topics.control, poll_ms=50,
                                                  worker=worker))
        try:
            await announced(1)
            assert [r["served_by"][0]["worker"] for r in await client.listing()] == [worker.name]
            second = await client.publish(artifacts[1])
            await announced(2)
            rows = await client.listing()
            assert [[w["worker"] for w in r["served_by"]] for r in rows] == [[], [worker.name]]
            assert rows[1]["sha256"] == second.sha256[:12] and not rows[1]["served_by"][0]["stale"]
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)
        (status,) = await client.workers()
        assert status.state == "stopped" and status.worker == worker.name
        assert [w for r in await client.listing() for w in r["served_by"]] == []
        assert [r.version for r in await client.history()] == [1, 2] and await client.events() == []

    asyncio.run(scenario())
    assert not registry.refused_total  # its own announcements were skipped, not refused
