"""Tests of FTM and Reg training (torch): the penalties, the trainer, the frozen scorer and its map, fit_scorer."""

import doctest

import numpy as np
import pytest
import torch

from fairstream.models import ftm, scorer_training
from fairstream.models.ftm import GapPenalty, MatchingPenalty
from fairstream.models.scorer import LogisticScorer, Scorer, validate_scorer
from fairstream.models.scorer_training import FairScorerTrainer, ScorerNet, TrainingData, fit_scorer
from fairstream.repair.validation import RepairInputError
from fairstream.repair.group_maps import exact_matching
from fairstream.repair.measure.mdp import matched_dp

torch.set_num_threads(1)
QUICK = {"n_epochs": 25, "batch_size": 128, "hidden": (8, 8)}


def biased_data(n=1500, seed=0, groups=2):
    """Group membership shifts the feature the label depends on: an unconstrained scorer is unfair."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, groups, n)
    X = rng.normal(size=(n, 3)) + np.outer(s, [1.0, 0.5, 0.0])
    y = (X[:, 0] + X[:, 2] + 0.5 * rng.normal(size=n) > 0.5).astype(int)
    return X, s, y


@pytest.fixture(scope="module")
def data():
    return biased_data()


@pytest.fixture(scope="module")
def unconstrained(data):
    X, s, y = data
    return fit_scorer(X, s, y, method="unconstrained", seed=0, **QUICK)


@pytest.mark.parametrize("module", [ftm, scorer_training])
def test_docstring_examples_run(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def toy_data(X, s, y):
    Z = (X - X.min(0)) / (X.max(0) - X.min(0))
    return TrainingData(X=X, Z=Z, standardised=X, codes=s, y=y, S=np.eye(2)[s], reference=1, groups=np.array([0, 1]))


@pytest.mark.parametrize("map_name", ["marginal", "joint"])
def test_the_penalty_is_the_batch_mdp_of_the_exact_assignment(data, map_name):
    X, s, y = data
    d = toy_data(X, s, y)
    penalty = MatchingPenalty(map_name, alpha=100.0).bind(d)
    rng = np.random.default_rng(1)
    blocks_rows = [rng.choice(np.flatnonzero(s == k), 32, replace=False) for k in (0, 1)]
    rows = np.concatenate(blocks_rows)
    proba = torch.tensor(rng.uniform(size=64), dtype=torch.float64, requires_grad=True)
    value = penalty(proba, rows, [np.arange(32), np.arange(32, 64)])
    alpha = 100.0 if map_name == "joint" else 0.0
    perm = exact_matching(d.Z[blocks_rows[0]], d.Z[blocks_rows[1]], y[blocks_rows[0]], y[blocks_rows[1]], alpha)
    p = proba.detach().numpy()
    expected = matched_dp(p[:32], p[32:][perm]).overall
    assert value.item() == pytest.approx(expected, rel=1e-12)
    value.backward()  # the gradient reaches every matched score: +-1/32 on each side of a pair
    assert torch.allclose(proba.grad.abs(), torch.full((64,), 1 / 32, dtype=torch.float64))
    assert len(penalty.cache) == 1 and penalty(proba, rows, [np.arange(32), np.arange(32, 64)]).item() == value.item()
    assert len(penalty.cache) == 1  # the same batch is not solved again


def test_gap_penalty_is_the_squared_mean_score_gap(data):
    X, s, y = data
    proba = torch.tensor([0.2, 0.4, 0.9, 0.7], dtype=torch.float64)
    value = GapPenalty().bind(toy_data(X, s, y))(proba, np.arange(4), [np.array([0, 1]), np.array([2, 3])])
    assert value.item() == pytest.approx((0.3 - 0.8) ** 2)


def test_ftm_lowers_mdp_and_dp_and_reg_lowers_the_mean_gap(data, unconstrained):
    X, s, y = data
    base = validate_scorer(unconstrained, X, s, y)
    fair = validate_scorer(fit_scorer(X, s, y, method="ftm", lam=1.0, seed=0, **QUICK), X, s, y,
                           group_map=unconstrained.group_map_)
    reg = validate_scorer(fit_scorer(X, s, y, method="reg", lam=20.0, seed=0, **QUICK), X, s, y)
    assert base.mdp > 0.08 and base.dp_gap > 0.2 and base.accuracy > 0.8  # the unconstrained scorer is unfair
    # MDP bounds the mean-score gap (Theorem 3.7): both fall; the thresholded gap falls too.
    assert fair.mdp < 0.5 * base.mdp and fair.mean_dp_gap < 0.5 * base.mean_dp_gap and fair.dp_gap < base.dp_gap
    assert fair.accuracy > 0.75 and fair.mean_dp_gap <= fair.mdp + 0.02
    assert reg.mean_dp_gap < 0.5 * base.mean_dp_gap


def test_the_joint_map_trains_and_is_carried_by_the_scorer(data):
    X, s, y = data
    scorer = fit_scorer(X, s, y, method="ftm", map="joint", joint_alpha=50.0, lam=1.0, seed=0, map_points=200,
                        **QUICK)
    assert scorer.group_map_.method == "joint" and scorer.group_map_.alpha == 50.0
    assert scorer.training_["map"] == "joint" and scorer.training_["hidden"] == [8, 8]
    assert len(scorer.group_map_.source_) == 200


def test_the_frozen_numpy_scorer_equals_the_torch_network(data, unconstrained):
    X, _, _ = data
    net = ScorerNet.from_scorer(unconstrained)
    with torch.no_grad():
        logits = net(torch.as_tensor(X, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(unconstrained.decision_function(X), logits, rtol=1e-4, atol=1e-5)
    again = net.freeze(unconstrained.columns_)
    for a, b in zip(again.weights_, unconstrained.weights_):
        np.testing.assert_array_equal(a, b)


def test_a_warm_start_without_epochs_keeps_the_scorer(data, unconstrained):
    X, s, y = data
    copy = fit_scorer(X, s, y, method="ftm", warm_start=unconstrained.to_artifact(), n_epochs=0, group_map=False)
    np.testing.assert_allclose(copy.predict_proba(X), unconstrained.predict_proba(X), atol=1e-6)
    assert copy.training_["warm_start"] and copy.group_map_ is None
    moved = fit_scorer(X, s, y, method="ftm", warm_start=unconstrained, lam=2.0, n_epochs=2, batch_size=128)
    assert moved.hidden_ == unconstrained.hidden_ and not np.allclose(moved.predict_proba(X), copy.predict_proba(X))


def test_three_groups_are_matched_to_the_largest(data):
    X, s, y = biased_data(n=1200, seed=3, groups=3)
    s = np.array(["a", "b", "c"])[s]
    s[:500] = "b"  # "b" is the largest group: the reference
    trainer = FairScorerTrainer("ftm", lam=2.0, seed=1, **QUICK).fit(X, s, y)
    assert trainer.scorer_.group_map_.reference_group == "b"
    matched = trainer.scorer_.matched_counterparts(X[:3], ["a", "b", "c"])
    # "a" and "c" are matched into "b"; "b" into both others; each row's shares sum to one per other group.
    groups = {row: sorted(set(matched.s[matched.rows == row].tolist())) for row in range(3)}
    assert groups == {0: ["b"], 1: ["a", "c"], 2: ["b"]}
    for row, others in groups.items():
        for other in others:
            assert matched.weights[(matched.rows == row) & (matched.s == other)].sum() == pytest.approx(1.0)
    assert len(trainer.history_) == 25 and all(h["penalty"] > 0 for h in trainer.history_)


def test_training_is_reproducible_for_a_seed(data):
    X, s, y = data
    a, b = (fit_scorer(X, s, y, method="ftm", lam=1.0, seed=4, group_map=False, **QUICK) for _ in range(2))
    assert all(np.array_equal(w, v) for w, v in zip(a.weights_, b.weights_))


def test_fit_scorer_logistic_is_irls_with_a_map(data):
    X, s, y = data
    scorer = fit_scorer(X, s, y, method="logistic", l2=0.1, map_points=100, columns=["a", "b", "c"])
    assert isinstance(scorer, LogisticScorer) and scorer.l2 == 0.1 and scorer.group_map_.columns_ == ["a", "b", "c"]
    assert isinstance(fit_scorer(X, s, y, method="unconstrained", n_epochs=1, group_map=False), Scorer)


def test_errors_name_the_problem(data):
    X, s, y = data
    with pytest.raises(RepairInputError, match="method must be one of"):
        fit_scorer(X, s, y, method="adversarial")
    with pytest.raises(RepairInputError, match=r"lam must be a number in \[0, 1.0\]"):
        fit_scorer(X, s, y, method="otf", lam=2.0)
    with pytest.raises(RepairInputError, match="map must be one of"):
        fit_scorer(X, s, y, method="ftm", map="gaussian")
    with pytest.raises(RepairInputError, match="group 2 has no training rows"):
        fit_scorer(X, s, y, method="ftm", groups=[0, 1, 2], n_epochs=1)
    with pytest.raises(RepairInputError, match="s has an unknown value 1"):
        fit_scorer(X, s, y, method="ftm", groups=[0, 2], n_epochs=1)
    with pytest.raises(RepairInputError, match="only the class 1"):
        fit_scorer(X, s, np.ones_like(y), method="ftm", n_epochs=1)
    with pytest.raises(RepairInputError, match="column 'b' has a non-finite value"):
        fit_scorer(np.where(np.arange(3) == 1, np.nan, X), s, y, method="reg", columns=["a", "b", "c"])
    with pytest.raises(RepairInputError, match="warm_start takes 3 features, X has 2"):
        fit_scorer(X[:, :2], s, y, method="ftm", warm_start=LogisticScorer().fit(X, y))
    with pytest.raises(TypeError, match="warm_start must be a Scorer"):
        fit_scorer(X, s, y, method="ftm", warm_start="model.pt")
    with pytest.raises(RepairInputError, match="hidden must be"):
        fit_scorer(X, s, y, method="ftm", hidden=(0,))
