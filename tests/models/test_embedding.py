"""Tests of the frozen embedding fairness module applied with numpy."""

import doctest
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.models import embedding
from fairstream.models.embedding import FairnessModule, normalise
from fairstream.repair import artifacts
from fairstream.repair.validation import RepairInputError
from fairstream.repair.protocol import Batch, IncompatibleArtifact, PipelineSchema


def random_module(d=4, seed=0):
    rng = np.random.default_rng(seed)
    return FairnessModule(rng.normal(size=(2 * d, d)), rng.normal(size=2 * d), rng.normal(size=(d, 2 * d)), rng.normal(size=d))


def test_docstring_examples_run():
    result = doctest.testmod(embedding)
    assert result.attempted > 0 and result.failed == 0


@given(arrays(np.float64, (5, 4), elements=st.floats(-1e3, 1e3)))
def test_identity_module_is_normalisation(v):
    out = FairnessModule.identity(4).transform(v)
    np.testing.assert_array_equal(out, normalise(v))
    zero = ~np.any(v != 0, axis=1)
    assert np.all(out[zero] == 0)
    np.testing.assert_allclose(np.linalg.norm(out[~zero], axis=1), 1.0, rtol=1e-12)
    # Same direction as the input (also for subnormal inputs, whose plain norm underflows).
    scaled = v[~zero] / np.abs(v[~zero]).max(axis=1, keepdims=True)
    np.testing.assert_allclose(out[~zero], scaled / np.linalg.norm(scaled, axis=1, keepdims=True), rtol=1e-12)


def test_module_matches_its_formula_and_is_scale_invariant():
    m = random_module()
    v = np.random.default_rng(1).normal(size=(10, 4))
    z = v / np.linalg.norm(v, axis=1, keepdims=True)
    expected = z + np.maximum(z @ m.w1.T + m.b1, 0) @ m.w2.T + m.b2
    np.testing.assert_allclose(m.transform(v), expected)
    np.testing.assert_allclose(m.transform(3.0 * v), m.transform(v))
    np.testing.assert_allclose(m.transform(v[0]), m.transform(v)[:1])


def test_artifact_round_trip_and_errors():
    m = random_module()
    again = FairnessModule.from_artifact(artifacts.decode(artifacts.encode(m.to_artifact(version=2))))
    v = np.random.default_rng(2).normal(size=(3, 4))
    np.testing.assert_array_equal(again.transform(v), m.transform(v))
    with pytest.raises(RepairInputError, match="expects 4"):
        m.transform(np.zeros((2, 5)))
    with pytest.raises(RepairInputError,
                       match=r"embedding module: array 'b1' has shape \(7,\), expected \(hidden=8 as in 'w1',\)"):
        FairnessModule(np.zeros((8, 4)), np.zeros(7), np.zeros((4, 8)), np.zeros(4))
    with pytest.raises(artifacts.ArtifactError, match="kind"):
        FairnessModule.from_artifact(artifacts.pack("plan", {"x": np.zeros(1)}, {}))


def test_identity_fast_path_equals_the_formula_with_zero_weights():
    identity = FairnessModule.identity(4)
    assert identity.is_identity and not random_module().is_identity
    # A module with a non-zero first layer but zero W2 and b2 is still the identity.
    m = random_module()
    zero_residual = FairnessModule(m.w1, m.b1, np.zeros_like(m.w2), np.zeros(4))
    v = np.random.default_rng(3).normal(size=(6, 4))
    assert zero_residual.is_identity
    np.testing.assert_array_equal(zero_residual.transform(v), identity.transform(v))
    only_bias = FairnessModule(m.w1, m.b1, np.zeros_like(m.w2), np.full(4, 0.5))
    np.testing.assert_allclose(only_bias.transform(v), normalise(v) + 0.5)


def test_protocol_members():
    m = random_module()
    m.check_compatible(PipelineSchema(dimension=4))
    with pytest.raises(IncompatibleArtifact, match="length 4"):
        m.check_compatible(PipelineSchema(dimension=3))
    X = np.random.default_rng(4).normal(size=(3, 4))
    applied = m.apply(Batch(X=X, keys=np.array(["a", "b", "c"], dtype=object)))
    np.testing.assert_array_equal(applied.X, m.transform(X))
    assert applied.ok.all() and m.kind == "embedding"


def test_artifact_records_training_and_refuses_bad_payloads():
    m = random_module()
    art = m.to_artifact(version=3, metrics={"bfar": 1.2}, training={"epochs": 20}, data_fingerprint="ab" * 32)
    assert art.parameters["training"] == {"epochs": 20} and art.parameters["hidden"] == 8
    with pytest.raises(artifacts.ArtifactError, match="embedding artifact: the array 'b1' is missing"):
        FairnessModule.from_artifact(artifacts.pack("embedding", {"w1": np.zeros((8, 4))}, {}))
    arrays = {k: v for k, v in art.arrays.items() if k != artifacts.PARAMETERS_ARRAY}
    with pytest.raises(artifacts.ArtifactError, match=r"'w1' has shape \(8, 4\), expected \(hidden=9, dimension=4\)"):
        FairnessModule.from_artifact(artifacts.pack("embedding", arrays, {**art.parameters, "hidden": 9}))
    with pytest.raises(artifacts.ArtifactError, match="'w1' must be finite, got nan at index"):
        FairnessModule.from_artifact(artifacts.pack("embedding", {"w1": np.full((2, 1), np.nan), "b1": np.zeros(2),
                                                                  "w2": np.zeros((1, 2)), "b2": np.zeros(1)}, {}))


def test_applying_a_module_does_not_import_torch():
    code = ("import sys, numpy as np\n"
            "from fairstream.models.embedding import FairnessModule\n"
            "import fairstream.models.centroid, fairstream.models.kinds\n"
            "FairnessModule.identity(3).transform(np.ones((2, 3)))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_single_precision_apply_is_close_and_typed():
    m = random_module()
    v = np.random.default_rng(5).normal(size=(7, 4))
    out32 = m.transform(v, dtype=np.float32)
    assert out32.dtype == np.float32 and FairnessModule.identity(4).transform(v, dtype=np.float32).dtype == np.float32
    np.testing.assert_allclose(out32, m.transform(v), rtol=1e-5, atol=1e-5)
    with pytest.raises(RepairInputError, match="float64 or float32"):
        m.transform(v, dtype=np.int64)


def test_a_module_whose_weights_overflow_is_refused_at_load_and_its_rows_at_apply():
    # The red team's F8 (p5_extreme_scorer_flow.py): weights of 1e300 loaded and every vector came out
    # as [null, null, ...] (msgspec writes NaN as null): valid JSON, nothing dead-lettered.
    from fairstream.models.kinds import load_module
    from fairstream.repair.protocol import apply_chain

    d, hidden = 8, 4
    huge = FairnessModule(np.full((hidden, d), 1e300), np.full(hidden, 1e300), np.full((d, hidden), 1e300),
                          np.full(d, 1e300))
    refused = r"embedding artifact: it cannot serve its own probe input \(row 0 of 5: embedding produced a non-finite"
    with pytest.raises(artifacts.ArtifactError, match=refused):
        load_module(huge.to_artifact(), PipelineSchema(dimension=d))
    vectors = np.abs(np.random.default_rng(0).normal(size=(3, d)))  # every hidden unit active: all overflow
    result = apply_chain([huge], Batch(X=vectors, keys=np.arange(3)))  # built directly, past the load check
    assert not result.ok.any() and result.X.tolist() == vectors.tolist()
    assert result.reasons[0].startswith("embedding produced a non-finite value for column ")
    load_module(random_module(d).to_artifact(), PipelineSchema(dimension=d))  # an ordinary module loads
