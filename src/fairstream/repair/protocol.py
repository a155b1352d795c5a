"""One protocol for every frozen fairness module: load from an artifact, check, apply to a batch.

A plan, a flow, a scorer and an embedding module are each one class that implements
:class:`FrozenModule`. The stream worker, the artifact registry, re-fit jobs and the monitor only
ever call these four members, so adding a kind is writing one class (and naming it in
:data:`fairstream.models.kinds.MODULE_KINDS`):

- ``kind``: the artifact kind the class loads (``"plan"``, ``"scorer"``, ...);
- ``array_layout(parameters)``: the arrays its artifact must hold, each with dtype, shape (in
  terms of the manifest's parameters) and value domain (:class:`~fairstream.repair.array_layout.ArraySpec`);
- ``from_artifact(artifact)``: rebuild the frozen module from its manifest and arrays, after
  checking every array against ``array_layout`` (a hash-consistent but corrupt payload, e.g. a
  truncated pmf or a NaN weight, is refused here instead of failing on every batch);
- ``check_compatible(schema)``: refuse, with a reason, a module that does not fit the pipeline
  (feature names and count, groups, strata, vector length). The registry calls it **at load
  time**, so a mis-shaped artifact is refused while the previous version keeps serving;
- ``apply(batch)``: values for every row of a decoded :class:`Batch`, which rows could not be
  processed and why, and any per-row columns the module adds (a scorer's score and decision).
  A row's output is bit-identical whatever batch it arrives in (draws keyed by the record,
  products row by row: :func:`rowwise_matmul`), so a replayed batch reproduces its outputs;
- ``probe()``: a few deterministic rows the module must serve (its grid ends, its fit range, its
  standardisation centre). :func:`check_probe` applies the module to them at load, so an artifact
  whose every array is in its domain but whose outputs overflow (weights of 1e300) is refused
  before it serves.

A record pipeline is an ordered chain of modules (``plan``; ``flow`` then ``scorer``); see
:func:`apply_chain`, which also keeps one record from stopping a batch: a row whose output is not
finite is refused, and a module that raises on a batch is applied part by part so only the rows
that raise are refused. Nothing here knows Kafka or a message type: a batch is arrays.

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

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from .array_layout import ArrayLayout
from .artifacts import Artifact, ArtifactError

__all__ = ["MODULE_ERRORS", "Applied", "Batch", "Capabilities", "FrozenModule", "IncompatibleArtifact", "PipelineSchema",
           "apply_chain", "check_labels_cover", "check_probe", "rowwise_matmul"]

log = logging.getLogger(__name__)

MODULE_ERRORS = (ValueError, ArithmeticError, LookupError)
"""What a module may raise on data it cannot process: its own input errors (``RepairInputError``), numpy's
``FloatingPointError`` and ``OverflowError``, an ``IndexError`` from a crafted record. :func:`apply_chain`
refuses the rows that raise them; anything else (``MemoryError``, ``KeyboardInterrupt``, a ``TypeError``
from a programming error) is the process's problem and propagates."""

_MAX_REASON_CHARS = 300  # an exception's message as a dead letter's reason: its first line, bounded


class IncompatibleArtifact(ArtifactError):
    """A valid artifact that does not fit the pipeline it was published to; the message says why."""


@dataclass(frozen=True)
class PipelineSchema:
    """What a pipeline promises the modules it applies: the record features, labels and vector length.

    Empty fields are not checked (an embedding pipeline has no features; a record one no dimension).
    ``impute_s``: some input of the pipeline imputes a missing protected attribute, so a plan
    must carry the posterior Pr[s | x, u] to serve it.

    Parameters
    ----------
    features : tuple of str, default=()
        Names of the record features, in the order of the columns of ``Batch.X``; empty for an embedding
        pipeline.
    groups : tuple of int or str, default=()
        The values the protected attribute s may take.
    strata : tuple of int or str, default=()
        The values the unprotected attribute u may take.
    dimension : int or None, default=None
        Length of every embedding vector; None for a record pipeline.
    impute_s : bool, default=False
        Whether some input of the pipeline imputes a missing s (a plan must then carry Pr[s | x, u]).
    """

    features: tuple[str, ...] = ()
    groups: tuple = ()
    strata: tuple = ()
    dimension: int | None = None
    impute_s: bool = False


PLACES = ("repair", "score", "post")
"""Where a record module may sit, in chain order: it changes the features, it scores them, it acts on the score."""

COLUMNS = ("features", "vectors", "score", "decision")
"""What a module may read or write: a record's features, an embedding vector, a score in [0, 1], a decision 0/1."""


@dataclass(frozen=True)
class Capabilities:
    """What a kind of module does, declared once on its class (``capabilities``), as scikit-learn's estimator tags.

    Everything outside the kind's own module asks these instead of its name: config validation and the chain
    check (:func:`fairstream.models.kinds.chain_problem`), the monitor, the worker's output and the re-fit
    command.

    - ``agent``: which input it is applied to, ``"records"`` (tabular records) or ``"embeddings"`` (vectors);
    - ``reads`` / ``writes``: of :data:`COLUMNS`; ``"features"`` or ``"vectors"`` written replace the input, a
      ``"score"`` or ``"decision"`` written is a per-row column of :class:`Applied` that every output record
      carries (a later module's replaces an earlier one's);
    - ``place``: of :data:`PLACES`, a record chain's modules in that order (a ``"post"`` module reads a score);
    - ``needs_s``: ``apply`` reads the protected attribute; ``needs_labels``: training needs y;
      ``needs_group_map``: training fits a transport map between the groups (it carries one frozen);
    - ``fitted_range``: instances answer ``fitted_range()`` -> (strata, lowest, highest) of the features they
      were fitted on, per stratum (the monitor's bins and out-of-range count);
    - ``counterparts``: instances carry ``group_map_`` (None when the artifact holds no map) and answer
      ``matched_counterparts(X, s)`` and ``predict_proba(X)`` (matched DP).

    Parameters
    ----------
    agent : {"records", "embeddings"}
        The input the module is applied to.
    reads : frozenset of str
        The columns (of ``COLUMNS``) ``apply`` reads.
    writes : frozenset of str
        The columns (of ``COLUMNS``) ``apply`` writes.
    place : {"repair", "score", "post"} or None, default=None
        The module's place in a record chain; None for an embedding module.
    needs_s : bool, default=False
        Whether ``apply`` reads the protected attribute s.
    needs_labels : bool, default=False
        Whether training needs the labels y.
    needs_group_map : bool, default=False
        Whether training fits a transport map between the groups.
    fitted_range : bool, default=False
        Whether instances answer ``fitted_range()``.
    counterparts : bool, default=False
        Whether instances carry ``group_map_`` and answer ``matched_counterparts(X, s)``.

    Examples
    --------
    >>> caps = Capabilities(agent="records", reads=frozenset({"features"}), writes=frozenset({"features"}),
    ...                     place="repair")
    >>> caps.adds
    frozenset()
    """

    agent: str
    reads: frozenset
    writes: frozenset
    place: str | None = None
    needs_s: bool = False
    needs_labels: bool = False
    needs_group_map: bool = False
    fitted_range: bool = False
    counterparts: bool = False

    def __post_init__(self) -> None:
        unknown = (self.reads | self.writes) - set(COLUMNS)
        if unknown or self.agent not in ("records", "embeddings") or (self.place is not None and
                                                                       self.place not in PLACES):
            raise ValueError(f"capabilities: unknown column {sorted(unknown)}, agent {self.agent!r} or place "
                             f"{self.place!r} (columns: {COLUMNS}, places: {PLACES})")

    @property
    def adds(self) -> frozenset:
        """The per-row columns it adds to an output record (a score, a decision), beside the features."""
        return self.writes - {"features", "vectors"}


@dataclass
class Batch:
    """A decoded batch: rows of ``X`` (record features or embedding vectors), their keys and labels.

    ``keys`` seed every deterministic draw, so a row's output does not depend on its batch.
    A missing ``s`` entry is ``None`` or NaN; ``impute_s`` says whether the batch's input has such
    rows repaired under an imputed s (True) or refused, to be dead-lettered (False, the default).
    ``columns`` names the columns of ``X`` (the pipeline's features) in the reasons rows are refused
    with; None: they are named by position. ``added`` holds the per-row columns earlier modules of a
    chain added (a scorer's ``score`` for a module placed after it).

    Parameters
    ----------
    X : ndarray of shape (n_rows, n_columns)
        Record features or embedding vectors, one row per message.
    keys : ndarray of shape (n_rows,)
        The record keys (ids) that seed every deterministic draw.
    s : ndarray of shape (n_rows,) or None, default=None
        Protected attribute of each row; a missing entry is None or NaN.
    u : ndarray of shape (n_rows,) or None, default=None
        Unprotected attribute (stratum) of each row.
    y : ndarray of shape (n_rows,) or None, default=None
        Binary label of each row, when records carry one.
    impute_s : bool, default=False
        Repair rows without s under an imputed s (True) or refuse them (False).
    columns : tuple of str or None, default=None
        Names of the columns of ``X``, used in refusal reasons; None names them by position.
    added : dict of str to ndarray of shape (n_rows,), default={}
        Per-row columns added by earlier modules of a chain (e.g. ``"score"``).
    """

    X: np.ndarray
    keys: np.ndarray
    s: np.ndarray | None = None
    u: np.ndarray | None = None
    y: np.ndarray | None = None
    impute_s: bool = False
    columns: tuple[str, ...] | None = None
    added: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.X)

    def take(self, rows) -> "Batch":
        """The sub-batch of ``rows`` (indices, a boolean mask or a slice)."""
        pick = (lambda a: None if a is None else a[rows])
        return Batch(X=self.X[rows], keys=self.keys[rows], s=pick(self.s), u=pick(self.u), y=pick(self.y),
                     impute_s=self.impute_s, columns=self.columns,
                     added={name: values[rows] for name, values in self.added.items()})

    def misaligned(self) -> str | None:
        """Why the batch's arrays do not describe the same rows (keys, s, u, y or an added column of another
        length than ``X``, or no keys at all), or None. Row by row, such a batch would pair one record's
        values with another's score or key, so :func:`apply_chain` refuses it whole."""
        if self.keys is None:
            return "the batch has no record keys"
        lengths = {"keys": self.keys, "s": self.s, "u": self.u, "y": self.y, **self.added}
        for name, values in lengths.items():
            if values is not None and len(values) != len(self.X):
                return f"the batch's {name} has {len(values)} values for {len(self.X)} rows"
        return None

    def column_name(self, k: int) -> str:
        """How a reason names column ``k``: ``feature 'age'``, or ``column 3`` when the batch has no names."""
        return f"feature {self.columns[k]!r}" if self.columns is not None and k < len(self.columns) else f"column {k}"


@dataclass
class Applied:
    """What a module (or a chain) did to a batch, row by row.

    ``X`` holds the output values (rows that were refused keep their input), ``ok`` which rows were
    processed, ``reasons`` why the others were not, ``out_of_range`` which rows had a value outside
    the module's fitted range (clamped or refused), and ``columns`` the per-row outputs a module adds.
    Modules that read the protected attribute also report ``imputed`` (rows whose missing s was
    imputed: provenance) and ``s`` (the s each row was processed under); None when they do not.

    Parameters
    ----------
    X : ndarray of shape (n_rows, n_columns)
        Output values; refused rows keep their input values.
    ok : ndarray of bool, shape (n_rows,)
        Which rows were processed.
    reasons : list of (str or None), length n_rows
        Why each refused row was refused; None for processed rows.
    out_of_range : ndarray of bool, shape (n_rows,)
        Which rows had a value outside the module's fitted range.
    columns : dict of str to ndarray of shape (n_rows,), default={}
        Per-row columns the module adds (a score, a decision).
    imputed : ndarray of bool, shape (n_rows,), or None, default=None
        Rows whose missing s was imputed; None for modules that do not read s.
    s : ndarray of shape (n_rows,) or None, default=None
        The s each row was processed under; None for modules that do not read s.
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
    capabilities: ClassVar[Capabilities]

    @classmethod
    def array_layout(cls, parameters: dict) -> ArrayLayout:
        """The arrays an artifact of this kind must hold, given its manifest parameters."""

    @property
    def seed(self) -> str:
        """What the module's deterministic draws are keyed by ('' when it draws nothing); provenance."""

    @classmethod
    def from_artifact(cls, artifact: Artifact) -> "FrozenModule":
        """Rebuild the frozen module from an artifact of this kind; raise :class:`ArtifactError` if any array
        does not fit :meth:`array_layout`.

        Parameters
        ----------
        artifact : Artifact
            An artifact of this kind, already verified against its manifest's hash.

        Returns
        -------
        FrozenModule
            The module, ready to ``apply``.
        """

    def check_compatible(self, schema: PipelineSchema) -> None:
        """Raise :class:`IncompatibleArtifact` if the module cannot serve a pipeline of ``schema``.

        Parameters
        ----------
        schema : PipelineSchema
            What the pipeline promises: features, groups, strata, vector length.
        """

    def apply(self, batch: Batch) -> Applied:
        """Process every row of ``batch``; per-row failures are reasons, never exceptions.

        Parameters
        ----------
        batch : Batch
            The decoded rows.

        Returns
        -------
        Applied
            The output values and, per row, whether it was processed and why not.
        """

    def probe(self) -> Batch:
        """A few deterministic rows the module must serve with finite outputs (checked at load)."""


def apply_chain(modules: Sequence[FrozenModule], batch: Batch) -> Applied:
    """Apply modules in order; a row refused by one module is not passed to the next.

    The result's ``X`` is the last module's output, ``reasons`` the first refusal of each row,
    ``columns`` every column the modules added (NaN, or -1 for integer columns, on refused rows).
    No single row can stop the chain or leave it with a non-finite value: after each module, a row
    whose values or added columns are not finite is refused, naming the module's kind and the column
    (:func:`refuse_non_finite`), and a module that raises one of :data:`MODULE_ERRORS` on a batch is
    applied to its halves, and theirs, until only the rows that raise are left; they are refused with
    the exception's message, the others get exactly what the whole batch would have given them
    (a row's output does not depend on its batch).

    Parameters
    ----------
    modules : sequence of FrozenModule
        The chain, in application order (repair, then score, then post).
    batch : Batch
        The decoded rows.

    Returns
    -------
    Applied
        The chain's output: the last module's values, the first refusal reason of each row and every
        column the modules added.
    """
    n = len(batch)
    result = Applied(X=batch.X.copy(), ok=np.ones(n, dtype=bool), reasons=[None] * n,
                     out_of_range=np.zeros(n, dtype=bool))
    misaligned = batch.misaligned()
    if misaligned:  # a library caller's mistake; the codec's batches are aligned by construction
        result.ok[:] = False
        result.reasons = [misaligned] * n
        return result
    for module in modules:
        rows = np.flatnonzero(result.ok)
        current = _with_x(batch, result.X, result.columns)
        current = current.take(rows) if len(rows) < n else current
        step = refuse_non_finite(module.kind, current, apply_isolating(module, current))
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


def refuse_non_finite(kind: str, batch: Batch, step: Applied) -> Applied:
    """``step`` with every processed row whose values or float columns are not finite refused, with a reason.

    Vectorised: one ``isfinite`` per array; the loop runs over the refused rows only (rare by construction).

    >>> batch = Batch(X=np.array([[1.0, 2.0], [3.0, 4.0]]), keys=np.array(["a", "b"]), columns=("age", "hours"))
    >>> step = Applied.all_ok(batch, np.array([[1.0, 2.0], [3.0, np.inf]]), score=np.array([np.nan, 0.5]))
    >>> for reason in refuse_non_finite("plan", batch, step).reasons:
    ...     print(reason)
    plan produced a non-finite value for its column 'score' (nan)
    plan produced a non-finite value for feature 'hours' (inf)
    """
    columns = {name: column for name, column in step.columns.items() if np.asarray(column).dtype.kind in "fc"}
    if np.isfinite(step.X).all() and all(np.isfinite(column).all() for column in columns.values()):
        return step  # the common case: one reduction per array, no per-row mask
    values = np.isfinite(step.X).reshape(len(step.ok), -1)
    broken = ~values.all(axis=1)
    floats = {name: np.isfinite(column).reshape(len(step.ok), -1) for name, column in columns.items()}
    for finite in floats.values():
        broken |= ~finite.all(axis=1)
    broken &= step.ok
    if not broken.any():
        return step
    reasons = list(step.reasons)
    for i in np.flatnonzero(broken):
        if not values[i].all():
            k = int(np.argmin(values[i]))
            what, value = batch.column_name(k), np.asarray(step.X).reshape(len(step.ok), -1)[i, k]
        else:
            name = next(name for name, finite in floats.items() if not finite[i].all())
            column = np.asarray(step.columns[name]).reshape(len(step.ok), -1)
            what, value = f"its column {name!r}", column[i, int(np.argmin(floats[name][i]))]
        reasons[i] = f"{kind} produced a non-finite value for {what} ({float(value)!r})"
    return Applied(X=step.X, ok=step.ok & ~broken, reasons=reasons, out_of_range=step.out_of_range,
                   columns=step.columns, imputed=step.imputed, s=step.s)


def apply_isolating(module: FrozenModule, batch: Batch) -> Applied:
    """``module.apply(batch)``, or, if it raises one of :data:`MODULE_ERRORS`, the batch applied part by part.

    Halves are applied until the rows that raise are alone; each is refused with the exception's
    message (``"<kind> could not process the row: ValueError: ..."``). The other rows' outputs are
    those of the whole batch, since a row's output does not depend on its batch. numpy's floating-point
    warnings are off inside: an overflow is a non-finite output, refused by :func:`refuse_non_finite`,
    whatever ``np.seterr`` the process runs under.
    """
    try:
        return _apply_quietly(module, batch)
    except MODULE_ERRORS as error:
        parts = _bisect(module, batch, error)
    refused = [reason for _, applied, raised in parts if raised for reason in applied.reasons]
    log.warning("the %s module raised on a batch of %d rows; applied part by part, it refused the %d rows that "
                "raise, e.g. %s", module.kind, len(batch), len(refused), refused[0] if refused else "none")
    return _concatenate([(part, applied) for part, applied, _ in parts])


def _apply_quietly(module: FrozenModule, batch: Batch) -> Applied:
    with np.errstate(all="ignore"):
        return module.apply(batch)


def _bisect(module: FrozenModule, batch: Batch, error: Exception) -> list[tuple[Batch, Applied, bool]]:
    """(part, its outcome, whether it raised) for consecutive parts of ``batch``, on which the module raised."""
    if len(batch) <= 1:
        return [(batch, _raised(module.kind, batch, error), True)]
    parts = []
    half = len(batch) // 2
    for part in (batch.take(slice(0, half)), batch.take(slice(half, None))):
        try:
            parts.append((part, _apply_quietly(module, part), False))
        except MODULE_ERRORS as part_error:
            parts += _bisect(module, part, part_error)
    return parts


def _raised(kind: str, batch: Batch, error: Exception) -> Applied:
    """Every row of ``batch`` refused with the first line of ``error`` (which it raised alone)."""
    message = (str(error).strip().splitlines() or [""])[0]
    reason = f"{kind} could not process the row: {type(error).__name__}: {message}"[:_MAX_REASON_CHARS]
    n = len(batch)
    return Applied(X=batch.X.copy(), ok=np.zeros(n, dtype=bool), reasons=[reason] * n,
                   out_of_range=np.zeros(n, dtype=bool))


def _concatenate(parts: list[tuple[Batch, Applied]]) -> Applied:
    """The outcomes of consecutive parts of a batch as one; a part without a column (it raised) gets the fill."""
    outcomes = [applied for _, applied in parts]
    names = dict.fromkeys(name for applied in outcomes for name in applied.columns)
    columns = {}
    for name in names:
        model = next(np.asarray(applied.columns[name]) for applied in outcomes if name in applied.columns)
        columns[name] = np.concatenate([np.asarray(applied.columns[name]) if name in applied.columns
                                        else _empty_column(model, len(applied.ok)) for applied in outcomes])
    imputed = s = None
    if any(applied.imputed is not None for applied in outcomes):
        imputed = np.concatenate([np.zeros(len(a.ok), dtype=bool) if a.imputed is None else a.imputed
                                  for a in outcomes])
    if any(applied.s is not None for applied in outcomes):  # a part that raised keeps its input s
        s = np.concatenate([np.asarray(a.s, dtype=object) if a.s is not None else
                            (np.full(len(a.ok), None, dtype=object) if part.s is None else part.s.astype(object))
                            for part, a in parts])
    return Applied(X=np.concatenate([applied.X for applied in outcomes]),
                   ok=np.concatenate([applied.ok for applied in outcomes]),
                   reasons=[reason for applied in outcomes for reason in applied.reasons],
                   out_of_range=np.concatenate([applied.out_of_range for applied in outcomes]),
                   columns=columns, imputed=imputed, s=s)


def check_probe(module: FrozenModule) -> None:
    """Refuse (:class:`ArtifactError`) a module that does not serve its own :meth:`~FrozenModule.probe` rows.

    The rows are the module's ordinary inputs (its grid ends, fit range, standardisation centre), so a
    module that refuses one, raises on it or gives it a non-finite output would fail on ordinary records:
    an artifact whose arrays are each in their domain but overflow together (weights of 1e300) is refused
    at load, while the previous version keeps serving.
    """
    probe = module.probe()
    outcome = apply_chain([module], probe)
    if not outcome.ok.all():
        i = int(np.argmin(outcome.ok))
        raise ArtifactError(f"{module.kind} artifact: it cannot serve its own probe input (row {i} of "
                            f"{len(probe)}: {outcome.reasons[i]}); refusing to load")


def _with_x(batch: Batch, X: np.ndarray, added: dict) -> Batch:
    return Batch(X=X.copy(), keys=batch.keys, s=batch.s, u=batch.u, y=batch.y, impute_s=batch.impute_s,
                 columns=batch.columns, added={**batch.added, **added})


def _empty_column(values: np.ndarray, n: int) -> np.ndarray:
    values = np.asarray(values)
    fill = -1 if values.dtype.kind in "iub" else np.nan
    dtype = np.int64 if values.dtype.kind in "iub" else np.float64
    return np.full(n, fill, dtype=dtype)


# BLAS kernels may peel a loop until an operand is aligned (OpenBLAS's SSE2 dot does), which makes a
# product depend on where its operands sit in memory; a cache line (and AVX-512 register) is 64 bytes.
_ALIGNMENT = 64


def rowwise_matmul(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``X @ W`` computed as one identical product per row, so a row's result never depends on its batch.

    On a whole batch, BLAS picks its kernel, blocking and summation order by the number of rows
    (and the CPU), so the same record comes out a few ulps apart in batches of different sizes,
    and a replayed batch would not reproduce its outputs bit for bit. Here every row is its own
    (1, in) @ (in, out) call (numpy's matmul over a stack makes one BLAS gemv per row), with the
    same shapes, strides and memory alignment for every row, every batch and every copy of ``W``
    (rows, ``W`` and outputs are zero-padded to 64-byte lines in 64-byte-aligned buffers): a row's
    result is a function of that row and ``W`` alone. ``W`` is (in, out) or, stacked like ``X``,
    (..., in, out); the result is (..., n, out). The cost is one gemv per row instead of one gemm:
    measured on 1,000 rows (one thread), 2x to 4x a batched product: 1.6 -> 3.8 ms for a
    100-100-100-1 scorer, 6 -> 15 ms for a 10-block (20, 20) flow on 11 features, 22 -> 85 ms for
    a 512-wide embedding module.

    >>> X = np.random.default_rng(0).normal(size=(5, 3)); W = np.arange(6.0).reshape(3, 2)
    >>> bool(np.array_equal(rowwise_matmul(X, W)[2], rowwise_matmul(X[2:3], W)[0]))
    True
    """
    X, W = np.asarray(X), np.asarray(W)
    dtype = np.result_type(X, W)
    (n_in, n_out), line = W.shape[-2:], _ALIGNMENT // dtype.itemsize
    k, m = -(-n_in // line) * line, -(-n_out // line) * line  # padded widths: whole lines
    rows = _aligned((*X.shape[:-1], k), dtype)
    rows[..., :n_in] = X
    weights = _aligned((*W.shape[:-2], k, m), dtype)
    weights[..., :n_in, :n_out] = W
    out = _aligned((*np.broadcast_shapes(X.shape[:-2], W.shape[:-2]), X.shape[-2], m), dtype)
    np.matmul(rows[..., :, None, :], weights[..., None, :, :], out=out[..., :, None, :])
    return out[..., :n_out]


def _aligned(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A zeroed C-ordered array starting on a 64-byte boundary."""
    size = int(np.prod(shape))
    raw = np.zeros(size + _ALIGNMENT // dtype.itemsize, dtype)
    start = (-raw.ctypes.data % _ALIGNMENT) // dtype.itemsize
    return raw[start:start + size].reshape(shape)


def check_labels_cover(kind: str, what: str, fitted: Sequence, configured: Sequence) -> None:
    """Refuse a module fitted without some of the pipeline's ``what`` (groups or strata) values."""
    missing = sorted({str(v) for v in configured} - {str(v) for v in fitted})
    if configured and missing:
        raise IncompatibleArtifact(f"the {kind} was fitted without the pipeline's {what} {missing} "
                                   f"(fitted: {sorted(str(v) for v in fitted)})")
