"""The frozen embedding fairness module, applied with numpy.

Centroid Fairness (Conti and Clémençon, "Mitigating Bias in Facial Recognition Systems: Centroid
Fairness Loss Optimization", 2024) trains a residual MLP on top of a frozen embedding model:
``g(x) = z + W2 relu(W1 z + b1) + b2`` with ``z = x / ||x||``. Outputs are compared by cosine
similarity (their norm carries no meaning). Training needs torch
(:mod:`fairstream.models.centroid`); applying needs only these arrays, so a stream worker applies
the artifact without importing torch.

The identity module (all weights zero, :meth:`FairnessModule.identity`) is plain L2
normalisation, ``g(x) = x / ||x||``: what a pipeline whose embedding artifact is "identity" should
emit (:func:`normalise` does the same without a module). It takes a fast path that skips the MLP.

>>> import numpy as np
>>> module = FairnessModule.identity(3)
>>> module.transform(np.array([[3.0, 0.0, 4.0]])).tolist()
[[0.6, 0.0, 0.8]]
>>> normalise([[0.0, 2.0, 0.0]]).tolist()
[[0.0, 1.0, 0.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairstream.repair import artifacts
from fairstream.repair.array_layout import ArrayLayout, ArraySpec, check_arrays, finite, int_parameter
from fairstream.repair.measure.verification import l2_normalise
from fairstream.repair.protocol import Applied, Batch, Capabilities, IncompatibleArtifact, PipelineSchema, rowwise_matmul
from fairstream.repair.validation import RepairInputError

__all__ = ["ARTIFACT_KIND", "FairnessModule", "normalise"]

ARTIFACT_KIND = "embedding"


def normalise(vectors) -> np.ndarray:
    """L2-normalise (n, d) vectors (or one vector) in float64; zero vectors stay zero."""
    return l2_normalise(vectors)


@dataclass(frozen=True)
class FairnessModule:
    """Residual MLP ``z + W2 relu(W1 z + b1) + b2`` on L2-normalised vectors, frozen.

    Parameters
    ----------
    w1 : ndarray of shape (hidden, d)
        First layer's weights.
    b1 : ndarray of shape (hidden,)
        First layer's bias.
    w2 : ndarray of shape (d, hidden)
        Second layer's weights.
    b2 : ndarray of shape (d,)
        Second layer's bias.
    """

    w1: np.ndarray  # (hidden, d)
    b1: np.ndarray  # (hidden,)
    w2: np.ndarray  # (d, hidden)
    b2: np.ndarray  # (d,)

    def __post_init__(self) -> None:
        arrays = {name: np.ascontiguousarray(getattr(self, name), dtype=np.float64) for name in ("w1", "b1", "w2", "b2")}
        check_arrays(arrays, self.array_layout({}), "embedding module", RepairInputError)
        for name, array in arrays.items():
            object.__setattr__(self, name, array)
        # The residual branch is exactly zero when W2 and b2 are: then g is the normalisation.
        object.__setattr__(self, "_residual", bool(np.any(arrays["w2"]) or np.any(arrays["b2"])))

    @property
    def dimension(self) -> int:
        """The length of the vectors the module takes."""
        return int(self.w1.shape[1])

    @property
    def hidden(self) -> int:
        """Width of the MLP's hidden layer."""
        return int(self.w1.shape[0])

    @property
    def is_identity(self) -> bool:
        """True when the module is plain L2 normalisation (its residual branch is zero)."""
        return not self._residual

    @classmethod
    def identity(cls, dimension: int, hidden: int | None = None) -> FairnessModule:
        """The module that only L2-normalises, with zero weights of the usual shapes (hidden = 2d).

        Parameters
        ----------
        dimension : int
            Vector length d.
        hidden : int or None, default=None
            Hidden layer width; None is 2d.

        Returns
        -------
        FairnessModule
            The module that only normalises.
        """
        if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)) or dimension < 1:
            raise RepairInputError(f"dimension must be a positive integer, got {dimension!r}")
        hidden = hidden or 2 * dimension
        return cls(np.zeros((hidden, dimension)), np.zeros(hidden), np.zeros((dimension, hidden)), np.zeros(dimension))

    def transform(self, vectors, dtype=np.float64) -> np.ndarray:
        """Apply the module to (n, d) vectors (or one vector); a zero vector has z = 0 (the identity keeps it 0).

        ``dtype=np.float32`` computes the MLP in single precision: about 3-4x faster at d = 512 and
        ample for cosine scores of float32 embeddings; the default float64 is the reference result.

        Parameters
        ----------
        vectors : array-like of shape (n, d) or (d,)
            Embedding vectors.
        dtype : numpy dtype, default=numpy.float64
            Precision of the MLP's computation.

        Returns
        -------
        ndarray of shape (n, d)
            The L2-normalised outputs.
        """
        v = np.atleast_2d(np.asarray(vectors, dtype=np.float64))
        if v.ndim != 2 or v.shape[1] != self.dimension:
            raise RepairInputError(f"vectors have {v.shape[-1]} values, the module expects {self.dimension}")
        z = l2_normalise(v)
        if not self._residual:
            return z.astype(dtype, copy=False)
        w1t, b1, w2t, b2 = self._weights(np.dtype(dtype))
        z = z.astype(dtype, copy=False)
        # Row by row, so a vector's output does not depend on the batch it arrives in.
        hidden = rowwise_matmul(z, w1t)
        hidden += b1
        np.maximum(hidden, 0, out=hidden)
        return z + rowwise_matmul(hidden, w2t) + b2

    def _weights(self, dtype: np.dtype) -> tuple[np.ndarray, ...]:
        """(W1^T, b1, W2^T, b2) in ``dtype``, converted once and cached (frozen module, so the cache stays valid)."""
        cache = self.__dict__.setdefault("_cast", {})
        if dtype not in cache:
            if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
                raise RepairInputError(f"dtype must be float64 or float32, got {dtype}")
            weights = (self.w1.T, self.b1, self.w2.T, self.b2)
            cache[dtype] = tuple(np.ascontiguousarray(a.astype(dtype)) for a in weights)
        return cache[dtype]

    kind = ARTIFACT_KIND
    capabilities = Capabilities(agent="embeddings", reads=frozenset({"vectors"}), writes=frozenset({"vectors"}))
    seed = ""  # no random draws

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Refuse a module whose vector length is not the pipeline's."""
        if schema.dimension is not None and self.dimension != schema.dimension:
            raise IncompatibleArtifact(f"the embedding module takes vectors of length {self.dimension}, "
                                       f"the pipeline's are {schema.dimension}")

    def apply(self, batch: Batch) -> Applied:
        """The module protocol: :meth:`transform` on the batch's vectors."""
        return Applied.all_ok(batch, self.transform(batch.X))

    def probe(self) -> Batch:
        """The module protocol's load-time probe: zero, the first axis both ways, all ones, alternating signs."""
        d = self.dimension
        axis = np.eye(1, d)[0]
        X = np.stack([np.zeros(d), axis, -axis, np.ones(d), (-1.0) ** np.arange(d)])
        return Batch(X=X, keys=np.array([f"probe-{i}" for i in range(len(X))], dtype=object))

    def to_artifact(self, version: int = 1, metrics: dict | None = None, training: dict | None = None,
                    data_fingerprint: str | None = None) -> artifacts.Artifact:
        """Freeze the weights into an artifact; ``training`` (JSON) records how the module was fitted."""
        arrays = {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}
        parameters = {"architecture": "residual-mlp", "dimension": self.dimension, "hidden": self.hidden}
        if training:
            parameters["training"] = training
        return artifacts.pack(ARTIFACT_KIND, arrays, parameters=parameters, metrics=metrics or {}, version=version,
                              data_fingerprint=data_fingerprint)

    @staticmethod
    def array_layout(parameters: dict) -> ArrayLayout:
        """The arrays of an ``embedding`` artifact: finite weights of the manifest's ``dimension`` and ``hidden``.

        A size the parameters do not give (a module checking its own arrays) is taken from ``w1``.
        """
        dims = {name: int_parameter(parameters, name, "embedding artifact")
                for name in ("dimension", "hidden") if name in parameters}
        return ArrayLayout((
            ArraySpec("w1", "f", ("hidden", "dimension"), (finite(),)),
            ArraySpec("b1", "f", ("hidden",), (finite(),)),
            ArraySpec("w2", "f", ("dimension", "hidden"), (finite(),)),
            ArraySpec("b2", "f", ("dimension",), (finite(),)),
        ), dims)

    @classmethod
    def from_artifact(cls, artifact: artifacts.Artifact) -> FairnessModule:
        """Rebuild the module from an ``embedding`` artifact, every array checked against :meth:`array_layout` first.

        Parameters
        ----------
        artifact : Artifact
            An artifact of kind ``embedding``.

        Returns
        -------
        FairnessModule
            The frozen module.
        """
        if artifact.kind != ARTIFACT_KIND:
            raise artifacts.ArtifactError(f"expected an artifact of kind {ARTIFACT_KIND!r}, got {artifact.kind!r}")
        a = artifact.arrays
        check_arrays(a, cls.array_layout(artifact.parameters), "embedding artifact")
        return cls(a["w1"], a["b1"], a["w2"], a["b2"])
