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

    [topics]
    prefix = "fairstream"
    partitions = 4

    [agents.records]
    artifact = "plan"
    batch_size = 1000

    [agents.embeddings]
    artifact = "identity"    # or "embedding"
    dimension = 8

Records on ``records.in`` are JSON objects ``{"id", "ts", "features": {...}, "s", "u", "y"?}``;
anything else is dead-lettered with a reason.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fairstream.repair.protocol import PipelineSchema

from .topics import TopicConfig


class ConfigError(ValueError):
    """The pipeline configuration is invalid; the message names the key."""


@dataclass(frozen=True)
class AgentConfig:
    """Batching and the artifact kind one agent applies."""

    artifact: str
    batch_size: int = 1000
    batch_within: float = 0.05  # seconds to wait for a batch to fill before processing what is there
    missing_s: str = "dead_letter"  # records only: "impute" repairs a record without s under a drawn s

    def __post_init__(self) -> None:
        if self.missing_s not in ("dead_letter", "impute"):
            raise ConfigError(f"missing_s must be 'dead_letter' or 'impute', got {self.missing_s!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if isinstance(self.batch_within, bool) or not isinstance(self.batch_within, (int, float)) or self.batch_within <= 0:
            raise ConfigError(f"batch_within must be a number of seconds > 0, got {self.batch_within!r}")


@dataclass(frozen=True)
class EmbeddingConfig(AgentConfig):
    """The embedding agent: the module it applies (or the identity) and the vector length."""
    artifact: str = "identity"
    dimension: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.artifact not in ("identity", "embedding"):
            raise ConfigError(f"agents.embeddings.artifact must be 'identity' or 'embedding', got {self.artifact!r}")
        if self.dimension < 1:
            raise ConfigError(f"agents.embeddings.dimension must be >= 1, got {self.dimension}")


@dataclass(frozen=True)
class MonitorConfig:
    """The fairness monitor: windows, drift detection, the metrics endpoint, and re-fit requests."""

    metrics_port: int = 0  # the worker's Prometheus /metrics port; 0 = no HTTP endpoint
    window_records: int = 8000  # count-based window of the statistics
    window_seconds: float = 120.0  # time-based window of the statistics
    buckets: int = 10  # windows slide by 1/buckets of their length
    statistic: str = "dependence_e"  # the statistic fed to the drift detector
    detector: str = "adwin"  # adwin | page_hinkley | kswin (river)
    threshold: float = 0.1  # fairness gap above which the statistic counts as unfair (above the window's noise)
    cooldown_seconds: float = 60.0  # hysteresis: at most one drift event per cooldown
    min_records: int = 500  # no statistic is reported before the window holds this many records

    def __post_init__(self) -> None:
        if self.detector not in ("adwin", "page_hinkley", "kswin"):
            raise ConfigError(f"monitor.detector must be adwin, page_hinkley or kswin, got {self.detector!r}")
        if self.window_records < 1 or self.window_seconds <= 0 or self.buckets < 1 or self.min_records < 1:
            raise ConfigError("monitor windows, buckets and min_records must be positive")


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline: record fields, groups, strata, topics, agents and the monitor (from a TOML file)."""
    name: str
    features: tuple[str, ...]
    groups: tuple
    strata: tuple
    s_name: str = "s"
    u_name: str = "u"
    label: bool = False
    max_message_bytes: int = 64 * 1024
    include_original: bool = True
    artifact_dir: str = "runs/artifacts"
    topics: TopicConfig = field(default_factory=TopicConfig)
    records: AgentConfig = field(default_factory=lambda: AgentConfig(artifact="plan"))
    embeddings: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def __post_init__(self) -> None:
        if not self.features or not all(isinstance(f, str) and f for f in self.features):
            raise ConfigError(f"pipeline.features must be a list of non-empty names, got {self.features!r}")
        if len(set(self.features)) != len(self.features):
            raise ConfigError(f"pipeline.features has duplicates: {list(self.features)}")
        for key in ("groups", "strata"):
            values = getattr(self, key)
            if not values or len(set(values)) != len(values):
                raise ConfigError(f"pipeline.{key} must be a non-empty list of distinct values, got {list(values)}")
            if any(isinstance(v, (bool, float)) or not isinstance(v, (int, str)) for v in values):
                raise ConfigError(f"pipeline.{key} values must be integers or strings, got {list(values)}")

    def schema(self) -> PipelineSchema:
        """What this pipeline promises its modules (checked by every module at load time)."""
        return PipelineSchema(features=tuple(self.features), groups=tuple(self.groups), strata=tuple(self.strata),
                              dimension=self.embeddings.dimension, impute_s=self.imputes_s)

    @property
    def imputes_s(self) -> bool:
        """Whether records without s are repaired under an imputed s (else dead-lettered)."""
        return self.records.missing_s == "impute"

    @classmethod
    def from_toml(cls, path: str | Path) -> "PipelineConfig":
        """Read and validate a pipeline TOML file."""
        with open(path, "rb") as fh:
            return cls.from_dict(tomllib.load(fh))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PipelineConfig":
        """Validate a parsed pipeline TOML document."""
        pipeline = dict(data.get("pipeline", {}))
        unknown = set(data) - {"pipeline", "topics", "agents", "monitor"}
        if unknown:
            raise ConfigError(f"unknown top-level section(s): {sorted(unknown)}")
        agents = data.get("agents", {})
        unknown_agents = set(agents) - {"records", "embeddings"}
        if unknown_agents:
            raise ConfigError(f"unknown agent section(s) {sorted(unknown_agents)}; known: ['embeddings', 'records']")
        try:
            return cls(
                **_known(cls, pipeline, "pipeline", tuples=("features", "groups", "strata")),
                topics=TopicConfig(**_known(TopicConfig, data.get("topics", {}), "topics")),
                records=AgentConfig(**_known(AgentConfig, {"artifact": "plan", **agents.get("records", {})}, "agents.records")),
                embeddings=EmbeddingConfig(**_known(EmbeddingConfig, agents.get("embeddings", {}), "agents.embeddings")),
                monitor=MonitorConfig(**_known(MonitorConfig, data.get("monitor", {}), "monitor")),
            )
        except TypeError as exc:  # a missing required key
            raise ConfigError(f"invalid pipeline configuration: {exc}") from None
        except ValueError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"invalid [topics] section: {exc}") from None

    def to_toml(self) -> str:
        """The configuration as TOML that :meth:`from_toml` reads back to an equal object."""
        pipeline = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SECTIONS}
        sections = {"pipeline": pipeline, "topics": _asdict(self.topics), "agents.records": _asdict(self.records),
                    "agents.embeddings": _asdict(self.embeddings), "monitor": _asdict(self.monitor)}
        return "\n".join(f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())
                         for name, values in sections.items())

    def with_topics(self, **changes) -> "PipelineConfig":
        """A copy with other topic settings."""
        return replace(self, topics=replace(self.topics, **changes))

    def with_monitor(self, **changes) -> "PipelineConfig":
        """A copy with other monitor settings."""
        return replace(self, monitor=replace(self.monitor, **changes))


_SECTIONS = ("topics", "records", "embeddings", "monitor")


def _known(cls, section: dict, name: str, tuples: tuple[str, ...] = ()) -> dict:
    allowed = {f.name for f in fields(cls)} - set(_SECTIONS)
    unknown = set(section) - allowed
    if unknown:
        raise ConfigError(f"[{name}] has unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    for key in tuples:
        if key in section and not isinstance(section[key], list):
            raise ConfigError(f"[{name}] {key} must be a list, got {section[key]!r}")
    return {k: tuple(v) if k in tuples else v for k, v in section.items()}


def _asdict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string literal is a valid TOML basic string
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def adult_config(**changes) -> PipelineConfig:
    """The pipeline of the Adult demo: S = sex, U = education-num > 9, X = age, hours-per-week."""
    base = PipelineConfig(name="adult", features=("age", "hours-per-week"), groups=(0, 1), strata=(0, 1),
                          s_name="sex", u_name="education-num > 9", label=True)
    return replace(base, **changes)
