"""Topic names from one config, and their explicit, idempotent, verified creation."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from fairstream.streams import topics as topics_module
from fairstream.streams.ops.broker import free_port
from fairstream.streams.topics import (
    TopicConfig,
    TopicConfigError,
    TopicSpec,
    describe_topic_configs,
    ensure_topics,
    ensure_topics_async,
)


async def _create_raw(bootstrap: str, name: str, partitions: int, configs: dict | None = None) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        await admin.close()


async def _topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await describe_topic_configs(admin, names)
    finally:
        await admin.close()


# --------------------------------------------------------------------------- names


def test_names_share_the_prefix():
    config = TopicConfig()
    assert config.records_in == "fairstream.records.in"
    assert config.records_repaired == "fairstream.records.repaired"
    assert config.embeddings_in == "fairstream.embeddings.in"
    assert config.embeddings_repaired == "fairstream.embeddings.repaired"
    assert config.dlq == "fairstream.dlq"
    assert config.control == "fairstream.control"
    assert config.refit_requests == "fairstream.refit.requests"
    assert config.research == "fairstream.research"
    assert TopicConfig(prefix="acme.fair").dlq == "acme.fair.dlq"


def test_specs_cover_every_topic_once():
    config = TopicConfig(partitions=6, replication=3)
    specs = config.specs()
    assert len({spec.name for spec in specs}) == len(specs) == 8
    data = [spec for spec in specs if spec.name != config.control]
    assert all(spec.partitions == 6 and spec.replication == 3 and not spec.configs for spec in data)


def test_control_topic_is_compacted_with_one_partition():
    spec = TopicConfig(partitions=8).spec("fairstream.control")
    assert spec == TopicSpec("fairstream.control", 1, 1, {"cleanup.policy": "compact"})


@pytest.mark.parametrize("kwargs", [{"prefix": ""}, {"prefix": ".x"}, {"partitions": 0}, {"replication": 0}])
def test_invalid_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        TopicConfig(**kwargs)


# --------------------------------------------------------------------------- creation against a broker


@pytest.mark.integration
def test_ensure_topics_creates_all_with_configured_partitions(broker):
    config = TopicConfig(prefix="create", partitions=3)
    counts = ensure_topics(broker.bootstrap, config)
    assert counts == {spec.name: spec.partitions for spec in config.specs()}
    assert counts[config.control] == 1
    assert counts[config.records_in] == 3


@pytest.mark.integration
def test_control_topic_gets_the_compact_policy(broker):
    config = TopicConfig(prefix="compact")
    ensure_topics(broker.bootstrap, config)
    configs = asyncio.run(_topic_configs(broker.bootstrap, [config.control]))
    assert configs[config.control]["cleanup.policy"] == "compact"


@pytest.mark.integration
def test_ensure_topics_is_idempotent(broker):
    config = TopicConfig(prefix="again")
    first = ensure_topics(broker.bootstrap, config)
    assert ensure_topics(broker.bootstrap, config) == first


@pytest.mark.integration
def test_concurrent_workers_may_race_to_create(broker):
    config = TopicConfig(prefix="race")

    async def two_workers():
        return await asyncio.gather(
            ensure_topics_async(broker.bootstrap, config), ensure_topics_async(broker.bootstrap, config)
        )

    first, second = asyncio.run(two_workers())
    assert first == second


@pytest.mark.integration
def test_partition_mismatch_is_a_clear_error(broker):
    config = TopicConfig(prefix="mismatch", partitions=4)
    asyncio.run(_create_raw(broker.bootstrap, config.records_in, 2))
    with pytest.raises(TopicConfigError, match=r"mismatch\.records\.in has 2, expected 4"):
        ensure_topics(broker.bootstrap, config)


@pytest.mark.integration
def test_missing_compaction_is_warned_about_not_fatal(broker, caplog):
    config = TopicConfig(prefix="uncompacted")
    asyncio.run(_create_raw(broker.bootstrap, config.control, 1))  # created by hand, no policy
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.topics"):
        counts = ensure_topics(broker.bootstrap, config)
    assert counts[config.control] == 1
    assert any("uncompacted.control" in r.message and "cleanup.policy" in r.message for r in caplog.records)


@pytest.mark.integration
def test_unreachable_broker_is_a_clear_error():
    with pytest.raises(TopicConfigError, match="cannot reach a Kafka broker at 127.0.0.1:"):
        ensure_topics(f"127.0.0.1:{free_port()}", TopicConfig(), timeout=5.0)


# --------------------------------------------------------------------------- brokers that reject configs


class _ConfigRejectingAdmin:
    """Answers CreateTopics like a broker whose policy forbids topic configs (INVALID_CONFIG)."""

    def __init__(self):
        self.requests: list[list[NewTopic]] = []

    async def create_topics(self, new_topics, timeout_ms=None):
        self.requests.append(new_topics)
        codes = [40 if topic.topic_configs else 0 for topic in new_topics]
        return type("Response", (), {"topic_errors": [(t.name, c, None) for t, c in zip(new_topics, codes)]})


def test_rejected_configs_fall_back_to_a_plain_topic_with_a_warning(caplog):
    admin = _ConfigRejectingAdmin()
    spec = TopicConfig().spec("fairstream.control")
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.topics"):
        asyncio.run(topics_module._create(admin, [spec], timeout=5.0))
    assert [topic.topic_configs for topic in admin.requests[1]] == [{}]
    assert "rejected configs" in caplog.text


def test_other_create_errors_raise():
    with pytest.raises(TopicConfigError, match="fairstream.dlq: PolicyViolationError"):
        topics_module._raise_on_create_errors({"fairstream.dlq": 44, "fairstream.control": 36})
