"""Every artifact kind the product serves, and the one function that turns an artifact into a module.

The worker, the registry and re-fit jobs look kinds up here: a kind is one class implementing
:class:`~fairstream.repair.protocol.FrozenModule`, named in :data:`MODULE_KINDS` (what else a new kind
touches today, and why, is in docs/architecture.md). Each declares the arrays its artifact holds (``array_layout``); loading
checks every one of them and then applies the module to a few of its own ordinary inputs (its
``probe``), so a corrupt payload, or one whose weights overflow every output, is an
:class:`ArtifactError` here, which the registry counts as a refusal while the previous version keeps
serving.

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

from fairstream.repair.artifacts import Artifact, ArtifactError
from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.protocol import FrozenModule, PipelineSchema, check_probe

from .embedding import FairnessModule
from .flow import FlowPreprocessor
from .scorer import Scorer

MODULE_KINDS: dict[str, type] = {cls.kind: cls for cls in (DistributionalRepair, Scorer, FairnessModule,
                                                           FlowPreprocessor)}
"""Artifact kind -> the class that loads, checks and applies it."""


def module_class(kind: str) -> type:
    """The class serving ``kind``; an unknown kind is an :class:`ArtifactError` naming the known ones."""
    try:
        return MODULE_KINDS[kind]
    except KeyError:
        raise ArtifactError(f"unknown artifact kind {kind!r} (known: {sorted(MODULE_KINDS)})") from None


def load_module(artifact: Artifact, schema: PipelineSchema) -> FrozenModule:
    """Build the module of ``artifact``, probe it, check it against the pipeline ``schema`` (raises if it does not fit).

    The probe (:func:`~fairstream.repair.protocol.check_probe`) applies the module to a few of its own
    ordinary inputs: arrays that are each in their domain but overflow together are refused here.
    """
    module = module_class(artifact.kind).from_artifact(artifact)
    check_probe(module)
    module.check_compatible(schema)
    return module
