"""Sliding windows over any mergeable accumulator of :mod:`fairstream.repair.measure.accumulators`.

A window keeps a ring of sub-accumulators ("buckets"), each made by ``factory()``. A batch is cut
into the buckets it belongs to and each piece is handed to that bucket's ``update``; whole buckets
leave the window as it slides. ``value()`` merges the buckets (exact for count accumulators) and
reads the merged accumulator's ``value()``, so a window costs O(1) amortised numpy calls per
update and O(buckets) merges per read.

The same window wraps every accumulator: ``update(*args, **kwargs)`` forwards the accumulator's own
arguments. Arguments with a first axis (arrays, lists) are *row-aligned*: they must all have the
same number of rows and are sliced together; scalars and ``None`` are passed on unchanged to every
piece. So a single record's ``X`` must be 2-D, shape (1, d).

>>> import numpy as np
>>> from fairstream.repair.measure.accumulators import PositiveRateAccumulator
>>> window = CountWindow(lambda: PositiveRateAccumulator(groups=[0, 1]), size=4, buckets=2)
>>> _ = window.update([1, 1, 0, 0, 1, 0], s=[0, 1, 0, 1, 0, 1])
>>> window.n_records, window.value().difference
(4, 0.5)
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections import deque
from functools import reduce
from typing import Any, Callable

import numpy as np

from fairstream.repair.validation import RepairInputError

__all__ = ["BatchWindow", "CountWindow", "TimeWindow"]


class _Batch:
    """A batch's arguments with the row-aligned ones found, so pieces can be taken together."""

    def __init__(self, args: tuple, kwargs: dict):
        self.args = [_as_rows(a, f"argument {i}") for i, a in enumerate(args)]
        self.kwargs = {k: _as_rows(v, k) for k, v in kwargs.items()}
        named = [(f"argument {i}", a) for i, a in enumerate(self.args)] + list(self.kwargs.items())
        rows = [(name, a.shape[0]) for name, a in named if _is_rows(a)]
        if not rows:
            raise RepairInputError("a window update needs at least one row-aligned array (one value per record)")
        self.n_rows = rows[0][1]
        for name, n in rows[1:]:
            if n != self.n_rows:
                raise RepairInputError(f"{name} has {n} rows, {rows[0][0]} has {self.n_rows}; window arguments "
                                       "must be row-aligned")

    def take(self, rows) -> tuple[list, dict]:
        """The arguments restricted to ``rows`` (a slice or an index array)."""
        pick = (lambda a: a[rows] if _is_rows(a) else a)
        return [pick(a) for a in self.args], {k: pick(v) for k, v in self.kwargs.items()}


def _as_rows(value, name: str):
    if value is None or isinstance(value, (str, bytes)):
        return value
    try:
        arr = np.asanyarray(value)  # keeps subclasses such as EncodedLabels through the slicing
    except ValueError:  # ragged nested lists
        raise RepairInputError(f"{name} is not a rectangular array") from None
    return arr if arr.ndim >= 1 else value


def _is_rows(value) -> bool:
    return isinstance(value, np.ndarray) and value.ndim >= 1


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RepairInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _template(factory: Callable[[], Any]):
    """One fresh accumulator, checked to have the mergeable protocol."""
    if not callable(factory):
        raise RepairInputError(f"factory must be a callable returning a fresh accumulator, got {factory!r}")
    acc = factory()
    missing = [m for m in ("update", "merge", "value") if not callable(getattr(acc, m, None))]
    if missing:
        raise RepairInputError(f"factory() returned {type(acc).__name__}, which lacks {', '.join(missing)}")
    return acc


class _Window(ABC):
    """Shared read side: merge the buckets, read the merged accumulator."""

    factory: Callable[[], Any]
    _empty: Any  # a fresh accumulator, never updated: the start of every merge

    @abstractmethod
    def _buckets(self) -> list:
        """The buckets' accumulators, oldest first."""

    def accumulator(self):
        """A new accumulator holding every record in the window (merge it across workers)."""
        buckets = self._buckets()
        if not buckets:
            return self.factory()
        return reduce(lambda a, b: a.merge(b), buckets, self._empty)

    def value(self):
        """The wrapped accumulator's ``value()`` over the records in the window."""
        return self.accumulator().value()

    def _commit_pieces(self, batch: _Batch, pieces: list, in_place) -> list:
        """Feed the pieces; nothing in the window changes unless every piece is accepted.

        ``pieces`` are (key, rows) for fresh buckets; ``in_place`` is None or (bucket, rows) for
        the one existing bucket updated directly. Fresh buckets are filled first and the in-place
        update runs last: accumulators refuse a bad batch without partial counts, so a refused
        piece leaves the window as it was.
        """
        fresh = []
        for key, rows in pieces:
            args, kwargs = batch.take(rows)
            fresh.append((key, self.factory().update(*args, **kwargs)))
        if in_place is not None:
            bucket, rows = in_place
            args, kwargs = batch.take(rows)
            bucket.update(*args, **kwargs)
        return fresh


class CountWindow(_Window):
    """The last ~``size`` records, in a ring of ``buckets`` sub-accumulators.

    Bucket capacities are ``size // buckets`` or one more, repeating with period ``buckets``, so a
    full ring holds exactly ``size`` records; when the newest bucket is full the next record opens
    a new one and the oldest leaves. The window therefore holds between ``size - ceil(size /
    buckets) + 1`` and ``size`` records once ``size`` have been seen, always the most recent ones.
    A batch larger than a bucket is split across buckets; records that later records of the same
    batch push out are skipped (counted in ``n_seen_`` but never handed to an accumulator).

    >>> from fairstream.repair.measure.accumulators import DamageAccumulator
    >>> window = CountWindow(lambda: DamageAccumulator(n_features=1), size=10, buckets=5)
    >>> _ = window.update(np.zeros((25, 1)), np.ones((25, 1)))
    >>> window.n_records, window.n_seen_, window.value().overall  # 25 = 12 full buckets of 2 + 1
    (9, 25, 1.0)
    """

    def __init__(self, factory: Callable[[], Any], size: int, buckets: int = 10):
        self.size = _check_positive_int(size, "size")
        self.buckets = _check_positive_int(buckets, "buckets")
        if self.buckets > self.size:
            raise RepairInputError(f"buckets ({buckets}) must not exceed size ({size}): every bucket holds "
                                   "at least one record")
        self.factory = factory
        self._empty = _template(factory)
        base, extra = divmod(self.size, self.buckets)
        self._capacity = base + (np.arange(self.buckets) < extra)
        self.reset()

    def reset(self) -> "CountWindow":
        """Empty the window. Returns ``self``."""
        self.ring_: deque = deque()  # the buckets' accumulators, oldest first
        self.fill_: deque = deque()  # records in each bucket
        self.newest_ = -1  # running number of the newest bucket (decides its capacity)
        self.n_seen_ = 0
        return self

    @property
    def n_records(self) -> int:
        """Records currently in the window."""
        return int(sum(self.fill_))

    def _buckets(self) -> list:
        return list(self.ring_)

    def _cap(self, index: int) -> int:
        return int(self._capacity[index % self.buckets])

    def update(self, *args, **kwargs) -> "CountWindow":
        """Add a batch: the wrapped accumulator's ``update`` arguments, row-aligned ones sliced."""
        batch = _Batch(args, kwargs)
        n = batch.n_rows
        if n == 0:
            return self
        room = self._cap(self.newest_) - self.fill_[-1] if self.ring_ else 0
        first = min(room, n)
        rest, index = n - first, self.newest_
        # Whole cycles of buckets (``size`` records each) that later records push out are skipped;
        # what is left spans at most two cycles, so the work per update is bounded.
        skip = max(0, (rest - 1) // self.size - 1)
        start = first + skip * self.size
        index += skip * self.buckets
        chunks = []
        while start < n:
            index += 1
            stop = min(start + self._cap(index), n)
            chunks.append((index, start, stop))
            start = stop
        evicts_all = skip > 0 or len(chunks) >= self.buckets
        chunks = chunks[-self.buckets:]
        in_place = (self.ring_[-1], slice(0, first)) if first and not evicts_all else None
        fresh = self._commit_pieces(batch, [(i, slice(a, b)) for i, a, b in chunks], in_place)
        if in_place is not None:
            self.fill_[-1] += first
        if evicts_all:
            self.ring_.clear()
            self.fill_.clear()
        for (_, acc), (_, a, b) in zip(fresh, chunks):
            self.ring_.append(acc)
            self.fill_.append(b - a)
        while len(self.ring_) > self.buckets:
            self.ring_.popleft()
            self.fill_.popleft()
        self.newest_ = index
        self.n_seen_ += n
        return self


class TimeWindow(_Window):
    """Records of the last ``seconds`` of event time, in buckets of ``seconds / buckets``.

    Bucket i covers event times ``[origin + i*w, origin + (i+1)*w)`` with ``w = seconds / buckets``
    (a fixed ``origin``, so workers' buckets line up and :meth:`merge` is exact). The window keeps
    the ``buckets`` bucket numbers ending at the newest event time seen, so it spans between
    ``seconds - w`` and ``seconds``. A record is *late* if, when it arrives, its bucket has already
    left the window; late records are dropped and counted in ``late_``. Lateness is decided record
    by record in arrival order, also inside a batch; records that a later record of the same batch
    pushes out of the window are skipped (not late, and never handed to an accumulator).

    >>> from fairstream.repair.measure.accumulators import PositiveRateAccumulator
    >>> window = TimeWindow(lambda: PositiveRateAccumulator(groups=[0, 1]), seconds=60.0, buckets=6)
    >>> _ = window.update([1, 0], s=[0, 1], ts=[0.0, 5.0])
    >>> _ = window.update([1, 1], s=[0, 1], ts=[65.0, 1.0])  # 1.0 arrives after 65.0: late
    >>> window.n_records, window.late_, window.value().difference
    (1, 1, 0.0)
    """

    def __init__(self, factory: Callable[[], Any], seconds: float, buckets: int = 10, origin: float = 0.0):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)) \
                or not np.isfinite(seconds) or seconds <= 0:
            raise RepairInputError(f"seconds must be a positive finite number, got {seconds!r}")
        if isinstance(origin, bool) or not isinstance(origin, (int, float, np.integer, np.floating)) \
                or not np.isfinite(origin):
            raise RepairInputError(f"origin must be a finite number of seconds, got {origin!r}")
        self.seconds = float(seconds)
        self.buckets = _check_positive_int(buckets, "buckets")
        self.origin = float(origin)
        self.width = self.seconds / self.buckets
        self.factory = factory
        self._empty = _template(factory)
        self.reset()

    def reset(self) -> "TimeWindow":
        """Empty the window and its counters. Returns ``self``."""
        self.buckets_: dict[int, Any] = {}  # bucket number -> accumulator
        self.fill_: dict[int, int] = {}  # bucket number -> records in it
        self.newest_: int | None = None  # bucket number of the newest event time seen
        self.latest_ts_ = -np.inf  # newest event time seen
        self.late_ = 0
        self.n_seen_ = 0
        return self

    @property
    def n_records(self) -> int:
        """Records currently in the window."""
        return int(sum(self.fill_.values()))

    def _buckets(self) -> list:
        return [self.buckets_[i] for i in sorted(self.buckets_)]

    def bucket_of(self, ts) -> np.ndarray:
        """Bucket number of each event time."""
        return np.floor((np.asarray(ts, dtype=np.float64) - self.origin) / self.width).astype(np.int64)

    def update(self, *args, ts, **kwargs) -> "TimeWindow":
        """Add a batch with event times ``ts`` (seconds, one per record) to the window."""
        batch = _Batch(args, kwargs)
        n = batch.n_rows
        ts = _timestamps(ts, n)
        if n == 0:
            return self
        index = self.bucket_of(ts)
        start = index[0] if self.newest_ is None else self.newest_
        # The newest bucket seen before each record arrived (a running max, so no row loop).
        before = np.maximum.accumulate(np.concatenate(([start], index[:-1])))
        late = index <= before - self.buckets
        newest = int(max(start, index.max()))
        keep = np.flatnonzero(~late & (index > newest - self.buckets))
        keep = keep[np.argsort(index[keep], kind="stable")]  # grouped by bucket, arrival order kept
        numbers, first = np.unique(index[keep], return_index=True)
        groups = np.split(keep, first[1:]) if keep.size else []
        existing = [k for k, number in enumerate(numbers) if int(number) in self.buckets_]
        target = existing[-1] if existing else None  # the newest existing bucket is updated in place
        pieces = [(int(numbers[k]), rows) for k, rows in enumerate(groups) if k != target]
        in_place = None if target is None else (self.buckets_[int(numbers[target])], groups[target])
        fresh = self._commit_pieces(batch, pieces, in_place)
        if target is not None:
            self.fill_[int(numbers[target])] += len(groups[target])
        for (number, acc), (_, rows) in zip(fresh, pieces):
            self._add_bucket(number, acc, len(rows))
        self.newest_ = newest
        self.latest_ts_ = max(self.latest_ts_, float(ts.max()))
        self._evict()
        self.late_ += int(late.sum())
        self.n_seen_ += n
        return self

    def _add_bucket(self, number: int, acc, n_records: int) -> None:
        if number in self.buckets_:
            self.buckets_[number] = self.buckets_[number].merge(acc)
            self.fill_[number] += n_records
        else:
            self.buckets_[number] = acc
            self.fill_[number] = n_records

    def _evict(self) -> None:
        for number in [i for i in self.buckets_ if i <= self.newest_ - self.buckets]:
            del self.buckets_[number], self.fill_[number]

    def merge(self, other: "TimeWindow") -> "TimeWindow":
        """A new window holding both windows' buckets (e.g. two partitions of one stream).

        Buckets with the same number are merged, then the window slides to the newer of the two
        newest times. Exact: when no record was late, it equals one window fed both streams in
        event-time order. ``self`` and ``other`` are unchanged.
        """
        if not isinstance(other, TimeWindow) or (self.seconds, self.buckets, self.origin) != (
                other.seconds, other.buckets, other.origin):
            raise RepairInputError("cannot merge time windows with different seconds, buckets or origin")
        merged = TimeWindow(self.factory, self.seconds, self.buckets, self.origin)
        for window in (self, other):
            for number in window.buckets_:
                merged._add_bucket(number, copy.deepcopy(window.buckets_[number]), window.fill_[number])
        known = [w.newest_ for w in (self, other) if w.newest_ is not None]
        merged.newest_ = max(known) if known else None
        merged.latest_ts_ = max(self.latest_ts_, other.latest_ts_)
        if merged.newest_ is not None:
            merged._evict()
        merged.late_ = self.late_ + other.late_
        merged.n_seen_ = self.n_seen_ + other.n_seen_
        return merged


def _timestamps(ts, n_rows: int) -> np.ndarray:
    """Event times as finite float seconds, one per record."""
    try:
        arr = np.asarray(ts, dtype=np.float64)
    except (TypeError, ValueError):
        raise RepairInputError(f"ts must be numeric event times in seconds, got {ts!r:.80}") from None
    if arr.ndim != 1 or arr.shape[0] != n_rows:
        raise RepairInputError(f"ts must have one value per record ({n_rows}), got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.argmax(bad))
        raise RepairInputError(f"ts has a non-finite value {float(arr[row])!r} at row {row}")
    return arr


class BatchWindow:
    """A sliding window over whole batches, each already summarised by an accumulator.

    Where :class:`CountWindow` and :class:`TimeWindow` cut every batch at bucket boundaries and
    update one accumulator per piece, a caller that measures several windows of the same records
    (the stream monitor keeps a count window and a time window of a dozen statistics) can update
    one accumulator per batch and :meth:`add` it to each window: a merge, a few array additions.
    Buckets hold whole batches, so the window covers its ``records`` (or ``seconds``) plus at most
    one bucket and one batch: batch-granular, which is what a monitor needs.

    >>> from fairstream.repair.measure.accumulators import PositiveRateAccumulator
    >>> window = BatchWindow(records=4, buckets=2)
    >>> for y, s in (([1, 1], [0, 1]), ([0, 0], [0, 1]), ([1, 0], [0, 1])):
    ...     _ = window.add(PositiveRateAccumulator(groups=[0, 1]).update(y, s), n_records=2)
    >>> window.n_records, window.value().difference
    (4, 0.5)
    """

    def __init__(self, records: int | None = None, seconds: float | None = None, buckets: int = 10):
        if (records is None) == (seconds is None):
            raise RepairInputError("a BatchWindow is bounded by records or by seconds: give exactly one")
        self.buckets = _check_positive_int(buckets, "buckets")
        if records is not None:
            self.records = _check_positive_int(records, "records")
            self.capacity = -(-self.records // self.buckets)  # records per bucket, rounded up
        else:
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise RepairInputError(f"seconds must be a positive number, got {seconds!r}")
            self.span = float(seconds) / self.buckets
        self.seconds = seconds
        # [key, accumulator, records, owned] per bucket, oldest first; owned: the accumulator is the window's own
        # (made by a merge), so later batches are added into it in place
        self.ring_: deque = deque()
        self._n_records = 0  # the buckets' records, kept with them: read after every batch

    @property
    def n_records(self) -> int:
        """Records in the window now."""
        return self._n_records

    def add(self, accumulator, n_records: int, ts: float | None = None) -> "BatchWindow":
        """Add one batch's accumulator (``ts``: the batch's time, required for a time window)."""
        if self.seconds is None:
            self._add_counted(accumulator, n_records)
        else:
            if ts is None or not np.isfinite(ts):
                raise RepairInputError(f"a time window needs each batch's finite time, got {ts!r}")
            self._add_timed(accumulator, n_records, float(ts))
        return self

    def _add_counted(self, accumulator, n: int) -> None:
        if self.ring_ and self.ring_[-1][2] < self.capacity:
            self._merge_into(self.ring_[-1], accumulator, n)
        else:
            self.ring_.append([None, accumulator, n, False])
        self._n_records += n
        while len(self.ring_) > 1 and self._n_records - self.ring_[0][2] >= self.records:
            self._n_records -= self.ring_.popleft()[2]

    def _add_timed(self, accumulator, n: int, ts: float) -> None:
        key = math.floor(ts / self.span)
        newest = self.ring_[-1][0] if self.ring_ else key
        if key < newest - self.buckets + 1:
            return  # older than the window: it would leave at once
        if key == newest and self.ring_:  # the common case: the batch belongs to the newest bucket
            match = self.ring_[-1]
        else:
            match = next((bucket for bucket in self.ring_ if bucket[0] == key), None)
        self._n_records += n
        if match is not None:
            self._merge_into(match, accumulator, n)
        elif key > newest or not self.ring_:
            self.ring_.append([key, accumulator, n, False])
        else:  # a late batch for a bucket that saw nothing: kept in time order
            self.ring_.append([key, accumulator, n, False])
            self.ring_ = deque(sorted(self.ring_, key=lambda bucket: bucket[0]))
        newest = self.ring_[-1][0]
        while self.ring_ and self.ring_[0][0] <= newest - self.buckets:
            self._n_records -= self.ring_.popleft()[2]

    @staticmethod
    def _merge_into(bucket: list, accumulator, n: int) -> None:
        # The caller may hold (and add elsewhere) the accumulators it adds: a bucket's first one is never changed;
        # the first merge makes the window's own copy, and later batches are added into that one.
        if bucket[3] and hasattr(bucket[1], "absorb"):
            bucket[1].absorb(accumulator)
        else:
            bucket[1], bucket[3] = bucket[1].merge(accumulator), True
        bucket[2] += n

    def accumulator(self):
        """An accumulator holding every batch in the window (later adds never change it), or None while it is empty."""
        if not self.ring_:
            return None
        if len(self.ring_) == 1:  # handed out as it is: later batches of its bucket are added into a new copy
            self.ring_[0][3] = False
            return self.ring_[0][1]
        return reduce(lambda a, b: a.merge(b), [bucket[1] for bucket in self.ring_])

    def value(self):
        """The wrapped accumulator's ``value()`` over the batches in the window."""
        merged = self.accumulator()
        if merged is None:
            raise RepairInputError("the window is empty: add a batch first")
        return merged.value()
