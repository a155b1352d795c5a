"""Topic names and their explicit creation.

Every topic name comes from one :class:`TopicConfig`, so a deployment can run several pipelines on
one cluster by changing the prefix. Topics are created explicitly with the configured partition
counts rather than left to broker auto-creation (Tansu auto-creates with 4 partitions, Apache Kafka,
where it is allowed at all, with ``num.partitions``), and the control topic with its configs.

Partitions. ``partitions`` is one number for every data topic, or a table that gives some topics
their own count (the control topic always has one partition)::

    [topics]
    prefix = "fairstream"
    partitions = { default = 4, "records.in" = 12, "records.repaired" = 12 }

The table's keys are ``default`` (4 when left out) and the data topics by their name after the
prefix (:data:`DATA_TOPICS`); a mistake is a ValueError naming the key (``topics.partitions."recrds.in"``).

What :func:`ensure_topics` accepts of a topic that exists:

* more partitions than configured on a data topic: Kafka only ever adds partitions, so that is an
  operator's expansion (``kafka-topics.sh --alter --partitions``). It is used as it is, with a
  warning that the config says fewer. The workers' consumers take the new partitions at their next
  metadata refresh and rebalance; producers spread keys over them. A worker that (re)starts after an
  expansion therefore starts, where it used to exit (a restart loop under a supervisor).
* refused, :class:`TopicConfigError`: the control topic with more than one partition (the version
  rule needs one order of every record, and readers follow partition 0 only); a data topic with
  fewer partitions than configured (Kafka cannot remove partitions, so that topic was created with
  another layout, e.g. auto-created with ``num.partitions``, and the parallelism the config was
  sized for is not there: expand it, or configure the count it has).

A team's own topics. ``input`` and ``output`` name the record topics when they are a team's (``input =
"loan-applications"``); they default to ``<prefix>.records.in`` and ``<prefix>.records.repaired``. A named topic
that exists is used with the partitions it has, whatever the config's count (one log line says so); a named
topic that does not exist is created like the others.

The admin calls use aiokafka (a dependency of Faust, so always present) because it works against
both Tansu and Apache Kafka, and its async API can run inside a Faust worker's startup as well as
from the CLI through :func:`ensure_topics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping, Union

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, for_code

from .kafka import active, aiokafka_options

log = logging.getLogger(__name__)

COMPACT = {"cleanup.policy": "compact"}
_TOPIC_ALREADY_EXISTS = 36
# Brokers that reject a topic's configs answer with one of these; the topic is then created
# without them (and a warning says so) rather than not at all.
_CONFIG_REJECTED = {
    40,  # INVALID_CONFIG
    42,  # INVALID_REQUEST
    44,  # POLICY_VIOLATION
}


class TopicConfigError(RuntimeError):
    """Topics could not be created, or exist with a layout the pipeline cannot use."""


DATA_TOPICS = ("records.in", "records.repaired", "embeddings.in", "embeddings.repaired", "dlq", "refit.requests",
               "research")
"""Every topic but the control topic, by its name after the prefix (the keys of a ``partitions`` table)."""
CONTROL = "control"
STATS = "stats"
"""The workers' partial aggregates, read by the pipeline's monitoring agent: one partition, so one agent of the
pipeline's group reads them all (a second one waits as a standby), in the order the workers sent them."""
STATS_RETENTION = {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}
DEFAULT = "default"
"""The key of a ``partitions`` table that gives every data topic it does not name its count."""
DEFAULT_PARTITIONS = 4
FORMATS = ("json", "avro")
"""Formats of the input and output record topics (``topics.format``)."""
MAX_PARTITIONS = 10_000

Partitions = Union[int, Mapping[str, int]]
"""One count for every data topic, or ``{"default": n, "<topic>": n, ...}``."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic as the pipeline needs it.

    ``partitions`` is the count it is created with; an existing topic may have more when
    ``may_grow`` (an operator's expansion), never fewer.
    """

    name: str
    partitions: int
    replication: int
    configs: dict[str, str] = field(default_factory=dict)
    may_grow: bool = True
    teams: bool = False  # a topic the config names (a team's own): used with whatever partitions it has


@dataclass(frozen=True)
class TopicConfig:
    """Names and layout of every topic, all under one prefix (``fairstream.records.in``, ...).

    ``partitions`` is one count for every data topic or a table with per-topic counts (see the
    module docstring); it is kept as the int, or as ``(("default", n), (topic, n), ...)`` pairs in
    :data:`DATA_TOPICS` order without the counts equal to the default, so equal layouts compare equal.

    Parameters
    ----------
    prefix : str, default="fairstream"
        Prefix of every topic name (``<prefix>.records.in``, ...).
    partitions : int or mapping of str to int, default=4
        Partitions of every data topic, or ``{"default": n, "<topic>": n, ...}``; the control topic has one.
    replication : int, default=1
        Replication factor of every topic.
    input : str, default=""
        The input records' topic (a team's own); "" = ``<prefix>.records.in``.
    output : str, default=""
        The repaired records' topic; "" = ``<prefix>.records.repaired``.
    format : {"json", "avro"}, default="json"
        The format of the input and output topics.
    """

    prefix: str = "fairstream"
    partitions: Partitions = DEFAULT_PARTITIONS
    replication: int = 1
    input: str = ""
    output: str = ""
    format: str = "json"

    def __post_init__(self) -> None:
        if not self.prefix or self.prefix != self.prefix.strip("."):
            raise ValueError(f"topic prefix {self.prefix!r} must be non-empty, without outer dots")
        object.__setattr__(self, "partitions", _partitions_setting(self.partitions))
        if isinstance(self.replication, bool) or not isinstance(self.replication, int) or self.replication < 1:
            raise ValueError(f"topics.replication must be an integer of at least 1, got {self.replication!r}")
        if self.format not in FORMATS:
            raise ValueError(f"topics.format must be {' or '.join(map(repr, FORMATS))}, got {self.format!r}")
        self._check_named_topics()

    def _check_named_topics(self) -> None:
        # A worker reading its own outputs (or dead letters, or the control topic) would process them again, forever.
        if self.records_in == self.records_repaired:
            raise ValueError(f"topics.output {self.records_repaired!r} is the input topic: a worker would read its "
                             "own outputs")
        own = {self.name(suffix) for suffix in (*DATA_TOPICS, CONTROL)} - {self.name("records.in"),
                                                                           self.name("records.repaired")}
        for key, name in (("input", self.input), ("output", self.output)):
            if name in own:
                raise ValueError(f"topics.{key} {name!r} is one of the pipeline's own topics (under the prefix "
                                 f"{self.prefix!r}): name the team's topic")

    @property
    def default_partitions(self) -> int:
        """The count of every data topic the ``partitions`` table does not name (all of them for one number)."""
        return self.partitions if isinstance(self.partitions, int) else self.partitions[0][1]

    def partitions_for(self, suffix: str) -> int:
        """The configured partition count of topic ``suffix`` (its name after the prefix; the control topic has 1)."""
        if suffix == CONTROL:
            return 1
        if suffix not in DATA_TOPICS:
            raise KeyError(suffix)
        return dict(self._overrides()).get(suffix, self.default_partitions)

    @property
    def partitions_setting(self) -> int | dict[str, int]:
        """``partitions`` as a config file states it: one number, or the table ``{"default": n, topic: n, ...}``."""
        return self.partitions if isinstance(self.partitions, int) else dict(self.partitions)

    def _overrides(self) -> tuple[tuple[str, int], ...]:
        return () if isinstance(self.partitions, int) else self.partitions[1:]

    def name(self, suffix: str) -> str:
        """The full name of topic ``suffix`` under the prefix."""
        return f"{self.prefix}.{suffix}"

    @property
    def records_in(self) -> str:
        """Input records: the configured topic, else ``<prefix>.records.in``."""
        return self.input or self.name("records.in")

    @property
    def records_repaired(self) -> str:
        """Repaired records: the configured topic, else ``<prefix>.records.repaired``."""
        return self.output or self.name("records.repaired")

    def topic_name(self, suffix: str) -> str:
        """The full name of data topic ``suffix`` (a configured input or output topic's own name)."""
        return {"records.in": self.records_in, "records.repaired": self.records_repaired}.get(suffix) or \
            self.name(suffix)

    @property
    def embeddings_in(self) -> str:
        """Input embeddings."""
        return self.name("embeddings.in")

    @property
    def embeddings_repaired(self) -> str:
        """Repaired embeddings."""
        return self.name("embeddings.repaired")

    @property
    def dlq(self) -> str:
        """Dead letters (every input message that could not be repaired, with the reason)."""
        return self.name("dlq")

    @property
    def control(self) -> str:
        """Artifact versions (one partition)."""
        return self.name("control")

    @property
    def stats(self) -> str:
        """The workers' partial aggregates (one partition), merged by the monitoring agent."""
        return self.name(STATS)

    @property
    def refit_requests(self) -> str:
        """Re-fit requests from monitors."""
        return self.name("refit.requests")

    @property
    def research(self) -> str:
        """Labelled research records for re-fits."""
        return self.name("research")

    def specs(self) -> list[TopicSpec]:
        """Every topic with its partition count, replication and topic configs."""
        named = {"records.in": bool(self.input), "records.repaired": bool(self.output)}
        specs = [TopicSpec(self.topic_name(suffix), self.partitions_for(suffix), self.replication,
                           teams=named.get(suffix, False)) for suffix in DATA_TOPICS]
        # One partition so every worker reads every artifact version in publication order;
        # compacted so a new worker replays only the latest version per artifact kind.
        specs.append(TopicSpec(self.control, 1, self.replication, dict(COMPACT), may_grow=False))
        specs.append(TopicSpec(self.stats, 1, self.replication, dict(STATS_RETENTION), may_grow=False))
        return specs

    def spec(self, name: str) -> TopicSpec:
        """Every topic with its partitions, replication and configs."""
        for spec in self.specs():
            if spec.name == name:
                return spec
        raise KeyError(name)


def _partitions_setting(value) -> Partitions:
    """``partitions`` checked and in its kept form (see :class:`TopicConfig`); a ValueError names the key at fault."""
    if not isinstance(value, (Mapping, tuple)):
        return _count(value, "topics.partitions", " or a table of topic = count")
    try:
        table = dict(value)
    except (TypeError, ValueError):
        raise ValueError(f"topics.partitions must be an integer or a table, got {value!r}") from None
    for key, count in table.items():
        where = f"topics.partitions.{_toml_key(key)}"
        if key == CONTROL:
            raise ValueError(f"{where}: the control topic always has one partition (every reader needs one order of "
                             "its records); leave it out")
        if key != DEFAULT and key not in DATA_TOPICS:
            known = ", ".join(json.dumps(name) for name in (DEFAULT, *DATA_TOPICS))
            raise ValueError(f"{where} names no topic of the pipeline; known: {known} (names after the prefix)")
        _count(count, where)
    default = table.get(DEFAULT, DEFAULT_PARTITIONS)
    overrides = tuple((name, table[name]) for name in DATA_TOPICS if table.get(name, default) != default)
    return ((DEFAULT, default), *overrides) if overrides else default


def _count(value, where: str, alternative: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        raise ValueError(f"{where} must be an integer >= 1 and <= {MAX_PARTITIONS}{alternative}, got {value!r}")
    return value


def _toml_key(key) -> str:
    """``key`` as TOML writes it: bare when it can be, else quoted (a topic name has dots)."""
    text = str(key)
    return text if text and text.replace("-", "").replace("_", "").isalnum() and text.isascii() else json.dumps(text)


# --------------------------------------------------------------------------- creation


def ensure_topics(bootstrap: str, config: TopicConfig = TopicConfig(), timeout: float = 30.0) -> dict[str, int]:
    """Create the missing topics and check all of them; return ``{name: partitions}`` as the broker has them.

    Idempotent: topics that already exist are left alone. A data topic with more partitions than
    configured (an operator's expansion) is used as it is, with a warning; :class:`TopicConfigError`
    when a topic exists with a layout the pipeline cannot use (see the module docstring). Synchronous
    wrapper for the CLI; inside a running event loop await :func:`ensure_topics_async`.
    """
    return asyncio.run(ensure_topics_async(bootstrap, config, timeout))


async def ensure_topics_async(
    bootstrap: str, config: TopicConfig = TopicConfig(), timeout: float = 30.0
) -> dict[str, int]:
    """Async form of :func:`ensure_topics`."""
    specs = config.specs()
    async with _admin(bootstrap, timeout) as admin:
        existing = set(await admin.list_topics())
        missing = [spec for spec in specs if spec.name not in existing]
        if missing:
            await _create(admin, missing, timeout)
        counts = await _wait_for_partitions(admin, [spec.name for spec in specs], timeout)
        _check_partition_counts(specs, counts, config.prefix)
        await _warn_about_missing_configs(admin, specs)
        return counts


def existing_topics(bootstrap: str, timeout: float = 30.0) -> set[str]:
    """The names of the topics the broker has; asking creates none (unlike a client's metadata request)."""
    async def listing() -> set[str]:
        async with _admin(bootstrap, timeout) as admin:
            return set(await admin.list_topics())

    return asyncio.run(listing())


@contextlib.asynccontextmanager
async def _admin(bootstrap: str, timeout: float) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client; an unreachable broker is a :class:`TopicConfigError` naming it (and the security)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="fairstream-admin", request_timeout_ms=int(timeout * 1000),
        **aiokafka_options(),
    )
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        await admin.close()
        protocol = active().protocol
        via = "" if protocol == "PLAINTEXT" else f" over {protocol} (check the [kafka] settings and credentials)"
        raise TopicConfigError(f"cannot reach a Kafka broker at {bootstrap}{via}: {exc}") from exc
    try:
        yield admin
    finally:
        await admin.close()


async def _create(admin: AIOKafkaAdminClient, specs: list[TopicSpec], timeout: float) -> None:
    errors = await _send_create(admin, specs, timeout)
    rejected = [spec for spec in specs if errors.get(spec.name) in _CONFIG_REJECTED and spec.configs]
    if rejected:
        for spec in rejected:
            log.warning(
                "broker rejected configs %s for topic %s (%s); creating it without them",
                spec.configs, spec.name, for_code(errors[spec.name]).__name__,
            )
        plain = [TopicSpec(spec.name, spec.partitions, spec.replication) for spec in rejected]
        errors.update(await _send_create(admin, plain, timeout))
    _raise_on_create_errors(errors)
    for spec in specs:
        if errors.get(spec.name) == 0:
            log.info("created topic %s (%d partitions, configs %s)", spec.name, spec.partitions, spec.configs)


async def _send_create(admin: AIOKafkaAdminClient, specs: list[TopicSpec], timeout: float) -> dict[str, int]:
    new_topics = [NewTopic(s.name, s.partitions, s.replication, topic_configs=s.configs) for s in specs]
    response = await admin.create_topics(new_topics, timeout_ms=int(timeout * 1000))
    # Each entry starts (name, error_code[, message]) in every CreateTopicsResponse version.
    return {entry[0]: entry[1] for entry in response.topic_errors}


def _raise_on_create_errors(errors: dict[str, int]) -> None:
    # TOPIC_ALREADY_EXISTS is success here: another worker created it between our list and create.
    failed = {name: code for name, code in errors.items() if code not in (0, _TOPIC_ALREADY_EXISTS)}
    if failed:
        details = ", ".join(f"{name}: {for_code(code).__name__}" for name, code in failed.items())
        raise TopicConfigError(f"could not create topics: {details}")


async def _wait_for_partitions(admin: AIOKafkaAdminClient, names: list[str], timeout: float) -> dict[str, int]:
    """Partition counts once every topic is in metadata with a leader for each partition."""
    deadline = time.monotonic() + timeout
    while True:
        described = await admin.describe_topics(names)
        counts = {t["topic"]: len(t["partitions"]) for t in described if _is_ready(t)}
        if len(counts) == len(names):
            return counts
        if time.monotonic() >= deadline:
            pending = sorted(set(names) - set(counts))
            raise TopicConfigError(f"topics not ready after {timeout:.0f}s: {pending}")
        await asyncio.sleep(0.1)


def _is_ready(topic: dict) -> bool:
    partitions = topic.get("partitions") or []
    return (
        topic.get("error_code", 0) == 0
        and bool(partitions)
        and all(p.get("error_code", 0) == 0 and p.get("leader", -1) >= 0 for p in partitions)
    )


def _check_partition_counts(specs: list[TopicSpec], counts: dict[str, int], prefix: str) -> None:
    """Refuse the layouts the pipeline cannot use; warn about data topics an operator expanded."""
    wrong = []
    for spec in specs:
        count = counts[spec.name]
        if spec.teams and count != spec.partitions:
            log.info("topic %s is the team's own, with %d partitions: used as it is (the config's %d are for a topic "
                     "fairstream creates)", spec.name, count, spec.partitions)
        elif count > spec.partitions and spec.may_grow:
            log.warning("topic %s has %d partitions, more than the %d configured: used as expanded by an operator (the "
                        "workers take every partition); say so in the config's [topics] partitions table: %s = %d",
                        spec.name, count, spec.partitions, _toml_key(spec.name.removeprefix(f"{prefix}.")), count)
        elif count > spec.partitions:
            wrong.append(f"{spec.name} has {count} partitions, and must have exactly {spec.partitions}: every reader "
                         "needs one order of its records")
        elif count < spec.partitions:
            wrong.append(f"{spec.name} has {count} partitions, fewer than the {spec.partitions} configured: Kafka "
                         "cannot remove partitions, so it was created with another layout; add partitions "
                         f"(kafka-topics.sh --alter --partitions {spec.partitions}) or configure {count}")
    if wrong:
        raise TopicConfigError("topics exist with a layout the pipeline cannot use: " + "; ".join(wrong))


async def _warn_about_missing_configs(admin: AIOKafkaAdminClient, specs: list[TopicSpec]) -> None:
    """Warn, not fail, when a topic lacks a config it asked for: the pipeline still works without it."""
    wanted = {spec.name: spec.configs for spec in specs if spec.configs}
    if not wanted:
        return
    try:
        actual = await describe_topic_configs(admin, list(wanted))
    except Exception as exc:  # brokers without DescribeConfigs: cannot check, say so
        log.warning("could not read topic configs to check %s: %s", sorted(wanted), exc)
        return
    for name, configs in wanted.items():
        for key, value in configs.items():
            if actual.get(name, {}).get(key) != value:
                log.warning(
                    "topic %s has %s=%s, wanted %s; readers must still keep only the newest value per key",
                    name, key, actual.get(name, {}).get(key), value,
                )


async def describe_topic_configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    """``{topic: {config: value}}`` as the broker reports it."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    result: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for error_code, _message, _type, name, entries, *_ in response.resources:
            if error_code:
                raise TopicConfigError(f"describe configs of {name}: {for_code(error_code).__name__}")
            # Entries start (name, value, ...) in every DescribeConfigsResponse version.
            result[name] = {entry[0]: entry[1] for entry in entries}
    return result
