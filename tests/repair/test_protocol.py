"""The module protocol: chains of modules on a batch, and compatibility checks at load time."""

import numpy as np
import pytest

from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.protocol import (
    Applied,
    Batch,
    FrozenModule,
    IncompatibleArtifact,
    PipelineSchema,
    apply_chain,
    check_labels_cover,
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
