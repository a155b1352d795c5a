"""The evidence on a candidate version: what the control topic, the store and ``records.in`` know of it.

:func:`gather` reads the control topic (the version's publish, the decisions and rollbacks naming it,
the latest shadow figures announced for it), rebuilds the active chain as a worker's registry does, and
applies the active chain and the candidate chain (the active one with the candidate in place of its
kind) to the last records of ``records.in``. The result is plain data, an :class:`Evidence`, that
:func:`~fairstream.streams.refit.report.render` turns into a page. What is missing (no records, no
active version, no live figures yet) is a note or an empty field, never an error.

Two kinds of process announce live figures of a candidate. The pipeline's monitoring agent (``fairstream
monitor``, app id ``<app id>.monitor``: :func:`is_agent`) announces the pipeline-wide figures the shadow
policy decides on: its verdict, the confidence bounds behind it and the decisions the candidate changes
(:attr:`Evidence.pipeline`). Each worker announces the figures of its own partitions (:attr:`Evidence.shadow`):
diagnostics, not the pipeline's. The re-fit's holdout figures, measured on labelled research data before
the candidate was published, are :attr:`Evidence.holdout`.

>>> measured_columns("plan", ("plan", "scorer"))
('features', 'score', 'decision')
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from fairstream.models.kinds import capabilities
from fairstream.repair.protocol import Applied, Batch, apply_chain
from fairstream.streams.codec.partials import AGENT_SUFFIX
from fairstream.streams.topics import TopicConfig

from .sources import ResearchWindow, read_research_topic

if TYPE_CHECKING:
    from fairstream.repair.artifacts import Artifact
    from fairstream.streams.config import PipelineConfig
    from fairstream.streams.control.client import ControlLog, Entry
    from fairstream.streams.control.records import WorkerStatus
    from fairstream.streams.schemas import ControlRecord

__all__ = ["MEASURED", "SAMPLE_SECONDS", "Chains", "Evidence", "HoldoutFigures", "gather", "holdout_figures",
           "is_agent", "measured_columns"]

MEASURED = ("features", "score", "decision")
"""The columns the two chains are compared on, in this order, where the chains write them."""
SAMPLE_SECONDS = 120.0
"""The read of the sample's tail of ``records.in`` stops after this many seconds (the evidence then says so)."""


@dataclass(frozen=True)
class Chains:
    """The record chain applied to the sample: the active one and the one with the candidate in its kind's place.

    Parameters
    ----------
    kinds : tuple of str
        The kinds of the pipeline's record chain, in order.
    active, candidate : tuple
        One module per kind of ``kinds`` (None where none can be had).
    versions : mapping of str to int or None
        The active version of each kind (None: none is active).
    notes : tuple of str
        What the reader must know (a kind without an active version, a candidate that cannot be built).
    """

    kinds: tuple[str, ...]
    active: tuple
    candidate: tuple
    versions: Mapping[str, int | None]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HoldoutFigures:
    """The re-fit's comparison on its research holdout: the candidate and the version it would replace.

    Parameters
    ----------
    statistic : str
        The compared figure as the kind's trainer names it (``E`` for plans, ``DP gap`` for flows); lower is better.
    candidate : float
        The candidate's value on the holdout.
    serving : float or None
        The value of the version serving at the re-fit (None: none served, or it could not be scored).
    rows : int or None
        Research rows held out (None when not recorded).
    """

    statistic: str
    candidate: float
    serving: float | None
    rows: int | None = None

    @property
    def candidate_better(self) -> bool | None:
        """True when the candidate is lower (better) on the holdout, False when higher, None when not compared."""
        if self.serving is None or self.candidate == self.serving:
            return None
        return self.candidate < self.serving


@dataclass(frozen=True)
class Evidence:
    """Everything the report shows of one candidate version, gathered once.

    Parameters
    ----------
    config : PipelineConfig
        The pipeline (its name, groups, features and promotion and shadow policies).
    kind, version : str, int
        The version reported on.
    publish : ControlRecord
        The publish that claimed the version.
    trail : tuple of Entry
        Every record naming (kind, version), in log order, refused ones with their reason.
    state : str
        What became of the version, by the ledger's rule (one of ``control.records.STATES``).
    pending : (int, str) or None
        (version, sha256) of the pending candidate of ``kind``, if one waits for a decision.
    artifact : Artifact or None
        The version's artifact, checked by its hash; None when it cannot be fetched, ``artifact_refusal`` says why.
    artifact_refusal : str or None
    chains : Chains
    shadow : tuple of (WorkerStatus, dict)
        Each worker's latest announcement with live figures of this version, and those figures: the worker's own
        partitions only (the monitoring agent's are ``pipeline``).
    window : ResearchWindow or None
        The sample of ``records.in``; None when it cannot be read, ``window_note`` says why.
    window_note : str or None
        What the reader must know of the sample (unreadable, empty, cut short).
    topic : str
        The topic the sample is read from.
    generated_at : float
        Wall-clock time of the gathering.
    measured : tuple of str
        What the two chains can differ in (of :data:`MEASURED`); empty when ``kind`` is not in the chain.
    applied : dict of str to Applied
        ``"active"`` / ``"candidate"``: each chain's output on the sample (a chain missing a module is left out).
    pipeline : (WorkerStatus, dict) or None
        The monitoring agent's latest announcement with pipeline-wide figures of this version, and those figures
        (the keys of :meth:`~fairstream.streams.agent.promotion.Verdict.figures`, ``verdict``, ``changed``, ...);
        None when no agent announced any (it is not running, or has not measured this version).
    holdout : HoldoutFigures or None
        The re-fit's holdout comparison, from the artifact's metrics or else the publish record's figures; None
        when neither carries one (a publish by hand).
    """

    config: "PipelineConfig"
    kind: str
    version: int
    publish: "ControlRecord"
    trail: tuple["Entry", ...]
    state: str
    pending: tuple[int, str] | None
    artifact: "Artifact | None"
    artifact_refusal: str | None
    chains: Chains
    shadow: tuple[tuple["WorkerStatus", dict], ...]
    window: ResearchWindow | None
    window_note: str | None
    topic: str
    generated_at: float
    measured: tuple[str, ...] = ()
    applied: Mapping[str, Applied] = dataclasses.field(default_factory=dict)
    pipeline: tuple["WorkerStatus", dict] | None = None
    holdout: HoldoutFigures | None = None


def gather(config: "PipelineConfig", bootstrap: str, kind: str, version: int, sample: int) -> Evidence:
    """Read the control topic, the store and ``records.in``, and apply both chains to the sample.

    Parameters
    ----------
    config : PipelineConfig
    bootstrap : str
        The broker's bootstrap servers.
    kind, version : str, int
        The version to report on; it must have been published.
    sample : int
        How many of the latest ``records.in`` records the two chains are applied to.

    Returns
    -------
    Evidence

    Raises
    ------
    ControlError
        When no publish claimed ``version`` of ``kind``.
    """
    from fairstream.streams.control.client import ControlClient
    from fairstream.streams.control.store import ArtifactStore

    store = ArtifactStore(config.artifact_dir)
    client = ControlClient.of(config, bootstrap, store=store)  # the workers' gate: what they admit, nothing else
    control = asyncio.run(client.read())
    claim = _claiming_publish(control, kind, version, client.topic)
    publish = claim.record
    artifact, artifact_refusal = _fetch(publish, store)
    chains = _chains(config, control, store, client.loaders, claim)
    window, window_note = _sample(config, bootstrap, sample)
    generated_at = time.time()
    sampled = window is not None and len(window)
    announced = _shadowing(control, publish)
    return Evidence(
        config=config, kind=kind, version=version, publish=publish,
        trail=tuple(e for e in control.entries if (e.record.kind, e.record.version) == (kind, version)),
        # The claiming publish was admitted, so the ledger has a state for the version.
        state=control.ledger.state(kind, version), pending=control.ledger.pending(kind), artifact=artifact,
        artifact_refusal=artifact_refusal, chains=chains, window=window,
        shadow=tuple(entry for entry in announced if not is_agent(entry[0])),
        pipeline=_latest(entry for entry in announced if is_agent(entry[0])),
        window_note=window_note, topic=config.topics.records_in, generated_at=generated_at,
        measured=measured_columns(kind, chains.kinds) if kind in chains.kinds else (),
        applied=_apply(chains, window, config) if sampled else {},
        holdout=holdout_figures(publish, artifact),
    )


def is_agent(status: "WorkerStatus") -> bool:
    """Whether an announcement is the pipeline's monitoring agent's (app id ``<app id>.monitor``), not a worker's.

    Parameters
    ----------
    status : WorkerStatus
        An announcement read from the control topic.

    Returns
    -------
    bool
        True for the agent's announcements: their figures are the pipeline's.
    """
    return status.app_id.endswith(AGENT_SUFFIX)


def holdout_figures(publish: "ControlRecord", artifact: "Artifact | None") -> HoldoutFigures | None:
    """The re-fit's holdout comparison: the artifact's fit-time metrics, else the publish record's figures.

    The re-fit job (:mod:`~fairstream.streams.refit.job`) writes both: ``holdout_statistic``, ``holdout_value``,
    ``current_holdout_value`` and ``n_holdout`` in the metrics, ``{name: value, "current <name>": value}`` on the
    record. The metrics come first: the record's figures are what a person may also type by hand.

    Parameters
    ----------
    publish : ControlRecord
        The publish that claimed the version.
    artifact : Artifact or None
        Its artifact, when it could be fetched.

    Returns
    -------
    HoldoutFigures or None
        None when neither carries a holdout figure.

    >>> from fairstream.streams.schemas import ControlRecord
    >>> holdout_figures(ControlRecord("plan", 2, "a" * 64, statistics={"E": 0.03, "current E": 0.09}), None)
    HoldoutFigures(statistic='E', candidate=0.03, serving=0.09, rows=None)
    """
    metrics = {} if artifact is None else dict(artifact.manifest.metrics)
    name, value = metrics.get("holdout_statistic"), metrics.get("holdout_value")
    if isinstance(name, str) and _is_number(value):
        serving, rows = metrics.get("current_holdout_value"), metrics.get("n_holdout")
        return HoldoutFigures(name, float(value), float(serving) if _is_number(serving) else None,
                              int(rows) if _is_number(rows) else None)
    return _holdout_of_statistics(publish.statistics or {})


def _holdout_of_statistics(statistics: Mapping[str, float]) -> HoldoutFigures | None:
    """``{name: value, "current <name>": value}`` as the re-fit writes it on the record; None for anything else."""
    names = [name for name in statistics if not name.startswith("current ") and _is_number(statistics[name])]
    if len(names) != 1:  # a record by hand may carry any figures: only the re-fit's one pair is read as a holdout
        return None
    name = names[0]
    serving = statistics.get(f"current {name}")
    return HoldoutFigures(name, float(statistics[name]), float(serving) if _is_number(serving) else None)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _latest(announced) -> tuple["WorkerStatus", dict] | None:
    """The most recent announcement of several (a restarted or standby agent announces under a new name)."""
    return max(announced, key=lambda entry: entry[0].at, default=None)


def measured_columns(kind: str, chain: tuple[str, ...]) -> tuple[str, ...]:
    """What the two chains can differ in: what ``kind`` writes and what every module after it writes.

    Parameters
    ----------
    kind : str
        The candidate's kind.
    chain : tuple of str
        The kinds of the record chain, in order.

    Returns
    -------
    tuple of str
        The columns of :data:`MEASURED` some module from ``kind`` on writes, in that order.
    """
    after = chain[chain.index(kind):] if kind in chain else (kind,)
    written = frozenset().union(*(capabilities(k).writes for k in after))
    return tuple(column for column in MEASURED if column in written)


def _claiming_publish(control: "ControlLog", kind: str, version: int, topic: str) -> "Entry":
    """The entry of the publish that claimed ``version`` of ``kind``; :class:`ControlError` if none did."""
    from fairstream.streams.control.records import ControlError

    entry = next((e for e in control.entries if e.refusal is None and e.record.action == "publish"
                  and (e.record.kind, e.record.version) == (kind, version)), None)
    if entry is None:
        published = sorted({e.record.version for e in control.entries if e.refusal is None and e.record.kind == kind
                            and e.record.action == "publish"})
        listed = ", ".join(map(str, published)) or "none"
        raise ControlError(f"no {kind} version {version} was published on {topic} (published {kind} versions: "
                           f"{listed}); the report names a version in the history")
    return entry


def _fetch(record: "ControlRecord", store) -> tuple["Artifact | None", str | None]:
    """The artifact a record names (checked by its hash), or why it cannot be had."""
    from fairstream.streams.control.registry import fetch_artifact

    try:
        return fetch_artifact(record, store), None
    except Exception as exc:  # a missing store file, a damaged blob: said on the page
        return None, f"{type(exc).__name__}: {exc}"


def _shadowing(control: "ControlLog", publish: "ControlRecord") -> tuple:
    """(worker status, figures) of each worker's latest announcement with live figures of this version."""
    mine = (publish.kind, publish.version, publish.sha256)
    # The log keeps announcements per shadowed (kind, version); the sha256 must match too, and empty figures
    # have nothing to show.
    statuses = control.shadow_figures(publish.kind, publish.version).values()
    return tuple((status, dict(status.shadow)) for status in statuses if status.shadow and mine in status.shadowing)


def _chains(config: "PipelineConfig", control: "ControlLog", store, loaders, claim: "Entry") -> Chains:
    """The active record chain (a worker's registry, replayed) and the chain with the candidate in its place."""
    from fairstream.streams.control.records import encode_control
    from fairstream.streams.control.registry import ArtifactRegistry, build_active, load_refusal

    kinds = tuple(config.records.chain)
    notes = []
    registry = ArtifactRegistry(loaders, store=store)
    publish = claim.record
    before = None  # what served the candidate's kind when the candidate was published
    for entry in control.entries:  # at their offsets: the version rule counts the messages between claims
        if entry.refusal is None:
            if entry.offset == claim.offset:
                before = registry.current(publish.kind)
            registry.apply(encode_control(entry.record), offset=entry.offset)
    active = dict(registry.snapshot())
    current = active.get(publish.kind)
    if current is not None and current.version == publish.version:
        # It serves already (promoted, approved, or published without shadow): the comparison is with what it replaced.
        active[publish.kind] = before
        notes.append(f"{publish.kind} v{publish.version} serves now; the active chain shown is the one it replaced "
                     f"({_version_name(publish.kind, before)})")
    try:
        candidate = build_active(publish, loaders, store)
    except Exception as exc:  # the workers would refuse it too: said on the page
        candidate = None
        notes.append(f"{publish.kind} v{publish.version} cannot be built as the workers build it: "
                     f"{load_refusal(exc)[0]}")
    if publish.kind not in kinds:
        notes.append(f"{publish.kind} is not a kind of this pipeline's record chain {list(kinds)}: no distributions")
    for kind in kinds:
        if active.get(kind) is None:
            notes.append(f"no {kind} version is active: the active chain cannot be applied")
    modules = tuple(None if active.get(k) is None else active[k].module for k in kinds)
    swapped = tuple((None if candidate is None else candidate.module) if k == publish.kind else m
                    for k, m in zip(kinds, modules))
    versions = {k: None if active.get(k) is None else active[k].version for k in kinds}
    return Chains(kinds, modules, swapped, versions, tuple(notes))


def _version_name(kind: str, active) -> str:
    return f"no {kind}" if active is None else f"{kind} v{active.version}"


@dataclass(frozen=True)
class _RecordsInTopics(TopicConfig):
    """The pipeline's topics with ``records.in`` read where the research topic would be (the sample's source)."""

    @property
    def research(self) -> str:
        return self.records_in


def _sample(config: "PipelineConfig", bootstrap: str, sample: int) -> tuple[ResearchWindow | None, str | None]:
    """The latest ``sample`` valid records of ``records.in`` (read from each partition's tail), or why there are none,
    and whether the read was cut short."""
    topics = _RecordsInTopics(**{f.name: getattr(config.topics, f.name) for f in dataclasses.fields(TopicConfig)})
    try:
        window = read_research_topic(bootstrap, dataclasses.replace(config, topics=topics), last_n=sample,
                                     idle_seconds=1.0, timeout=SAMPLE_SECONDS, tail=True)
    except Exception as exc:  # the page still says what the log knows
        return None, f"could not read {config.topics.records_in}: {type(exc).__name__}: {exc}"
    cut = (f"the read of {config.topics.records_in} was cut short after {SAMPLE_SECONDS:g} s: the records compared "
           "are the latest of those read, not necessarily the topic's latest") if window.cut_short else None
    if not len(window):
        return window, "; ".join(filter(None, (cut, f"no valid record on {config.topics.records_in} "
                                                    f"({window.n_invalid} invalid): no distributions to compare")))
    return window, cut


def _apply(chains: Chains, window: ResearchWindow, config: "PipelineConfig") -> dict[str, Applied]:
    """Each chain's output on the sample (a chain missing a module is left out)."""
    batch = Batch(X=window.X, keys=window.keys, s=window.s, u=window.u, y=window.y, columns=tuple(config.features))
    return {role: apply_chain(list(modules), batch) for role, modules in (("active", chains.active),
                                                                          ("candidate", chains.candidate))
            if modules and all(m is not None for m in modules)}
