"""Tests of OTF and norm-penalty training (torch): autograd gradients, the penalties, stacked attributes."""

import doctest

import numpy as np
import pytest
import torch

from fairstream.models import otf_training
from fairstream.models.otf_training import NormPenalty, OTFPenalty, otf0_loss
from fairstream.models.scorer import Scorer, validate_scorer
from fairstream.models.scorer_training import TrainingData, fit_scorer
from fairstream.repair.measure.otf import (
    constraint_matrix,
    correlation_violation,
    cost_matrix,
    one_hot,
    otf0,
)

torch.set_num_threads(1)


def test_docstring_examples_run():
    result = doctest.testmod(otf_training)
    assert result.attempted > 0 and result.failed == 0


def small_problem(n=14, seed=0, notion="eo"):
    rng = np.random.default_rng(seed)
    X, s, y = rng.normal(size=(n, 2)), np.r_[0, 0, 1, 1, rng.integers(0, 2, n - 4)], np.r_[0, 1, 0, 1,
                                                                                          rng.integers(0, 2, n - 4)]
    return cost_matrix(X), constraint_matrix(one_hot(s)[0], y, notion), rng.uniform(0.1, 0.9, n)


@pytest.mark.parametrize("notion", ["dp", "eo"])
def test_autograd_gradcheck_of_otf0(notion):
    C, G, h = small_problem(notion=notion)
    state = {"tol": 1e-13}
    h = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: otf0_loss(v, C, G, 0.05, state), (h,), eps=1e-6, atol=1e-7, rtol=1e-4)


def test_the_gradient_flows_through_the_sigmoid_to_the_logits():
    C, G, h = small_problem()
    logits = torch.tensor(np.log(h / (1 - h)), dtype=torch.float64, requires_grad=True)
    otf0_loss(torch.sigmoid(logits), C, G, 0.05).backward()
    expected = otf0(h, C, G, 0.05).gradient * h * (1 - h)
    np.testing.assert_allclose(logits.grad.numpy(), expected, rtol=1e-6, atol=1e-12)


def data_for(X, s, y, S):
    return TrainingData(X=X, Z=X, standardised=X, codes=s, y=y, S=S, reference=1, groups=np.array([0, 1]))


def test_the_penalties_compute_otf0_over_eps_and_the_norm_of_g_h():
    rng = np.random.default_rng(1)
    X, s, y = rng.normal(size=(40, 3)), rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    S = np.column_stack([one_hot(s)[0], rng.integers(0, 2, 40)])  # a second binary attribute, stacked
    rows, proba = np.arange(10, 40), torch.tensor(rng.uniform(0.1, 0.9, 30), dtype=torch.float64)
    G = constraint_matrix(S[rows], y[rows], "eo")
    otf = OTFPenalty("eo", eps=0.01).bind(data_for(X, s, y, S))(proba, rows, None)
    assert otf.item() == pytest.approx(otf0(proba.numpy(), cost_matrix(X[rows]), G, 0.01).value / 0.01, rel=1e-6)
    norm = NormPenalty("eo").bind(data_for(X, s, y, S))(proba, rows, None)
    assert norm.item() == pytest.approx(np.abs(G @ proba.numpy()).sum())
    assert len(G) == 6  # 2 labels x 3 sensitive columns (group 0, group 1, the second attribute)
    single = OTFPenalty("dp").bind(data_for(X, np.zeros(40, dtype=int), y, np.ones((40, 1))))
    assert single(proba, rows, None).item() == 0.0  # no measurable constraint in the batch


def biased_data(n=800, seed=0):
    """Each of two attributes shifts one feature; the label depends on all: scores correlate with both within labels."""
    rng = np.random.default_rng(seed)
    s, race = rng.integers(0, 2, n), rng.integers(0, 2, n)
    X = rng.normal(size=(n, 3)) + np.outer(s, [2.0, 0.0, 0.0]) + np.outer(race, [0.0, 2.0, 0.0])
    y = (X.sum(axis=1) + rng.normal(size=n) > 1.0).astype(int)
    return X, s, race, y


def test_otf_and_norm_training_lower_the_violation_of_both_stacked_attributes():
    X, s, race, y = biased_data()
    S = np.column_stack([one_hot(s)[0], one_hot(race)[0]])
    base = fit_scorer(X, s, y, method="logistic", group_map=False)
    quick = {"n_epochs": 10, "lr": 0.05, "batch_size": 200, "group_map": False, "warm_start": base}  # fine-tune the LR
    otf = fit_scorer(X, s, y, method="otf", lam=0.9, notion="eo", eps=1e-2, sensitive=S, **quick)
    norm = fit_scorer(X, s, y, method="norm", lam=0.9, notion="eo", sensitive=S, **quick)
    assert isinstance(otf, Scorer) and otf.hidden_ == () and otf.training_["notion"] == "eo"
    for attribute in (one_hot(s)[0], one_hot(race)[0]):
        before = correlation_violation(base.predict_proba(X), attribute, y)
        assert before > 0.25
        for scorer in (otf, norm):
            assert correlation_violation(scorer.predict_proba(X), attribute, y) < 0.6 * before
    assert validate_scorer(otf, X, s, y).auc > 0.75


def test_a_linear_scorer_from_torch_exposes_coefficients():
    X, s, _, y = biased_data(n=300)
    scorer = fit_scorer(X, s, y, method="norm", lam=0.2, n_epochs=2, group_map=False)
    np.testing.assert_allclose(scorer.decision_function(X),
                               ((X - scorer.mean_) / scorer.scale_) @ scorer.coef_ + scorer.intercept_)
