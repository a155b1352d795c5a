"""Tests of the frozen flow preprocessor (numpy): invertibility, routing, protocol, artifacts, validation."""

import dataclasses
import doctest
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.models import flow as flow_module
from fairstream.models.flow import FlowPreprocessor, coupling_masks, validate_flow
from fairstream.models.kinds import MODULE_KINDS, load_module
from fairstream.repair import artifacts
from fairstream.repair.validation import RepairInputError
from fairstream.repair.protocol import Batch, IncompatibleArtifact, PipelineSchema, apply_chain

COLUMNS = ("a", "b", "c")


def random_flow(group_aware=True, groups=(0, 1), n_blocks=3, hidden=(6, 5), seed=0, weight=0.5):
    """A flow with random (non-identity) weights, standardisation and a fit range."""
    base = FlowPreprocessor.identity(COLUMNS, groups=groups, group_aware=group_aware, n_blocks=n_blocks,
                                     hidden=hidden, mean=[1.0, -2.0, 0.5], scale=[2.0, 0.5, 1.0], seed=seed)
    rng = np.random.default_rng(seed)
    nets = {f"{net}_{part}": tuple(weight * rng.normal(size=a.shape) for a in getattr(base, f"{net}_{part}"))
            for net in ("scale", "shift") for part in ("weights", "biases")}
    return dataclasses.replace(base, data_min=np.full(3, -5.0), data_max=np.full(3, 5.0), **nets)


def test_docstring_examples_run():
    result = doctest.testmod(flow_module)
    assert result.attempted > 0 and result.failed == 0


def test_masks_pair_up_into_complements():
    masks = coupling_masks(5, 4, seed=3)
    assert masks.shape == (8, 5)
    np.testing.assert_array_equal(masks[0::2] + masks[1::2], 1.0)
    assert set(masks[0::2].sum(axis=1)) == {2.0}


@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, (6, 3), elements=st.floats(-1e3, 1e3)), st.sampled_from([(0, 1), (0, 1, 2)]))
def test_identity_flow_maps_rows_to_themselves(X, groups):
    flow = FlowPreprocessor.identity(COLUMNS, groups=groups, n_blocks=2, hidden=(4,))
    s = np.resize(np.array(groups), 6)
    np.testing.assert_allclose(flow.transform(X, s), X, rtol=1e-12, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (8, 3), elements=st.floats(-20, 20)), st.integers(0, 1000), st.booleans())
def test_flow_is_invertible(X, seed, group_aware):
    flow = random_flow(group_aware=group_aware, seed=seed)
    s = np.arange(8) % 2
    Y = flow.transform(X, s)
    assert not np.allclose(Y, X)  # the random flow does move the rows
    np.testing.assert_allclose(flow.inverse_transform(Y, s), X, rtol=1e-9, atol=1e-9)


def test_group_aware_flow_routes_each_row_to_its_group():
    flow = random_flow()
    X = np.random.default_rng(1).normal(size=(10, 3))
    s = np.array([0, 1] * 5)
    mapped = flow.transform(X, s)
    only = {g: dataclasses.replace(flow, **{name: tuple(a[[g]] for a in getattr(flow, name))
                                             for name in ("scale_weights", "scale_biases", "shift_weights", "shift_biases")},
                                   groups=np.array([g])) for g in (0, 1)}
    for g in (0, 1):
        np.testing.assert_allclose(mapped[s == g], only[g].transform(X[s == g], s[s == g]))
    assert not np.allclose(flow.transform(X, 1 - s), mapped)
    # A row's output does not depend on its batch.
    np.testing.assert_allclose(flow.transform(X[3], [s[3]]), mapped[[3]])


def test_blind_flow_needs_no_group():
    flow = random_flow(group_aware=False)
    X = np.random.default_rng(2).normal(size=(5, 3))
    np.testing.assert_allclose(flow.transform(X), flow.transform(X, s=[7, 7, 7, 7, 7]))
    assert flow.n_flows == 1


def test_apply_gives_reasons_for_rows_it_cannot_map():
    flow = random_flow()
    X = np.array([[0.0, 0.0, 0.0], [1.0, np.nan, 0.0], [0.0, 1.0, 0.0], [9.0, 0.0, 0.0]])
    batch = Batch(X=X, keys=np.array(list("abcd"), dtype=object), s=np.array([0, 1, 5, 1]))
    result = flow.apply(batch)
    assert result.ok.tolist() == [True, False, False, True]
    assert result.reasons[1] == "column 'b' has a non-finite value nan"
    assert result.reasons[2] == "s value 5 has no flow (the flow was fitted for groups [0, 1])"
    assert result.out_of_range.tolist() == [False, False, False, True]  # 9 is outside the fit range [-5, 5]
    np.testing.assert_array_equal(result.X[2], X[2])  # refused rows keep their values
    np.testing.assert_allclose(result.X[[0, 3]], flow.transform(X[[0, 3]], [0, 1]))
    no_s = flow.apply(Batch(X=X[:1], keys=np.array(["a"])))
    assert no_s.reasons == ["the flow is group-aware and the row has no s"]
    with pytest.raises(RepairInputError, match="s value 5 has no flow"):
        flow.transform(X[[2]], [5])


def test_flow_then_scorer_chain():
    from fairstream.models.scorer import LogisticScorer

    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3))
    scorer = LogisticScorer().fit(X, (X[:, 0] > 0).astype(int))
    flow = random_flow()
    batch = Batch(X=X[:4], keys=np.arange(4), s=np.array([0, 1, 9, 0]))
    result = apply_chain([flow, scorer], batch)
    assert result.ok.tolist() == [True, True, False, True]
    expected = scorer.predict_proba(flow.transform(X[[0, 1, 3]], [0, 1, 0]))
    np.testing.assert_allclose(result.columns["score"][[0, 1, 3]], expected)
    assert np.isnan(result.columns["score"][2])


def test_artifact_round_trip_is_bit_exact(tmp_path):
    flow = dataclasses.replace(random_flow(groups=("f", "m")), training={"lam": 0.5, "notion": "dp"})
    art = flow.to_artifact(version=4, metrics={"dp_gap": 0.1})
    for copy in (artifacts.decode(artifacts.encode(art), kind="flow"),
                 artifacts.load(artifacts.save(art, tmp_path), kind="flow")):
        again = FlowPreprocessor.from_artifact(copy)
        X = np.random.default_rng(4).normal(size=(20, 3))
        s = np.array(["f", "m"] * 10)
        np.testing.assert_array_equal(again.transform(X, s), flow.transform(X, s))
        assert again.columns == COLUMNS and again.groups.tolist() == ["f", "m"]
        assert again.training == {"lam": 0.5, "notion": "dp"} and copy.version == 4
    assert isinstance(load_module(art, PipelineSchema(features=COLUMNS, groups=("f", "m"))), FlowPreprocessor)
    assert MODULE_KINDS["flow"] is FlowPreprocessor


def _repack(art, **changes):
    """The artifact's arrays and parameters with some replaced, packed again (a valid payload hash)."""
    arrays = {k: v for k, v in art.arrays.items() if k != artifacts.PARAMETERS_ARRAY}
    parameters = dict(art.parameters)
    for key, value in changes.items():
        (parameters if key in parameters else arrays)[key] = value
    return artifacts.pack("flow", arrays, parameters=parameters)


@pytest.mark.parametrize("change, message", [
    ({"shift_w1": np.zeros((2, 6, 3, 4))},
     r"'shift_w1' has shape \(2, 6, 3, 4\), expected "
     r"\(n_groups=2 as in 'groups', n_layers=6, hidden_2=5, hidden_1=6\)"),
    ({"masks": np.ones((5, 3))}, r"'masks' has shape \(5, 3\), expected \(n_layers=6, n_features=3\)"),
    ({"masks": np.full((6, 3), 0.5)}, r"'masks' must be one of \[0.0, 1.0\], got 0.5 at index \(0, 0\)"),
    ({"mean": np.zeros(4)}, r"'mean' has shape \(4,\), expected \(n_features=3,\)"),
    ({"data_max": np.zeros(4)}, "'data_max' has shape"),
    ({"data_max": np.full(3, -6.0)}, r"'data_max' must be at least data_min, got -6.0 at index \(0,\)"),
    ({"groups": np.array([1, 0])}, "sorted unique"),
    ({"scale_b0": np.full((2, 6, 6), np.inf)}, r"'scale_b0' must be finite, got inf at index \(0, 0, 0\)"),
    ({"hidden": [6]}, "undeclared array 'scale_w2'"),
    ({"n_blocks": 4}, r"'masks' has shape \(6, 3\), expected \(n_layers=8, n_features=3\)"),
    ({"n_blocks": 0}, "parameter 'n_blocks' must be an integer >= 1, got 0"),
])
def test_mis_shaped_flow_artifact_is_refused(change, message):
    art = random_flow().to_artifact()
    with pytest.raises(artifacts.ArtifactError, match=message):
        FlowPreprocessor.from_artifact(_repack(art, **change))


def test_artifact_missing_an_array_or_of_another_kind_is_refused():
    art = random_flow().to_artifact()
    arrays = {k: v for k, v in art.arrays.items() if k not in (artifacts.PARAMETERS_ARRAY, "scale_w2")}
    with pytest.raises(artifacts.ArtifactError, match="flow artifact: the array 'scale_w2' is missing"):
        FlowPreprocessor.from_artifact(artifacts.pack("flow", arrays, parameters=art.parameters))
    with pytest.raises(artifacts.ArtifactError, match="expected an artifact of kind 'flow'"):
        FlowPreprocessor.from_artifact(artifacts.pack("plan", {"q": np.arange(2)}, parameters={}))


def test_check_compatible_refuses_wrong_features_and_groups():
    flow = random_flow()
    flow.check_compatible(PipelineSchema(features=COLUMNS, groups=(0, 1)))
    flow.check_compatible(PipelineSchema())
    with pytest.raises(IncompatibleArtifact, match="maps 3 features"):
        flow.check_compatible(PipelineSchema(features=("a", "b")))
    with pytest.raises(IncompatibleArtifact, match="fitted on features"):
        flow.check_compatible(PipelineSchema(features=("a", "b", "x")))
    with pytest.raises(IncompatibleArtifact, match=r"without the pipeline's groups \['2'\]"):
        flow.check_compatible(PipelineSchema(groups=(0, 1, 2)))
    random_flow(group_aware=False).check_compatible(PipelineSchema(groups=(0, 1, 2)))  # blind: s unused
    unnamed = FlowPreprocessor.identity(3)
    unnamed.check_compatible(PipelineSchema(features=("p", "q", "r")))  # no names to compare
    with pytest.raises(IncompatibleArtifact):
        load_module(flow.to_artifact(), PipelineSchema(features=("a", "b")))


def test_apply_path_does_not_import_torch():
    code = ("import sys, numpy as np; import fairstream.models.kinds as k; from fairstream.models.flow import "
            "FlowPreprocessor, validate_flow; f = FlowPreprocessor.identity(2); f.transform(np.ones((1, 2)), [0]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class Threshold:
    """Scores 0.9 where the first feature is positive, else 0.1."""

    def predict_proba(self, X):
        return np.where(np.asarray(X)[:, 0] > 0, 0.9, 0.1)


def test_validate_flow_counts_decisions_by_group_and_label():
    X = np.array([[1.0], [1.0], [-1.0], [-1.0], [1.0], [-1.0]])
    s = np.array([0, 0, 0, 1, 1, 1])
    y = np.array([1, 0, 1, 1, 1, 0])
    v = validate_flow(None, Threshold(), X, s, y)
    # decisions 1 1 0 | 0 1 0: rates 2/3 vs 1/3; y=1 rows: (1, 0) vs (0, 1); y=0 rows: (1) vs (0)
    assert v.accuracy == pytest.approx(3 / 6)
    assert v.dp_gap == pytest.approx(1 / 3)
    assert v.eopp_gap == pytest.approx(0.0)
    assert v.eo_gap == pytest.approx(1.0)
    assert v.positive_rates == pytest.approx({0: 2 / 3, 1: 1 / 3})
    assert v.as_metrics()["n_rows"] == 6


def test_validate_flow_applies_the_flow_and_leaves_out_unmapped_rows():
    flow = dataclasses.replace(FlowPreprocessor.identity(1, groups=(0, 1), n_blocks=1, hidden=(2,)))
    # Shift group 1 by +2 through the bias of the shift net's last layer of the layer that moves x0.
    moved = int(np.argmin(flow.masks[:, 0]))
    biases = [b.copy() for b in flow.shift_biases]
    biases[-1][1, moved, 0] = 2.0
    flow = dataclasses.replace(flow, shift_biases=tuple(biases))
    X = np.array([[-1.0], [-1.0], [-1.0], [-1.0]])
    v = validate_flow(flow, Threshold(), X, s=[0, 1, 1, 3], y=[0, 1, 1, 1])
    assert v.n_refused == 1 and v.n_rows == 3
    assert v.positive_rates == {0: 0.0, 1: 1.0} and v.accuracy == 1.0
    assert np.isnan(v.eo_gap) and "eo_gap" not in v.as_metrics()  # no y=0 row in group 1


def overflowing_flow():
    """Each array finite, but a scale of 1e308 with shift biases of 10 maps every row to +-inf (F5's crafted flow)."""
    base = FlowPreprocessor.identity(COLUMNS, n_blocks=1, hidden=(4,))
    return dataclasses.replace(base, scale=np.full(3, 1e308),
                               shift_biases=tuple(np.full_like(b, 10.0) for b in base.shift_biases))


def test_a_row_the_flow_maps_to_a_non_finite_value_is_refused_and_keeps_its_input():
    # Before, map_rows marked rows ok from their input alone: the inf went on to the scorer, which
    # raised for the whole batch.
    X = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    result = overflowing_flow().map_rows(X, [0, 1])
    assert not result.ok.any() and result.X.tolist() == X.tolist()
    assert result.reasons[0].startswith("the flow maps column 'a' of the row to inf (its values overflow the flow")
    with pytest.raises(RepairInputError, match="the flow maps column"):
        overflowing_flow().transform(X, [0, 1])


def test_a_flow_that_overflows_its_own_fit_range_is_refused_at_load():
    with pytest.raises(artifacts.ArtifactError, match=r"flow artifact: it cannot serve its own probe input "
                                                      r"\(row 0 of 6: the flow maps column 'a' of the row to inf"):
        load_module(overflowing_flow().to_artifact(), PipelineSchema())
    probe = random_flow().probe()  # an ordinary flow: its centre and fit-range corners, per group
    assert probe.X[:3].tolist() == [[1.0, -2.0, 0.5], [-5.0] * 3, [5.0] * 3] and probe.s.tolist() == [0, 0, 0, 1, 1, 1]
    load_module(random_flow().to_artifact(), PipelineSchema())


@pytest.mark.parametrize("seed", range(6))
def test_one_record_of_extreme_age_through_a_flow_and_a_scorer_never_stops_the_batch(seed):
    # The red team's F5 (p6c_sweep.py): ordinary-looking flows (coupling weights N(0, 0.5)) in front of
    # an ordinary scorer, a pipeline without valid_ranges and one valid record with age = +-1.7e308:
    # before, 37 of 80 (flow, record) pairs raised for the whole batch; now that row is refused or
    # served finite, and the 50 others get exactly what they get without it.
    from fairstream.models.scorer import Scorer

    rng = np.random.default_rng(seed)
    columns = ("age", "hours-per-week")
    base = FlowPreprocessor.identity(columns, n_blocks=2, hidden=(8,), mean=[38.0, 40.0], scale=[13.0, 12.0])
    flow = dataclasses.replace(base, **{f"{net}_weights": tuple(rng.normal(scale=0.5, size=w.shape)
                                                                for w in getattr(base, f"{net}_weights"))
                                        for net in ("scale", "shift")})
    scorer = Scorer.from_weights([rng.normal(size=(2, 4)), rng.normal(size=(4, 1))], [np.zeros(4), np.zeros(1)],
                                 [38.0, 40.0], [13.0, 12.0], columns=list(columns))
    normal = np.column_stack([rng.normal(38, 13, 50).round(), rng.normal(40, 12, 50).round()])
    s = rng.integers(0, 2, 51)
    for age in (1.7e308, -1.7e308):
        X = np.vstack([normal[:25], [[age, 40.0]], normal[25:]])
        batch = Batch(X=X, keys=np.array([f"r-{i}" for i in range(51)], dtype=object), s=s, columns=columns)
        result = apply_chain([flow, scorer], batch)
        assert np.isfinite(result.X[result.ok]).all() and np.isfinite(result.columns["score"][result.ok]).all()
        without = apply_chain([flow, scorer], batch.take(np.r_[0:25, 26:51]))
        assert without.ok.all() and result.ok[np.r_[0:25, 26:51]].all()
        assert np.array_equal(result.X[np.r_[0:25, 26:51]], without.X)
        assert np.array_equal(result.columns["score"][np.r_[0:25, 26:51]], without.columns["score"])
        if not result.ok[25]:
            assert result.reasons[25].startswith(("the flow maps column", "the scorer's logit", "scorer produced"))
