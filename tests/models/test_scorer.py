"""Tests of the scorers (network and Newton/IRLS logistic), their artifacts, the carried map, validation."""

import doctest
from itertools import pairwise

import numpy as np
import pytest

from fairstream.models import scorer
from fairstream.models.kinds import MODULE_KINDS, load_module
from fairstream.models.scorer import LogisticScorer, Scorer, validate_scorer
from fairstream.repair import artifacts
from fairstream.repair.validation import RepairInputError
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.protocol import Batch, IncompatibleArtifact, PipelineSchema


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


# ---------------------------------------------------------------------------------------------
# the network layout, the registry, the carried group map, validation


def random_network(d=3, hidden=(5, 4), seed=0, columns=None, group_map=None):
    rng = np.random.default_rng(seed)
    sizes = [d, *hidden, 1]
    return Scorer.from_weights([rng.normal(size=(a, b)) for a, b in pairwise(sizes)],
                               [rng.normal(size=b) for b in sizes[1:]], mean=rng.normal(size=d),
                               scale=rng.uniform(0.5, 2.0, d), columns=columns, group_map=group_map,
                               training={"method": "ftm", "lam": 1.0})


def test_the_network_forward_pass_by_hand():
    scorer = random_network()
    X = np.random.default_rng(1).normal(size=(6, 3))
    h = (X - scorer.mean_) / scorer.scale_
    for w, b in zip(scorer.weights_[:-1], scorer.biases_[:-1]):
        h = np.maximum(h @ w + b, 0.0)
    np.testing.assert_allclose(scorer.decision_function(X), (h @ scorer.weights_[-1] + scorer.biases_[-1])[:, 0])
    assert scorer.hidden_ == (5, 4) and not hasattr(scorer, "coef_")  # coefficients exist for linear scorers only
    applied = scorer.apply(Batch(X=X, keys=np.arange(6).astype(str)))
    assert applied.ok.all() and np.array_equal(applied.X, X)
    np.testing.assert_array_equal(applied.columns["score"], scorer.predict_proba(X))
    np.testing.assert_array_equal(applied.columns["decision"], scorer.decision(X))


def fitted_map(d=3, seed=0, columns=None):
    rng = np.random.default_rng(seed)
    return GroupTransportMap(n_points=20).fit(rng.normal(size=(60, d)), rng.choice(["f", "m"], 60), columns=columns)


@pytest.mark.parametrize("with_map", [False, True])
def test_network_artifact_round_trip_is_bit_exact(with_map, tmp_path):
    scorer = random_network(columns=["a", "b", "c"], group_map=fitted_map(columns=["a", "b", "c"]) if with_map else None)
    art = scorer.to_artifact(version=2, metrics={"mdp": 0.1})
    assert art.parameters["hidden"] == [5, 4] and art.parameters["training"] == {"method": "ftm", "lam": 1.0}
    assert ("group_map" in art.parameters) == with_map and ("group_map.source" in art.arrays) == with_map
    X = np.random.default_rng(2).normal(size=(9, 3))
    for loaded in (artifacts.decode(artifacts.encode(art), kind="scorer"),
                   artifacts.load(artifacts.save(art, tmp_path), kind="scorer")):
        copy = Scorer.from_artifact(loaded)
        assert type(copy) is Scorer and copy.predict_proba(X).tobytes() == scorer.predict_proba(X).tobytes()
        assert copy.to_artifact(version=2, metrics={"mdp": 0.1}).sha256 == art.sha256
        if with_map:
            for a, b in zip(copy.matched_counterparts(X, ["f"] * 9), scorer.matched_counterparts(X, ["f"] * 9)):
                assert np.array_equal(a, b)
        else:
            assert copy.group_map_ is None


def test_one_class_serves_the_kind_and_reads_both_layouts():
    assert MODULE_KINDS["scorer"] is Scorer
    X, y = simulate_logistic(300, np.array([1.0, -0.5, 2.0]), -0.3, seed=3)
    logistic = LogisticScorer().fit(X, y).attach_group_map(fitted_map())
    for fitted in (logistic, random_network()):
        module = load_module(fitted.to_artifact(), PipelineSchema(features=("a", "b", "c"), groups=("f", "m")))
        assert type(module) is type(fitted) and module.predict_proba(X).tobytes() == fitted.predict_proba(X).tobytes()
    copy = LogisticScorer.from_artifact(logistic.to_artifact())
    assert copy.group_map_.reference_group == logistic.group_map_.reference_group
    with pytest.raises(artifacts.ArtifactError, match="holds a network"):
        LogisticScorer.from_artifact(random_network().to_artifact())


def test_a_mis_shaped_scorer_is_refused_at_load_time():
    scorer = random_network(group_map=fitted_map())
    with pytest.raises(IncompatibleArtifact, match="takes 3 features, the pipeline has 2"):
        load_module(scorer.to_artifact(), PipelineSchema(features=("a", "b")))
    with pytest.raises(IncompatibleArtifact, match=r"group map was fitted without the pipeline's groups \['x'\]"):
        load_module(scorer.to_artifact(), PipelineSchema(features=("a", "b", "c"), groups=("f", "m", "x")))
    art = scorer.to_artifact()
    arrays = {name: np.array(a) for name, a in art.arrays.items() if name != "__parameters__"}
    for name, bad, message in (
            ("weight_1", np.zeros((3, 4)), r"'weight_1' has shape \(3, 4\), expected \(hidden_1=5, hidden_2=4\)"),
            ("bias_0", np.zeros(2), r"'bias_0' has shape \(2,\), expected \(hidden_1=5,\)"),
            ("weight_2", np.zeros((4, 2)), r"'weight_2' has shape \(4, 2\), expected \(hidden_2=4, 1\)"),
            ("scale", np.zeros(3), r"'scale' must be > 0, got 0.0 at index \(0,\)")):
        broken = artifacts.pack("scorer", {**arrays, name: bad}, parameters=dict(art.parameters))
        with pytest.raises(artifacts.ArtifactError, match="scorer artifact: array " + message):
            Scorer.from_artifact(broken)
    missing = artifacts.pack("scorer", {k: v for k, v in arrays.items() if k != "bias_2"}, dict(art.parameters))
    with pytest.raises(artifacts.ArtifactError, match=r"the array 'bias_2' is missing"):
        Scorer.from_artifact(missing)
    no_source = artifacts.pack("scorer", {k: v for k, v in arrays.items() if k != "group_map.source"},
                               dict(art.parameters))
    with pytest.raises(artifacts.ArtifactError, match="group map is malformed"):
        Scorer.from_artifact(no_source)
    with pytest.raises(RepairInputError, match="the group map takes 2 features, the scorer 3"):
        random_network().attach_group_map(fitted_map(d=2))
    with pytest.raises(RepairInputError, match="carries no group map"):
        random_network().matched_counterparts(np.zeros((1, 3)), ["f"])


def test_validate_scorer_by_hand():
    # A linear scorer on one feature: score = sigmoid(4 x); decisions 1 for x >= 0.
    scorer = Scorer.from_weights([np.array([[4.0]])], [np.array([0.0])], mean=[0.0], scale=[1.0])
    X = np.array([[1.0], [1.0], [-1.0], [1.0], [-1.0], [-1.0]])
    s, y = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 0, 0, 1, 1, 0])
    result = validate_scorer(scorer, X, s, y)
    assert result.accuracy == pytest.approx(4 / 6) and result.dp_gap == pytest.approx(1 / 3)
    assert result.positive_rates == {0: pytest.approx(2 / 3), 1: pytest.approx(1 / 3)}
    assert result.tpr_gap == pytest.approx(0.5) and result.fpr_gap == pytest.approx(0.5)  # TPR 1 vs 1/2, FPR 1/2 vs 0
    assert result.eo_gap == pytest.approx(0.5) and result.eo_mean_gap == pytest.approx(0.5)
    high, low = 1 / (1 + np.exp(-4.0)), 1 / (1 + np.exp(4.0))
    assert result.mean_dp_gap == pytest.approx((high - low) / 3) and result.wdp == pytest.approx((high - low) / 3)
    assert result.mdp >= result.wdp - 1e-12  # in-sample equal-size map: a transport map (Theorem 3.7)
    # AUC over the 9 (positive, negative) pairs: high-high ties 2 x 0.5, high-low wins 2 x 2, low-low ties 2 x 0.5.
    assert result.auc == pytest.approx(6 / 9)
    assert set(result.as_metrics()) >= {"accuracy", "auc", "dp_gap", "mdp", "eo_gap", "pdp", "peo"}


def test_apply_refuses_a_non_finite_or_overflowing_row_alone(fitted):
    # Before, one NaN row made Scorer.apply raise for the whole batch (F5: the flow in front of it had
    # mapped age = 1.7e308 to inf, and the batch, with every valid record in it, stopped the partition).
    model, X = fitted
    net = Scorer.from_weights([np.ones((3, 2)), np.array([[1.0], [1.0]])], [np.zeros(2), np.zeros(1)],
                              np.zeros(3), np.full(3, 1e-300), columns=["a", "b", "c"])
    rows = np.vstack([X[:2], [[np.nan, 0.0, 0.0]], X[2:4], [[1e10, 0.0, 0.0]]])
    for scorer_, refused in ((model, [2]), (net, [2, 5])):  # the network's logit overflows at 1e10 / 1e-300
        applied = scorer_.apply(Batch(X=rows, keys=np.arange(6)))
        assert np.flatnonzero(~applied.ok).tolist() == refused
        assert applied.reasons[2] == "column 'a' has a non-finite value nan"
        served = np.flatnonzero(applied.ok)
        assert np.array_equal(applied.columns["score"][served], scorer_.predict_proba(rows[served]))
        assert np.isnan(applied.columns["score"][refused]).all() and (applied.columns["decision"][refused] == 0).all()
    assert applied.reasons[5].startswith("the scorer's logit is inf: the row's values overflow its network")


def test_a_scorer_whose_outputs_overflow_at_its_own_centre_is_refused_at_load():
    # Each array is finite (in its domain), but together they overflow: the probe at the standardisation
    # centre and three scales either side of it refuses the artifact before it serves.
    huge = Scorer.from_weights([np.full((3, 2), 1e300), np.array([[1e300], [1e300]])], [np.zeros(2), np.zeros(1)],
                               np.zeros(3), np.ones(3), columns=["a", "b", "c"])
    with pytest.raises(artifacts.ArtifactError, match=r"scorer artifact: it cannot serve its own probe input "
                                                      r"\(row 2 of 3: the scorer's logit is inf"):
        load_module(huge.to_artifact(), PipelineSchema())
