"""One protocol for every frozen fairness module: load from an artifact, check, apply to a batch.

A plan, a flow, a scorer and an embedding module are each one class that implements
:class:`FrozenModule`. The stream worker, the artifact registry, re-fit jobs and the monitor only
ever call these four members, so adding a kind is writing one class (and naming it in
:data:`fairstream.models.kinds.MODULE_KINDS`):

- ``kind``: the artifact kind the class loads (``"plan"``, ``"scorer"``, ...);
- ``from_artifact(artifact)``: rebuild the frozen module from its manifest and arrays;
- ``check_compatible(schema)``: refuse, with a reason, a module that does not fit the pipeline
  (feature names and count, groups, strata, vector length). The registry calls it **at load
  time**, so a mis-shaped artifact is refused while the previous version keeps serving;
- ``apply(batch)``: values for every row of a decoded :class:`Batch`, which rows could not be
  processed and why, and any per-row columns the module adds (a scorer's score and decision).

A record pipeline is an ordered chain of modules (``plan``; ``flow`` then ``scorer``); see
:func:`apply_chain`. Nothing here knows Kafka or a message type: a batch is arrays.

>>> import numpy as np
>>> class Double:
...     kind = "double"
...     seed = ""
...     def check_compatible(self, schema): pass
...     def apply(self, batch):
...         return Applied.all_ok(batch, batch.X * 2)
>>> batch = Batch(X=np.array([[1.0], [2.0]]), keys=np.array(["a", "b"], dtype=object))
>>> apply_chain([Double(), Double()], batch).X.ravel().tolist()
[4.0, 8.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from .artifacts import Artifact, ArtifactError

__all__ = ["Applied", "Batch", "FrozenModule", "IncompatibleArtifact", "PipelineSchema", "apply_chain",
           "check_labels_cover"]


class IncompatibleArtifact(ArtifactError):
    """A valid artifact that does not fit the pipeline it was published to; the message says why."""


@dataclass(frozen=True)
class PipelineSchema:
    """What a pipeline promises the modules it applies: the record features, labels and vector length.

    Empty fields are not checked (an embedding pipeline has no features; a record one no dimension).
    ``impute_s``: some input of the pipeline imputes a missing protected attribute, so a plan
    must carry the posterior Pr[s | x, u] to serve it.
    """

    features: tuple[str, ...] = ()
    groups: tuple = ()
    strata: tuple = ()
    dimension: int | None = None
    impute_s: bool = False


@dataclass
class Batch:
    """A decoded batch: rows of ``X`` (record features or embedding vectors), their keys and labels.

    ``keys`` seed every deterministic draw, so a row's output does not depend on its batch.
    A missing ``s`` entry is ``None`` or NaN; ``impute_s`` says whether the batch's input has such
    rows repaired under an imputed s (True) or refused, to be dead-lettered (False, the default).
    """

    X: np.ndarray
    keys: np.ndarray
    s: np.ndarray | None = None
    u: np.ndarray | None = None
    y: np.ndarray | None = None
    impute_s: bool = False

    def __len__(self) -> int:
        return len(self.X)

    def take(self, rows: np.ndarray) -> "Batch":
        """The sub-batch of ``rows`` (indices or a boolean mask)."""
        pick = (lambda a: None if a is None else a[rows])
        return Batch(X=self.X[rows], keys=self.keys[rows], s=pick(self.s), u=pick(self.u), y=pick(self.y),
                     impute_s=self.impute_s)


@dataclass
class Applied:
    """What a module (or a chain) did to a batch, row by row.

    ``X`` holds the output values (rows that were refused keep their input), ``ok`` which rows were
    processed, ``reasons`` why the others were not, ``out_of_range`` which rows had a value outside
    the module's fitted range (clamped or refused), and ``columns`` the per-row outputs a module adds.
    Modules that read the protected attribute also report ``imputed`` (rows whose missing s was
    imputed: provenance) and ``s`` (the s each row was processed under); None when they do not.
    """

    X: np.ndarray
    ok: np.ndarray
    reasons: list
    out_of_range: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    imputed: np.ndarray | None = None
    s: np.ndarray | None = None

    @classmethod
    def all_ok(cls, batch: Batch, X: np.ndarray, **columns: np.ndarray) -> "Applied":
        """Every row processed: ``X`` is the output, ``columns`` the added per-row values."""
        n = len(batch)
        return cls(X=X, ok=np.ones(n, dtype=bool), reasons=[None] * n, out_of_range=np.zeros(n, dtype=bool),
                   columns=dict(columns))


@runtime_checkable
class FrozenModule(Protocol):
    """The contract every artifact kind implements (see the module docstring)."""

    kind: ClassVar[str]

    @property
    def seed(self) -> str:
        """What the module's deterministic draws are keyed by ('' when it draws nothing); provenance."""

    @classmethod
    def from_artifact(cls, artifact: Artifact) -> "FrozenModule":
        """Rebuild the frozen module from an artifact of this kind."""

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Raise :class:`IncompatibleArtifact` if the module cannot serve a pipeline of ``schema``."""

    def apply(self, batch: Batch) -> Applied:
        """Process every row of ``batch``; per-row failures are reasons, never exceptions."""


def apply_chain(modules: Sequence[FrozenModule], batch: Batch) -> Applied:
    """Apply modules in order; a row refused by one module is not passed to the next.

    The result's ``X`` is the last module's output, ``reasons`` the first refusal of each row,
    ``columns`` every column the modules added (NaN, or -1 for integer columns, on refused rows).
    """
    n = len(batch)
    result = Applied(X=batch.X.copy(), ok=np.ones(n, dtype=bool), reasons=[None] * n,
                     out_of_range=np.zeros(n, dtype=bool))
    for module in modules:
        rows = np.flatnonzero(result.ok)
        current = _with_x(batch, result.X)
        step = module.apply(current.take(rows) if len(rows) < n else current)
        result.X[rows[step.ok]] = step.X[step.ok]  # a refused row keeps the values it came in with
        result.out_of_range[rows] |= step.out_of_range
        for name, values in step.columns.items():
            column = result.columns.setdefault(name, _empty_column(values, n))
            column[rows] = values
        if step.imputed is not None:
            result.imputed = np.zeros(n, dtype=bool) if result.imputed is None else result.imputed
            result.imputed[rows] |= step.imputed
        if step.s is not None:
            if result.s is None:  # rows no module labelled keep their input s
                result.s = np.full(n, None, dtype=object) if batch.s is None else batch.s.astype(object)
            result.s[rows] = step.s
        for i in np.flatnonzero(~step.ok):
            result.reasons[rows[i]] = step.reasons[i]
        result.ok[rows] = step.ok
    return result


def _with_x(batch: Batch, X: np.ndarray) -> Batch:
    return Batch(X=X.copy(), keys=batch.keys, s=batch.s, u=batch.u, y=batch.y, impute_s=batch.impute_s)


def _empty_column(values: np.ndarray, n: int) -> np.ndarray:
    values = np.asarray(values)
    fill = -1 if values.dtype.kind in "iub" else np.nan
    dtype = np.int64 if values.dtype.kind in "iub" else np.float64
    return np.full(n, fill, dtype=dtype)


def check_labels_cover(kind: str, what: str, fitted: Sequence, configured: Sequence) -> None:
    """Refuse a module fitted without some of the pipeline's ``what`` (groups or strata) values."""
    missing = sorted({str(v) for v in configured} - {str(v) for v in fitted})
    if configured and missing:
        raise IncompatibleArtifact(f"the {kind} was fitted without the pipeline's {what} {missing} "
                                   f"(fitted: {sorted(str(v) for v in fitted)})")
