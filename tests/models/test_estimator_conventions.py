"""models' estimators follow scikit-learn's conventions: clone, get/set_params, repr, fit returns self, learned_.

Training is tiny (a few steps on a few hundred rows): these check conventions, not quality.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from fairstream.models.centroid import CentroidFairness
from fairstream.models.centroid_targets import GroupQuantileScoreNormaliser
from fairstream.models.flow import FlowPreprocessor
from fairstream.models.flow_training import AdapFair
from fairstream.models.scorer import LogisticScorer
from fairstream.models.scorer_training import FairScorerTrainer
from fairstream.models.thresholds import GroupThresholds
from fairstream.repair.embedding_datasets import simulate_train_test
from tests.repair.estimator_checks import CHECKS, Case

_rng = np.random.default_rng(21)
S = _rng.integers(0, 2, 240)
X = _rng.normal(S[:, None] * 0.8, 1.0, size=(240, 3))
Y = (X[:, 0] - X[:, 1] + 0.5 * _rng.normal(size=240) > 0.4).astype(int)
FROZEN_SCORER = LogisticScorer(l2=0.01).fit(X, Y)
FACES, _ = simulate_train_test(train_identities=(6, 4), train_images=4, test_identities=(2, 2), test_images=2,
                               concentration=(0.3, 0.5), noise=(0.7, 0.7),
                               dimension=6, seed=0)
PAIR_SCORES = np.linspace(-0.9, 0.9, 7)


def _fit_faces(est):
    return est.fit(FACES.vectors, FACES.identities, FACES.groups)


def adapfair(**params) -> AdapFair:
    return AdapFair(FROZEN_SCORER, **params)


CASES = [
    Case(make=LogisticScorer, changed={"l2": 0.5, "max_iter": 20}, fit=lambda est: est.fit(X, Y),
         output=lambda est: est.predict_proba(X), exact=False),
    Case(make=adapfair, changed={"n_blocks": 1, "hidden": (4,), "n_steps": 3, "batch_size": 16, "seed": 2},
         fit=lambda est: est.fit(X, S, Y), output=lambda est: est.transform(X, S), exact=False,
         required="scorer=LogisticScorer(l2=0.01)", shared=("scorer", "warm_start")),
    Case(make=FairScorerTrainer, changed={"method": "reg", "n_epochs": 1, "batch_size": 32, "min_steps": 2,
                                          "group_map": False, "seed": 4},
         fit=lambda est: est.fit(X, S, Y), output=lambda est: est.scorer_.predict_proba(X), exact=False,
         shared=("warm_start",)),
    Case(make=CentroidFairness, changed={"epochs": 1, "batch_size": 16, "hidden": 4, "seed": 5}, fit=_fit_faces,
         output=lambda est: est.transform(FACES.vectors), exact=False),
    Case(make=GroupQuantileScoreNormaliser, changed={"bins": 64}, fit=_fit_faces,
         output=lambda est: est.transform_scores(PAIR_SCORES, 1), exact=False),
    Case(make=GroupThresholds, changed={"constraint": "eo", "random_state": 3},
         fit=lambda est: est.fit(FROZEN_SCORER.predict_proba(X), S, Y),
         output=lambda est: est.decide(FROZEN_SCORER.predict_proba(X), S, keys=np.arange(len(X))), exact=True),
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_estimator_conventions(case, check):
    check(case)


def test_a_cloned_trainer_shares_its_warm_start_and_starts_from_it():
    warm = FairScorerTrainer(method="unconstrained", n_epochs=1, batch_size=32, min_steps=2, group_map=False,
                             seed=1).fit(X, S, Y).scorer_
    trainer = FairScorerTrainer(method="reg", n_epochs=1, batch_size=32, min_steps=2, group_map=False, warm_start=warm)
    copy = clone(trainer)
    assert copy.warm_start is warm and copy.fit(X, S, Y).scorer_.training_["warm_start"] is True


def test_a_flow_is_a_fitted_result_not_an_estimator():
    # scikit-learn's clone rebuilds anything with get_params from it: a flow (arrays, built by AdapFair) has none,
    # so an AdapFair warm-started from one clones.
    flow = FlowPreprocessor.identity(3, n_blocks=1, hidden=(4,))
    assert not hasattr(flow, "get_params") and flow.artifact_parameters()["n_blocks"] == 1
    est = AdapFair(FROZEN_SCORER, n_steps=2, batch_size=16, warm_start=flow)
    assert clone(est).warm_start is flow
