"""No message on the control topic can stop a reader: the registry, the follower, the client and ``artifacts list``
refuse what they cannot take (logged, counted) and go on serving the previous version."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import uuid
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaError

from fairstream.streams.cli import main
from fairstream.streams.config import adult_config
from fairstream.streams.control.client import ControlClient, ControlLog
from fairstream.streams.control.records import (
    ControlError,
    WorkerStatus,
    encode_announcement,
    parse_announcement,
    parse_control,
    parse_event,
    read_message,
)
from fairstream.streams.control.registry import ArtifactRegistry, follow_control, module_loaders
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.topics import ensure_topics

from ..test_cli import tiny_plan
from .test_registry import FOLLOW_TIMEOUT, LOADERS, catch_up, fit_plan, keyed, own_key, served_version, write_log
from .test_versions import wait_until

DEEP = 5000  # past Python's recursion limit (1000): json.loads raises RecursionError
SQUAT = "version 2**53 - 1 under its own key"  # well-formed: the version rule refuses it, not the reader


def hostile_messages(sha: str) -> dict[str, tuple[bytes | None, bytes]]:
    """name -> (key, value) of messages anyone with write access could put on the control topic."""
    def publish(**changes) -> bytes:
        return json.dumps({"kind": "plan", "version": 2, "sha256": sha, "path": "/nope", **changes}).encode()

    status = WorkerStatus("app@host:1", "app", "host", 1, 1.0, 300.0, ("plan",), (("plan", 1, sha),))
    status_key, announcement = encode_announcement(status)
    squat = publish(version=2**53 - 1)
    return {
        "nested lists": (b"x", b"[" * DEEP + b"]" * DEEP),
        "nested objects": (b"x", b'{"a": ' * DEEP + b"1" + b"}" * DEEP),
        "nested lists under a worker's key": (b"status/worker/evil", b"[" * DEEP + b"]" * DEEP),
        "nested lists under an event key": (b"event/reembed/embedding/1-2/x", b"[" * DEEP + b"]" * DEEP),
        "nested version": (b"x", b'{"kind": "plan", "version": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
        "invalid UTF-8": (b"plan", b"\xff\xfe\x00garbage"),
        "a 5,000-digit version": (b"x", publish(version=1).replace(b'"version": 1', b'"version": ' + b"9" * 5000)),
        "900 KB of garbage": (b"k", b"A" * 900_000),
        "no key": (None, publish()),
        "a publish under a worker's key": (b"status/worker/evil", publish()),
        "a publish under another record's key": (keyed(fit_plan(4).to_artifact(), 2)[0], publish()),
        "an announcement under another key": (b"x", announcement),
        "an announcement under another worker's key": (b"status/worker/other@host:2", announcement),
        "an announcement with an infinite pid": (status_key, announcement.replace(b'"pid": 1', b'"pid": Infinity')),
        "an announcement with a NaN time": (status_key, announcement.replace(b'"at": 1.0', b'"at": NaN')),
        "an event under a record's key": (b"plan/2/publish/0123456789abcdef", b'{"event": "reembed"}'),
        "version 2**63 - 1": (f"plan/{2**63 - 1}/publish/0123456789abcdef".encode(), publish(version=2**63 - 1)),
        "version 2**53 - 1 under its own key": (own_key(squat), squat),
        "published in the year 1e308": (b"x", publish(published_at=1e308)),
        "published at NaN": (b"x", publish().replace(b'"path"', b'"published_at": NaN, "path"')),
        "a kind with a slash": (b"x", publish(kind="plan/2")),
        **{f"an audit trail with {name}": under_its_key(publish(**field)) for name, field in BAD_AUDIT.items()},
        "a 400-digit statistic": under_its_key(publish(statistics={"E": 1}).replace(b'"E": 1', b'"E": ' + b"9" * 400)),
    }


BAD_AUDIT = {
    "an empty actor": {"actor": ""},
    "a blank actor": {"actor": "   "},
    "a 201-character actor": {"actor": "a" * 201},
    "a numeric actor": {"actor": 7},
    "a 1,001-character reason": {"reason": "r" * 1001},
    "a list of a reason": {"reason": ["why"]},
    "statistics as a list": {"statistics": [1.0]},
    "65 statistics": {"statistics": {f"s{i}": 1.0 for i in range(65)}},
    "a 101-character statistic name": {"statistics": {"n" * 101: 1.0}},
    "an empty statistic name": {"statistics": {"": 1.0}},
    "a NaN statistic": {"statistics": {"E": math.nan}},
    "an infinite statistic": {"statistics": {"E": math.inf}},
    "a text statistic": {"statistics": {"E": "0.1"}},
    "a true statistic": {"statistics": {"E": True}},
    "nested statistics": {"statistics": {"E": {"after": 0.1}}},
}
"""Audit fields (who, why, the figures) no reader takes: each makes the whole record refused."""


def under_its_key(value: bytes) -> tuple[bytes, bytes]:
    """(the control key a valid record of this value would have, the value): only the value can be refused."""
    return f"plan/2/publish/{hashlib.sha256(value).hexdigest()[:16]}".encode(), value


@pytest.fixture(scope="module")
def good():
    return [fit_plan(seed).to_artifact() for seed in (1, 2)]


@pytest.fixture(scope="module")
def hostile(good):
    return hostile_messages(good[0].sha256)


def test_every_parser_refuses_a_hostile_message_and_raises_nothing_else(hostile):
    for name, (key, value) in hostile.items():
        assert read_message(key, value).what == ("record" if name == SQUAT else "refused"), name
        assert parse_event(value) is None or name == "an event under a record's key", name
        assert parse_announcement(value) is None or name.startswith("an announcement under another"), name
        try:
            parse_control(value)
        except ControlError:
            pass
        else:  # a record, but under a key that is not its own (or the squat)
            assert name in ("no key", "a publish under a worker's key", "a publish under another record's key",
                            SQUAT), name


def test_the_registry_refuses_every_hostile_message_counts_it_and_keeps_serving(good, hostile, caplog):
    first, second = good
    registry = ArtifactRegistry(LOADERS)
    key, value = keyed(first, 1)
    assert registry.apply(value, key, 0)
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.registry"):
        for offset, (name, (key, value)) in enumerate(hostile.items(), start=1):
            assert not registry.apply(value, key, offset), name
            assert served_version(registry) == 1, name
    assert sum(registry.refused_total.values()) == len(hostile)  # each one logged and counted, none skipped
    assert registry.refused_total["plan"] == 1 and "version gap: plan version 9007199254740991" in caplog.text
    assert "RecursionError" in caplog.text and max(len(line) for line in caplog.text.splitlines()) < 2_000
    key, value = keyed(second, 2)  # the squat claimed nothing: the next publish is version 2
    assert registry.apply(value, key, len(hostile) + 1) and served_version(registry) == 2


def test_the_client_skips_every_hostile_message_with_a_warning(good, hostile, caplog):
    control = ControlLog()
    messages = [keyed(good[0], 1), *hostile.values(), keyed(good[1], 2)]
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.control.client"):
        for offset, (key, value) in enumerate(messages):
            control.add(SimpleNamespace(offset=offset, key=key, value=value))
        control.warn_skipped()
    assert [(r.version, r.sha256) for r in control.history()] == [(1, good[0].sha256), (2, good[1].sha256)]
    assert control.workers == {} and control.events == {}  # no announcement or event under a wrong key
    assert control.ledger.next_version("plan") == 3
    assert len(control.skipped) == len(hostile) - 4  # the other 4 are records, listed as refused rows
    assert caplog.messages == [f"skipped {len(control.skipped)} control message(s) that no reader takes (at offsets 1, "
                               "2, 3, 4, 5, ...); the first: unparsable control message: control message is not "
                               "JSON: RecursionError: 'maximum recursion depth exc... array from a unicode string'"]


@pytest.mark.integration
def test_hostile_messages_on_the_topic_stop_no_follower_and_no_listing(broker, tmp_path, hostile, capsys):
    """The red team's reproduction: hostile messages, then a squat, on a running follower; a fresh one; the CLI."""
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"
    config = adult_config(artifact_dir=str(tmp_path / "artifacts")).with_topics(prefix=prefix, partitions=1)
    toml = tmp_path / "pipeline.toml"
    toml.write_text(config.to_toml())
    ensure_topics(broker.bootstrap, config.topics)
    store = ArtifactStore(config.artifact_dir)
    client = ControlClient(broker.bootstrap, config.topics, store, schema=config.schema())
    plans = [tiny_plan(["age", "hours-per-week"], seed).to_artifact() for seed in (1, 2)]
    client.publish_sync(plans[0])
    registry = ArtifactRegistry(module_loaders(config.schema()), store)
    listing = ["artifacts", "list", "--broker", broker.url, "--config", str(toml)]

    async def scenario():
        ready = asyncio.Event()
        task = asyncio.create_task(follow_control(registry, broker.bootstrap, config.topics.control, ready=ready,
                                                  poll_ms=50))
        try:
            await asyncio.wait_for(ready.wait(), FOLLOW_TIMEOUT)
            # Apache Kafka refuses a keyless record on a compacted topic itself: that one never reaches a reader.
            with pytest.raises(KafkaError):  # INVALID_RECORD, which aiokafka names UnknownError
                await write_log(broker.bootstrap, config.topics.control, [hostile["no key"]])
            written = [message for name, message in hostile.items() if name != "no key"]
            await write_log(broker.bootstrap, config.topics.control, written)
            await wait_until(lambda: sum(registry.refused_total.values()) == len(written) or task.done())
            assert not task.done() and served_version(registry) == 1
            assert await asyncio.to_thread(main, listing) == 0
            second = await client.publish(plans[1])
            await wait_until(lambda: served_version(registry) == 2 or task.done())
            assert not task.done() and second.version == 2  # the squat took no version
        finally:
            task.cancel()
            await asyncio.wait([task], timeout=FOLLOW_TIMEOUT)

    asyncio.run(scenario())
    assert marks(capsys.readouterr().out) == [("1", "*")]  # before the second publish
    fresh = ArtifactRegistry(module_loaders(config.schema()), store)  # a worker started after the hostile messages
    asyncio.run(catch_up(fresh, broker.bootstrap, config.topics.control))
    assert served_version(fresh) == 2 and fresh.current("plan").sha256 == plans[1].sha256
    assert main(listing) == 0
    assert marks(capsys.readouterr().out) == [("1", "-"), ("2", "*")]


def marks(out: str) -> list[tuple[str, str]]:
    """(version, mark) of the rows ``artifacts list`` printed that are not refused (no date: "-" in one column)."""
    rows = [line.split() for line in out.split("\n\n")[0].splitlines()[1:]]
    pairs = [(row[1], row[6] if row[5] == "-" else row[7]) for row in rows]
    return [(version, mark) for version, mark in pairs if mark != "refused"]
