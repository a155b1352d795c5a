"""Counter-based random draws: uniforms that are a pure function of (seed, record key, stream).

The repair is stochastic (Algorithm 2 of the paper draws a row and a column per feature), but a
stream processor must give the same output for the same record whatever batch it arrives in and
however often it is replayed. So instead of a stateful generator we hash the record key with the
plan fingerprint and a stream number (feature k, draw d): splitmix64, vectorised over the batch.

>>> import numpy as np
>>> keys = keys_to_uint64(np.array(["a", "b", "a"]))
>>> u = uniforms(seed=7, keys=keys, n_streams=2)
>>> u.shape, bool((u[0] == u[2]).all()), bool((u >= 0).all() and (u < 1).all())
((3, 2), True, True)
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 2.0**-53


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser applied element-wise (uint64 arithmetic wraps by design)."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def keys_to_uint64(keys) -> np.ndarray:
    """Map record keys (integers, strings or bytes) to uint64, one per key, without a Python loop.

    Integers map to themselves (two's complement). Strings are hashed code point by code point;
    numpy pads short strings with trailing zeros, so padding is skipped, which makes a key's hash
    independent of the longest key in its batch.
    """
    arr = np.asarray(keys)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64).view(np.uint64) if arr.dtype.kind == "i" else arr.astype(np.uint64)
    if arr.dtype.kind == "b":
        return arr.astype(np.uint64)
    if arr.dtype.kind == "S":
        units = np.frombuffer(arr.tobytes(), dtype=np.uint8).reshape(len(arr), arr.dtype.itemsize)
    else:
        arr = arr.astype(str)
        units = np.frombuffer(arr.tobytes(), dtype=np.uint32).reshape(len(arr), arr.dtype.itemsize // 4)
    h = np.full(len(arr), 0x51_7C_C1_B7_27_22_0A_95, dtype=np.uint64)
    for column in units.T.astype(np.uint64):  # loop over characters, vectorised over keys
        h = np.where(column != 0, splitmix64(h ^ column), h)
    return h


def uniforms(seed: int, keys: np.ndarray, n_streams: int) -> np.ndarray:
    """Uniform draws in [0, 1), shape (len(keys), n_streams); row i depends only on (seed, keys[i])."""
    base = splitmix64(np.asarray(keys, dtype=np.uint64) ^ splitmix64(np.array([seed % 2**64], dtype=np.uint64)))
    streams = (np.arange(1, n_streams + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    bits = splitmix64(base[:, None] + streams)
    return (bits >> np.uint64(11)).astype(np.float64) * _TO_UNIT
