"""The OT losses' mass weights, the Sinkhorn branch of fairness_loss and its eps: found untested by mutation testing."""

import pytest
import torch

from fairstream.models.fairness_loss import fairness_loss, sharp_sinkhorn_loss, wasserstein2_loss

T = (lambda *v: torch.tensor(v, dtype=torch.float64))


@pytest.mark.parametrize("loss", [wasserstein2_loss, sharp_sinkhorn_loss])
def test_mass_weights_of_either_side_count(loss):
    # One point on the other side: every coupling sends all of a point's mass there, so by hand
    # 0.75 * 0.2^2 + 0.25 * 0.8^2 = 0.19 (0.34 with equal masses).
    assert loss(T(0.0, 1.0), T(0.2), a=[0.75, 0.25]).item() == pytest.approx(0.19, rel=1e-6)
    assert loss(T(0.2), T(0.0, 1.0), b=[0.75, 0.25]).item() == pytest.approx(0.19, rel=1e-6)


def test_the_sinkhorn_fairness_loss_passes_its_scores_and_eps():
    scores, groups = T(0.1, 0.3, 0.6, 0.9, 0.2, 0.8), [0, 0, 0, 1, 1, 1]
    for eps in (2.0, 200.0):
        expected = sharp_sinkhorn_loss(scores[:3], scores[3:], eps)
        assert fairness_loss(scores, groups, [0] * 6, eps=eps).item() == pytest.approx(expected.item(), rel=1e-12)
    assert fairness_loss(scores, groups, [0] * 6, eps=2.0).item() != pytest.approx(
        fairness_loss(scores, groups, [0] * 6).item(), rel=1e-3)  # eps changes the coupling
