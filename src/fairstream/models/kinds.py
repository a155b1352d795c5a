"""Every artifact kind the product serves, and the one function that turns an artifact into a module.

The worker, the registry and re-fit jobs look kinds up here: a kind is one class implementing
:class:`~fairstream.repair.protocol.FrozenModule`, named in :data:`MODULE_KINDS`, that declares what it
reads, writes and needs (``capabilities``): the rest of the product asks :func:`capabilities`,
:func:`kinds_for`, :func:`chain_problem` and :func:`active_at` instead of comparing or looking up kind names,
and takes its default kind from :data:`DEFAULT_KIND`, so a new kind is its module, its entry here, its example
in the conformance suite and, to be re-fittable, its trainer's module in ``streams/refit/trainers/`` (found
there by the trainers' registry; see docs/architecture.md). Each declares the arrays its artifact holds
(``array_layout``); loading checks every one of them and then applies the module to a few of its own ordinary
inputs (its ``probe``), so a corrupt payload, or one whose weights overflow every output, is an
:class:`ArtifactError` here, which the registry counts as a refusal while the previous version keeps serving.

>>> import numpy as np
>>> from fairstream.repair.protocol import PipelineSchema
>>> from fairstream.models.embedding import FairnessModule
>>> artifact = FairnessModule.identity(3).to_artifact()
>>> load_module(artifact, PipelineSchema(dimension=3)).dimension
3
>>> load_module(artifact, PipelineSchema(dimension=4))
Traceback (most recent call last):
...
fairstream.repair.protocol.IncompatibleArtifact: the embedding module takes vectors of length 3, the pipeline's are 4
"""

from __future__ import annotations

from typing import Mapping, TypeVar

from fairstream.repair.artifacts import Artifact, ArtifactError
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import PLACES, Capabilities, FrozenModule, PipelineSchema, check_probe

from .embedding import FairnessModule
from .flow import FlowPreprocessor
from .scorer import Scorer
from .thresholds import GroupThresholds

T = TypeVar("T")

MODULE_KINDS: dict[str, type] = {cls.kind: cls for cls in (DistributionalRepair, Scorer, FairnessModule,
                                                           FlowPreprocessor, GroupThresholds)}
"""Artifact kind -> the class that loads, checks and applies it."""

DEFAULT_KIND = DistributionalRepair.kind
"""The kind a record pipeline applies, and a re-fit or its request trains, when none is named: the repair plan."""


def module_class(kind: str) -> type:
    """The class serving ``kind``; an unknown kind is an :class:`ArtifactError` naming the known ones.

    Parameters
    ----------
    kind : str
        An artifact kind (a key of ``MODULE_KINDS``).

    Returns
    -------
    type
        The :class:`~fairstream.repair.protocol.FrozenModule` class of that kind.
    """
    try:
        return MODULE_KINDS[kind]
    except KeyError:
        raise ArtifactError(f"unknown artifact kind {kind!r} (known: {sorted(MODULE_KINDS)})") from None


def capabilities(kind: str) -> Capabilities:
    """What modules of ``kind`` read, write and need (:class:`~fairstream.repair.protocol.Capabilities`).

    >>> sorted(capabilities("scorer").writes)
    ['decision', 'score']
    """
    return module_class(kind).capabilities


def kinds_for(agent: str) -> tuple[str, ...]:
    """The kinds an agent (``"records"`` or ``"embeddings"``) can apply, in chain order then by name.

    >>> kinds_for("embeddings")
    ('embedding',)
    """
    mine = [kind for kind, cls in MODULE_KINDS.items() if cls.capabilities.agent == agent]
    return tuple(sorted(mine, key=lambda kind: (PLACES.index(capabilities(kind).place or PLACES[0]), kind)))


def chain_problem(chain: tuple[str, ...], carried: frozenset = frozenset()) -> str | None:
    """Why ``chain`` (record kinds, in order) cannot be applied, or None.

    Its kinds are distinct record kinds in the order of their places (repair, score, post), and each
    reads only what the record or an earlier module provides (a module after the scorer reads its score).
    ``carried`` is what the records bring of their own model (``score``, ``decision``: mapped fields), so group
    thresholds may decide on the record's own score. The empty chain applies nothing: a monitor-only pipeline.

    >>> chain_problem(("plan", "scorer")) is None
    True
    >>> chain_problem(("scorer", "plan"))
    "'plan' (place repair) cannot come after 'scorer' (place score)"
    >>> chain_problem(("thresholds",))
    "'thresholds' reads the score, which nothing before it provides"
    >>> chain_problem(("thresholds",), carried=frozenset({"score"})) is None
    True
    """
    if len(set(chain)) != len(chain):
        return f"kinds repeat: {list(chain)}"
    unknown = [kind for kind in chain if kind not in kinds_for("records")]
    if unknown:
        return f"{unknown[0]!r} is not a record kind (known: {list(kinds_for('records'))})"
    provided = {"features", *carried}
    for before, kind in zip((None, *chain), chain):
        mine = capabilities(kind)
        if before is not None and PLACES.index(mine.place) < PLACES.index(capabilities(before).place):
            return (f"{kind!r} (place {mine.place}) cannot come after {before!r} "
                    f"(place {capabilities(before).place})")
        if mine.reads - provided:
            return f"{kind!r} reads the {sorted(mine.reads - provided)[0]}, which nothing before it provides"
        provided |= mine.writes
    return None


def active_at(actives: Mapping[str, T], place: str) -> T | None:
    """The entry of ``actives`` (artifact kind -> anything) whose record kind sits at ``place``, or None.

    Asks the place instead of a kind's name: the active scorer is ``active_at(actives, "score")``. Where several
    kinds share a place (plans and flows repair), the first in chain order (:func:`kinds_for`) answers.

    >>> active_at({"thresholds": "t", "scorer": "s"}, "score")
    's'
    >>> active_at({"plan": "p"}, "post") is None
    True
    """
    return next((actives[kind] for kind in kinds_for("records")
                 if kind in actives and capabilities(kind).place == place), None)


def chain_writes(chain: tuple[str, ...]) -> frozenset:
    """Everything a chain's output records carry beside their input: its modules' writes together."""
    return frozenset().union(*(capabilities(kind).writes for kind in chain))


def reads_carried(chain: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds of ``chain`` that read a column no module before them writes: one the records carry of their own
    model (group thresholds on the record's score). Such a kind cannot be re-fitted from the pipeline's research
    window, which holds features, groups and labels, never the records' own scores.

    >>> reads_carried(("scorer", "thresholds")), reads_carried(("thresholds",))
    ((), ('thresholds',))
    """
    return tuple(kind for at, kind in enumerate(chain)
                 if capabilities(kind).reads - {"features"} - chain_writes(chain[:at]))


def load_module(artifact: Artifact, schema: PipelineSchema) -> FrozenModule:
    """Build the module of ``artifact``, probe it, check it against the pipeline ``schema`` (raises if it does not fit).

    The probe (:func:`~fairstream.repair.protocol.check_probe`) applies the module to a few of its own
    ordinary inputs: arrays that are each in their domain but overflow together are refused here.

    Parameters
    ----------
    artifact : Artifact
        A verified artifact of any known kind.
    schema : PipelineSchema
        What the pipeline promises the module.

    Returns
    -------
    FrozenModule
        The module, probed and checked, ready to apply.
    """
    module = module_class(artifact.kind).from_artifact(artifact)
    check_probe(module)
    module.check_compatible(schema)
    return module
