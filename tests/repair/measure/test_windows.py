"""Tests of the sliding windows: each holds exactly the records a record-by-record model says."""

import doctest
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair.validation import RepairInputError
from fairstream.repair.measure import windows
from fairstream.repair.measure.accumulators import (
    DamageAccumulator,
    HistogramDependenceAccumulator,
    PositiveRateAccumulator,
)
from fairstream.repair.measure.metrics import dependence_e
from fairstream.repair.measure.windows import BatchWindow, CountWindow, TimeWindow

from .test_accumulators import assert_same_dependence, assert_same_dp

PROPERTY = settings(max_examples=60, deadline=None)
GROUPS, STRATA = ["a", "b", "c"], [0, 1]


def rate_factory():
    return PositiveRateAccumulator(groups=GROUPS, strata=STRATA)


def records(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2, n), np.array(GROUPS)[rng.integers(0, 3, n)], rng.integers(0, 2, n)


class Counting:
    """Wraps an accumulator and counts update calls into a shared list, to check the work done."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def update(self, *args, **kwargs):
        self.calls.append(len(args[0]))
        self.inner.update(*args, **kwargs)
        return self

    def merge(self, other):
        self.calls.append("merge")
        return Counting(self.inner.merge(other.inner), self.calls)

    def value(self):
        return self.inner.value()


def test_docstring_examples_run():
    result = doctest.testmod(windows)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------------------------
# CountWindow
# ---------------------------------------------------------------------------------------------


def count_window_model(batch_sizes, size, buckets):
    """Records held after each batch, fed one record at a time into a ring of capped buckets."""
    capacity = [size // buckets + (i < size % buckets) for i in range(buckets)]
    ring, newest, seen, held = deque(), -1, 0, []
    for n in batch_sizes:
        for _ in range(n):
            if not ring or ring[-1] == capacity[newest % buckets]:
                newest += 1
                ring.append(0)
                if len(ring) > buckets:
                    ring.popleft()
            ring[-1] += 1
        seen += n
        held.append(sum(ring))
    return held


@st.composite
def count_stream(draw):
    buckets = draw(st.integers(1, 8))
    size = draw(st.integers(buckets, 60))
    batch_sizes = draw(st.lists(st.integers(0, 150), min_size=1, max_size=12))
    return size, buckets, batch_sizes, draw(st.integers(0, 2**32 - 1))


@PROPERTY
@given(count_stream())
def test_count_window_equals_a_fresh_accumulator_on_the_last_records(stream):
    size, buckets, batch_sizes, seed = stream
    y, s, u = records(sum(batch_sizes), seed)
    window = CountWindow(rate_factory, size=size, buckets=buckets)
    expected_held = count_window_model(batch_sizes, size, buckets)
    end = 0
    for n, held in zip(batch_sizes, expected_held):
        window.update(y[end:end + n], s[end:end + n], u=u[end:end + n])
        end += n
        assert window.n_records == held and window.n_seen_ == end
        assert window.n_records <= size
        if end >= size:
            assert window.n_records >= size - -(-size // buckets) + 1
        k = window.n_records
        fresh = rate_factory().update(y[end - k:end], s[end - k:end], u[end - k:end]) if k else rate_factory()
        np.testing.assert_array_equal(window.accumulator().totals_, fresh.totals_)
        np.testing.assert_array_equal(window.accumulator().positives_, fresh.positives_)
        assert_same_dp(window.value(), fresh.value())


@PROPERTY
@given(count_stream())
def test_count_window_over_dependence_equals_the_batch_metric(stream):
    size, buckets, batch_sizes, seed = stream
    rng = np.random.default_rng(seed)
    n = sum(batch_sizes)
    X, s, u = rng.normal(size=(n, 2)), rng.integers(0, 2, n), rng.integers(0, 2, n)
    edges = [np.linspace(-2, 2, 9)] * 2
    window = CountWindow(lambda: HistogramDependenceAccumulator(edges, groups=[0, 1], strata=[0, 1]), size, buckets)
    end = 0
    for b in batch_sizes:
        window.update(X[end:end + b], s=s[end:end + b], u=u[end:end + b])
        end += b
    k = window.n_records
    merged = window.accumulator()
    fresh = HistogramDependenceAccumulator(edges, groups=[0, 1], strata=[0, 1]).update(X[end - k:end], s[end - k:end],
                                                                                     u[end - k:end])
    for got, want in zip(merged.counts_, fresh.counts_):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(merged.out_of_range_, fresh.out_of_range_)
    assert_same_dependence(window.value(), fresh.value())
    if k and len(np.unique(s[end - k:end])) == 2 and len(np.unique(u[end - k:end])) == 2:
        assert_same_dependence(window.value(), dependence_e(X[end - k:end], s[end - k:end], u[end - k:end],
                                                            edges=edges))


def test_count_window_splits_a_batch_at_bucket_boundaries():
    window = CountWindow(lambda: DamageAccumulator(n_features=1), size=6, buckets=3)
    window.update(np.zeros((3, 1)), np.zeros((3, 1)))
    assert list(window.fill_) == [2, 1]
    window.update(np.zeros((4, 1)), np.ones((4, 1)))  # fills 1 + 2 + 1 more: the oldest bucket leaves
    assert list(window.fill_) == [2, 2, 1] and window.n_records == 5
    assert window.value().overall == pytest.approx(4 / 5)


def test_count_window_bucket_capacities_sum_to_size_when_size_is_not_a_multiple():
    window = CountWindow(lambda: DamageAccumulator(n_features=1), size=7, buckets=3)
    window.update(np.zeros((7, 1)), np.zeros((7, 1)))
    assert list(window.fill_) == [3, 2, 2] and window.n_records == 7
    window.update(np.zeros((1, 1)), np.zeros((1, 1)))
    assert list(window.fill_) == [2, 2, 1]


def test_count_window_work_per_update_is_bounded_for_huge_batches():
    calls = []
    window = CountWindow(lambda: Counting(DamageAccumulator(n_features=1), calls), size=100, buckets=10)
    X = np.arange(1_000_003, dtype=float)[:, None]
    window.update(X, X + 1.0)
    updates = [c for c in calls if c != "merge"]
    assert len(updates) <= 10 and sum(updates) == window.n_records  # only the kept records are counted
    assert window.accumulator().inner.n_rows_ == window.n_records == 93  # 9 full buckets + 3
    calls.clear()
    window.value()
    assert calls.count("merge") == len(window.ring_) <= 10


def test_count_window_single_rows_scalar_labels_and_empty_batches():
    window = CountWindow(rate_factory, size=4, buckets=2)
    for y in [1, 0, 1, 1, 1]:
        window.update([y], "a", u=0)  # a scalar group is passed to every piece unchanged
    window.update([], s=[], u=[])
    assert window.n_records == 3 and window.n_seen_ == 5
    assert window.value().rates[0] == 1.0


def test_count_window_refused_batch_leaves_the_window_unchanged():
    window = CountWindow(rate_factory, size=4, buckets=2)
    window.update([1, 0, 1], s=["a", "b", "a"], u=[0, 0, 1])
    before = (list(window.fill_), window.accumulator().totals_.copy(), window.newest_)
    with pytest.raises(RepairInputError, match="'zz'"):
        window.update([1, 1, 1, 1], s=["a", "b", "a", "zz"], u=[0, 0, 0, 0])  # bad row in a new bucket
    with pytest.raises(RepairInputError, match="'zz'"):
        window.update([1, 1, 1], s=["zz", "b", "a"], u=[0, 0, 0])  # bad row in the existing bucket
    assert (list(window.fill_), window.newest_) == (before[0], before[2])
    np.testing.assert_array_equal(window.accumulator().totals_, before[1])


def test_count_window_rejects_bad_configuration_and_misaligned_arrays():
    with pytest.raises(RepairInputError, match="must not exceed size"):
        CountWindow(rate_factory, size=5, buckets=10)
    with pytest.raises(RepairInputError, match="size must be a positive integer"):
        CountWindow(rate_factory, size=0)
    with pytest.raises(RepairInputError, match="factory"):
        CountWindow(rate_factory(), size=10)
    with pytest.raises(RepairInputError, match="lacks"):
        CountWindow(lambda: object(), size=10)
    window = CountWindow(rate_factory, size=10, buckets=2)
    with pytest.raises(RepairInputError, match="row-aligned"):
        window.update([1, 0, 1], s=["a", "b"], u=[0, 0, 1])
    with pytest.raises(RepairInputError, match="at least one row-aligned"):
        window.update(1, s="a", u=0)
    assert window.n_records == 0


def test_count_window_empty_value_and_reset():
    window = CountWindow(rate_factory, size=10, buckets=2)
    assert window.value().difference == 0.0 and window.n_records == 0
    window.accumulator().update([1], s=["a"], u=[0])  # a new accumulator: the window is not changed
    assert window.n_records == 0 and window.accumulator().totals_.sum() == 0
    window.update([1, 0], s=["a", "b"], u=[0, 0])
    window.accumulator().update([1], s=["a"], u=[0])
    assert window.value().difference == 1.0 and window.accumulator().totals_.sum() == 2
    assert window.reset().n_records == 0 and window.n_seen_ == 0 and window.value().difference == 0.0


def test_count_window_accumulators_merge_across_workers():
    y, s, u = records(300, 1)
    a = CountWindow(rate_factory, size=50, buckets=5).update(y[:150], s[:150], u=u[:150])
    b = CountWindow(rate_factory, size=50, buckets=5).update(y[150:], s[150:], u=u[150:])
    merged = a.accumulator().merge(b.accumulator())
    fresh = rate_factory().update(np.r_[y[100:150], y[250:]], np.r_[s[100:150], s[250:]], np.r_[u[100:150], u[250:]])
    assert_same_dp(merged.value(), fresh.value())


# ---------------------------------------------------------------------------------------------
# TimeWindow
# ---------------------------------------------------------------------------------------------


def time_window_model(ts, seconds, buckets, origin=0.0):
    """Indices of the records a time window holds, and the late count, record by record."""
    width = seconds / buckets
    newest, late, taken = None, 0, []
    for i, t in enumerate(ts):
        index = int(np.floor((t - origin) / width))
        if newest is not None and index <= newest - buckets:
            late += 1
            continue
        newest = index if newest is None else max(newest, index)
        taken.append((i, index))
    kept = [i for i, index in taken if index > newest - buckets] if taken else []
    return np.array(kept, dtype=int), late


@st.composite
def time_stream(draw):
    n = draw(st.integers(1, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Mostly increasing times with jitter, so some records are late and some buckets are skipped.
    ts = np.cumsum(rng.exponential(draw(st.floats(0.01, 5.0)), n)) + rng.normal(0, draw(st.floats(0, 20)), n)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    return ts, cuts, draw(st.floats(1.0, 100.0)), draw(st.integers(1, 8)), rng.integers(0, 2**32 - 1)


@PROPERTY
@given(time_stream())
def test_time_window_holds_the_records_of_a_record_by_record_model(stream):
    ts, cuts, seconds, buckets, seed = stream
    y, s, u = records(len(ts), seed)
    window = TimeWindow(rate_factory, seconds=seconds, buckets=buckets)
    for a, b in zip([0, *cuts], [*cuts, len(ts)]):
        window.update(y[a:b], s[a:b], u=u[a:b], ts=ts[a:b])
    kept, late = time_window_model(ts, seconds, buckets)
    assert window.late_ == late and window.n_records == len(kept) and window.n_seen_ == len(ts)
    assert len(window.buckets_) <= buckets
    fresh = rate_factory().update(y[kept], s[kept], u[kept])
    np.testing.assert_array_equal(window.accumulator().totals_, fresh.totals_)
    assert_same_dp(window.value(), fresh.value())


def test_time_window_drops_old_buckets():
    window = TimeWindow(lambda: DamageAccumulator(n_features=1), seconds=10.0, buckets=5)
    window.update(np.zeros((3, 1)), np.ones((3, 1)), ts=[0.5, 1.0, 2.5])  # buckets 0, 0, 1
    assert sorted(window.buckets_) == [0, 1] and window.n_records == 3
    window.update(np.zeros((1, 1)), np.full((1, 1), 3.0), ts=[10.1])  # bucket 5: bucket 0 leaves
    assert sorted(window.buckets_) == [1, 5] and window.n_records == 2
    assert window.value().overall == pytest.approx(2.0)
    window.update(np.zeros((1, 1)), np.ones((1, 1)), ts=[100.0])  # everything older leaves
    assert sorted(window.buckets_) == [50] and window.n_records == 1 and window.late_ == 0


def test_time_window_counts_late_records_inside_a_batch_in_arrival_order():
    window = TimeWindow(rate_factory, seconds=4.0, buckets=4)
    window.update([1, 1, 1, 1], ["a"] * 4, u=0, ts=[0.0, 9.0, 1.0, 6.0])  # 1.0 arrives after 9.0: late
    assert window.late_ == 1 and sorted(window.buckets_) == [6, 9] and window.n_records == 2
    window.update([0], ["b"], u=[0], ts=[2.0])
    assert window.late_ == 2 and window.n_records == 2


def test_time_window_refused_batch_touching_several_buckets_changes_nothing():
    window = TimeWindow(rate_factory, seconds=10.0, buckets=10)
    window.update([1, 0, 1], ["a", "b", "c"], u=[0, 1, 0], ts=[1.0, 2.0, 3.0])
    before = window.accumulator().totals_.copy()
    with pytest.raises(RepairInputError, match="'zz'"):
        window.update([1, 1, 1], ["a", "b", "zz"], u=[0, 0, 0], ts=[1.5, 2.5, 3.5])
    for labels in (["zz", "b", "a"], ["a", "zz", "a"], ["a", "b", "zz"]):  # existing, existing, new bucket
        with pytest.raises(RepairInputError, match="'zz'"):
            window.update([1, 1, 1], labels, u=[0, 0, 0], ts=[1.5, 2.5, 8.0])
    np.testing.assert_array_equal(window.accumulator().totals_, before)
    assert window.n_records == 3 and window.newest_ == 3 and window.late_ == 0


@PROPERTY
@given(st.integers(2, 300), st.integers(0, 2**32 - 1), st.floats(1.0, 50.0), st.integers(1, 6))
def test_time_window_merge_of_partitions_equals_one_window(n, seed, seconds, buckets):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.uniform(0, 200, n))
    y, s, u = records(n, seed)
    part = rng.integers(0, 2, n).astype(bool)
    whole = TimeWindow(rate_factory, seconds, buckets).update(y, s, u=u, ts=ts)
    a = TimeWindow(rate_factory, seconds, buckets).update(y[part], s[part], u=u[part], ts=ts[part])
    b = TimeWindow(rate_factory, seconds, buckets).update(y[~part], s[~part], u=u[~part], ts=ts[~part])
    a_before = a.accumulator().totals_.copy()
    for merged in (a.merge(b), b.merge(a)):
        assert sorted(merged.buckets_) == sorted(whole.buckets_) and merged.fill_ == whole.fill_
        assert merged.n_records == whole.n_records and merged.late_ == 0 and merged.newest_ == whole.newest_
        np.testing.assert_array_equal(merged.accumulator().totals_, whole.accumulator().totals_)
        np.testing.assert_array_equal(merged.accumulator().positives_, whole.accumulator().positives_)
        assert_same_dp(merged.value(), whole.value())
    np.testing.assert_array_equal(a.accumulator().totals_, a_before)  # inputs unchanged
    # Merged windows keep sliding like the single one.
    more = dict(ts=[ts[-1] + seconds / 2], u=[0])
    merged = a.merge(b).update([1], ["a"], **more)
    whole.update([1], ["a"], **more)
    assert_same_dp(merged.value(), whole.value())


def test_time_window_merge_with_an_empty_window_and_bad_merges():
    a = TimeWindow(rate_factory, 10.0, 5).update([1], ["a"], u=[0], ts=[3.0])
    empty = TimeWindow(rate_factory, 10.0, 5)
    assert a.merge(empty).n_records == 1 and empty.merge(a).n_records == 1
    assert empty.merge(TimeWindow(rate_factory, 10.0, 5)).newest_ is None
    with pytest.raises(RepairInputError, match="different seconds"):
        a.merge(TimeWindow(rate_factory, 20.0, 5))
    with pytest.raises(RepairInputError, match="different seconds"):
        a.merge(TimeWindow(rate_factory, 10.0, 5, origin=1.0))


def test_time_window_rejects_bad_times_and_configuration():
    window = TimeWindow(rate_factory, seconds=10.0)
    with pytest.raises(RepairInputError, match="non-finite value nan at row 1"):
        window.update([1, 0], ["a", "b"], u=[0, 0], ts=[1.0, np.nan])
    with pytest.raises(RepairInputError, match="one value per record"):
        window.update([1, 0], ["a", "b"], u=[0, 0], ts=[1.0])
    with pytest.raises(RepairInputError, match="numeric event times"):
        window.update([1], ["a"], u=[0], ts=["noon"])
    with pytest.raises(TypeError):
        window.update([1], ["a"], u=[0])  # ts is required
    for bad in (0.0, -1.0, np.inf, "10"):
        with pytest.raises(RepairInputError, match="seconds"):
            TimeWindow(rate_factory, seconds=bad)
    with pytest.raises(RepairInputError, match="origin"):
        TimeWindow(rate_factory, seconds=1.0, origin=np.nan)
    assert window.n_records == 0 and window.newest_ is None


def test_time_window_reset_and_bucket_of():
    window = TimeWindow(rate_factory, seconds=60.0, buckets=6, origin=5.0)
    np.testing.assert_array_equal(window.bucket_of([4.9, 5.0, 14.99, 15.0]), [-1, 0, 0, 1])
    window.update([1, 0], ["a", "b"], u=[0, 1], ts=[5.0, 15.0])
    assert window.n_records == 2 and window.latest_ts_ == 15.0
    assert window.reset().n_records == 0 and window.newest_ is None and window.late_ == 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_batch_windows_sharing_batches_add_into_their_own_buckets_only(seed, n_batches):
    # A count window and a time window are handed the same accumulator of each batch (as the monitor does); a
    # bucket that takes a second batch adds into its own copy, so neither window nor the caller sees the other's.
    rng = np.random.default_rng(seed)
    counted, timed = BatchWindow(records=40, buckets=4), BatchWindow(seconds=30.0, buckets=3)
    prototype, handed, seen = PositiveRateAccumulator(groups=[0, 1]), [], []
    for i in range(n_batches):
        n = int(rng.integers(1, 15))
        y, s, ts = rng.integers(0, 2, n), rng.integers(0, 2, n), float(rng.uniform(0, 8) + 4 * i)
        batch = prototype.fresh().update(y, s)
        handed.append((batch, batch.positives_.copy(), batch.totals_.copy()))
        seen.append((y, s, n, ts))
        counted.add(batch, n)
        timed.add(batch, n, ts=ts)
    assert all(np.array_equal(b.positives_, p) and np.array_equal(b.totals_, t) for b, p, t in handed)
    for window in (counted, timed):  # each window holds exactly the batches of its buckets
        reference = BatchWindow(records=40, buckets=4) if window is counted else BatchWindow(seconds=30.0, buckets=3)
        for y, s, n, ts in seen:
            reference.add(PositiveRateAccumulator(groups=[0, 1]).update(y, s), n, ts=ts)
        assert window.n_records == reference.n_records == sum(bucket[2] for bucket in window.ring_)
        mine, theirs = window.accumulator(), reference.accumulator()
        assert np.array_equal(mine.positives_, theirs.positives_) and np.array_equal(mine.totals_, theirs.totals_)


def test_a_read_of_a_window_never_changes_when_later_batches_are_added():
    window = BatchWindow(seconds=60.0, buckets=1)
    for _ in range(2):  # one bucket: the window adds the second batch into its own copy
        window.add(PositiveRateAccumulator([0, 1]).update([0], [0]), 1, ts=0.0)
    read = window.accumulator()
    window.add(PositiveRateAccumulator([0, 1]).update([1], [0]), 1, ts=1.0)  # same bucket
    assert read.positives_.tolist() == [[0, 0]] and read.totals_.tolist() == [[2, 0]]
    assert window.accumulator().positives_.tolist() == [[1, 0]] and window.accumulator().totals_.tolist() == [[3, 0]]
