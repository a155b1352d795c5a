"""The frozen embedding fairness module, applied with numpy (spec 000, section 3.4).

Centroid Fairness trains a residual MLP on top of a frozen embedding model:
``g(x) = z + W2 relu(W1 z + b1) + b2`` with ``z = x / ||x||``. Training needs torch (models
layer); applying it needs only these arrays, so the stream applies the artifact without torch.
With W2 = 0 the module is plain normalisation, which is also the identity artifact a pipeline can
start from.

>>> import numpy as np
>>> module = FairnessModule.identity(3)
>>> module.transform(np.array([[3.0, 0.0, 4.0]])).tolist()
[[0.6, 0.0, 0.8]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairstream.repair import artifacts
from fairstream.repair._validation import RepairInputError
from fairstream.repair.protocol import Applied, Batch, IncompatibleArtifact, PipelineSchema

ARTIFACT_KIND = "embedding"


@dataclass(frozen=True)
class FairnessModule:
    """Residual MLP ``z + W2 relu(W1 z + b1) + b2`` on L2-normalised vectors, frozen."""

    w1: np.ndarray  # (hidden, d)
    b1: np.ndarray  # (hidden,)
    w2: np.ndarray  # (d, hidden)
    b2: np.ndarray  # (d,)

    def __post_init__(self) -> None:
        hidden, d = self.w1.shape
        if self.b1.shape != (hidden,) or self.w2.shape != (d, hidden) or self.b2.shape != (d,):
            raise RepairInputError(f"inconsistent module shapes: w1 {self.w1.shape}, b1 {self.b1.shape}, "
                                   f"w2 {self.w2.shape}, b2 {self.b2.shape}")

    @property
    def dimension(self) -> int:
        return int(self.w1.shape[1])

    @classmethod
    def identity(cls, dimension: int, hidden: int | None = None) -> "FairnessModule":
        hidden = hidden or 2 * dimension
        return cls(np.zeros((hidden, dimension)), np.zeros(hidden), np.zeros((dimension, hidden)), np.zeros(dimension))

    def transform(self, vectors) -> np.ndarray:
        """Apply the module to (n, d) vectors (or one vector); zero vectors stay zero."""
        v = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
        if v.shape[1] != self.dimension:
            raise RepairInputError(f"vectors have {v.shape[1]} values, the module expects {self.dimension}")
        # Divide by the largest entry first: the norm of tiny (subnormal) vectors would underflow to 0.
        scale = np.max(np.abs(v), axis=1, keepdims=True)
        v = v / np.where(scale > 0, scale, 1.0)
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        z = v / np.where(norms > 0, norms, 1.0)
        return z + np.maximum(z @ self.w1.T + self.b1, 0.0) @ self.w2.T + self.b2

    kind = ARTIFACT_KIND
    seed = ""  # no random draws

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a module whose vector length is not the pipeline's."""
        if schema.dimension is not None and self.dimension != schema.dimension:
            raise IncompatibleArtifact(f"the embedding module takes vectors of length {self.dimension}, "
                                       f"the pipeline's are {schema.dimension}")

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: :meth:`transform` on the batch's vectors."""
        return Applied.all_ok(batch, self.transform(batch.X))

    def to_artifact(self, version: int = 1, metrics: dict | None = None) -> artifacts.Artifact:
        arrays = {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters={"architecture": "residual-mlp", "dimension": self.dimension},
                              metrics=metrics or {}, version=version)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> "FairnessModule":
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        a = artifact.arrays
        return cls(np.asarray(a["w1"]), np.asarray(a["b1"]), np.asarray(a["w2"]), np.asarray(a["b2"]))
