"""The conformance suite's table: one small real fitted module per registered kind (and per scorer layout).

A new kind is covered by the whole suite (tests/models/test_conformance.py) by adding one builder here,
decorated with :func:`kind_example`: a fitted module, the pipeline schema it serves (declaring what the
kind reads: its features, groups, strata or vector width) and a pool of rows to draw batches from (with
the s, u and earlier modules' columns, ``added``, the kind reads). Every check derives its cases from the
kind's declared capabilities, so nothing else is written per kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fairstream.models.centroid import fit_embedding_module
from fairstream.models.flow_training import refit_flow
from fairstream.models.scorer import LogisticScorer
from fairstream.models.scorer_training import fit_scorer
from fairstream.models.thresholds import GroupThresholds
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.embedding_datasets import simulate_train_test
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.protocol import Batch, PipelineSchema

torch.set_num_threads(1)
COLUMNS = ("a", "b", "c")


@dataclass(frozen=True)
class Example:
    """A fitted module, the pipeline it serves and a pool of rows to draw batches from."""

    module: object
    schema: PipelineSchema
    pool: Batch


BUILDERS: dict[str, Callable[[], Example]] = {}


def kind_example(label: str):
    """Register a builder of one table entry under ``label`` (a kind, or a kind and its layout)."""

    def register(build: Callable[[], Example]) -> Callable[[], Example]:
        BUILDERS[label] = build
        return build

    return register


@functools.cache
def example(label: str) -> Example:
    """The fitted example of ``label``, built once per process (a few seconds in all, mostly torch's first call)."""
    return BUILDERS[label]()


@functools.cache
def records(n: int = 240, seed: int = 0):
    """Three features (one integer-valued, so plans use its lattice), two groups, two strata, a label."""
    rng = np.random.default_rng(seed)
    s, u = rng.integers(0, 2, n), rng.integers(0, 2, n)
    X = np.column_stack([rng.normal(s, 1.0), rng.integers(0, 5, n) + s, rng.normal(size=n)])
    y = (X[:, 0] + rng.normal(size=n) > 0.5).astype(int)
    return X, s, u, y


def record_keys(n: int) -> np.ndarray:
    return np.array([f"rec-{i}" for i in range(n)], dtype=object)


@kind_example("plan")
def plan_example() -> Example:
    X, s, u, _ = records()
    plan = DistributionalRepair(n_q=12, columns=list(COLUMNS)).fit(X, s, u)
    s_pool = s.astype(object)
    s_pool[::7] = None  # imputed under a draw from the plan's posterior
    far = X.copy()
    far[::5, 0] += 10.0  # outside the grid: clamped
    return Example(plan, PipelineSchema(features=COLUMNS, groups=(0, 1), strata=(0, 1)),
                   Batch(X=far, keys=record_keys(len(X)), s=s_pool, u=u, impute_s=True))


@kind_example("scorer-logistic")
def logistic_scorer_example() -> Example:
    X, s, _, y = records()
    scorer = LogisticScorer().fit(X, y, columns=list(COLUMNS))
    scorer.attach_group_map(GroupTransportMap().fit(X, s, columns=list(COLUMNS)))
    return Example(scorer, PipelineSchema(features=COLUMNS, groups=(0, 1)), Batch(X=X, keys=record_keys(len(X))))


@kind_example("scorer-network")
def network_scorer_example() -> Example:
    X, s, _, y = records()
    scorer = fit_scorer(X, s, y, method="unconstrained", columns=list(COLUMNS), hidden=(4,), n_epochs=2,
                        batch_size=64, min_steps=0)
    return Example(scorer, PipelineSchema(features=COLUMNS, groups=(0, 1)), Batch(X=X, keys=record_keys(len(X))))


@kind_example("flow")
def flow_example() -> Example:
    X, s, _, y = records()
    groups = np.where(s == 1, "m", "f")
    # A large learning rate takes the flow far from the identity in a few steps: products then matter.
    flow = refit_flow(X, groups, y, LogisticScorer().fit(X, y), columns=list(COLUMNS), n_blocks=1, hidden=(8,),
                      n_steps=10, batch_size=16, lr=0.1)
    unknown = groups.astype(object)
    unknown[::9] = "x"  # no flow for that group: refused with a reason
    return Example(flow, PipelineSchema(features=COLUMNS, groups=("f", "m")),
                   Batch(X=X, keys=record_keys(len(X)), s=unknown))


@kind_example("embedding")
def embedding_example() -> Example:
    train, test = simulate_train_test(train_identities=(6, 6), train_images=4, test_identities=(10, 10),
                                      test_images=3, concentration=(0.3, 0.5), noise=(0.7, 0.7), dimension=5, seed=0)
    module = fit_embedding_module(train.vectors, train.identities, train.groups, epochs=3, batch_size=16, hidden=8,
                                  learning_rate=0.1)
    vectors = test.vectors.copy()
    vectors[0] = 0.0  # a zero vector stays zero
    return Example(module, PipelineSchema(dimension=5), Batch(X=vectors, keys=np.arange(len(vectors))))


def scored_records():
    """The records, their scores by the logistic example's scorer (the chain's score a post kind reads)."""
    X, s, u, y = records()
    return X, s, u, y, example("scorer-logistic").module.predict_proba(X)


@kind_example("thresholds-dp")
def dp_thresholds_example() -> Example:
    X, s, _, y, score = scored_records()
    module = GroupThresholds(constraint="dp", random_state=0).fit(score, s, y)
    return Example(module, PipelineSchema(features=COLUMNS, groups=(0, 1)),
                   Batch(X=X, keys=record_keys(len(X)), s=s, added={"score": score}))


@kind_example("thresholds-eo")
def eo_thresholds_example() -> Example:
    # Equalized odds: a randomised pair of thresholds per group and stratum, drawn by record key.
    X, s, u, y, score = scored_records()
    module = GroupThresholds(constraint="eo", random_state=0).fit(score, s, y, u=u)
    return Example(module, PipelineSchema(features=COLUMNS, groups=(0, 1), strata=(0, 1)),
                   Batch(X=X, keys=record_keys(len(X)), s=s, u=u, added={"score": score}))


EXAMPLES = tuple(BUILDERS)
