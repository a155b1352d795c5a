"""A hash-consistent artifact with a corrupt array is refused at load, and the previous version keeps serving."""

from __future__ import annotations

import base64

import numpy as np

from fairstream.repair import artifacts
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import Batch, PipelineSchema
from fairstream.streams.control.records import encode_control
from fairstream.streams.control.registry import ArtifactRegistry, module_loaders
from fairstream.streams.schemas import ControlRecord


def publish(artifact: artifacts.Artifact, version: int) -> bytes:
    """The control message a publisher sends for ``artifact`` inline."""
    blob = artifacts.encode(artifacts.with_version(artifact, version))
    return encode_control(ControlRecord(kind=artifact.kind, version=version, sha256=artifact.sha256,
                                        blob_b64=base64.b64encode(blob).decode(), published_at=1.0))


def test_a_plan_with_a_truncated_pmf_is_refused_and_the_previous_version_keeps_serving():
    # The reproduction: the truncated pmf was accepted, then raised IndexError on every batch.
    rng = np.random.default_rng(0)
    s, u = rng.integers(0, 2, 400), rng.integers(0, 2, 400)
    X = rng.normal(size=(400, 2)) + s[:, None]
    good = DistributionalRepair(n_q=20).fit(X, s, u).to_artifact()
    arrays = {name: a for name, a in good.arrays.items() if name != artifacts.PARAMETERS_ARRAY}
    corrupt = artifacts.pack("plan", {**arrays, "source_pmf": arrays["source_pmf"][..., :-1]}, dict(good.parameters))
    refusals = []
    registry = ArtifactRegistry(module_loaders(PipelineSchema(groups=(0, 1), strata=(0, 1))),
                                on_refuse=lambda kind, reason, category: refusals.append((kind, reason)))
    assert registry.apply(publish(good, 1))
    assert not registry.apply(publish(corrupt, 2))
    assert registry.current("plan").version == 1 and registry.refused_total["plan"] == 1
    assert refusals == [("plan", refusals[0][1])] and "ArtifactError: plan artifact: array" in refusals[0][1]
    served = registry.current("plan").module.apply(Batch(X=X[:50], keys=np.arange(50), s=s[:50], u=u[:50]))
    assert served.ok.all()
