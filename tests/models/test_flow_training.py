"""Tests of AdapFair training (torch): the flow bank, scorer adapters, fit, warm-started re-fit."""

import numpy as np
import pytest
import torch  # noqa: E402  (installed with the models extra)

from fairstream.models.fairness_loss import sharp_sinkhorn_loss  # noqa: E402
from fairstream.models.flow import FlowPreprocessor, coupling_masks, validate_flow  # noqa: E402
from fairstream.models.flow_training import (  # noqa: E402
    AdapFair,
    FlowBank,
    LogisticLogits,
    as_torch_scorer,
    refit_flow,
    train_classifier,
)
from fairstream.models.scorer import LogisticScorer  # noqa: E402
from fairstream.repair.validation import RepairInputError  # noqa: E402

torch.set_num_threads(1)
TINY = {"n_blocks": 2, "hidden": (8,), "batch_size": 64}


def random_bank(n_flows=2, d=3, seed=0):
    torch.manual_seed(seed)
    bank = FlowBank(n_flows, coupling_masks(d, 2, seed), (6, 5), np.linspace(-1, 1, d), np.linspace(0.5, 2, d))
    with torch.no_grad():
        for p in bank.parameters():
            p.normal_(0.0, 0.4)  # away from the identity
    return bank


def biased_data(n=1600, seed=0):
    """Group 1 sits higher on the feature the label depends on: a classifier fitted on it is unfair."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n)
    X = rng.normal(size=(n, 3)) + np.outer(s, [1.0, 0.5, 0.0])
    y = (X[:, 0] + X[:, 2] + 0.5 * rng.normal(size=n) > 0.5).astype(int)
    return X, s, y


@pytest.fixture(scope="module")
def data():
    X, s, y = biased_data()
    return X, s, y, LogisticScorer().fit(X, y)


def test_numpy_apply_reproduces_the_torch_flow_and_its_inverse():
    bank = random_bank()
    frozen = bank.freeze(columns=("a", "b", "c"), groups=np.array([0, 1]), group_aware=True,
                         data_min=np.full(3, -np.inf), data_max=np.full(3, np.inf))
    X = np.random.default_rng(1).normal(size=(2, 7, 3))
    with torch.no_grad():
        mapped = bank(torch.as_tensor(X)).numpy()
        back = bank(torch.as_tensor(mapped), inverse=True).numpy()
    for k in (0, 1):
        np.testing.assert_allclose(frozen.transform(X[k], [k] * 7), mapped[k], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(back, X, atol=1e-10)
    assert not np.allclose(mapped, X)
    again = FlowBank.from_frozen(frozen, [1, None])  # flow 0 copies frozen flow 1, flow 1 is the identity
    with torch.no_grad():
        np.testing.assert_allclose(again(torch.as_tensor(X), flows=[0, 1]).numpy()[0],
                                   frozen.transform(X[0], [1] * 7), atol=1e-12)
        np.testing.assert_allclose(again(torch.as_tensor(X[1:]), flows=[1]).numpy()[0], X[1], atol=1e-12)


def test_logistic_adapter_reproduces_the_scorer(data):
    X, _, _, scorer = data
    logits = LogisticLogits.from_scorer(scorer)(torch.as_tensor(X)).numpy()
    np.testing.assert_allclose(logits, scorer.decision_function(X), rtol=1e-12)
    with pytest.raises(RepairInputError, match="fit it first"):
        LogisticLogits.from_scorer(LogisticScorer())
    with pytest.raises(TypeError, match="torch.nn.Module returning logits or a fitted LogisticScorer"):
        as_torch_scorer(object())


def test_gradient_reaches_the_flow_through_scorer_and_ot_layer(data):
    # Theorem 1's chain: d loss / d theta = C (OT layer) * G (scorer input gradient) * phi (flow).
    X, s, _, scorer = data
    bank, f = random_bank(seed=2), as_torch_scorer(scorer)
    x = torch.as_tensor(np.stack([X[s == 0][:12], X[s == 1][:12]]))

    def loss(weight):
        mapped = torch.func.functional_call(bank, {"weights.0": weight}, (x,))
        r = torch.sigmoid(f(mapped.reshape(-1, 3)))
        return sharp_sinkhorn_loss(r[:12], r[12:], 100.0)

    probe = bank.weights[0].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(loss, (probe,), eps=1e-6, atol=1e-7, fast_mode=True)
    loss(probe).backward()
    assert probe.grad.abs().max() > 1e-4


def test_fit_halves_the_dp_gap_at_a_small_accuracy_cost(data):
    X, s, y, scorer = data
    before = validate_flow(None, scorer, X, s, y)
    model = AdapFair(scorer, lam=0.3, n_steps=80, lr=5e-3, seed=1, **TINY).fit(X, s, y)
    after = validate_flow(model.flow_, scorer, X, s, y)
    assert after.dp_gap < 0.5 * before.dp_gap
    assert after.accuracy > before.accuracy - 0.08
    assert [h["step"] for h in model.history_][-1] == 79
    assert model.flow_.training["lam"] == 0.3 and model.flow_.training["warm_start"] is False
    np.testing.assert_array_equal(model.transform(X[:5], s[:5]), model.flow_.transform(X[:5], s[:5]))


def test_zero_steps_give_the_identity_and_lambda_one_leaves_fairness_alone(data):
    X, s, y, scorer = data
    identity = AdapFair(scorer, n_steps=0, **TINY).fit(X, s, y).flow_
    np.testing.assert_allclose(identity.transform(X, s), X, atol=1e-12)
    plain = AdapFair(scorer, lam=1.0, n_steps=40, lr=5e-3, **TINY).fit(X, s, y)
    assert all(h["fairness"] == 0.0 for h in plain.history_)


def test_blind_flow_serves_rows_without_a_group(data):
    X, s, y, scorer = data
    flow = AdapFair(scorer, group_aware=False, lam=0.3, n_steps=30, lr=5e-3, **TINY).fit(X, s, y).flow_
    assert flow.n_flows == 1 and not flow.group_aware
    np.testing.assert_array_equal(flow.transform(X[:4]), flow.transform(X[:4], s=[9, 9, 9, 9]))


def test_torch_scorer_is_used_frozen_and_never_modified(data):
    X, s, y, _ = data
    clf = train_classifier(X, y, hidden=(8,), n_epochs=2, seed=0)
    before = [p.clone() for p in clf.parameters()]
    flow = refit_flow(X, s, y, clf, lam=0.3, n_steps=10, **TINY)
    assert all(torch.equal(a, b) for a, b in zip(before, clf.parameters()))
    assert isinstance(flow, FlowPreprocessor)
    assert validate_flow(flow, clf, X, s, y).n_rows == len(X)


def test_warm_start_continues_from_the_deployed_flow(data):
    X, s, y, scorer = data
    active = AdapFair(scorer, lam=0.3, n_steps=30, lr=5e-3, seed=0, **TINY).fit(X, s, y).flow_
    copied = refit_flow(X, s, y, scorer, warm_start=active.to_artifact(), n_steps=0)
    np.testing.assert_allclose(copied.transform(X, s), active.transform(X, s), atol=1e-12)
    assert copied.training["warm_start"] is True and copied.hidden == active.hidden
    # A window without group 1: its flow is carried over unchanged, group 0's is re-fitted.
    only0 = np.flatnonzero(s == 0)
    groups2 = np.where(np.arange(len(only0)) % 2 == 0, 0, 2)  # a new group 2 appears
    refit = refit_flow(X[only0], groups2, y[only0], scorer, warm_start=active, lam=0.3, n_steps=10, **TINY)
    assert refit.groups.tolist() == [0, 1, 2]
    ones = np.flatnonzero(s == 1)[:20]
    np.testing.assert_allclose(refit.transform(X[ones], s[ones]), active.transform(X[ones], s[ones]), atol=1e-12)
    assert not np.allclose(refit.transform(X[only0[:20]], [0] * 20), active.transform(X[only0[:20]], [0] * 20))


@pytest.mark.parametrize("params, message", [
    ({"lam": 1.5}, "lam must be a number in"),
    ({"notion": "parity"}, "notion must be one of"),
    ({"hidden": (0,)}, "hidden must be positive"),
    ({"batch_size": 1}, "batch_size must be an integer >= 2"),
])
def test_bad_parameters_raise(data, params, message):
    X, s, y, scorer = data
    with pytest.raises(RepairInputError, match=message):
        AdapFair(scorer, **params).fit(X, s, y)


def test_bad_windows_and_warm_starts_raise(data):
    X, s, y, scorer = data
    with pytest.raises(RepairInputError, match="only the group"):
        AdapFair(scorer).fit(X, np.zeros(len(X)), y)
    with pytest.raises(RepairInputError, match="warm_start maps 2 features"):
        AdapFair(scorer, warm_start=FlowPreprocessor.identity(2)).fit(X, s, y)
    named = FlowPreprocessor.identity(["a", "b", "c"])
    with pytest.raises(RepairInputError, match=r"warm_start was fitted on features \['a', 'b', 'c'\]"):
        AdapFair(scorer, warm_start=named, columns=["a", "b", "x"]).fit(X, s, y)
    assert refit_flow(X, s, y, scorer, warm_start=named, n_steps=0).columns == ("a", "b", "c")
    with pytest.raises(RepairInputError, match="warm_start is blind"):
        AdapFair(scorer, warm_start=FlowPreprocessor.identity(3, group_aware=False)).fit(X, s, y)
    with pytest.raises(RepairInputError, match="column 'x1' has a non-finite value"):
        AdapFair(scorer).fit(np.where(np.arange(3) == 1, np.nan, X), s, y)


def test_equal_opportunity_flow_narrows_the_true_positive_gap(data):
    X, s, y, scorer = data
    before = validate_flow(None, scorer, X, s, y)
    flow = AdapFair(scorer, notion="eopp", lam=0.2, n_steps=60, lr=5e-3, seed=3, **TINY).fit(X, s, y).flow_
    assert validate_flow(flow, scorer, X, s, y).eopp_gap < 0.6 * before.eopp_gap


@pytest.mark.parametrize("divergence", ["exact", "sinkhorn"])
def test_the_first_step_loss_is_the_window_weighted_bce_plus_the_ot_term_on_probabilities(divergence):
    # One point and one label per group, so every per-row term is known by hand; the flow starts at the
    # identity, so the first step's terms are those of the frozen scorer: logits -1 (group 0) and 2 (group 1).
    n0, n1 = 30, 90  # unequal groups: the batch (64 rows of each) is weighted back to the window's 1:3
    X = np.repeat([[0.0, 0.0], [1.0, 1.0]], [n0, n1], axis=0)
    s = y = np.repeat([0, 1], [n0, n1])
    scorer = torch.nn.Linear(2, 1, dtype=torch.float64)
    with torch.no_grad():
        scorer.weight.copy_(torch.tensor([[3.0, 0.0]]))
        scorer.bias.fill_(-1.0)
    first = AdapFair(scorer, lam=0.25, divergence=divergence, n_steps=1, **TINY).fit(X, s, y).history_[0]
    bce = (n0 * np.log1p(np.exp(-1.0)) + n1 * np.log1p(np.exp(-2.0))) / (n0 + n1)  # y=0 at -1, y=1 at 2
    gap = 1 / (1 + np.exp(-2.0)) - 1 / (1 + np.exp(1.0))  # the scores' gap in (0, 1), not the logits' 3
    assert first["bce"] == pytest.approx(bce, rel=1e-9)
    assert first["fairness"] == pytest.approx(gap ** 2, rel=1e-6)  # one coupling: every pair costs gap^2
    assert first["loss"] == pytest.approx(0.25 * bce + 0.75 * gap ** 2, rel=1e-6)


def test_a_fit_is_reproducible_from_its_seed(data):
    X, s, y, scorer = data
    fits = [AdapFair(scorer, lam=0.3, n_steps=5, lr=5e-3, seed=seed, **TINY).fit(X, s, y).flow_ for seed in (3, 3, 4)]
    mapped = [flow.transform(X[:50], s[:50]) for flow in fits]
    np.testing.assert_array_equal(mapped[0], mapped[1])  # the batches and the initial flow both come from the seed
    assert not np.array_equal(mapped[0], mapped[2])


@pytest.mark.parametrize("notion", ["eopp", "eo"])
def test_the_fairness_cells_of_three_groups_and_two_labels_never_mix(notion):
    # With two groups a wrong cell key can still separate them; three groups make (group, label) keys collide.
    codes, y = np.repeat([0, 1, 2], 4), np.tile([0, 1], 6)
    cells = AdapFair(scorer=None, notion=notion)._cells(codes, y)
    assert len(cells) == 6
    assert all(len(set(codes[c])) == 1 and len(set(y[c])) == 1 and len(c) == 2 for c in cells)
