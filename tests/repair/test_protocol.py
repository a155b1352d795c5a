"""The module protocol: chains of modules on a batch, and compatibility checks at load time."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.protocol import (
    Applied,
    Batch,
    FrozenModule,
    IncompatibleArtifact,
    PipelineSchema,
    apply_chain,
    check_labels_cover,
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
