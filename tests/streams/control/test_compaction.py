"""The control topic compacted by Apache Kafka's own log cleaner (issue 29, item 7).

``test_registry``, ``test_candidates`` and ``test_worker_start`` write by hand what compaction leaves
into a new topic, and ``test_log_rewritten`` rewrites a log under its follower: they hold on the
embedded broker too, which does not compact. Here Kafka does it: the control topic gets small
segments (``segment.ms``) and a cleaner that takes it at once (``min.cleanable.dirty.ratio``, and
``log.cleaner.backoff.ms`` on a cluster of this module's own), over a history with what compaction
removes in real use: each worker's older announcements, a publisher's losing record and the
tombstone that withdraws it, a retried send, a re-embed event every worker sends, garbage under an
old-style key and its tombstone. The history is written and read with Kafka's default segments (one
active segment, never cleaned); then the topic's configs are changed, and once the cleaner has removed
those records (the proof: records gone, their offsets left as holes, no key twice), a fresh registry
and ``fairstream artifacts history`` and ``list`` reach the same verdicts, states and audit trail as
before.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.records import WorkerStatus, encode_announcement, reembed_event
from fairstream.streams.control.registry import ArtifactRegistry, follow_control, module_loaders
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.kafka_cluster import KafkaCluster
from fairstream.streams.topics import ensure_topics
from tests.polling import wait_for

from ..test_cli import listing_rows, pipeline_toml, run_main, tiny_plan
from .test_registry import catch_up, message, own_key

pytestmark = pytest.mark.integration

COMPACT_SOON = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
"""Topic configs: a segment rolls 100 ms after its first record, any dirty share makes the log cleanable, and a
tombstone may go 100 ms after the cleaning that kept it (the defaults: 7 days, 0.5, 1 day)."""
CLEANER_BACKOFF_MS = 100  # broker: how long the cleaner sleeps when it found nothing to clean (default 15 s)
COMPACTED_WITHIN = 30.0


@pytest.fixture(scope="module")
def cleaner(tmp_path_factory):
    """A single-node Kafka of this module's own whose log cleaner looks for work every 100 ms."""
    with KafkaCluster(tmp_path_factory.mktemp("kafka-cleaner"),
                      settings={"log.cleaner.backoff.ms": CLEANER_BACKOFF_MS}) as cluster:
        yield cluster


def set_topic_configs(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()]
    for future in admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic,
                                                                  incremental_configs=entries)]).values():
        future.result(timeout=30)


def raw_log(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record the broker returns of the control partition now: (offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-reader", "enable.auto.commit": False})
    partition = TopicPartition(topic, 0, 0)
    try:
        _, end = consumer.get_watermark_offsets(partition, timeout=10)
        consumer.assign([partition])
        log, deadline = [], time.monotonic() + timeout
        while not log or log[-1][0] < end - 1:
            assert time.monotonic() < deadline, f"{topic} not read to offset {end} within {timeout:g} s"
            for m in consumer.consume(1000, 0.5):
                assert m.error() is None, m.error()
                log.append((m.offset(), m.key(), m.value()))
        return log
    finally:
        consumer.close()


def write_raw(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes | None]]) -> None:
    """Write (key, value) pairs as they are (a None value is a tombstone), in order, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    failed = []
    for key, value in messages:
        producer.produce(topic, value, key, partition=0,
                         on_delivery=lambda error, _message: error is None or failed.append(error))
    assert producer.flush(30) == 0 and not failed, failed[:1]


def announcement(worker: str, serving: tuple, shadowing: tuple = (), shadow: dict | None = None,
                 at: float | None = None) -> tuple[bytes, bytes]:
    app_id, host_pid = worker.split("@")
    return encode_announcement(WorkerStatus(worker=worker, app_id=app_id, host=host_pid.split(":")[0],
                                            pid=int(host_pid.split(":")[1]), at=time.time() if at is None else at,
                                            every=600.0, kinds=("plan",), serving=serving, shadowing=shadowing,
                                            shadow=shadow))


class RunningFollower:
    """A worker's follower of the control topic, running on an event loop in a thread of its own."""

    def __init__(self, bootstrap: str, topic: str, registry: ArtifactRegistry):
        self.registry, self.loop = registry, asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="follower", daemon=True)
        self.thread.start()
        self.ready = asyncio.Event()

        async def start() -> asyncio.Task:
            return asyncio.create_task(follow_control(registry, bootstrap, topic, ready=self.ready, poll_ms=50))

        self.task = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10)
        wait_for(lambda: self.task.done() or self.ready.is_set(), 60, "a caught-up follower")

    def served(self) -> tuple[dict, dict]:
        """What it serves and shadows, as {kind: (version, sha256)}; fails if it stopped (with its error)."""
        assert not self.task.done(), f"the follower stopped: {self.task.exception()!r}"
        return served_versions(self.registry)

    def stop(self) -> None:
        async def cancel() -> None:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=30)

        asyncio.run_coroutine_threadsafe(cancel(), self.loop).result(timeout=40)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def served_versions(registry: ArtifactRegistry) -> tuple[dict, dict]:
    """The active and the candidate version of each kind, as {kind: (version, sha256)}."""
    served = registry.served()
    return ({kind: (a.version, a.sha256) for kind, a in served.active.items()},
            {kind: (a.version, a.sha256) for kind, a in served.candidates.items()})


def compacted(bootstrap: str, topic: str, written: list, roll: tuple[bytes, bytes]) -> list | None:
    """The records of ``written`` the broker still returns, once its cleaner has compacted them (else None).

    ``roll`` is sent first, each time: the cleaner never takes the active segment, and a segment rolls only on a
    write. Compacted means records removed and no key left twice; what is left must be unchanged and at its offset
    (compaction leaves holes, it does not renumber), and every record removed must have a later one with its key.
    """
    write_raw(bootstrap, topic, [roll])
    log = raw_log(bootstrap, topic)
    end = written[-1][0] + 1
    kept = [record for record in log if record[0] < end]
    if len(kept) == len(written) or max(Counter(key for _, key, _ in kept).values()) > 1:
        return None
    assert set(kept) < set(written)
    later = {(offset, key) for offset, key, _ in written for other, same, _ in written + log
             if other > offset and same == key}
    assert {(offset, key) for offset, key, _ in set(written) - set(kept)} <= later
    return kept


def without_ages(text: str) -> str:
    """``artifacts list`` text without how long ago each worker announced (the clock moves between two reads)."""
    return re.sub(r"\d+[smhd] ago", "ago", text)


def what_readers_conclude(cluster, config, toml, store, capsys) -> dict:
    """Everything a reader of the control topic concludes: the CLI's history and list, a fresh registry, the ledger."""
    common = ["--broker", cluster.url, "--config", str(toml)]
    code, history, err = run_main(["artifacts", "history", *common, "--verify"], capsys)
    verified = code
    history = history.split("\nverify:")[0]
    code, history_json, err = run_main(["artifacts", "history", *common, "--json"], capsys)
    assert code == 0, err
    rows, listing = listing_rows(cluster.url, toml, capsys)
    registry = ArtifactRegistry(module_loaders(config.schema()), store)  # a fresh worker's, as the worker builds it
    asyncio.run(catch_up(registry, cluster.bootstrap, config.topics.control))
    control = asyncio.run(ControlClient(cluster.bootstrap, config.topics, store).read())
    return {
        # The records that take effect (a refused record is what compaction may remove).
        "history": [line for line in history.splitlines() if "REFUSED: " not in line],
        # Without offsets: of a record sent twice, compaction keeps the later copy.
        "history json": [{name: value for name, value in entry.items() if name != "offset"}
                         for entry in map(json.loads, history_json.splitlines()) if entry["refused"] is None],
        "verify": verified,
        # Rows of the records that take effect (a refused record is what compaction may remove), ages left out.
        "list": [without_ages(line) for line in listing.splitlines() if " refused " not in line],
        "verdicts": [(r["version"], r["action"], r["mark"], r["state"], r["actor"], without_ages(r["served"]))
                     for r in rows if r["mark"] != "refused"],
        "registry": served_versions(registry),
        "states": {version: control.ledger.state("plan", version) for version in range(1, 8)},
        "workers": sorted((w.worker, w.serving, w.shadowing, json.dumps(w.shadow, sort_keys=True))
                          for w in control.workers.values()),
        "events": control.events,
    }


def test_a_control_topic_compacted_by_kafka_keeps_every_verdict_state_and_the_audit_trail(cleaner, tmp_path, capsys):
    toml, config = pipeline_toml(tmp_path, "compacted")
    topic, bootstrap = config.topics.control, cleaner.bootstrap
    ensure_topics(bootstrap, config.topics)  # compacted, with Kafka's default segments: nothing is cleaned yet
    store = ArtifactStore(config.artifact_dir)
    client = ControlClient(bootstrap, config.topics, store, schema=config.schema())
    plans = [tiny_plan(["age", "hours-per-week"], seed).to_artifact() for seed in range(1, 7)]
    workers = [f"compacted-adult@host-{i}:{100 + i}" for i in (1, 2)]

    # The history: publishes, a rollback, candidates approved, retired and rejected, each with its audit trail.
    v1 = client.publish_sync(plans[0], actor="alice", reason="first plan", statistics={"E": 0.31})
    client.publish_sync(plans[1], actor="refit@host", reason="drift alert", statistics={"E": 0.12, "current E": 0.3})
    client.rollback_sync("plan", actor="bob", reason="v2 widened the gap for women over 60")
    loser = message(plans[2], version=2)  # a publisher that lost version 2 to the one above, and its withdrawal
    write_raw(bootstrap, topic, [(own_key(loser), loser), (own_key(loser), None)])
    v3 = client.publish_sync(plans[2], actor="refit@host", reason="schedule", candidate=True)
    shadowing = (("plan", 3, v3.sha256),)
    for n in range(1, 4):  # every few seconds, each worker's figures of the candidate beside the active version
        write_raw(bootstrap, topic, [announcement(w, (("plan", 1, v1.sha256),), shadowing,
                                                 {"records": 1000.0 * n + i, "E": 0.2 - 0.01 * n})
                                     for i, w in enumerate(workers)])
    client.decide_sync("plan", 3, "approve", actor="carol", reason="closes the gap")  # with the live figures
    event = reembed_event(SimpleNamespace(kind="embedding", version=1, sha256="a" * 64),
                          SimpleNamespace(kind="embedding", version=2, sha256="b" * 64))
    write_raw(bootstrap, topic, [event, (b"plan", b"garbage under the old per-kind key")])
    client.publish_sync(plans[3], actor="refit@host", reason="schedule", candidate=True)  # v4
    write_raw(bootstrap, topic, [event, (b"plan", None)])  # the other worker's copy of the event; a tombstone
    client.publish_sync(plans[4], actor="refit@host", reason="next window", candidate=True)  # v5 retires v4
    client.decide_sync("plan", 5, "reject", actor="dave", reason="accuracy dropped")
    retried = message(plans[5], version=6, candidate=True, actor="refit@host", reason="a send retried")
    write_raw(bootstrap, topic, [(own_key(retried), retried)] * 2)  # v6, sent twice in a row: identical bytes
    last = [announcement(w, (("plan", 3, v3.sha256),), (("plan", 6, plans[5].sha256),), {"records": 50.0 + i})
            for i, w in enumerate(workers)]
    write_raw(bootstrap, topic, last)

    before = what_readers_conclude(cleaner, config, toml, store, capsys)
    assert before["states"] == {1: "published", 2: "published", 3: "approved", 4: "superseded", 5: "rejected",
                                6: "candidate", 7: None}
    assert before["registry"] == ({"plan": (3, v3.sha256)}, {"plan": (6, plans[5].sha256)})
    assert [line.split()[2:4] for line in before["history"]] == [
        ["v1", "publish"], ["v2", "publish"], ["v1", "rollback"], ["v3", "candidate"], ["v3", "approve"],
        ["v4", "candidate"], ["v5", "candidate"], ["v5", "reject"], ["v6", "candidate"]]
    assert before["history json"][4]["statistics"] == {"records": 3001.0, "E": 0.2 - 0.01 * 3}  # the live figures
    assert before["verify"] == 0  # nothing compaction removes breaks the trail
    written = raw_log(bootstrap, topic)
    assert [offset for offset, _, _ in written] == list(range(len(written)))  # one active segment: nothing cleaned

    # Small segments and an eager cleaner, under a worker's follower that has read the whole log.
    follower = RunningFollower(bootstrap, topic, ArtifactRegistry(module_loaders(config.schema()), store))
    try:
        set_topic_configs(bootstrap, topic, COMPACT_SOON)
        started = time.monotonic()
        kept = wait_for(lambda: compacted(bootstrap, topic, written, roll=last[-1]), COMPACTED_WITHIN,
                        "compaction of the control topic by Kafka's log cleaner", interval=0.5)
        took = time.monotonic() - started
        removed = sorted(set(written) - set(kept))
        gone = Counter(key.split(b"/")[0] + b"/" if b"/" in key else key for _, key, _ in removed)
        assert gone[b"status/"] >= 2 * 3 and gone[b"event/"] == 1 and gone[b"plan"] >= 1, gone
        assert own_key(loser) not in {key for _, key, value in kept if value is not None}  # the loser itself is gone
        retries = [offset for offset, key, _ in written if key == own_key(retried)]
        assert [offset for offset, key, _ in kept if key == own_key(retried)] == retries[1:]  # the later copy, in place

        after = what_readers_conclude(cleaner, config, toml, store, capsys)
        assert after == before
        # The follower goes on: compaction leaves holes below it, never a lower high watermark or offset (which would
        # be a re-created log), and it serves what it served.
        assert follower.served() == before["registry"]
    finally:
        follower.stop()
    print(f"\nKafka's cleaner compacted {topic} {took:.1f} s after its segments were made small: {len(written)} "
          f"records written, {len(kept)} left ({dict(gone)} removed); history, list, registry, ledger states, workers "
          "and events unchanged")
