"""The module protocol: chains of modules on a batch, and compatibility checks at load time."""

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair.validation import RepairInputError
from fairstream.repair.artifacts import ArtifactError
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import (
    MODULE_ERRORS,
    Applied,
    Batch,
    FrozenModule,
    IncompatibleArtifact,
    PipelineSchema,
    apply_chain,
    check_labels_cover,
    check_probe,
    rowwise_matmul,
)


class RefuseNegative:
    """Refuses rows with a negative first value; adds their doubled first value as a column."""

    kind = "refuse-negative"
    seed = ""

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        ok = batch.X[:, 0] >= 0
        return Applied(X=batch.X + 1, ok=ok, reasons=[None if k else "negative" for k in ok],
                       out_of_range=~ok, columns={"double": 2 * batch.X[:, 0]})


class CountRows:
    kind = "count-rows"
    seed = ""
    seen: list = []

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        CountRows.seen.append(len(batch))
        return Applied.all_ok(batch, batch.X, rank=np.arange(len(batch)))


def batch_of(values):
    X = np.asarray(values, dtype=float).reshape(-1, 1)
    return Batch(X=X, keys=np.array([str(i) for i in range(len(X))], dtype=object))


def test_a_refused_row_keeps_its_input_and_reason_and_skips_later_modules():
    CountRows.seen = []
    result = apply_chain([RefuseNegative(), CountRows()], batch_of([1.0, -2.0, 3.0]))
    assert result.ok.tolist() == [True, False, True]
    assert result.reasons == [None, "negative", None]
    assert result.X.ravel().tolist() == [2.0, -2.0, 4.0]
    assert CountRows.seen == [2]  # the refused row never reached the second module
    assert result.columns["double"].tolist() == [2.0, -4.0, 6.0]
    assert result.columns["rank"].tolist() == [0, -1, 1]  # integer column: -1 on refused rows
    assert result.out_of_range.tolist() == [False, True, False]


def test_an_empty_chain_returns_the_batch_unchanged():
    result = apply_chain([], batch_of([1.0, 2.0]))
    assert result.ok.all() and result.X.ravel().tolist() == [1.0, 2.0] and result.columns == {}


def test_modules_implement_the_protocol():
    plan = DistributionalRepair(n_q=20).fit(np.arange(40.0).reshape(20, 2), [0, 1] * 10, [0] * 20)
    assert isinstance(plan, FrozenModule) and plan.kind == "plan" and len(plan.seed) == 16


def test_label_cover_names_the_missing_values():
    check_labels_cover("plan", "groups", [0, 1, 2], (0, 1))
    with pytest.raises(IncompatibleArtifact, match=r"without the pipeline's groups \['2'\]"):
        check_labels_cover("plan", "groups", [0, 1], (0, 1, 2))


def test_a_plan_fitted_without_column_names_matches_by_position():
    rng = np.random.default_rng(0)
    s, u = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    plan = DistributionalRepair(n_q=20).fit(rng.normal(size=(200, 2)), s, u)
    plan.check_compatible(PipelineSchema(features=("age", "hours"), groups=(0, 1), strata=(0, 1)))
    with pytest.raises(IncompatibleArtifact, match="repairs 2 features"):
        plan.check_compatible(PipelineSchema(features=("age",)))


class Overflow:
    """Multiplies every value by 1e307 (a value of 100 overflows to inf); adds the row's last value times 1e307."""

    kind = "overflow"
    seed = ""

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        return Applied.all_ok(batch, batch.X * 1e307, tail=batch.X[:, -1] * 1e307)

    def probe(self):
        return batch_of([100.0])


def test_a_row_with_a_non_finite_output_is_refused_naming_the_module_and_feature_and_skips_later_modules():
    # Before, the inf went on to the next module and into the output topic (F4: a plan with a grid
    # ending at inf wrote "inf" into records.repaired, which no JSON reader accepts).
    CountRows.seen = []
    X = np.array([[1.0, 2.0], [100.0, 3.0], [4.0, -5.0]])
    batch = Batch(X=X, keys=np.array(["a", "b", "c"], dtype=object), columns=("age", "hours_per_week"))
    result = apply_chain([Overflow(), CountRows()], batch)
    assert result.ok.tolist() == [True, False, True]
    assert result.reasons[1] == "overflow produced a non-finite value for feature 'age' (inf)"
    assert CountRows.seen == [2]  # the row never reached the next module
    assert result.X[1].tolist() == [100.0, 3.0]  # a refused row keeps its input
    assert result.X[[0, 2]].tolist() == (X[[0, 2]] * 1e307).tolist()
    tail = apply_chain([Overflow()], batch_of([1.0, 100.0]))  # unnamed columns, and an added column
    assert tail.reasons == [None, "overflow produced a non-finite value for column 0 (inf)"]


class NaNScore:
    kind = "nan-score"
    seed = ""

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        score = np.where(batch.X[:, 0] < 0, np.nan, 0.5)
        return Applied.all_ok(batch, batch.X, score=score, decision=(score >= 0.5).astype(np.int64))


def test_a_non_finite_added_column_is_refused_naming_it():
    result = apply_chain([NaNScore()], batch_of([1.0, -1.0]))
    assert result.ok.tolist() == [True, False]
    assert result.reasons[1] == "nan-score produced a non-finite value for its column 'score' (nan)"
    assert result.columns["score"][0] == 0.5 and result.columns["decision"].tolist() == [1, 0]


class Fragile:
    """Raises ``error`` on a batch holding a 13; otherwise a keyed per-row output, a column and an s."""

    kind = "fragile"
    seed = ""

    def __init__(self, error=ValueError):
        self.error = error
        self.calls = 0

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        self.calls += 1
        if np.any(batch.X == 13.0):
            raise self.error("cannot take 13\nsecond line")
        out = batch.X * 2 + np.array([hash(k) % 7 for k in batch.keys], dtype=float)[:, None]
        ok = batch.X[:, 0] >= 0
        return Applied(X=out, ok=ok, reasons=[None if k else "negative" for k in ok],
                       out_of_range=batch.X[:, 0] > 50, columns={"twice": 2 * batch.X[:, 0]},
                       imputed=batch.X[:, 0] == 1.0, s=np.array(["m"] * len(batch), dtype=object))


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 1.0, 2.5, -1.0, 13.0, 60.0]), min_size=1, max_size=40),
       error=st.sampled_from([ValueError, RepairInputError, FloatingPointError, OverflowError, IndexError, KeyError,
                              ZeroDivisionError]))
def test_a_module_raising_on_some_rows_refuses_only_them_and_the_others_get_their_own_output(values, error):
    # Before, the exception left apply_chain and stopped the batch: the consumer crashed on the same
    # batch at every restart (F5: one record of age 1.7e308 through a flow made the scorer raise).
    batch = Batch(X=np.array(values).reshape(-1, 1), keys=np.array([f"k{i}" for i in range(len(values))], dtype=object),
                  s=np.array(["f"] * len(values), dtype=object))
    module = Fragile(error)
    result = apply_chain([module], batch)
    poison = np.array(values) == 13.0
    assert result.ok[poison].sum() == 0
    twice = result.columns.get("twice", np.full(len(values), np.nan))  # no row applied: no column
    for i in np.flatnonzero(poison):
        assert result.reasons[i] == f"fragile could not process the row: {error.__name__}: " + (
            "'cannot take 13\\nsecond line'" if error is KeyError else "cannot take 13")
        assert result.X[i, 0] == 13.0 and np.isnan(twice[i]) and (result.s is None or result.s[i] == "f")
    for i in np.flatnonzero(~poison):
        alone = Fragile().apply(batch.take(np.array([i])))
        assert result.ok[i] == alone.ok[0] and result.reasons[i] == alone.reasons[0]
        assert result.X[i, 0] == (alone.X[0, 0] if alone.ok[0] else values[i])
        assert result.columns["twice"][i] == alone.columns["twice"][0]
        assert result.out_of_range[i] == alone.out_of_range[0] and result.imputed[i] == alone.imputed[0]
        assert result.s[i] == "m"
    if not poison.any():
        assert module.calls == 1  # the common case: one call, no isolation
    else:  # bisection: a few calls per poisoned row, not one per row
        assert module.calls <= 1 + 2 * poison.sum() * int(np.ceil(np.log2(len(values)) + 1))


@pytest.mark.parametrize("error", [MemoryError, KeyboardInterrupt, TypeError, SystemExit])
def test_only_errors_of_the_data_are_isolated_not_those_of_the_process_or_the_code(error):
    assert apply_chain([Fragile(ValueError)], batch_of([1.0, 13.0])).ok.tolist() == [True, False]
    with pytest.raises(error):
        apply_chain([Fragile(error)], batch_of([1.0, 13.0]))
    assert not issubclass(error, MODULE_ERRORS)


def test_isolation_is_logged_and_the_next_module_sees_the_other_rows(caplog):
    CountRows.seen = []
    with caplog.at_level(logging.WARNING, logger="fairstream.repair.protocol"):
        result = apply_chain([Fragile(), CountRows()], batch_of([1.0, 13.0, 2.0, 13.0]))
    assert result.ok.tolist() == [True, False, True, False] and CountRows.seen == [2]
    assert "the fragile module raised on a batch of 4 rows" in caplog.text and "refused the 2 rows" in caplog.text


def test_a_numpy_floating_point_error_setting_does_not_turn_an_overflow_into_an_exception():
    with np.errstate(all="raise"):
        result = apply_chain([Overflow()], batch_of([1.0, 100.0]))
    assert result.ok.tolist() == [True, False]


def test_a_module_that_does_not_serve_its_own_probe_is_refused():
    with pytest.raises(ArtifactError, match=r"overflow artifact: it cannot serve its own probe input \(row 0 of 1: "
                                            r"overflow produced a non-finite value for column 0 \(inf\)\)"):
        check_probe(Overflow())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 96), st.integers(1, 48), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_rowwise_matmul_gives_each_row_the_same_bits_in_any_batch(n, n_in, n_out, stack, seed):
    # A batched X @ W lets BLAS choose kernels by the row count: on this suite's machines a row's
    # result then differs in the last bits between a batch and the row alone. Row by row it cannot.
    rng = np.random.default_rng(seed)
    X, W = rng.normal(size=(stack, n, n_in)), rng.normal(size=(stack, n_in, n_out))
    together = rowwise_matmul(X, W)
    np.testing.assert_allclose(together, X @ W, rtol=1e-12, atol=1e-12 * n_in)
    assert together.shape == (stack, n, n_out)
    start = int(rng.integers(0, n))
    part = rowwise_matmul(X[:, start:], W)  # another batch holding the same rows
    assert np.array_equal(part, together[:, start:])
    for i in range(n):
        assert np.array_equal(rowwise_matmul(X[:, i:i + 1], W)[:, 0], together[:, i])
    assert np.array_equal(rowwise_matmul(X[0], W[0]), together[0])  # a 2-D W: one matrix for every row
    # Copies at other addresses (a reloaded artifact, a row decoded elsewhere): some BLAS kernels peel
    # loops to an aligned address (OpenBLAS's SSE2 dot), so alignment must not reach the result either.
    assert np.array_equal(rowwise_matmul(shifted(X, rng), shifted(W, rng)), together)


def shifted(a: np.ndarray, rng) -> np.ndarray:
    """A copy of ``a`` starting 8 to 56 bytes past a 64-byte boundary."""
    raw = np.empty(a.size + 16)
    start = (-raw.ctypes.data % 64) // 8 + int(rng.integers(1, 8))
    copy = raw[start:start + a.size].reshape(a.shape)
    copy[...] = a
    return copy


@pytest.mark.parametrize("field, values, says", [
    ("s", np.array([0, 1]), "the batch's s has 2 values for 3 rows"),
    ("keys", np.array(["a", "b", "c", "d"]), "the batch's keys has 4 values for 3 rows"),
    ("added", {"score": np.array([0.5])}, "the batch's score has 1 values for 3 rows"),
    ("keys", None, "the batch has no record keys"),
])
def test_a_batch_whose_arrays_describe_other_rows_is_refused_whole(field, values, says):
    # Applied row by row, the first rows would be decided with another record's s, key or score.
    batch = Batch(X=np.ones((3, 1)), keys=np.array(["a", "b", "c"]), s=np.array([0, 1, 0]))
    setattr(batch, field, values)
    outcome = apply_chain([RefuseNegative()], batch)
    assert not outcome.ok.any() and outcome.reasons == [says] * 3
