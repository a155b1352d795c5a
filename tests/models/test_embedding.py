import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fairstream.models.embedding import FairnessModule
from fairstream.repair import artifacts
from fairstream.repair._validation import RepairInputError


def random_module(d=4, seed=0):
    rng = np.random.default_rng(seed)
    return FairnessModule(rng.normal(size=(2 * d, d)), rng.normal(size=2 * d), rng.normal(size=(d, 2 * d)), rng.normal(size=d))


@given(arrays(np.float64, (5, 4), elements=st.floats(-1e3, 1e3)))
def test_identity_module_is_normalisation(v):
    out = FairnessModule.identity(4).transform(v)
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
    with pytest.raises(RepairInputError, match="inconsistent"):
        FairnessModule(np.zeros((8, 4)), np.zeros(7), np.zeros((4, 8)), np.zeros(4))
    with pytest.raises(artifacts.ArtifactError, match="kind"):
        FairnessModule.from_artifact(artifacts.pack("plan", {"x": np.zeros(1)}, {}))
