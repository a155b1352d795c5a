"""Topic names from one config, and their explicit, idempotent, verified creation."""

from __future__ import annotations

import asyncio
import logging

import dataclasses

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

from fairstream.streams import topics as topics_module
from fairstream.streams.config import ConfigError, PipelineConfig, adult_config
from fairstream.streams.ops.broker import free_port
from fairstream.streams.topics import (
    DATA_TOPICS,
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


async def _add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 30.0) -> None:
    """What an operator does with ``kafka-topics.sh --alter --partitions``: done once the broker's metadata says so."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_partitions({topic: NewPartitions(total_count=total)})
        assert [error[1] for error in response.topic_errors] == [0], response
        deadline = asyncio.get_running_loop().time() + timeout
        while len((await admin.describe_topics([topic]))[0]["partitions"]) != total:
            assert asyncio.get_running_loop().time() < deadline, f"{topic} not at {total} partitions in {timeout:g} s"
            await asyncio.sleep(0.1)
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
    assert len({spec.name for spec in specs}) == len(specs) == 9
    data = [spec for spec in specs if spec.name not in (config.control, config.stats)]
    assert all(spec.partitions == 6 and spec.replication == 3 and not spec.configs for spec in data)


def test_control_topic_is_compacted_with_one_partition_that_never_grows():
    spec = TopicConfig(partitions=8).spec("fairstream.control")
    assert spec == TopicSpec("fairstream.control", 1, 1, {"cleanup.policy": "compact"}, may_grow=False)


def test_the_stats_topic_has_one_partition_and_keeps_a_day():
    """One partition: one monitoring agent of the pipeline reads every worker's partials (a second one stands by)."""
    spec = TopicConfig(partitions=8).spec("fairstream.stats")
    assert spec == TopicSpec("fairstream.stats", 1, 1, {"cleanup.policy": "delete", "retention.ms": "86400000"},
                             may_grow=False)


@pytest.mark.parametrize("kwargs", [{"prefix": ""}, {"prefix": ".x"}, {"partitions": 0}, {"replication": 0}])
def test_invalid_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        TopicConfig(**kwargs)


# --------------------------------------------------------------------------- per-topic partition counts


def test_a_partitions_table_gives_topics_their_own_count_and_the_rest_the_default():
    config = TopicConfig(prefix="t", partitions={"default": 3, "records.in": 12, "records.repaired": 12})
    counts = {spec.name: spec.partitions for spec in config.specs()}
    assert counts == {"t.records.in": 12, "t.records.repaired": 12, "t.embeddings.in": 3, "t.embeddings.repaired": 3,
                      "t.dlq": 3, "t.refit.requests": 3, "t.research": 3, "t.control": 1, "t.stats": 1}
    assert config.partitions_for("records.in") == 12 and config.default_partitions == 3
    assert TopicConfig(partitions={"dlq": 6}).partitions_for("embeddings.in") == 4  # no default: the built-in 4
    assert config.partitions_setting == {"default": 3, "records.in": 12, "records.repaired": 12}


def test_equal_layouts_compare_equal_whatever_their_spelling_and_survive_a_copy():
    assert TopicConfig(partitions={"default": 4, "dlq": 4}) == TopicConfig() and TopicConfig().partitions_setting == 4
    table = TopicConfig(partitions={"research": 2, "default": 5, "records.in": 9})
    assert table == TopicConfig(partitions={"default": 5, "records.in": 9, "research": 2})
    assert hash(table) == hash(TopicConfig(partitions={"default": 5, "records.in": 9, "research": 2}))
    copy = dataclasses.replace(table, prefix="other")  # how with_topics() copies it: the kept form reads back
    assert copy.partitions_for("records.in") == 9 and copy.partitions_for("research") == 2


@pytest.mark.parametrize("partitions, message", [
    ({"recrds.in": 2}, 'topics.partitions."recrds.in" names no topic of the pipeline; known: "default", "records.in"'),
    ({"control": 2}, "topics.partitions.control: the control topic always has one partition"),
    ({"records.in": 0}, 'topics.partitions."records.in" must be an integer >= 1 and <= 10000, got 0'),
    ({"default": True}, "topics.partitions.default must be an integer >= 1 and <= 10000, got True"),
    ("4", "topics.partitions must be an integer >= 1 and <= 10000 or a table of topic = count, got '4'"),
], ids=["unknown topic", "control", "zero", "bool", "text"])
def test_a_partitions_mistake_names_the_key(partitions, message):
    with pytest.raises(ValueError) as info:
        TopicConfig(partitions=partitions)
    assert str(info.value).startswith(message), info.value


def test_every_data_topic_can_be_named_in_the_table():
    config = TopicConfig(prefix="all", partitions={name: i + 1 for i, name in enumerate(DATA_TOPICS)})
    assert [config.partitions_for(name) for name in DATA_TOPICS] == list(range(1, len(DATA_TOPICS) + 1))
    assert {spec.name for spec in config.specs()} == {f"all.{name}" for name in (*DATA_TOPICS, "control", "stats")}


# Through the pipeline's TOML (streams/config.py reads [topics] and writes it back).

TABLE_FORMS = {
    "inline": 'partitions = { default = 3, "records.in" = 12 }\n',
    "table": '[topics.partitions]\ndefault = 3\n"records.in" = 12\n',
}


def pipeline_file(tmp_path, topics: str):
    path = tmp_path / "pipeline.toml"
    path.write_text("[pipeline]\nname = 'p'\nfeatures = ['x']\ngroups = [0, 1]\nstrata = [0]\n[topics]\n"
                    f"prefix = 'p'\n{topics}")
    return path


@pytest.mark.parametrize("form", list(TABLE_FORMS))
def test_a_config_file_gives_topics_their_own_partition_counts_and_writes_them_back(form, tmp_path):
    config = PipelineConfig.from_toml(pipeline_file(tmp_path, TABLE_FORMS[form]))
    assert config.topics.partitions_for("records.in") == 12 and config.topics.partitions_for("dlq") == 3
    again = tmp_path / "again.toml"
    again.write_text(config.to_toml())
    assert PipelineConfig.from_toml(again) == config
    plain = adult_config()
    again.write_text(plain.to_toml())
    assert "partitions = 4\n" in plain.to_toml() and PipelineConfig.from_toml(again) == plain


@pytest.mark.parametrize("topics, message", [
    ('partitions = { default = 4, "recrds.in" = 2 }\n', 'topics.partitions."recrds.in" names no topic of the pipeline'),
    ("partitions = { control = 2 }\n", "topics.partitions.control: the control topic always has one partition"),
    ('partitions = { "records.in" = 0 }\n', "topics.partitions must be a table of topic = count (counts >= 1 and "
                                             "<= 10000"),
    ("partitions = 0\n", "topics.partitions must be an integer >= 1 and <= 10000, got 0"),
], ids=["unknown topic", "control", "zero", "zero for all"])
def test_a_partitions_mistake_in_a_config_file_names_the_file_and_the_key(topics, message, tmp_path):
    path = pipeline_file(tmp_path, topics)
    with pytest.raises(ConfigError) as info:
        PipelineConfig.from_toml(path)
    assert str(info.value).startswith(f"{path}: {message}"), info.value


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
def test_per_topic_counts_are_created_as_configured(broker):
    config = TopicConfig(prefix="pertopic", partitions={"default": 2, "records.in": 5, "records.repaired": 3})
    counts = ensure_topics(broker.bootstrap, config)
    assert counts == {spec.name: spec.partitions for spec in config.specs()}
    assert (counts[config.records_in], counts[config.records_repaired], counts[config.dlq]) == (5, 3, 2)


@pytest.mark.integration
def test_fewer_partitions_than_configured_is_a_clear_error(broker):
    config = TopicConfig(prefix="mismatch", partitions=4)
    asyncio.run(_create_raw(broker.bootstrap, config.records_in, 2))
    with pytest.raises(TopicConfigError, match=r"mismatch\.records\.in has 2 partitions, fewer than the 4 configured: "
                                               r"Kafka cannot remove partitions"):
        ensure_topics(broker.bootstrap, config)


@pytest.mark.integration
def test_a_topic_an_operator_expanded_is_used_as_it_is_with_a_warning(broker, caplog):
    config = TopicConfig(prefix="expanded", partitions=2)
    ensure_topics(broker.bootstrap, config)
    asyncio.run(_add_partitions(broker.bootstrap, config.records_in, 5))
    asyncio.run(_add_partitions(broker.bootstrap, config.records_repaired, 3))
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.topics"):
        counts = ensure_topics(broker.bootstrap, config)  # a worker (re)started after the expansion: no exit
    assert (counts[config.records_in], counts[config.records_repaired], counts[config.dlq]) == (5, 3, 2)
    warned = sorted(r.getMessage() for r in caplog.records)
    assert warned == [f"topic expanded.{name} has {n} partitions, more than the 2 configured: used as expanded by an "
                      f'operator (the workers take every partition); say so in the config\'s [topics] partitions table: '
                      f'"{name}" = {n}'
                      for name, n in [("records.in", 5), ("records.repaired", 3)]]
    # Configured as it now is: nothing to say.
    caplog.clear()
    matching = dataclasses.replace(config, partitions={"default": 2, "records.in": 5, "records.repaired": 3})
    with caplog.at_level(logging.WARNING, logger="fairstream.streams.topics"):
        assert ensure_topics(broker.bootstrap, matching) == counts
    assert not caplog.records


@pytest.mark.integration
def test_a_control_topic_with_more_than_one_partition_is_refused(broker):
    config = TopicConfig(prefix="twocontrol")
    asyncio.run(_create_raw(broker.bootstrap, config.control, 2, dict(topics_module.COMPACT)))
    with pytest.raises(TopicConfigError, match=r"twocontrol\.control has 2 partitions, and must have exactly 1: every "
                                               r"reader needs one order of its records"):
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
