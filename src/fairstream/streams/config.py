"""Pipeline configuration: which fields a record has, which groups exist, which artifacts apply.

One TOML file describes a pipeline (``deploy/pipeline.adult.toml`` is the example):

.. code-block:: toml

    [pipeline]
    name = "adult"
    features = ["age", "hours-per-week"]
    groups = [0, 1]          # values of the protected attribute s
    strata = [0, 1]          # values of the unprotected attribute u
    s_name = "sex"
    u_name = "education-num > 9"
    label = true             # records may carry y

    [pipeline.valid_ranges]  # values outside these are dead-lettered, whatever the plan's policy
    age = [0, 120]
    hours-per-week = [0, 168]

    [topics]
    prefix = "fairstream"
    partitions = 4           # or per topic: { default = 4, "records.in" = 12 }

    [agents.records]
    artifact = "plan"        # or a chain applied in order: ["flow", "scorer"], ["plan", "scorer"]
    batch_size = 1000

    [agents.embeddings]
    artifact = "identity"    # or "embedding"
    dimension = 8

    [delivery]
    guarantee = "at_least_once"  # or "exactly_once": one Kafka transaction per batch (Apache Kafka only)

Every key has a type and a valid range, declared once on the dataclass fields below (``Annotated``
with :class:`msgspec.Meta`): msgspec checks them, and :func:`reference_markdown` renders them as the
configuration reference (docs/reference/configuration.md). A mistake is one :class:`ConfigError` naming the file, the key,
what was expected and what was found.

Records on ``records.in`` are JSON objects ``{"id", "ts", "features": {...}, "s", "u", "y"?}``;
anything else is dead-lettered with a reason. A ``[mapping]`` table reads a team's own records instead
(each role at a field path, everything else passed through; :mod:`fairstream.streams.mapping`), and
``[output]`` says where a mapped record's output puts what fairstream adds.
"""

from __future__ import annotations

import functools
import json
import math
import tomllib
import typing
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import Meta

from fairstream.models.kinds import DEFAULT_KIND, capabilities, chain_problem, chain_writes, kinds_for, reads_carried
from fairstream.repair.protocol import PipelineSchema

from .kafka import MECHANISMS, PROTOCOLS
from .mapping import REFERENCE as MAPPING_REFERENCE
from .mapping import MappingError, OutputLayout, RecordMapping, check_layout, mapping_table, parse_mapping
from .topics import TopicConfig


class ConfigError(ValueError):
    """The pipeline configuration is invalid; the message names the file, the key, what was expected and found."""


# --------------------------------------------------------------------------- types with their valid ranges
# ``Meta.extra["expected"]`` words a compound type for messages and the reference; scalar types
# are worded from their constraints (see _expected).

_NAME_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"  # Kafka topic/group characters, no empty dot segments
Label = Union[int, str]
Features = Annotated[tuple[Annotated[str, Meta(min_length=1)], ...], Meta(
    min_length=1, extra={"expected": "a non-empty list of distinct, non-empty names", "type": "list of strings"})]
Labels = Annotated[tuple[Label, ...], Meta(
    min_length=1, extra={"expected": "a non-empty list of distinct integers or strings",
                         "type": "list of integers or strings"})]
Ranges = Annotated[dict[str, tuple[float, float]], Meta(
    extra={"expected": "a table of feature = [min, max] (numbers, min <= max; inf for no bound)",
           "type": "table", "range": "keys: configured features"})]
RecordChain = Annotated[Union[Annotated[str, Meta(min_length=1)], tuple[Annotated[str, Meta(min_length=1)], ...]],
                        Meta(extra={
    "expected": f"an artifact kind ({', '.join(map(repr, kinds_for('records')))}) or a list of distinct "
                "kinds in chain order (repair, then score, then post), each reading only what the record or an "
                "earlier kind provides ([]: none, the pipeline monitors what its records carry)",
    "type": "string or list of strings"})]
"""The record chain: its kinds are checked against the registry (:func:`fairstream.models.kinds.chain_problem`)."""
IDENTITY = "identity"
"""``agents.embeddings.artifact`` of no module: vectors are L2-normalised only."""
STATISTICS = ("dependence_e", "w1", "dp_difference", "dp_ratio", "conditional_dp", "eopp", "mdp", "otf")
"""Statistics the drift detector can watch (after the chain); each has an after/all/all/all gauge row."""
CARRIED_ROLES = ("score", "decision")
"""Mapped roles that are a record's own model's columns, named as the columns a chain writes (see ``carried``)."""
STATISTIC_NEEDS = {"dp_difference": {"decision"}, "dp_ratio": {"decision"}, "conditional_dp": {"decision"},
                   "eopp": {"decision"}, "mdp": {"score", "counterparts"}, "otf": {"score"}}
"""What a statistic needs of the record chain (its capabilities): the columns it writes
(:func:`fairstream.models.kinds.chain_writes`): DP and EOpp measure its decisions, OTF its scores; MDP,
f(x) - f(T(x)), scores counterparts too, so its score module must match them (``counterparts``). The others
(dependence_e, w1) measure the features."""
Statistics = Annotated[Union[Literal[STATISTICS], tuple[Literal[STATISTICS], ...]], Meta(extra={
    "expected": f"a statistic ({', '.join(map(repr, STATISTICS))}) or a non-empty list of distinct ones",
    "type": "string or list of strings"})]
ShadowStatistics = Annotated[Union[Literal[STATISTICS], tuple[Literal[STATISTICS], ...]], Meta(extra={
    "expected": f"a statistic ({', '.join(map(repr, STATISTICS))}) or a list of distinct ones ([]: the monitor's)",
    "type": "string or list of strings"})]
GUARANTEES = ("at_least_once", "exactly_once")
"""How often a consumed record's outputs reach the output topics (``delivery.guarantee``)."""
PROMOTIONS = ("auto", "shadow", "approve")
"""How a published candidate comes to serve (``pipeline.promotion``)."""
Threshold = Annotated[float, Meta(gt=0, le=1e6)]
Thresholds = Annotated[Union[Threshold, dict[str, Threshold]], Meta(extra={
    "expected": "a number in (0, 1e6], or a table of statistic = number for every monitored statistic",
    "type": "number or table"})]
Port = Union[Annotated[int, Meta(ge=0, le=65535)], Literal["off"]]


def _doc(text: str) -> dict:
    return {"doc": text}


# --------------------------------------------------------------------------- sections


class _Section:
    """Checks every field of a config dataclass against its annotated type at construction."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name not in _NESTED:
                object.__setattr__(self, f.name, check_value(getattr(self, f.name), _hints(type(self))[f.name],
                                                             f"{self.section}.{f.name}"))


@dataclass(frozen=True)
class AgentConfig(_Section):
    """Batching and the artifact kind one agent applies.

    Parameters
    ----------
    artifact : str or tuple of str
        Artifact kind the agent applies, or a chain applied in order (e.g. ["flow", "scorer"]); the columns its
        modules add are fields of every output record: a scorer's score and decision (a module after it, e.g.
        group thresholds, replaces the decision).
    batch_size : int, default=1000
        Most messages taken per batch. Valid: an integer >= 1 and <= 100000.
    batch_within : float, default=0.05
        Seconds to wait for a batch to fill before processing what is there. Valid: a number > 0 and <= 60.
    missing_s : str, default='dead_letter'
        Records without s: dead-lettered, or repaired under a drawn s. Valid: 'dead_letter' or 'impute'.
    """

    section: ClassVar[str] = "agents.records"
    artifact: RecordChain = field(metadata=_doc(
        "artifact kind the agent applies, or a chain applied in order (e.g. [\"flow\", \"scorer\"]); the columns "
        "its modules add are fields of every output record: a scorer's score and decision (a module after it, "
        "e.g. group thresholds, replaces the decision)"))
    batch_size: Annotated[int, Meta(ge=1, le=100_000)] = field(
        default=1000, metadata=_doc("most messages taken per batch"))
    batch_within: Annotated[float, Meta(gt=0, le=60)] = field(
        default=0.05, metadata=_doc("seconds to wait for a batch to fill before processing what is there"))
    missing_s: Literal["dead_letter", "impute"] = field(
        default="dead_letter", metadata=_doc("records without s: dead-lettered, or repaired under a drawn s"))

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "artifact", _check_chain(self.artifact, f"{self.section}.artifact"))

    @property
    def chain(self) -> tuple[str, ...]:
        """The artifact kinds applied to every batch, in order."""
        return self.artifact if isinstance(self.artifact, tuple) else (self.artifact,)


@dataclass(frozen=True)
class EmbeddingConfig(AgentConfig):
    """The embedding agent: the module it applies (or the identity) and the vector length.

    Parameters
    ----------
    artifact : str, default='identity'
        The identity (L2 normalisation) or the published embedding module.
    batch_size : int, default=1000
        Most messages taken per batch. Valid: an integer >= 1 and <= 100000.
    batch_within : float, default=0.05
        Seconds to wait for a batch to fill before processing what is there. Valid: a number > 0 and <= 60.
    missing_s : str, default='dead_letter'
        Records without s: dead-lettered, or repaired under a drawn s. Valid: 'dead_letter' or 'impute'.
    dimension : int, default=8
        Length of every vector. Valid: an integer >= 1 and <= 65536.
    far : float, default=0.001
        False accept rate at which the verification monitor sets each embedding module version's threshold, on
        the pooled impostor pairs of its window (FNMR, BFAR and BFRR are reported there). Valid: a number > 0
        and < 1.
    reference_vectors : int, default=200
        Labelled vectors kept per group, each new labelled vector is paired with these for FAR/FNMR. Valid: an
        integer >= 1 and <= 100000.
    bfar_threshold : float, default=2.0
        BFAR (max over geometric mean of the groups' FARs) above which the embeddings count as unfair (alert).
        Valid: a number >= 1 and <= 1000000.
    """

    section: ClassVar[str] = "agents.embeddings"
    artifact: Literal[(IDENTITY, *kinds_for("embeddings"))] = field(
        default=IDENTITY, metadata=_doc("the identity (L2 normalisation) or the published embedding module"))
    dimension: Annotated[int, Meta(ge=1, le=65_536)] = field(default=8, metadata=_doc("length of every vector"))
    far: Annotated[float, Meta(gt=0, lt=1)] = field(default=1e-3, metadata=_doc(
        "false accept rate at which the verification monitor sets each embedding module version's threshold, "
        "on the pooled impostor pairs of its window (FNMR, BFAR and BFRR are reported there)"))
    reference_vectors: Annotated[int, Meta(ge=1, le=100_000)] = field(default=200, metadata=_doc(
        "labelled vectors kept per group, each new labelled vector is paired with these for FAR/FNMR"))
    bfar_threshold: Annotated[float, Meta(ge=1, le=1e6)] = field(default=2.0, metadata=_doc(
        "BFAR (max over geometric mean of the groups' FARs) above which the embeddings count as unfair (alert)"))

    def __post_init__(self) -> None:
        _Section.__post_init__(self)  # one module, checked by its Literal: no chain to check

    @property
    def chain(self) -> tuple[str, ...]:
        """The artifact kinds applied to every vector: none for the identity, else the configured module."""
        return () if self.artifact == IDENTITY else (self.artifact,)


def statistic_names(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """A statistic key's value as names in order: one name, or a list of them."""
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class MonitorConfig(_Section):
    """The fairness monitor: windows, drift detection, the metrics endpoint, and re-fit requests.

    Parameters
    ----------
    metrics_port : int or "off", default=0
        The worker's Prometheus /metrics port: 0 = any free port (logged), "off" = no endpoint; `fairstream
        worker --metrics-port` overrides it per worker. Valid: an integer >= 0 and <= 65535 or 'off'.
    window_records : int, default=8000
        Count-based window of the statistics. Valid: an integer >= 1 and <= 10000000.
    window_seconds : float, default=120.0
        Time-based window of the statistics. Valid: a number > 0 and <= 604800.
    buckets : int, default=10
        Windows slide by 1/buckets of their length; at most window_records. Valid: an integer >= 1 and <= 1000.
    statistic : str or tuple of str, default='dependence_e'
        The statistic(s) after the chain fed to drift detectors, one detector each; decision statistics (dp_*,
        conditional_dp, eopp) need a chain that writes a decision (its last module's: a scorer's, or group
        thresholds after it), mdp and otf one that writes a score (mdp: by a scorer that carries a group map),
        eopp needs labels. Valid: a statistic ('dependence_e', 'w1', 'dp_difference', 'dp_ratio',
        'conditional_dp', 'eopp', 'mdp', 'otf') or a non-empty list of distinct ones.
    detector : str, default='adwin'
        River drift detector. Valid: 'adwin', 'page_hinkley' or 'kswin'.
    threshold : float or dict, default=0.1
        Fairness gap above which a statistic counts as unfair (dp_ratio: 1 - ratio); the alert rules are
        rendered from these values (`fairstream alerts`). Valid: a number in (0, 1e6], or a table of statistic =
        number for every monitored statistic.
    cooldown_seconds : float, default=60.0
        Hysteresis: at most one drift event per cooldown. Valid: a number >= 0 and <= 86400.
    min_records : int, default=500
        No statistic is reported before the window holds this many records; at most window_records. Valid: an
        integer >= 1 and <= 10000000.
    max_event_time_skew : float, default=60.0
        Seconds a record's ts may be from the worker's clock (either way); the time window files a record with a
        ts further off at its arrival time (Kafka timestamp, else now) and counts it
        (fairstream_records_event_time_skewed_total); at most window_seconds. Valid: a number > 0 and <= 604800.
    slice_seconds : float, default=1.0
        The pipeline's statistics are counted in slices of this much event time: the unit of the workers' partial
        aggregates, of the monitoring agent's windows and of its detectors' chunks (a slice reaches the detectors
        whole: for drift seen within seconds, a slice should hold at most window_records / 16 records). Valid: a
        number > 0 and <= 3600.
    lateness_seconds : float, default=2.0
        The agent closes a slice (it joins the windows and the detectors) once no partial for it arrived for this
        long and every slice before it has closed; a later partial is counted as late. Valid: a number >= 0 and <=
        3600.
    stats_seconds : float, default=1.0
        A worker sends its partial aggregates to the stats topic at most this often (and when its partitions are
        revoked). Valid: a number > 0 and <= 60.
    sample_share : float, default=0.125
        Share of the records, chosen by a hash of their key (the same records whatever worker reads them), on which
        the statistics that need extra scorer calls are measured: MDP and the classifier alone. Valid: a number > 0
        and <= 1.
    min_group_records : int, default=30
        A window holding fewer records of a configured group does not report the statistics between groups (they
        are exported as unmeasurable, with the reason). Valid: an integer >= 1 and <= 10000000.
    worker_statistics : bool, default=True
        A worker also keeps windows of its own records and exports them (scope="worker": a diagnostic of its
        partitions); false: it only counts for the pipeline's monitoring agent, which spares about a fifth of the
        monitor's CPU.
    """

    section: ClassVar[str] = "monitor"
    metrics_port: Port = field(default=0, metadata=_doc(
        "the worker's Prometheus /metrics port: 0 = any free port (logged), \"off\" = no endpoint; "
        "`fairstream worker --metrics-port` overrides it per worker"))
    window_records: Annotated[int, Meta(ge=1, le=10_000_000)] = field(
        default=8000, metadata=_doc("count-based window of the statistics"))
    window_seconds: Annotated[float, Meta(gt=0, le=604_800)] = field(
        default=120.0, metadata=_doc("time-based window of the statistics"))
    buckets: Annotated[int, Meta(ge=1, le=1000)] = field(
        default=10, metadata=_doc("windows slide by 1/buckets of their length; at most window_records"))
    statistic: Statistics = field(default="dependence_e", metadata=_doc(
        "the statistic(s) after the chain fed to drift detectors, one detector each; decision statistics "
        "(dp_*, conditional_dp, eopp) need a chain that writes a decision (its last module's: a scorer's, or group "
        "thresholds after it), mdp and otf one that writes a score (mdp: by a scorer that carries a group map), "
        "eopp needs labels"))
    detector: Literal["adwin", "page_hinkley", "kswin"] = field(default="adwin", metadata=_doc("river drift detector"))
    threshold: Thresholds = field(default=0.1, metadata=_doc(
        "fairness gap above which a statistic counts as unfair (dp_ratio: 1 - ratio); the alert rules are "
        "rendered from these values (`fairstream alerts`)"))
    cooldown_seconds: Annotated[float, Meta(ge=0, le=86_400)] = field(
        default=60.0, metadata=_doc("hysteresis: at most one drift event per cooldown"))
    min_records: Annotated[int, Meta(ge=1, le=10_000_000)] = field(
        default=500, metadata=_doc("no statistic is reported before the window holds this many records; "
                                   "at most window_records"))
    max_event_time_skew: Annotated[float, Meta(gt=0, le=604_800)] = field(default=60.0, metadata=_doc(
        "seconds a record's ts may be from the worker's clock (either way); the time window files a record with a "
        "ts further off at its arrival time (Kafka timestamp, else now) and counts it "
        "(fairstream_records_event_time_skewed_total); at most window_seconds"))
    slice_seconds: Annotated[float, Meta(gt=0, le=3600)] = field(default=1.0, metadata=_doc(
        "the pipeline's statistics are counted in slices of this much event time: the unit of the workers' partial "
        "aggregates, of the monitoring agent's windows and of its detectors' chunks (a slice reaches the detectors "
        "whole: for drift seen within seconds, a slice should hold at most window_records / 16 records)"))
    lateness_seconds: Annotated[float, Meta(ge=0, le=3600)] = field(default=2.0, metadata=_doc(
        "the agent closes a slice (it joins the windows and the detectors) once no partial for it arrived for this "
        "long and every slice before it has closed; a later partial is counted as late"))
    stats_seconds: Annotated[float, Meta(gt=0, le=60)] = field(default=1.0, metadata=_doc(
        "a worker sends its partial aggregates to the stats topic at most this often (and when its partitions are "
        "revoked)"))
    sample_share: Annotated[float, Meta(gt=0, le=1)] = field(default=0.125, metadata=_doc(
        "share of the records, chosen by a hash of their key (the same records whatever worker reads them), on "
        "which the statistics that need extra scorer calls are measured: MDP and the classifier alone"))
    min_group_records: Annotated[int, Meta(ge=1, le=10_000_000)] = field(default=30, metadata=_doc(
        "a window holding fewer records of a configured group does not report the statistics between groups (they "
        "are exported as unmeasurable, with the reason)"))
    worker_statistics: bool = field(default=True, metadata=_doc(
        "a worker also keeps windows of its own records and exports them (scope=\"worker\": a diagnostic of its "
        "partitions); false: it only counts for the pipeline's monitoring agent, which spares about a fifth of the "
        "monitor's CPU"))

    def __post_init__(self) -> None:
        if isinstance(self.threshold, tuple):  # the stored form (a copy made by replace) reads back
            object.__setattr__(self, "threshold", dict(self.threshold))
        super().__post_init__()
        # Either would silently disable the monitor: the window never reaches min_records, or a bucket is empty.
        for key in ("min_records", "buckets"):
            if getattr(self, key) > self.window_records:
                raise ConfigError(f"monitor.{key} must be at most monitor.window_records ({self.window_records}), "
                                  f"got {getattr(self, key)!r}")
        # A believed ts further ahead than the window would leave every batch after it out of the window.
        if self.max_event_time_skew > self.window_seconds:
            raise ConfigError(f"monitor.max_event_time_skew must be at most monitor.window_seconds "
                              f"({self.window_seconds!r}), got {self.max_event_time_skew!r}")
        statistics = statistic_names(self.statistic)
        if not statistics or len(set(statistics)) != len(statistics):
            raise ConfigError(f"monitor.statistic must be {_expected(_hints(MonitorConfig)['statistic'])}, "
                              f"got {_found(self.statistic)}")
        object.__setattr__(self, "statistic", statistics if len(statistics) > 1 else statistics[0])
        if isinstance(self.threshold, dict):
            unknown = sorted(set(self.threshold) - set(statistics))
            missing = sorted(set(statistics) - set(self.threshold))
            if unknown or missing:
                raise ConfigError(f"monitor.threshold must give a number for every monitored statistic "
                                  f"{list(statistics)}: " + "; ".join(
                                      ([f"missing {missing}"] if missing else []) + ([f"unknown {unknown}"] if unknown
                                                                                    else [])))
            # Hashable and in statistic order, so equal configs compare equal.
            object.__setattr__(self, "threshold", tuple((name, self.threshold[name]) for name in statistics))

    @property
    def statistics(self) -> tuple[str, ...]:
        """Every statistic a drift detector watches, in configured order."""
        return statistic_names(self.statistic)

    @property
    def thresholds(self) -> dict[str, float]:
        """The alert threshold of each monitored statistic (the one place the monitor and the alert rules read)."""
        if isinstance(self.threshold, tuple):
            return dict(self.threshold)
        return {name: float(self.threshold) for name in self.statistics}


@dataclass(frozen=True)
class ShadowConfig(_Section):
    """The shadow promotion policy: on how many live records and on what a candidate must beat the active chain.

    Parameters
    ----------
    min_records : int, default=2000
        Live records a candidate is measured on beside the active chain before the shadow policy decides. Valid:
        an integer >= 1 and <= 100000000.
    statistic : str or tuple of str, default=()
        The statistic(s) on which the candidate must beat the active chain; each needs what monitor.statistic
        needs of the chain; [] = monitor.statistic. Valid: a statistic ('dependence_e', 'w1', 'dp_difference',
        'dp_ratio', 'conditional_dp', 'eopp', 'mdp', 'otf') or a list of distinct ones ([]: the monitor's).
    min_improvement : float, default=0.0
        The candidate's value of every compared statistic must be lower than the active chain's by more than
        this. Valid: a number >= 0 and <= 1000000.
    max_accuracy_drop : float, default=0.02
        Guard with labels: the candidate's accuracy may be at most this much below the active chain's. Valid: a
        number >= 0 and <= 1.
    max_decision_rate_change : float, default=0.05
        Guard without labels: the candidate's overall decision rate may differ from the active chain's by at
        most this. Valid: a number >= 0 and <= 1.
    alpha : float, default=0.05
        The false-promotion rate the shadow policy allows: the chance of promoting a candidate that is not better
        by min_improvement, however often the evidence is checked (an anytime-valid test). Valid: a number > 0 and
        < 0.5.
    max_records : int, default=200000
        A candidate neither promoted nor retired after this many paired live records is retired. Valid: an integer
        >= 1 and <= 1000000000.
    """

    section: ClassVar[str] = "shadow"
    min_records: Annotated[int, Meta(ge=1, le=100_000_000)] = field(default=2000, metadata=_doc(
        "live records a candidate is measured on beside the active chain before the shadow policy decides"))
    statistic: ShadowStatistics = field(default=(), metadata=_doc(
        "the statistic(s) on which the candidate must beat the active chain; each needs what monitor.statistic "
        "needs of the chain; [] = monitor.statistic"))
    min_improvement: Annotated[float, Meta(ge=0, le=1e6)] = field(default=0.0, metadata=_doc(
        "the candidate's value of every compared statistic must be lower than the active chain's by more than this"))
    max_accuracy_drop: Annotated[float, Meta(ge=0, le=1)] = field(default=0.02, metadata=_doc(
        "guard with labels: the candidate's accuracy may be at most this much below the active chain's"))
    max_decision_rate_change: Annotated[float, Meta(ge=0, le=1)] = field(default=0.05, metadata=_doc(
        "guard without labels: the candidate's overall decision rate may differ from the active chain's by at "
        "most this"))
    alpha: Annotated[float, Meta(gt=0, lt=0.5)] = field(default=0.05, metadata=_doc(
        "the false-promotion rate the shadow policy allows: the chance of promoting a candidate that is not better "
        "by min_improvement, however often the evidence is checked (an anytime-valid test)"))
    max_records: Annotated[int, Meta(ge=1, le=1_000_000_000)] = field(default=200_000, metadata=_doc(
        "a candidate neither promoted nor retired after this many paired live records is retired"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(set(self.statistics)) != len(self.statistics):
            raise ConfigError(f"shadow.statistic must be {_expected(_hints(ShadowConfig)['statistic'])}, "
                              f"got {_found(self.statistic)}")

    @property
    def statistics(self) -> tuple[str, ...]:
        """The configured statistics in order (empty: the monitor's)."""
        return statistic_names(self.statistic)


@dataclass(frozen=True)
class KafkaConfig(_Section):
    """How every client authenticates and encrypts (see :mod:`fairstream.streams.kafka`); never the password itself.

    Parameters
    ----------
    security_protocol : str, default='PLAINTEXT'
        Kafka security protocol of every client (worker, control, replay, re-fit, CLI). Valid: 'PLAINTEXT',
        'SSL', 'SASL_PLAINTEXT' or 'SASL_SSL'.
    sasl_mechanism : str, default='PLAIN'
        SASL mechanism (SASL_* protocols). Valid: 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'.
    sasl_username : str, default=''
        SASL user.
    sasl_password_file : str, default=''
        File holding the SASL password (a mounted secret); $FAIRSTREAM_KAFKA_SASL_PASSWORD takes precedence.
    ssl_cafile : str, default=''
        CA bundle to verify the brokers (SSL protocols).
    ssl_certfile : str, default=''
        Client certificate (mutual TLS), with ssl_keyfile.
    ssl_keyfile : str, default=''
        The client certificate's key.
    """

    section: ClassVar[str] = "kafka"
    security_protocol: Literal[PROTOCOLS] = field(default="PLAINTEXT", metadata=_doc(
        "Kafka security protocol of every client (worker, control, replay, re-fit, CLI)"))
    sasl_mechanism: Literal[MECHANISMS] = field(default="PLAIN", metadata=_doc("SASL mechanism (SASL_* protocols)"))
    sasl_username: str = field(default="", metadata=_doc("SASL user"))
    sasl_password_file: str = field(default="", metadata=_doc(
        "file holding the SASL password (a mounted secret); $FAIRSTREAM_KAFKA_SASL_PASSWORD takes precedence"))
    ssl_cafile: str = field(default="", metadata=_doc("CA bundle to verify the brokers (SSL protocols)"))
    ssl_certfile: str = field(default="", metadata=_doc("client certificate (mutual TLS), with ssl_keyfile"))
    ssl_keyfile: str = field(default="", metadata=_doc("the client certificate's key"))


@dataclass(frozen=True)
class DeliveryConfig(_Section):
    """What the workers promise about each record's outputs: at least once, or exactly once (Kafka transactions).

    Parameters
    ----------
    guarantee : str, default='at_least_once'
        "at_least_once": a batch's outputs are acknowledged before its offsets are committed, and a crash or a
        rebalance replays the batch (its duplicates are identical: de-duplicate by id and input_digest);
        "exactly_once": a batch's outputs, dead letters and offsets are one Kafka transaction, so readers with
        isolation.level=read_committed see each output once (Apache Kafka only, not the embedded broker;
        agents.*.batch_size is the transaction's size). Valid: 'at_least_once' or 'exactly_once'.
    """

    section: ClassVar[str] = "delivery"
    guarantee: Literal[GUARANTEES] = field(default="at_least_once", metadata=_doc(
        "\"at_least_once\": a batch's outputs are acknowledged before its offsets are committed, and a crash or "
        "a rebalance replays the batch (its duplicates are identical: de-duplicate by id and input_digest); "
        "\"exactly_once\": a batch's outputs, dead letters and offsets are one Kafka transaction, so readers with "
        "isolation.level=read_committed see each output once (Apache Kafka only, not the embedded broker; "
        "agents.*.batch_size is the transaction's size)"))


@dataclass(frozen=True)
class SchemaRegistryConfig(_Section):
    """The schema registry of Avro topics (``[topics] format = "avro"``): a Confluent Schema Registry API.

    Parameters
    ----------
    url : str, default='http://127.0.0.1:8081'
        Base URL of the Confluent-compatible API (Confluent Schema Registry; Apicurio Registry serves it under
        /apis/ccompat/v7, as ``fairstream schema-registry start`` prints). Valid: an http:// or https:// URL.
    """

    section: ClassVar[str] = "schema_registry"
    url: Annotated[str, Meta(pattern=r"^https?://[^\s]+$", extra={
        "expected": "an http:// or https:// URL", "type": "string"})] = field(
        default="http://127.0.0.1:8081", metadata=_doc(
            "base URL of the Confluent-compatible API the Avro topics' schemas are read from and registered in "
            "(Confluent Schema Registry; Apicurio Registry serves it under /apis/ccompat/v7, as `fairstream "
            "schema-registry start` prints)"))


# TopicConfig lives in topics.py (the admin code uses it without a pipeline); its keys' types and
# ranges are stated here, checked when a pipeline is built, and listed in the reference.
TOPIC_KEYS: dict[str, tuple[Any, str]] = {
    "prefix": (Annotated[str, Meta(pattern=_NAME_PATTERN, max_length=200, extra={
        "expected": "a topic name prefix of letters, digits, '_', '-' and inner dots (at most 200 characters)",
        "type": "string"})], "every topic is named <prefix>.<topic>"),
    "partitions": (Annotated[int, Meta(ge=1, le=10_000, extra={
        "type": "integer or table",
        "range": "an integer >= 1 and <= 10000, or a table of topic = count: { default = 4, \"records.in\" = 12 } "
                 "(keys: \"default\" and data topics by their name after the prefix)"})],
        "partitions of every data topic (control has one), or a table giving some their own count; a topic an "
        "operator expanded beyond its count is used as it is (with a warning), one with fewer partitions is refused"),
    "replication": (Annotated[int, Meta(ge=1, le=100)], "replication factor of every topic"),
    "input": (Annotated[str, Meta(pattern=r"^([A-Za-z0-9._-]{1,249})?$", extra={
        "expected": "a topic name of letters, digits, '.', '_' and '-' (at most 249 characters), or \"\"",
        "type": "string"})],
        "the input records' topic; \"\" = <prefix>.records.in. An existing topic is the team's: used with the "
        "partitions it has"),
    "output": (Annotated[str, Meta(pattern=r"^([A-Za-z0-9._-]{1,249})?$", extra={
        "expected": "a topic name of letters, digits, '.', '_' and '-' (at most 249 characters), or \"\"",
        "type": "string"})],
        "the repaired records' topic; \"\" = <prefix>.records.repaired. An existing topic is used with the "
        "partitions it has; outputs keep their input's key and partition"),
    "format": (Literal["json", "avro"], "the input and output topics' format: JSON, or Avro with a schema registry"),
}
PARTITION_TABLE = Annotated[dict[str, Annotated[int, Meta(ge=1, le=10_000)]], Meta(extra={
    "expected": "a table of topic = count (counts >= 1 and <= 10000; keys: \"default\" and data topics by their "
                "name after the prefix, e.g. \"records.in\")"})]
"""``topics.partitions`` as a table: TopicConfig then checks its keys (naming the one at fault)."""


def _topic_hint(key: str, value):
    """What ``topics.<key>`` = ``value`` is checked against: ``partitions`` is a count or a table of counts."""
    return PARTITION_TABLE if key == "partitions" and isinstance(value, dict) else TOPIC_KEYS[key][0]


@dataclass(frozen=True)
class PipelineConfig(_Section):
    """One pipeline: record fields, groups, strata, topics, agents and the monitor (from a TOML file).

    Parameters
    ----------
    name : str
        Pipeline name; the worker's default app id is <prefix>-<name>. Valid: a name of letters, digits, '_',
        '-' and inner dots (at most 200 characters).
    features : tuple of str
        Feature names of every record, in plan order. Valid: a non-empty list of distinct, non-empty names.
    groups : tuple of int or str
        Values of the protected attribute s. Valid: a non-empty list of distinct integers or strings.
    strata : tuple of int or str
        Values of the unprotected attribute u. Valid: a non-empty list of distinct integers or strings.
    s_name : str, default='s'
        What s means (for reports).
    u_name : str, default='u'
        What u means (for reports).
    label : bool, default=False
        Records may carry a label y (0 or 1).
    max_message_bytes : int, default=65536
        Larger input messages are dead-lettered. Valid: an integer >= 64 and <= 524288.
    include_original : bool, default=True
        Repaired records also carry the original features.
    artifact_dir : str, default='runs/artifacts'
        The content-addressed artifact store. Valid: a non-empty string.
    valid_ranges : dict, default={}
        Valid [min, max] of a feature (inclusive): values outside are dead-lettered whatever the plan's out-of-
        range policy; a feature without an entry is unbounded. Valid: keys: configured features.
    promotion : str, default='auto'
        How a re-fit artifact comes to serve: "auto" = as soon as its holdout validation passes; "shadow" =
        published as a candidate that every worker applies beside the active chain, promoted or retired by the
        [shadow] policy; "approve" = a candidate in shadow until a person runs `fairstream artifacts approve`
        (or `reject`). Valid: 'auto', 'shadow' or 'approve'.
    trust : str, default='none'
        The trust file naming the public keys that may sign control records and their roles (publisher,
        approver, operator, policy, requester); "none" = unsigned: anyone who can write the control topic can
        change what serves (the embedded default; a warning at start). Valid: a non-empty string.
    topics : TopicConfig, default=TopicConfig()
        ``[topics]``: topic prefix, partitions and replication.
    records : AgentConfig, default=AgentConfig(artifact="plan")
        ``[agents.records]``: the record agent's chain and batching.
    embeddings : EmbeddingConfig, default=EmbeddingConfig()
        ``[agents.embeddings]``: the embedding agent.
    monitor : MonitorConfig, default=MonitorConfig()
        ``[monitor]``: windows, drift detection, metrics, re-fit requests.
    shadow : ShadowConfig, default=ShadowConfig()
        ``[shadow]``: when a candidate in shadow is promoted or retired.
    kafka : KafkaConfig, default=KafkaConfig()
        ``[kafka]``: the brokers' security protocol and credentials.
    delivery : DeliveryConfig, default=DeliveryConfig()
        ``[delivery]``: at-least-once or exactly-once.
    mapping : RecordMapping or None, default=None
        ``[mapping]``: where each role is in a team's own records (:mod:`fairstream.streams.mapping`); None:
        records are the fairstream envelope.
    output : OutputLayout, default=OutputLayout()
        ``[output]``: where a mapped record's output puts what fairstream adds.
    schema_registry : SchemaRegistryConfig, default=SchemaRegistryConfig()
        ``[schema_registry]``: where Avro topics' schemas are (``[topics] format = "avro"``).
    """

    section: ClassVar[str] = "pipeline"
    name: Annotated[str, Meta(pattern=_NAME_PATTERN, max_length=200, extra={
        "expected": "a name of letters, digits, '_', '-' and inner dots (at most 200 characters)", "type": "string"})] \
        = field(metadata=_doc("pipeline name; the worker's default app id is <prefix>-<name>"))
    features: Features = field(metadata=_doc("feature names of every record, in plan order"))
    groups: Labels = field(metadata=_doc("values of the protected attribute s"))
    strata: Labels = field(metadata=_doc("values of the unprotected attribute u"))
    s_name: str = field(default="s", metadata=_doc("what s means (for reports)"))
    u_name: str = field(default="u", metadata=_doc("what u means (for reports)"))
    label: bool = field(default=False, metadata=_doc("records may carry a label y (0 or 1)"))
    # Outputs are about as large as inputs and must fit under the producer's 1 MiB request limit.
    max_message_bytes: Annotated[int, Meta(ge=64, le=512 * 1024)] = field(
        default=64 * 1024, metadata=_doc("larger input messages are dead-lettered"))
    include_original: bool = field(default=True, metadata=_doc("repaired records also carry the original features"))
    artifact_dir: Annotated[str, Meta(min_length=1)] = field(
        default="runs/artifacts", metadata=_doc("the content-addressed artifact store"))
    valid_ranges: Ranges = field(default=(), metadata=_doc(
        "valid [min, max] of a feature (inclusive): values outside are dead-lettered whatever the plan's "
        "out-of-range policy; a feature without an entry is unbounded"))
    promotion: Literal[PROMOTIONS] = field(default="auto", metadata=_doc(
        "how a re-fit artifact comes to serve: \"auto\" = as soon as its holdout validation passes; "
        "\"shadow\" = published as a candidate that every worker applies beside the active chain, promoted or "
        "retired by the [shadow] policy; \"approve\" = a candidate in shadow until a person runs "
        "`fairstream artifacts approve` (or `reject`)"))
    trust: Annotated[str, Meta(min_length=1)] = field(default="none", metadata=_doc(
        "the trust file naming the public keys that may sign control records and their roles (publisher, "
        "approver, operator, policy, requester); \"none\" = unsigned: anyone who can write the control topic can "
        "change what serves (the embedded default; a warning at start)"))
    topics: TopicConfig = field(default_factory=TopicConfig)
    records: AgentConfig = field(default_factory=lambda: AgentConfig(artifact=DEFAULT_KIND))
    embeddings: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    mapping: RecordMapping | None = None
    output: OutputLayout = field(default_factory=OutputLayout)
    schema_registry: SchemaRegistryConfig = field(default_factory=SchemaRegistryConfig)

    def __post_init__(self) -> None:
        if isinstance(self.valid_ranges, tuple):  # the stored form (a copy made by replace) reads back
            object.__setattr__(self, "valid_ranges", {name: bounds for name, bounds in self.valid_ranges})
        super().__post_init__()
        for key in ("features", "groups", "strata"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ConfigError(f"pipeline.{key} has duplicates: {list(values)}; expected "
                                  f"{_expected(_hints(PipelineConfig)[key])}")
        for key in ("groups", "strata"):
            _check_labels(getattr(self, key), f"pipeline.{key}")
        object.__setattr__(self, "valid_ranges", _check_ranges(self.valid_ranges, self.features))
        self._check_mapping()
        self._check_sections()

    def _check_mapping(self) -> None:
        """The mapping must map exactly this pipeline's features, and the output field must be a path of its own."""
        if not isinstance(self.output, OutputLayout):
            raise ConfigError(f"pipeline output must be an OutputLayout, got {self.output!r}")
        if self.mapping is None and self.topics.format == "avro":
            raise ConfigError('topics.format = "avro" reads a team\'s own records: add a [mapping] table saying where '
                              "each role is in them")
        if self.mapping is None:
            if self.output != OutputLayout():
                raise ConfigError("output: [output] places what fairstream adds to a mapped record: add a [mapping] "
                                  "table, or remove [output]")
            return
        mapped = tuple(name for name, _ in self.mapping.features)
        if mapped != tuple(self.features):
            raise ConfigError(f"mapping.features: maps {list(mapped)}, but pipeline.features is "
                              f"{list(self.features)}")
        try:
            check_layout(self.mapping, self.output)
        except MappingError as exc:
            raise ConfigError(str(exc)) from None

    def _check_sections(self) -> None:
        for name, cls in (("topics", TopicConfig), ("records", AgentConfig), ("embeddings", EmbeddingConfig),
                          ("monitor", MonitorConfig), ("shadow", ShadowConfig), ("kafka", KafkaConfig),
                          ("delivery", DeliveryConfig), ("schema_registry", SchemaRegistryConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"pipeline {name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        for key in TOPIC_KEYS:
            value = self.topics.partitions_setting if key == "partitions" else getattr(self.topics, key)
            check_value(value, _topic_hint(key, value), f"topics.{key}")
        problem = chain_problem(self.records.chain, self.carried)
        if problem is not None:  # agents.records alone allowed what a [mapping] may carry; this pipeline's does not
            raise ConfigError(f"agents.records.artifact must be {_expected(_hints(AgentConfig)['artifact'])} "
                              f"({problem}), got {_found(self.records.artifact)}; a [mapping] may map the records' own "
                              "score and decision (mapping.score, mapping.decision)")
        self._check_statistics("monitor.statistic", self.monitor.statistics)
        self._check_statistics("shadow.statistic", self.shadow.statistics)
        self._check_refits()

    def _check_refits(self) -> None:
        """A monitor-only pipeline (:attr:`refit_kind` None) has nothing to re-fit: settings that only govern a
        re-fit candidate are refused in one line naming the key."""
        if self.refit_kind is not None:
            return
        chain = f"agents.records.artifact = {list(self.records.chain)} only monitors, nothing is re-fitted"
        if self.promotion != "auto":
            raise ConfigError(f"pipeline.promotion = {self.promotion!r} governs re-fit candidates, but {chain}: "
                              "remove it (or set it to \"auto\")")
        changed = [f.name for f in fields(ShadowConfig) if getattr(self.shadow, f.name) != f.default]
        if changed:
            raise ConfigError(f"shadow.{changed[0]} governs a re-fit candidate's trial, but {chain}: remove [shadow]")

    def _check_statistics(self, key: str, names: tuple[str, ...]) -> None:
        """Each statistic must be computable on what the record chain writes (and eopp on labels)."""
        for name in names:
            missing = _chain_lacks(self.records.chain, STATISTIC_NEEDS.get(name, set()), self.carried)
            if missing:
                raise ConfigError(f"{key} {name!r} needs a record chain that {missing}, got "
                                  f"agents.records.artifact = {list(self.records.chain)}")
            if name == "eopp" and not self.label:
                raise ConfigError(f"{key} 'eopp' needs labelled records: set pipeline.label = true")

    @property
    def shadow_statistics(self) -> tuple[str, ...]:
        """The statistics a shadow candidate is compared on: shadow.statistic, else monitor.statistic."""
        return self.shadow.statistics or self.monitor.statistics

    def schema(self) -> PipelineSchema:
        """What this pipeline promises its modules (checked by every module at load time).

        Returns
        -------
        PipelineSchema
            The features, groups, strata, vector length and whether s is imputed.
        """
        return PipelineSchema(features=tuple(self.features), groups=tuple(self.groups), strata=tuple(self.strata),
                              dimension=self.embeddings.dimension, impute_s=self.imputes_s)

    @property
    def carried(self) -> frozenset:
        """What the records carry of their own model (:data:`CARRIED_ROLES` their [mapping] maps): the monitor
        reads them where no module of the chain writes them (a monitor-only pipeline), and group thresholds
        decide on the records' own score."""
        if self.mapping is None:
            return frozenset()
        return frozenset(role for role in CARRIED_ROLES if getattr(self.mapping, role) is not None)

    @property
    def app_id(self) -> str:
        """The app id the pipeline's workers share without ``--app-id``: ``<topic prefix>-<pipeline name>`` (their
        consumer groups, the monitoring agent's and the ACLs' principals are named after it)."""
        return f"{self.topics.prefix}-{self.name}"

    @property
    def refit_kind(self) -> str | None:
        """The kind the monitor's drift trigger asks to re-fit: the chain's repair stage (its first kind placed
        "repair"), else its first kind; None for a monitor-only pipeline (no chain, or only kinds that read what
        the records carry of their own model: nothing to re-fit)."""
        chain = self.records.chain
        if not chain or set(reads_carried(chain)) == set(chain):
            return None
        return next((kind for kind in chain if capabilities(kind).place == "repair"), chain[0])

    @property
    def imputes_s(self) -> bool:
        """Whether records without s are repaired under an imputed s (else dead-lettered)."""
        return self.records.missing_s == "impute"

    def range_bounds(self) -> tuple[list[float], list[float]]:
        """Lower and upper valid bounds per feature, in feature order (-inf/inf where none is declared)."""
        ranges = dict(self.valid_ranges)
        return ([ranges.get(n, (-math.inf, math.inf))[0] for n in self.features],
                [ranges.get(n, (-math.inf, math.inf))[1] for n in self.features])

    @classmethod
    def from_toml(cls, path: str | Path) -> "PipelineConfig":
        """Read and validate a pipeline TOML file; every error is a ConfigError that starts with the path.

        Parameters
        ----------
        path : str or pathlib.Path
            The pipeline TOML file (UTF-8).

        Returns
        -------
        PipelineConfig
            The validated configuration.
        """
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such pipeline config file") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the pipeline config: {exc.strerror or exc}") from None
        try:
            return cls.from_dict(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PipelineConfig":
        """Validate a parsed pipeline TOML document.

        Parameters
        ----------
        data : dict
            The parsed TOML document: tables ``pipeline``, ``topics``, ``agents``, ``monitor``, ``shadow``, ``kafka``
            and ``delivery``.

        Returns
        -------
        PipelineConfig
            The validated configuration.
        """
        known = {"pipeline", "topics", "agents", "monitor", "shadow", "kafka", "delivery", "mapping", "output",
                 "schema_registry"}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown top-level section(s): {sorted(unknown)}; known: {sorted(known)}")
        agents = _table(data, "agents")
        unknown_agents = set(agents) - {"records", "embeddings"}
        if unknown_agents:
            raise ConfigError(f"unknown agent section(s) {sorted(unknown_agents)}; known: ['embeddings', 'records']")
        pipeline = _known(cls, _table(data, "pipeline"), "pipeline")
        return cls(
            **pipeline,
            mapping=_mapping(data, pipeline), output=_output(_table(data, "output")),
            topics=_topics(_table(data, "topics")),
            records=AgentConfig(**_known(AgentConfig, {"artifact": "plan", **_table(agents, "records", "agents.")},
                                         "agents.records")),
            embeddings=EmbeddingConfig(**_known(EmbeddingConfig, _table(agents, "embeddings", "agents."),
                                                "agents.embeddings")),
            monitor=MonitorConfig(**_known(MonitorConfig, _table(data, "monitor"), "monitor")),
            shadow=ShadowConfig(**_known(ShadowConfig, _table(data, "shadow"), "shadow")),
            kafka=KafkaConfig(**_known(KafkaConfig, _table(data, "kafka"), "kafka")),
            delivery=DeliveryConfig(**_known(DeliveryConfig, _table(data, "delivery"), "delivery")),
            schema_registry=SchemaRegistryConfig(**_known(SchemaRegistryConfig, _table(data, "schema_registry"),
                                                          "schema_registry")),
        )

    def to_toml(self) -> str:
        """The configuration as TOML that :meth:`from_toml` reads back to an equal object.

        Returns
        -------
        str
            The TOML text, every key written explicitly.
        """
        pipeline = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NESTED}
        ranges = pipeline.pop("valid_ranges")
        monitor = _asdict(self.monitor)
        per_statistic = isinstance(self.monitor.threshold, tuple)  # a [monitor.threshold] table
        thresholds = {"monitor.threshold": dict(monitor.pop("threshold"))} if per_statistic else {}
        topics = {**_asdict(self.topics), "partitions": self.topics.partitions_setting}  # a number or an inline table
        sections = {"pipeline": pipeline, "pipeline.valid_ranges": dict(ranges), "topics": topics,
                    "agents.records": _asdict(self.records), "agents.embeddings": _asdict(self.embeddings),
                    "monitor": monitor, **thresholds, "shadow": _asdict(self.shadow), "kafka": _asdict(self.kafka),
                    "delivery": _asdict(self.delivery)}
        if self.mapping is not None:  # the envelope's configs stay as they were
            sections.update({"mapping": mapping_table(self.mapping), "output": _asdict(self.output)})
        if self.topics.format == "avro" or self.schema_registry != SchemaRegistryConfig():  # JSON configs as they were
            sections["schema_registry"] = _asdict(self.schema_registry)
        return "\n".join(f"[{name}]\n" + "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in values.items())
                         for name, values in sections.items())

    def with_topics(self, **changes) -> "PipelineConfig":
        """A copy with other topic settings."""
        return replace(self, topics=replace(self.topics, **changes))

    def with_monitor(self, **changes) -> "PipelineConfig":
        """A copy with other monitor settings."""
        return replace(self, monitor=replace(self.monitor, **changes))

    def with_shadow(self, **changes) -> "PipelineConfig":
        """A copy with other shadow policy settings."""
        return replace(self, shadow=replace(self.shadow, **changes))

    def with_delivery(self, **changes) -> "PipelineConfig":
        """A copy with another delivery guarantee."""
        return replace(self, delivery=replace(self.delivery, **changes))


_NESTED = ("topics", "records", "embeddings", "monitor", "shadow", "kafka", "delivery", "mapping", "output",
           "schema_registry")


def _mapping(data: dict, pipeline: dict) -> RecordMapping | None:
    """The ``[mapping]`` table, parsed against the pipeline's features and labels (checked after it)."""
    if "mapping" not in data:
        return None
    try:
        features = check_value(pipeline.get("features"), Features, "pipeline.features")
        groups = check_value(pipeline.get("groups"), Labels, "pipeline.groups")
        strata = check_value(pipeline.get("strata"), Labels, "pipeline.strata")
        return parse_mapping(_table(data, "mapping"), features, groups, strata)
    except MappingError as exc:
        raise ConfigError(str(exc)) from None


def _output(section: dict) -> OutputLayout:
    hints = {"repaired": Literal["in_place", "under"], "field": Annotated[str, Meta(min_length=1)],
             "provenance": Literal["field", "headers"]}
    unknown = set(section) - set(hints)
    if unknown:
        raise ConfigError(f"[output] has unknown key(s) {sorted(unknown)}; allowed: {sorted(hints)}")
    try:
        return OutputLayout(**{key: check_value(value, hints[key], f"output.{key}") for key, value in section.items()})
    except MappingError as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------- checking values


def check_value(value, hint, key: str):
    """``value`` converted to ``hint`` (lists to tuples, ints to floats), or a ConfigError naming ``key``."""
    try:
        converted = msgspec.convert(value, hint)
    except msgspec.ValidationError:
        raise ConfigError(f"{key} must be {_expected(hint)}, got {_found(value)}") from None
    if isinstance(converted, float) and not math.isfinite(converted):
        raise ConfigError(f"{key} must be {_expected(hint)}, got {_found(value)}")
    return converted


def _check_chain(artifact, key: str) -> str | tuple[str, ...]:
    """The record chain, as :func:`~fairstream.models.kinds.chain_problem` accepts it (one kind stays a string)."""
    chain = artifact if isinstance(artifact, tuple) else (artifact,)
    problem = chain_problem(chain, frozenset(CARRIED_ROLES))  # the pipeline checks what its records carry
    if problem is not None:
        raise ConfigError(f"{key} must be {_expected(_hints(AgentConfig)['artifact'])} ({problem}), "
                          f"got {_found(artifact)}")
    return chain if len(chain) != 1 else chain[0]


def _chain_lacks(chain: tuple[str, ...], needs: set, carried: frozenset = frozenset()) -> str | None:
    """What of ``needs`` (columns, or ``"counterparts"``) the record ``chain`` lacks, in words, or None; a column
    the records carry of their own model (``carried``: mapped) is there without a module.

    >>> _chain_lacks(("plan",), {"decision"})
    'writes a decision (it writes: features)'
    >>> _chain_lacks((), {"decision"}, frozenset({"decision"})) is None
    True
    """
    writes = chain_writes(chain)
    missing = sorted(needs - writes - carried - {"counterparts"})
    if missing:
        lacking = f"writes a {' and a '.join(missing)} (it writes: {', '.join(sorted(writes)) or 'nothing'})"
        return lacking if chain else f"{lacking}, or records that carry their own (mapping.{missing[0]})"
    if "counterparts" in needs and not any(capabilities(kind).counterparts for kind in chain):
        return "has a score module that matches counterparts (a group map)"
    return None


def _check_labels(labels: tuple, key: str) -> None:
    """Labels every record field can carry: 64-bit integers (the arrays' type) and Unicode text (JSON's)."""
    for label in labels:
        if isinstance(label, int) and not -(2**63) <= label < 2**63:
            raise ConfigError(f"{key}: label {label} does not fit a 64-bit integer")
        if isinstance(label, str) and not is_unicode(label):
            raise ConfigError(f"{key}: label {label!r} is not Unicode text (a lone surrogate)")


def is_unicode(text: str) -> bool:
    """Whether ``text`` has UTF-8 bytes (JSON text and record keys need them; a lone surrogate has none)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_ranges(ranges: dict, features: tuple) -> tuple:
    """The valid ranges in feature order, as hashable (name, (min, max)) pairs."""
    for name, (lo, hi) in ranges.items():
        if name not in features:
            raise ConfigError(f"pipeline.valid_ranges names {name!r}, which is not a configured feature "
                              f"{list(features)}")
        if math.isnan(lo) or math.isnan(hi) or lo > hi:
            raise ConfigError(f"pipeline.valid_ranges.{name} must be [min, max] with min <= max, got [{lo!r}, {hi!r}]")
    return tuple((name, tuple(ranges[name])) for name in features if name in ranges)


def _found(value) -> str:
    shown = repr(list(value) if isinstance(value, tuple) else value)
    return shown if len(shown) <= 200 else shown[:200] + "..."


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls, include_extras=True)


def _meta(hint) -> tuple[Any, list]:
    """The bare type of an ``Annotated`` hint and its Meta constraints."""
    if typing.get_origin(hint) is Annotated:
        base, *extras = typing.get_args(hint)
        return base, [m for m in extras if isinstance(m, Meta)]
    return hint, []


def _expected(hint) -> str:
    """What a value of ``hint`` must be, in words (for messages and the reference)."""
    base, metas = _meta(hint)
    for meta in metas:
        if meta.extra and "expected" in meta.extra:
            return meta.extra["expected"]
    if typing.get_origin(base) is Literal:
        return _choices(typing.get_args(base))
    if typing.get_origin(base) is Union:
        return " or ".join(_expected(arg) for arg in typing.get_args(base))
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(base, str(base))
    bounds = [f"{op} {_number(getattr(m, attr))}" for m in metas
              for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if getattr(m, attr) is not None]
    if base is str and any(m.min_length for m in metas):
        words = "a non-empty string"
    return words + (" " + " and ".join(bounds) if bounds else "")


def _choices(values) -> str:
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(value)


# --------------------------------------------------------------------------- reading TOML tables


def _table(data: dict, name: str, parent: str = "") -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{parent}{name}] must be a table, got {_found(value)}")
    return value


def _known(cls, section: dict, name: str) -> dict:
    allowed = {f.name for f in fields(cls)} - set(_NESTED)
    unknown = set(section) - allowed
    if unknown:
        raise ConfigError(f"[{name}] has unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for f in fields(cls):
        if f.name in allowed and f.default is MISSING and f.default_factory is MISSING and f.name not in section:
            raise ConfigError(f"{name}.{f.name} is required: {_expected(_hints(cls)[f.name])}")
    return section


def _topics(section: dict) -> TopicConfig:
    unknown = set(section) - set(TOPIC_KEYS)
    if unknown:
        raise ConfigError(f"[topics] has unknown key(s) {sorted(unknown)}; allowed: {sorted(TOPIC_KEYS)}")
    # Checked here first: TopicConfig's own checks would compare a string with an int.
    checked = {key: check_value(value, _topic_hint(key, value), f"topics.{key}") for key, value in section.items()}
    try:
        return TopicConfig(**checked)
    except ValueError as exc:  # a partitions table naming the control topic or no topic at all: names the key
        raise ConfigError(str(exc)) from None


def _asdict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _toml_key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() and key.isascii() else json.dumps(key)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # inf and -inf are TOML floats too; NaN is refused by the checks
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string literal is a valid TOML basic string
    if isinstance(value, dict):  # an inline table: { default = 4, "records.in" = 12 }
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


# --------------------------------------------------------------------------- the reference


def reference_rows() -> list[tuple[str, str, str, str, str, str]]:
    """(section, key, type, default, valid values, meaning) of every configuration key, section by section."""
    rows = []
    for cls in (PipelineConfig, AgentConfig, EmbeddingConfig, MonitorConfig, ShadowConfig, KafkaConfig,
                DeliveryConfig, SchemaRegistryConfig):
        for f in fields(cls):
            if f.name in _NESTED:
                continue
            default = "required" if f.default is MISSING and f.default_factory is MISSING else _toml_value(f.default)
            rows.append(_reference_row(cls.section, f.name, _hints(cls)[f.name], default, f.metadata.get("doc", "")))
        if cls is PipelineConfig:
            defaults = TopicConfig()
            rows += [_reference_row("topics", key, hint, _toml_value(getattr(defaults, key)), doc)
                     for key, (hint, doc) in TOPIC_KEYS.items()]
    return rows


def _reference_row(section: str, key: str, hint, default: str, doc: str) -> tuple:
    base, metas = _meta(hint)
    extra = next((m.extra for m in metas if m.extra), {})
    kind = extra.get("type") or _type_name(base)
    valid = extra.get("range") or _expected(hint)
    if default == "[]" and kind == "table":
        default = "{} (none)"
    return section, key, kind, default, valid, doc


def _type_name(base) -> str:
    if typing.get_origin(base) is Literal:
        return "string"
    if typing.get_origin(base) is Union:
        return " or ".join(_type_name(_meta(arg)[0]) for arg in typing.get_args(base))
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(base, str(base))


def reference_markdown() -> str:
    """The configuration reference table: docs/reference/configuration.md shows it, generated at build time."""
    lines = ["| section | key | type | default | valid values | meaning |", "|---|---|---|---|---|---|"]
    for section, key, kind, default, valid, doc in [*reference_rows(), *MAPPING_REFERENCE]:
        cells = [f"`[{section}]`", f"`{key}`", kind, f"`{default}`" if default != "required" else "required",
                 valid, doc]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def adult_config(**changes) -> PipelineConfig:
    """The pipeline of the Adult demo: S = sex, U = education-num > 9, X = age, hours-per-week.

    Parameters
    ----------
    **changes
        Fields of :class:`PipelineConfig` to replace (e.g. ``features=("age",)``).

    Returns
    -------
    PipelineConfig
        The demo's configuration with ``changes`` applied.
    """
    ranges = {"age": (0.0, 120.0), "hours-per-week": (0.0, 168.0)}
    if "features" in changes and "valid_ranges" not in changes:  # another feature list keeps the ranges it names
        changes["valid_ranges"] = {k: v for k, v in ranges.items() if k in changes["features"]}
    base = PipelineConfig(name="adult", features=("age", "hours-per-week"), groups=(0, 1), strata=(0, 1),
                          s_name="sex", u_name="education-num > 9", label=True, valid_ranges=ranges)
    return replace(base, **changes)
