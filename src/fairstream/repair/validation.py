"""Input checks shared by every estimator and metric.

Errors name the offending column and value, so a user can find the bad row. Two flavours exist
for each check: a raising one for the batch API, and a mask-returning one (``*_mask``) that the
stream uses to dead-letter individual rows with a reason instead of failing the whole batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class RepairInputError(ValueError):
    """Bad input for a fairness estimator; the message names the column and the value."""


def column_names(n_columns: int, columns: Sequence[str] | None) -> list[str]:
    """Names for the feature columns: the given ones, or ``x0, x1, ...``."""
    if columns is None:
        return [f"x{k}" for k in range(n_columns)]
    names = [str(c) for c in columns]
    if len(names) != n_columns:
        raise RepairInputError(f"got {len(names)} column names for {n_columns} feature columns")
    return names


def as_2d(X, n_features: int | None = None, columns: Sequence[str] | None = None) -> np.ndarray:
    """``X`` as a float64 matrix of shape (n, d); a 1-D input of length d is one row.

    Non-numeric values raise an error naming the column and the value; NaN/inf are allowed here
    (the finite check is separate, so the stream can dead-letter those rows one by one).
    """
    arr = np.asarray(X)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1) if n_features is not None and arr.size == n_features else arr.reshape(-1, 1)
    if arr.ndim != 2:
        raise RepairInputError(f"X must be 1-D or 2-D, got shape {arr.shape}")
    if n_features is not None and arr.shape[1] != n_features:
        raise RepairInputError(f"X has {arr.shape[1]} feature columns, the estimator was fitted on {n_features}")
    if arr.dtype.kind in "fiub":
        return arr.astype(np.float64, copy=False)
    names = column_names(arr.shape[1], columns)
    out = np.empty(arr.shape, dtype=np.float64)
    for k, name in enumerate(names):
        try:
            out[:, k] = arr[:, k].astype(np.float64)
        except (TypeError, ValueError):
            bad = next(v for v in arr[:, k] if not _is_number(v))
            raise RepairInputError(f"column {name!r} has a non-numeric value {bad!r}") from None
    return out


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def check_finite(X: np.ndarray, columns: Sequence[str]) -> None:
    """Raise naming the first column and value that is NaN or infinite."""
    bad = ~np.isfinite(X)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise RepairInputError(f"column {columns[col]!r} has a non-finite value {X[row, col]!r} at row {row}")


def as_labels(values, n_rows: int, name: str) -> np.ndarray:
    """A 1-D label array of length ``n_rows`` (a scalar is broadcast)."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = np.full(n_rows, arr.item())
    if arr.ndim != 1 or arr.shape[0] != n_rows:
        raise RepairInputError(f"{name} must have one value per row ({n_rows}), got shape {arr.shape}")
    return arr


def encode_mask(values: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes of ``values`` in the sorted array ``classes`` and a mask of values not among them.

    Vectorised: one ``searchsorted`` plus an equality check; unseen values get code 0 and
    ``unseen=True``. Values of another kind than the classes (``"1"`` or a mixed object array
    against integer classes) are compared by their text, so ``"1"`` finds class ``1``.
    """
    values = np.asarray(values)
    if values.dtype.kind == classes.dtype.kind:
        keys, order, probe = classes, np.arange(len(classes)), values
    else:
        text = classes.astype(str)
        order = np.argsort(text, kind="stable")
        keys, probe = text[order], values.astype(str)
    pos = np.clip(np.searchsorted(keys, probe), 0, len(keys) - 1)
    unseen = np.asarray(keys[pos] != probe, dtype=bool)
    codes = np.where(unseen, 0, order[pos]).astype(np.intp)
    return codes, unseen


def encode(values: np.ndarray, classes: np.ndarray, name: str) -> np.ndarray:
    """Codes of ``values`` in ``classes``; raise naming the first unseen value."""
    codes, unseen = encode_mask(values, classes)
    if unseen.any():
        bad = np.asarray(values)[np.argmax(unseen)]
        bad = bad.item() if hasattr(bad, "item") else bad
        raise RepairInputError(f"{name} has an unknown value {bad!r} (known: {classes.tolist()})")
    return codes


def as_scores(values, name: str, n_rows: int | None = None) -> np.ndarray:
    """A 1-D finite float array (a scalar is one row); errors name the argument."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or (n_rows is not None and arr.shape[0] != n_rows):
        expected = "a 1-D array" if n_rows is None else f"one value per row ({n_rows})"
        raise RepairInputError(f"{name} must be {expected}, got shape {arr.shape}")
    column = as_2d(arr, columns=[name])
    check_finite(column, [name])
    return column[:, 0]


def normalise_labels(values: np.ndarray) -> np.ndarray:
    """Labels in a form that sorts and compares reliably: numbers stay numbers, else strings."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            return arr.astype(np.int64)
        return arr
    return arr.astype(str)
