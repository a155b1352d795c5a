"""Array layouts: what each artifact kind's payload must hold, checked in full at load.

A hash only proves the payload is the one the publisher sealed, not that it makes sense: a
consistent publisher can still seal a truncated pmf or a NaN weight, which would then fail on
every batch. So every kind declares its arrays (:class:`ArraySpec`: dtype, shape in terms of the
manifest's parameters, value domain, one :class:`Check` per rule) and its loader refuses with
:func:`check_arrays`, naming the array, the rule and the offending value, whatever does not fit,
before a module is built.

>>> import numpy as np
>>> layout = ArrayLayout((ArraySpec("grid", "f", ("n",), (finite(), strictly_increasing())),
...                       ArraySpec("pmf", "f", ("n",), (at_least(0.0), sums_to_one()))))
>>> check_arrays({"grid": np.array([0.0, 1.0]), "pmf": np.array([0.25, 0.75])}, layout, "toy artifact")
{'n': 2}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from .artifacts import PARAMETERS_ARRAY, ArtifactError

__all__ = [
    "ArrayContext",
    "ArrayLayout",
    "ArraySpec",
    "Check",
    "above",
    "any_true",
    "at_least",
    "at_most",
    "below",
    "check_arrays",
    "finite",
    "int_parameter",
    "names_parameter",
    "nonempty",
    "not_nan",
    "one_of",
    "sizes_parameter",
    "sorted_labels",
    "strictly_increasing",
    "sums_to_one",
]

_KIND_NAMES = {"f": "float", "i": "integer", "u": "unsigned integer", "b": "bool", "U": "text", "S": "bytes"}


@dataclass(frozen=True)
class ArrayContext:
    """What a :class:`Check` may look at: every array of the artifact and the dimensions bound so far."""

    arrays: Mapping[str, np.ndarray]
    dims: Mapping[str, int]

    def bound(self, value: float | str) -> float:
        """A number, or the value of the dimension it names."""
        return self.dims[value] if isinstance(value, str) else value


@dataclass(frozen=True)
class Check:
    """One rule on an array's values: ``rule`` in words, ``bad(array, context)`` -> (offending mask, values).

    The mask flags the offending entries (or rows, for a rule on rows); ``values`` has its shape
    and holds what the error reports for each (the entry, or the row's sum).
    """

    rule: str
    bad: Callable[[np.ndarray, ArrayContext], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ArraySpec:
    """One array a kind needs: name, dtype kinds, shape and value domain.

    ``dtype``: the numpy dtype kinds it may have (``"f"`` float, ``"iu"`` integer, ``"b"`` bool,
    ``"U"`` text; ``"iuU"`` for labels). ``shape``: per axis an int or a dimension name; a name is
    given by the kind (from its manifest parameters) or bound by the first array that uses it, and
    every later use must agree. ``checks``: the value domain, run once every shape is known.
    ``binds``: this 0-d integer array's value is the named dimension (a count stored as an array).
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...] = ()
    checks: tuple[Check, ...] = ()
    binds: str | None = None


@dataclass(frozen=True)
class ArrayLayout:
    """Everything a kind's payload must hold: its specs, the dimensions its parameters fix, and
    prefixes of arrays validated by a component's own loader (e.g. a scorer's group map)."""

    specs: tuple[ArraySpec, ...]
    dims: Mapping[str, int] = field(default_factory=dict)
    delegated: tuple[str, ...] = ()


def check_arrays(arrays: Mapping[str, np.ndarray], layout: ArrayLayout, what: str,
                 error: type[Exception] = ArtifactError) -> dict[str, int]:
    """Refuse ``arrays`` unless they are exactly the declared ones, each of its dtype, shape and domain.

    Parameters
    ----------
    arrays : mapping of str to ndarray
        The payload's arrays (the sealed parameters and ``layout.delegated`` prefixes are let through).
    layout : ArrayLayout
        What the kind declares.
    what : str
        What is checked, first in every message (e.g. ``"plan artifact"``).
    error : type of Exception, default ArtifactError
        Raised on the first misfit; a constructor checking its own arguments passes its own.

    Returns
    -------
    dict of str to int
        The dimensions, those of ``layout.dims`` and those bound on the way.

    Raises
    ------
    error
        Naming the array, the rule and the first offending value with its index.

    >>> import numpy as np
    >>> layout = ArrayLayout((ArraySpec("pmf", "f", ("n",), (finite(), at_least(0.0), sums_to_one())),))
    >>> check_arrays({"pmf": np.array([0.5, 0.5])}, layout, "toy artifact")
    {'n': 2}
    >>> check_arrays({"pmf": np.array([0.5, -0.5, 1.0])}, layout, "toy artifact")
    Traceback (most recent call last):
    ...
    fairstream.repair.artifacts.ArtifactError: toy artifact: array 'pmf' must be >= 0, got -0.5 at index (1,)
    """
    def fail(message: str) -> None:
        raise error(f"{what}: {message}")

    declared = {spec.name for spec in layout.specs}
    for name in arrays:
        if name not in declared and name != PARAMETERS_ARRAY and not any(map(name.startswith, layout.delegated)):
            fail(f"undeclared array {name!r} (the kind declares {sorted(declared)})")
    dims, origins = dict(layout.dims), {}
    for spec in layout.specs:
        if spec.name not in arrays:
            fail(f"the array {spec.name!r} is missing")
        _check_spec_form(spec, np.asarray(arrays[spec.name]), dims, origins, fail)
    context = ArrayContext(arrays, MappingProxyType(dims))
    for spec in layout.specs:
        array = np.asarray(arrays[spec.name])
        for check in spec.checks:
            mask, values = check.bad(array, context)
            mask = np.asarray(mask, dtype=bool)
            if mask.any():
                index = tuple(int(i) for i in np.argwhere(mask)[0])
                where = f" at index {index}" if index else ""
                rule = check.rule.format_map(dims)
                fail(f"array {spec.name!r} must be {rule}, got {_scalar(np.asarray(values)[index])!r}{where}")
    return dims


def _check_spec_form(spec: ArraySpec, array: np.ndarray, dims: dict[str, int], origins: dict[str, str],
                     fail: Callable[[str], None]) -> None:
    """dtype kind and shape; a named dimension seen for the first time is bound to this array's length."""
    if array.dtype.kind not in spec.dtype:
        expected = " or ".join(_KIND_NAMES.get(kind, kind) for kind in spec.dtype)
        fail(f"array {spec.name!r} has dtype {array.dtype} ({_KIND_NAMES.get(array.dtype.kind, array.dtype.kind)}), "
             f"expected {expected}")
    fits = array.ndim == len(spec.shape)
    for want, got in zip(spec.shape, array.shape):
        if isinstance(want, str):
            if want not in dims:
                dims[want], origins[want] = int(got), spec.name
            want = dims[want]
        fits = fits and want == got
    if not fits:
        fail(f"array {spec.name!r} has shape {array.shape}, expected {_describe(spec, dims, origins)}")
    if spec.binds is not None:
        value = int(array)
        if value < 0:
            fail(f"array {spec.name!r} must be a count (>= 0), got {value}")
        if dims.setdefault(spec.binds, value) != value:
            fail(f"array {spec.name!r} is {value}, but {spec.binds} is {dims[spec.binds]}")
        origins.setdefault(spec.binds, spec.name)


def _describe(spec: ArraySpec, dims: Mapping[str, int], origins: Mapping[str, str]) -> str:
    """A declared shape with its named dimensions' values and where each came from, e.g.
    ``(n_groups=2 as in 'groups', 3)`` (no origin: the manifest's parameters set it)."""
    def axis(d: int | str) -> str:
        if not isinstance(d, str) or d not in dims:
            return str(d)
        source = origins.get(d, spec.name)
        return f"{d}={dims[d]}" + (f" as in {source!r}" if source != spec.name else "")
    axes = [axis(d) for d in spec.shape]
    return "(" + ", ".join(axes) + ("," if len(axes) == 1 else "") + ")"


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0) else value


def _is_int(value: Any) -> bool:
    # JSON true parses as a bool, which Python counts as an int: it is no size.
    return isinstance(value, int) and not isinstance(value, bool)


def int_parameter(parameters: Mapping[str, Any], name: str, what: str, low: int = 1) -> int:
    """The manifest parameter ``name`` as an integer >= ``low`` (a size a layout is built from)."""
    value = parameters.get(name)
    if not _is_int(value) or value < low:
        raise ArtifactError(f"{what}: parameter {name!r} must be an integer >= {low}, got {value!r}")
    return value


def sizes_parameter(parameters: Mapping[str, Any], name: str, what: str) -> list[int]:
    """The manifest parameter ``name`` as a list of positive integers (hidden layer sizes)."""
    value = parameters.get(name)
    if not isinstance(value, list) or not all(_is_int(v) and v >= 1 for v in value):
        raise ArtifactError(f"{what}: parameter {name!r} must be a list of positive layer sizes, got {value!r}")
    return value


def names_parameter(parameters: Mapping[str, Any], name: str, what: str) -> dict[str, int]:
    """``{"n_features": len(names)}`` for a list-of-strings parameter (feature names), {} when it is null."""
    value = parameters.get(name)
    if value is None:
        return {}
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ArtifactError(f"{what}: parameter {name!r} must be a list of names or null, got {value!r}")
    return {"n_features": len(value)}


# -- value domains: the rules kinds declare (NaN fails every comparison, so it is refused too)


def _where(array: np.ndarray, context: ArrayContext, where) -> np.ndarray:
    return np.ones(array.shape, dtype=bool) if where is None else np.broadcast_to(where[1](context), array.shape)


def _compare(symbol: str, test: Callable, bound: float | str, where) -> Check:
    shown = f"{bound} ({{{bound}}})" if isinstance(bound, str) else f"{bound:g}"  # a dimension shows its value
    rule = f"{symbol} {shown}" + (f" where {where[0]}" if where else "")
    return Check(rule, lambda a, ctx: (~test(a, ctx.bound(bound)) & _where(a, ctx, where), a))


def at_least(bound: float | str, where: tuple[str, Callable] | None = None) -> Check:
    """Every entry >= ``bound`` (a number or a dimension name); ``where = (text, mask(context))`` restricts the rule."""
    return _compare(">=", np.greater_equal, bound, where)


def above(bound: float | str, where: tuple[str, Callable] | None = None) -> Check:
    """Every entry > ``bound``."""
    return _compare(">", np.greater, bound, where)


def at_most(bound: float | str, where: tuple[str, Callable] | None = None) -> Check:
    """Every entry <= ``bound``."""
    return _compare("<=", np.less_equal, bound, where)


def below(bound: float | str, where: tuple[str, Callable] | None = None) -> Check:
    """Every entry < ``bound`` (an index into a dimension: ``below("n_features")``)."""
    return _compare("<", np.less, bound, where)


def finite() -> Check:
    """No NaN or infinity."""
    return Check("finite", lambda a, ctx: (~np.isfinite(a), a))


def not_nan() -> Check:
    """No NaN (infinities allowed, e.g. an unbounded range)."""
    return Check("a number (not NaN)", lambda a, ctx: (np.isnan(a), a))


def one_of(*values: Any) -> Check:
    """Every entry is one of ``values``."""
    return Check(f"one of {list(values)}", lambda a, ctx: (~np.isin(a, values), a))


def strictly_increasing() -> Check:
    """Strictly increasing along the last axis (sorted, unique labels; a grid)."""
    def bad(a, ctx):
        if a.ndim == 0 or a.shape[-1] < 2:
            return np.zeros(a.shape, dtype=bool), a
        mask = np.zeros(a.shape, dtype=bool)
        mask[..., 1:] = ~(a[..., 1:] > a[..., :-1])
        return mask, a
    return Check("strictly increasing", bad)


def sorted_labels() -> Check:
    """Labels as fitting stores them: sorted, unique, and numbers as integers unless some are fractional
    (an integer-valued float label would never match the integer labels records carry)."""
    def bad(a, ctx):
        mask, _ = strictly_increasing().bad(a, ctx)
        if a.dtype.kind == "f":
            mask = mask | ~np.isfinite(a) | (np.all(a == np.round(a)) & (a == np.round(a)))
        return mask, a
    return Check("sorted unique labels (integers stored as integers)", bad)


def nonempty() -> Check:
    """At least one entry."""
    return Check("non-empty", lambda a, ctx: (np.array(a.size == 0), np.array(a.size)))


def any_true() -> Check:
    """A boolean array with at least one True (all False would leave the module nothing to do)."""
    return Check("true somewhere (all false leaves nothing to apply)",
                 lambda a, ctx: (np.array(not a.any()), np.array(a.sum())))


def sums_to_one(axis: int = -1, tol: float = 1e-6, where: tuple[str, Callable] | None = None) -> Check:
    """Each slice along ``axis`` sums to 1 within ``tol`` (a probability vector; pair with ``at_least(0.0)``)."""
    def bad(a, ctx):
        total = a.sum(axis=axis)
        keep = np.ones(total.shape, dtype=bool) if where is None else np.broadcast_to(where[1](ctx), total.shape)
        return ~(np.abs(total - 1.0) <= tol) & keep, total
    return Check(f"summing to 1 along axis {axis}" + (f" where {where[0]}" if where else ""), bad)
