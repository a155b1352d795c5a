"""A control topic re-created or truncated under a follower stops it loudly, never leaves it serving the old log."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from fairstream.streams.control.client import ControlClient
from fairstream.streams.control.registry import ArtifactRegistry, ControlLogRewritten, LogContinuity, follow_control
from fairstream.streams.control.store import ArtifactStore
from fairstream.streams.ops.supervise import WorkerProcess
from fairstream.streams.topics import ensure_topics, ensure_topics_async

from ..worker.test_liveness import adult, pipeline, wait_ready  # noqa: F401 (fixture)
from .test_registry import LOADERS, message, plans, send_raw, topics  # noqa: F401 (fixtures)

NOTICE_SECONDS = 10.0  # the follower polls every 50 ms: it must notice within a few fetches


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def follow_through_recreation(bootstrap: str, topics, plans) -> tuple[ArtifactRegistry, asyncio.Task]:
    """A follower that applied versions 1-3, then the topic deleted and re-created holding version 1 only."""
    await ensure_topics_async(bootstrap, topics)
    artifacts = [plan.to_artifact() for plan in plans]
    for version, artifact in enumerate(artifacts, start=1):
        await send_raw(bootstrap, topics.control, message(artifact, version))
    registry, ready = ArtifactRegistry(LOADERS), asyncio.Event()
    task = asyncio.create_task(follow_control(registry, bootstrap, topics.control, ready=ready, poll_ms=50))
    await asyncio.wait_for(ready.wait(), 60)
    assert registry.current("plan").version == 3
    await delete_topic(bootstrap, topics.control)
    await ensure_topics_async(bootstrap, topics)
    await send_raw(bootstrap, topics.control, message(artifacts[0], 1))
    return registry, task


def test_a_follower_whose_control_topic_is_recreated_raises_and_logs_one_critical_line(broker, topics, plans, caplog):
    async def scenario():
        registry, task = await follow_through_recreation(broker.bootstrap, topics, plans)
        try:
            with pytest.raises(ControlLogRewritten, match=topics.control):
                await asyncio.wait_for(task, NOTICE_SECONDS)
        finally:
            task.cancel()
        return registry

    with caplog.at_level(logging.INFO, logger="fairstream.streams.control.registry"):
        registry = asyncio.run(scenario())
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1 and topics.control in critical[0] and "offset 3" in critical[0], critical
    assert registry.current("plan").version == 3  # nothing of the new log was applied to the old state


def test_a_client_that_rewinds_after_an_out_of_range_fetch_is_a_rewritten_log_not_a_replay():
    # Kafka answers a fetch above a new log's end with OFFSET_OUT_OF_RANGE, and the client (reset
    # "earliest") silently starts again at the new log's first record.
    check = LogContinuity("t.control", position=0)
    check.check([SimpleNamespace(offset=offset) for offset in range(3)], highwater=3)
    check.advance(3, 3)
    with pytest.raises(ControlLogRewritten, match="returned offset 0"):
        check.check([SimpleNamespace(offset=0)], highwater=5)
    with pytest.raises(ControlLogRewritten, match="moved back to offset 1"):
        check.advance(1, 5)
    with pytest.raises(ControlLogRewritten, match="high watermark is 2"):
        check.check([], highwater=2)


@pytest.mark.integration
def test_a_worker_whose_control_topic_is_recreated_exits_non_zero(broker, adult, tmp_path):
    archive, plan = adult
    config = pipeline(tmp_path, "recreated", broker.bootstrap, plan)
    worker = WorkerProcess(config, broker.bootstrap, tmp_path, name="w").start()
    try:
        wait_ready(worker)
        asyncio.run(delete_topic(broker.bootstrap, config.topics.control))
        ensure_topics(broker.bootstrap, config.topics)  # as the operator does after a broker restart
        ControlClient(broker.bootstrap, config.topics, ArtifactStore(config.artifact_dir)).publish_sync(
            plan.to_artifact())
        published = time.monotonic()
        code = worker.wait(timeout=60)
        assert code not in (None, 0), f"still running 60 s after the control topic was re-created:\n{worker.log_tail()}"
        assert "was re-created or truncated" in worker.log_path.read_text()
        print(f"\nexit status {code} {time.monotonic() - published:.1f} s after the re-publish")
    finally:
        worker.stop()
