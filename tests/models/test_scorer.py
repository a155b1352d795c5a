"""Tests of the Newton/IRLS logistic scorer and its artifact round trip."""

import doctest

import numpy as np
import pytest

from fairstream.models import scorer
from fairstream.models.scorer import LogisticScorer
from fairstream.repair import artifacts
from fairstream.repair._validation import RepairInputError


def simulate_logistic(n, coef, intercept, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(coef))) * [1.0, 3.0, 0.5] + [0.5, 2.0, 0.5]
    p = 1.0 / (1.0 + np.exp(-(X @ coef + intercept)))
    return X, (rng.random(n) < p).astype(int)


def simulate_adult_like(n, seed):
    """Adult-census-like features (age, education-num, hours, sex, married, log capital gain), ~27% positive."""
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(38.5, 13.5, n), 17, 90)
    education_p = np.r_[np.full(8, 0.02), 0.30, 0.22, 0.04, 0.03, 0.17, 0.06, 0.01, 0.01]
    education = rng.choice(np.arange(1, 17), size=n, p=education_p)
    hours = np.clip(rng.normal(40.5, 12.3, n), 1, 99)
    male = rng.random(n) < 0.67
    married = rng.random(n) < np.where(male, 0.6, 0.2)
    log_gain = np.log1p(np.where(rng.random(n) < 0.08, rng.lognormal(8.5, 1.0, n), 0.0))
    # Age enters quadratically, so the linear scorer is not the true model.
    logit = (-9.5 + 0.1 * age - 0.001 * age ** 2 + 0.33 * education + 0.03 * hours + 2.1 * married
             + 0.25 * male + 0.35 * log_gain)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(int)
    return np.column_stack([age, education, hours, male, married, log_gain]), y


@pytest.fixture(scope="module")
def fitted():
    X, y = simulate_logistic(4000, np.array([1.0, -0.5, 2.0]), -0.3, seed=1)
    return LogisticScorer().fit(X, y, columns=["a", "b", "c"]), X


def test_docstring_examples_run():
    result = doctest.testmod(scorer)
    assert result.attempted > 0 and result.failed == 0


def test_recovers_known_coefficients_on_simulated_logistic_data():
    coef, intercept = np.array([1.0, -0.5, 2.0]), -0.3
    X, y = simulate_logistic(60_000, coef, intercept, seed=0)
    model = LogisticScorer(l2=0.0).fit(X, y)
    assert model.converged_ and model.n_iter_ < 20
    raw_coef = model.coef_ / model.scale_  # back from standardised to raw feature units
    raw_intercept = model.intercept_ - np.sum(model.coef_ * model.mean_ / model.scale_)
    # Within 4 standard errors (from the inverse Fisher information at the fit).
    design = np.column_stack([np.ones(len(X)), X])
    p = model.predict_proba(X)
    se = np.sqrt(np.diag(np.linalg.inv((design * (p * (1 - p))[:, None]).T @ design)))
    assert np.all(np.abs(np.r_[raw_intercept, raw_coef] - np.r_[intercept, coef]) < 4 * se)
    assert se.max() < 0.05  # and the test has power: the errors allowed are small
    np.testing.assert_allclose(model.mean_, X.mean(axis=0))
    np.testing.assert_allclose(model.scale_, X.std(axis=0))


def test_fit_is_the_penalised_optimum():
    X, y = simulate_logistic(2000, np.array([0.5, 0.2, -1.0]), 0.1, seed=2)
    model = LogisticScorer(l2=0.1).fit(X, y)
    Z = (X - model.mean_) / model.scale_
    p = model.predict_proba(X)
    grad_coef = Z.T @ (p - y) / len(y) + 0.1 * model.coef_
    grad_intercept = np.mean(p - y)
    assert np.abs(grad_coef).max() < 1e-10 and abs(grad_intercept) < 1e-10


def test_beats_075_accuracy_on_adult_like_data():
    X, y = simulate_adult_like(30_000, seed=0)
    model = LogisticScorer().fit(X[:20_000], y[:20_000])
    accuracy = float((model.decision(X[20_000:]) == y[20_000:]).mean())
    majority = max(y[20_000:].mean(), 1 - y[20_000:].mean())
    assert accuracy > 0.75 and accuracy > majority + 0.04


def test_separable_and_constant_columns_give_finite_fits():
    X = np.column_stack([np.r_[np.zeros(50), np.ones(50)], np.full(100, 7.0)])
    y = np.r_[np.zeros(50), np.ones(50)].astype(int)
    model = LogisticScorer(l2=1e-3).fit(X, y)
    assert np.all(np.isfinite(model.coef_)) and model.coef_[1] == 0.0 and model.scale_[1] == 1.0
    assert (model.decision(X) == y).all()


def test_any_number_of_rows_including_one(fitted):
    model, X = fitted
    assert model.predict_proba(X[0]).shape == (1,)  # a 1-D row of length d
    assert model.predict_proba(X[:1]).shape == (1,)
    assert model.predict_proba(X[:0]).shape == (0,)
    assert model.predict_proba(X[0])[0] == model.predict_proba(X)[0]
    decision = model.decision(X[:1])
    assert decision.dtype == np.int64 and decision.tolist() in ([0], [1])
    np.testing.assert_array_equal(model.decision(X, threshold=0.0), 1)
    np.testing.assert_array_equal(model.decision(X), (model.predict_proba(X) >= 0.5).astype(int))
    np.testing.assert_allclose(model.predict_proba(X), 1 / (1 + np.exp(-model.decision_function(X))))


def test_artifact_round_trip_is_bit_exact(fitted, tmp_path):
    model, X = fitted
    art = model.to_artifact(version=4, metrics={"accuracy": 0.8})
    assert art.kind == "scorer" and art.version == 4 and art.metrics == {"accuracy": 0.8}
    assert art.parameters["columns"] == ["a", "b", "c"] and art.parameters["l2"] == 1e-3
    for loaded in (artifacts.decode(artifacts.encode(art), kind="scorer"),
                   artifacts.load(artifacts.save(art, tmp_path), kind="scorer")):
        copy = LogisticScorer.from_artifact(loaded)
        for name in ("mean_", "scale_", "coef_"):
            assert getattr(copy, name).tobytes() == getattr(model, name).tobytes()
        assert copy.intercept_ == model.intercept_ and copy.columns_ == model.columns_
        assert copy.predict_proba(X).tobytes() == model.predict_proba(X).tobytes()
        assert copy.to_artifact(version=4, metrics={"accuracy": 0.8}).sha256 == art.sha256
        assert (copy.l2, copy.max_iter, copy.tol) == (model.l2, model.max_iter, model.tol)


def test_errors_name_the_column():
    X = np.array([[1.0, 2.0], [np.nan, 1.0], [0.0, 0.0]])
    with pytest.raises(RepairInputError, match=r"column 'age' has a non-finite value .*nan.* at row 1"):
        LogisticScorer().fit(X, [0, 1, 0], columns=["age", "hours"])
    model = LogisticScorer().fit(np.nan_to_num(X), [0, 1, 0], columns=["age", "hours"])
    with pytest.raises(RepairInputError, match="column 'hours' has a non-numeric value"):
        model.predict_proba(np.array([[1.0, "many"]], dtype=object))
    with pytest.raises(RepairInputError, match="column 'hours' has a non-finite value .*inf"):
        model.decision([[1.0, np.inf]])
    with pytest.raises(RepairInputError, match="3 feature columns"):
        model.predict_proba(np.zeros((2, 3)))
    with pytest.raises(RepairInputError, match="threshold"):
        model.decision([[1.0, 1.0]], threshold=1.5)


def test_errors_for_labels_parameters_and_unfitted_use():
    X = np.arange(8.0).reshape(4, 2)
    with pytest.raises(RepairInputError, match="only the class 1"):
        LogisticScorer().fit(X, [1, 1, 1, 1])
    with pytest.raises(RepairInputError, match="binary"):
        LogisticScorer().fit(X, [0, 1, 2, 1])
    with pytest.raises(RepairInputError, match="one value per row"):
        LogisticScorer().fit(X, [0, 1])
    with pytest.raises(RepairInputError, match="0 rows"):
        LogisticScorer().fit(np.zeros((0, 2)), [])
    for params, name in (({"l2": -1.0}, "l2"), ({"max_iter": 0}, "max_iter"), ({"tol": 0.0}, "tol")):
        with pytest.raises(RepairInputError, match=name):
            LogisticScorer(**params).fit(X, [0, 1, 0, 1])
    with pytest.raises(RepairInputError, match="not fitted"):
        LogisticScorer().predict_proba(X)
    with pytest.raises(RepairInputError, match="not fitted"):
        LogisticScorer().to_artifact()
    plan = artifacts.pack("plan", {"q": np.arange(3)}, {})
    with pytest.raises(artifacts.ArtifactError, match="kind 'scorer'"):
        LogisticScorer.from_artifact(plan)
