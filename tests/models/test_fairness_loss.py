"""Tests of the torch fairness losses: the autograd function against gradcheck, notions, errors."""

import doctest

import numpy as np
import ot
import pytest
import torch  # noqa: E402  (installed with the models extra)

from fairstream.models import fairness_loss as loss_module  # noqa: E402
from fairstream.models.fairness_loss import fairness_loss, sharp_sinkhorn_loss, wasserstein2_loss  # noqa: E402
from fairstream.models.score_transport import sharp_sinkhorn  # noqa: E402
from fairstream.repair.validation import RepairInputError  # noqa: E402

torch.set_num_threads(1)


def tensors(seed, n0=9, n1=6):
    rng = np.random.default_rng(seed)
    return (torch.tensor(rng.beta(2, 5, n0), requires_grad=True), torch.tensor(rng.beta(5, 2, n1), requires_grad=True))


def test_docstring_examples_run():
    result = doctest.testmod(loss_module)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("eps", [10.0, 200.0])
def test_sharp_sinkhorn_autograd_passes_gradcheck(eps):
    r0, r1 = tensors(0)
    assert torch.autograd.gradcheck(lambda a, b: sharp_sinkhorn_loss(a, b, eps), (r0, r1), eps=1e-6, atol=1e-7)


def test_backward_returns_theorem1_gradients_scaled_by_the_upstream_gradient():
    r0, r1 = tensors(1)
    (3.0 * sharp_sinkhorn_loss(r0, r1, 50.0)).backward()
    numpy = sharp_sinkhorn(r0.detach().numpy(), r1.detach().numpy(), 50.0)
    np.testing.assert_allclose(r0.grad.numpy(), 3.0 * numpy.grad_r0)
    np.testing.assert_allclose(r1.grad.numpy(), 3.0 * numpy.grad_r1)


def test_exact_wasserstein_loss_matches_the_lp_and_passes_gradcheck():
    r0, r1 = tensors(2)
    lp = ot.emd2(np.full(9, 1 / 9), np.full(6, 1 / 6), (r0.detach().numpy()[:, None] - r1.detach().numpy()[None, :]) ** 2)
    assert wasserstein2_loss(r0, r1).item() == pytest.approx(lp, rel=1e-10)
    assert torch.autograd.gradcheck(wasserstein2_loss, (r0, r1), eps=1e-6, atol=1e-7)


def test_notions_compare_the_right_rows():
    rng = np.random.default_rng(3)
    groups, y = np.repeat([0, 1], 20), np.tile([0, 1], 20)
    scores = torch.tensor(rng.random(40), requires_grad=True)
    dp = fairness_loss(scores, groups, y, "dp", "exact")
    eopp = fairness_loss(scores, groups, y, "eopp", "exact")
    eo = fairness_loss(scores, groups, y, "eo", "exact")
    s = scores.detach()
    assert dp.item() == pytest.approx(wasserstein2_loss(s[:20], s[20:]).item())
    positive = torch.as_tensor(y == 1)
    assert eopp.item() == pytest.approx(wasserstein2_loss(s[:20][positive[:20]], s[20:][positive[20:]]).item())
    negative_term = wasserstein2_loss(s[:20][~positive[:20]], s[20:][~positive[20:]]).item()
    assert eo.item() == pytest.approx(eopp.item() + negative_term)
    eopp.backward()
    assert torch.all(scores.grad[torch.as_tensor(y == 0)] == 0)  # y = 0 rows do not enter equal opportunity


def test_more_than_two_groups_average_the_pairs():
    scores = torch.tensor([0.1, 0.2, 0.5, 0.6, 0.9, 1.0], dtype=torch.float64)
    groups = np.array([0, 0, 1, 1, 2, 2])
    loss = fairness_loss(scores, groups, np.zeros(6), "dp", "exact")
    assert loss.item() == pytest.approx((0.16 + 0.64 + 0.16) / 3)


def test_missing_cells_and_bad_options_raise():
    scores = torch.tensor([0.1, 0.2, 0.5], dtype=torch.float64)
    with pytest.raises(RepairInputError, match="needs two groups with rows where y = 1"):
        fairness_loss(scores, [0, 0, 1], [1, 1, 0], "eopp")
    with pytest.raises(RepairInputError, match="notion must be one of"):
        fairness_loss(scores, [0, 0, 1], [1, 1, 0], "parity")
    with pytest.raises(RepairInputError, match="divergence must be one of"):
        fairness_loss(scores, [0, 0, 1], [1, 1, 0], "dp", "mmd")
