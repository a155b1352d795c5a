"""A version names one artifact: concurrent publishers, collisions, rollbacks to versions never published,
and worker announcements that no reader takes for a record."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient, ControlLog, _activation_stacks
from fairstream.streams.control.records import (
    ControlError,
    WorkerStatus,
    encode_announcement,
    parse_announcement,
    parse_control,
    parse_event,
    reembed_event,
)
from fairstream.streams.control.registry import WorkerIdentity, follow_control
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
    assert registry.apply(message(a, version=5))
    assert not registry.apply(message(b, version=5))  # another publisher proposed 5 at the same moment
    assert (served_version(registry), registry.current("plan").sha256) == (5, a.sha256)
    assert registry.refused_total["plan"] == 1 and f"plan version 5 already names sha256 {a.sha256[:12]}" in caplog.text


def test_a_rollback_names_only_a_published_version_and_its_artifact(artifacts):
    a, b, c = artifacts
    registry = ArtifactRegistry(LOADERS)
    assert registry.apply(message(a, version=1)) and registry.apply(message(b, version=2))
    assert not registry.apply(message(a, version=99, action="rollback"))  # crafted: version 99 never existed
    assert not registry.apply(message(c, version=1, action="rollback"))  # version 1 is a, not c
    assert served_version(registry) == 2 and registry.refused_total["plan"] == 2
    assert registry.apply(message(a, version=1, action="rollback"))
    assert (served_version(registry), registry.current("plan").sha256) == (1, a.sha256)


def fake_messages(log: list[tuple[bytes, bytes | None]]) -> list:
    return [SimpleNamespace(offset=offset, key=key, value=value) for offset, (key, value) in enumerate(log)]


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
        for _, value in surviving:
            registry.apply(value)
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
    assert taken == {(version, sha[:12]) for *_, version, sha in published}  # each version names one artifact


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
