"""Every artifact kind: each array checked in full at load, and a row's output independent of its batch.

One small real module per kind (and per scorer layout) is fitted once. Two properties are then
checked on each:

- a hostile but consistent publisher mutates one array (truncated, NaN, inf, negative, another
  dtype, another shape), re-seals the payload so every hash verifies, and the module is still
  refused at load, with an :class:`ArtifactError` naming an array, never built to fail later;
- applying the module to a batch gives every row bit for bit what applying it to that row alone
  gives (a replayed batch reproduces its outputs, whatever BLAS kernel the CPU picks).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.models.centroid import fit_embedding_module
from fairstream.models.flow_training import refit_flow
from fairstream.models.kinds import MODULE_KINDS, load_module
from fairstream.models.scorer import LogisticScorer
from fairstream.models.scorer_training import fit_scorer
from fairstream.repair import artifacts
from fairstream.repair.artifacts import ArtifactError
from fairstream.repair.distributional import DistributionalRepair
from fairstream.repair.embedding_datasets import simulate_train_test
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.protocol import Batch, IncompatibleArtifact, PipelineSchema, apply_chain, check_probe

torch.set_num_threads(1)
COLUMNS = ["a", "b", "c"]


@dataclass(frozen=True)
class Example:
    """A fitted module, the pipeline it serves and a pool of rows to draw batches from."""

    module: object
    schema: PipelineSchema
    pool: Batch


@functools.cache
def records(n: int = 240, seed: int = 0):
    """Three features (one integer-valued, so plans use its lattice), two groups, two strata, a label."""
    rng = np.random.default_rng(seed)
    s, u = rng.integers(0, 2, n), rng.integers(0, 2, n)
    X = np.column_stack([rng.normal(s, 1.0), rng.integers(0, 5, n) + s, rng.normal(size=n)])
    y = (X[:, 0] + rng.normal(size=n) > 0.5).astype(int)
    return X, s, u, y


@functools.cache
def example(label: str) -> Example:
    """Tiny real fits, one per kind and scorer layout (a few seconds in all, mostly torch's first call)."""
    X, s, u, y = records()
    keys = np.array([f"rec-{i}" for i in range(len(X))], dtype=object)
    if label == "plan":
        plan = DistributionalRepair(n_q=12, columns=COLUMNS).fit(X, s, u)
        s_pool = s.astype(object)
        s_pool[::7] = None  # imputed under a draw from the plan's posterior
        far = X.copy()
        far[::5, 0] += 10.0  # outside the grid: clamped
        return Example(plan, PipelineSchema(features=tuple(COLUMNS), groups=(0, 1), strata=(0, 1)),
                       Batch(X=far, keys=keys, s=s_pool, u=u, impute_s=True))
    if label == "scorer-logistic":
        scorer = LogisticScorer().fit(X, y, columns=COLUMNS)
        scorer.attach_group_map(GroupTransportMap().fit(X, s, columns=COLUMNS))
        return Example(scorer, PipelineSchema(features=tuple(COLUMNS), groups=(0, 1)), Batch(X=X, keys=keys))
    if label == "scorer-network":
        scorer = fit_scorer(X, s, y, method="unconstrained", columns=COLUMNS, hidden=(4,), n_epochs=2, batch_size=64,
                            min_steps=0)
        return Example(scorer, PipelineSchema(features=tuple(COLUMNS), groups=(0, 1)), Batch(X=X, keys=keys))
    if label == "flow":
        groups = np.where(s == 1, "m", "f")
        # A large learning rate takes the flow far from the identity in a few steps: products then matter.
        flow = refit_flow(X, groups, y, LogisticScorer().fit(X, y), columns=COLUMNS, n_blocks=1, hidden=(8,),
                          n_steps=10, batch_size=16, lr=0.1)
        unknown = groups.astype(object)
        unknown[::9] = "x"  # no flow for that group: refused with a reason
        schema = PipelineSchema(features=tuple(COLUMNS), groups=("f", "m"))
        return Example(flow, schema, Batch(X=X, keys=keys, s=unknown))
    if label == "embedding":
        train, test = simulate_train_test(train_identities=(6, 6), train_images=4, test_identities=(10, 10),
                                          test_images=3, concentration=(0.3, 0.5), noise=(0.7, 0.7), dimension=5,
                                          seed=0)
        module = fit_embedding_module(train.vectors, train.identities, train.groups, epochs=3, batch_size=16, hidden=8,
                                      learning_rate=0.1)
        vectors = test.vectors.copy()
        vectors[0] = 0.0  # a zero vector stays zero
        return Example(module, PipelineSchema(dimension=5), Batch(X=vectors, keys=np.arange(len(vectors))))
    raise ValueError(label)


EXAMPLES = ("plan", "scorer-logistic", "scorer-network", "flow", "embedding")


def check_the_examples_cover_every_kind() -> None:
    """A kind registered without an example here would escape both properties."""
    assert {example(label).module.kind for label in EXAMPLES} == set(MODULE_KINDS)


# ----------------------------------------------------------------------------- arrays checked at load

MUTATIONS = ("truncate", "nan", "inf", "negative", "dtype", "shape")
LABELS = re.compile(r"(group_map\.)?(groups|strata)")


@dataclass(frozen=True)
class Valid:
    """A mutation that leaves the artifact valid by its kind's declared domain: not a refusal case."""

    why: str


# Mutations that stay inside an array's declared domain, by array name (a regular expression). Every
# mutation not listed here must be refused.
STILL_VALID = {
    "negative": {
        r"grid_start|posterior_(coef|mean)": Valid("features, and so grids and their log-odds, may be negative"),
        r"mean|coef|intercept|weight_\d|bias_\d": Valid("standardisation means and a network's weights are any real"),
        r"(scale|shift)_[wb]\d|data_(min|max)": Valid("coupling weights and a feature's fit range are any real"),
        r"[wb][12]": Valid("an embedding module's weights are any real"),
        r"group_map\.(offset|source|target)": Valid("a map's offsets and matched records are feature values"),
        LABELS.pattern: Valid("any number is a label; labels out of order are the 'nan' mutation"),
    },
    "inf": {r"data_max": Valid("+inf stores an unbounded fit range")},
    "nan": {
        r"posterior_cv": Valid("NaN records a cross-validated score that was not measured"),
        r"posterior_n_folds": Valid("every count of folds >= 0 is valid; below 0 is the 'negative' mutation"),
    },
}


def still_valid(name: str, mutation: str) -> Valid | None:
    return next((why for pattern, why in STILL_VALID.get(mutation, {}).items() if re.fullmatch(pattern, name)), None)


def out_of_range(name: str, arrays: dict, index: int, parameters: dict) -> np.ndarray:
    """The 'nan' of an integer or text array: a value outside its domain (there is no NaN to store)."""
    array = arrays[name].copy()
    flat = array.reshape(-1)
    if LABELS.fullmatch(name):
        flat[index] = flat[index - 1] if index else flat[1]  # a duplicate: labels are unique and sorted
    elif name == "n_features_in":
        flat[0] = 0
    elif name == "features":
        flat[index] = arrays["n_features_in"]
    elif name == "grid_size":
        flat[index] = arrays["source_pmf"].shape[-1] + 1
    elif name == "n_research":  # a count that contradicts has_plan (plans exist exactly where counts suffice)
        flat[index] = 0 if arrays["has_plan"].reshape(-1)[index] else 10**6
    elif name == "n_iter":
        flat[0] = parameters["max_iter"] + 1
    elif name == "posterior_degree":
        return np.array("cubic")
    elif name in ("group_map.reference_index", "group_map.pair"):
        flat[index] = len(arrays["group_map.groups"])
    else:
        raise AssertionError(f"declare the out-of-range value of the integer array {name!r} here")
    return array


def mutate(name: str, arrays: dict, mutation: str, index: int, parameters: dict) -> np.ndarray | Valid:
    """``arrays[name]`` with one mutation at flat position ``index``, or why it is not a refusal case."""
    array, kind = arrays[name], arrays[name].dtype.kind
    if still_valid(name, mutation):
        return still_valid(name, mutation)
    if mutation == "truncate":  # the issue's reproduction: one entry short on the last axis
        return array[..., :-1] if array.ndim else np.empty(0, array.dtype)
    if mutation == "shape":
        return np.stack([array, array], axis=-1)
    if mutation == "dtype":  # floats as integers, everything else as floats
        return np.round(array).astype(np.int64) if kind == "f" else np.arange(array.size, dtype=float).reshape(
            array.shape) if kind == "U" else array.astype(np.float64)
    if kind == "b":  # all-false masks are the plan's own reproduction (tests/repair/test_distributional.py)
        return Valid("a bool has no NaN, infinity or sign; truncate, dtype and shape cover it")
    if mutation == "nan" and kind != "f":
        return out_of_range(name, arrays, index, parameters)
    if kind not in "f" + ("iu" if mutation == "negative" else ""):
        return Valid(f"an array of kind {kind!r} cannot hold {mutation}; 'nan' stores its out-of-range value")
    changed = array.astype(np.float64 if kind == "f" else array.dtype, copy=True)
    flat = changed.reshape(-1)
    flat[index] = {"nan": np.nan, "inf": np.inf, "negative": -(abs(flat[index]) + 1)}[mutation]
    return changed


def sealed(art: artifacts.Artifact, arrays: dict) -> artifacts.Artifact:
    """``arrays`` packed with ``art``'s parameters and sent as one blob: every hash and size verifies."""
    return artifacts.decode(artifacts.encode(artifacts.pack(art.kind, arrays, dict(art.parameters))), kind=art.kind)


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_every_corrupt_array_of_every_kind_is_refused_at_load(label, data):
    check_the_examples_cover_every_kind()
    check_the_table_names_only_arrays_that_exist()
    ex = example(label)
    art = ex.module.to_artifact()
    arrays = {name: np.array(a) for name, a in art.arrays.items() if name != artifacts.PARAMETERS_ARRAY}
    load_module(sealed(art, arrays), ex.schema)  # re-sealed unchanged, it loads: what follows is the mutations'
    # __parameters__ is left out: the seal itself refuses any change to it (tests/repair/test_artifacts.py).
    for name in arrays:
        for mutation in MUTATIONS:
            index = data.draw(st.integers(0, max(arrays[name].size - 1, 0)), label=f"{name} {mutation}")
            bad = mutate(name, arrays, mutation, index, art.parameters)
            if isinstance(bad, Valid):
                continue
            with pytest.raises(ArtifactError) as refused:
                load_module(sealed(art, {**arrays, name: bad}), ex.schema)
            # Corrupt, not a config mismatch: the registry logs these as refusals, not as config errors.
            assert not isinstance(refused.value, IncompatibleArtifact), (name, mutation)
            assert re.search(r"array '[\w.]+'", str(refused.value)), (name, mutation, str(refused.value))


def check_the_table_names_only_arrays_that_exist() -> None:
    """A stale entry of STILL_VALID (an array renamed) would silently stop exempting anything."""
    names = {name for label in EXAMPLES for name in example(label).module.to_artifact().arrays}
    for table in STILL_VALID.values():
        for pattern in table:
            assert any(re.fullmatch(pattern, name) for name in names), pattern


# ----------------------------------------------------------------------------- batch independence


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_a_rows_output_is_bit_identical_in_any_batch(label, data):
    check_the_examples_cover_every_kind()
    ex = example(label)
    size = data.draw(st.integers(1, 40), label="batch size")
    rows = np.array(data.draw(st.lists(st.integers(0, len(ex.pool) - 1), min_size=size, max_size=size)))
    batch = ex.pool.take(rows)
    together = ex.module.apply(batch)
    for i in range(size):
        alone = ex.module.apply(batch.take(np.array([i])))
        assert alone.ok[0] == together.ok[i] and alone.reasons[0] == together.reasons[i]
        assert np.array_equal(alone.X[0], together.X[i]), (label, i)
        for name, column in together.columns.items():
            assert np.array_equal(alone.columns[name][0], column[i], equal_nan=True), (label, name, i)
        if together.imputed is not None:
            assert alone.imputed[0] == together.imputed[i] and alone.s[0] == together.s[i]


# ----------------------------------------------------------------------------- one extreme row among normal ones

EXTREMES = (1.7e308, -1.7e308, 1e300, -1e300, 5e-324, -5e-324, 2.2250738585072014e-308, 0.0)


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_one_row_of_extreme_finite_values_never_stops_or_changes_the_others(label, data):
    # The red team's F5 (p6c_sweep.py): one valid record with age = +-1.7e308 made a flow emit inf and the
    # scorer behind it raise for the whole batch (37 of 80 flows), so the partition stopped at that record.
    check_the_examples_cover_every_kind()
    ex = example(label)
    size = data.draw(st.integers(1, 20), label="normal rows")
    rows = np.array(data.draw(st.lists(st.integers(0, len(ex.pool) - 1), min_size=size, max_size=size)))
    donor = data.draw(st.integers(0, len(ex.pool) - 1), label="the extreme row's labels")
    values = data.draw(st.lists(st.sampled_from(EXTREMES), min_size=ex.pool.X.shape[1],
                                max_size=ex.pool.X.shape[1]), label="extreme values")
    at = data.draw(st.integers(0, size), label="position")
    normal = ex.pool.take(rows)
    extreme = ex.pool.take(np.array([donor]))
    extreme = Batch(X=np.array([values]), keys=np.array(["extreme"], dtype=object), s=extreme.s, u=extreme.u,
                    y=extreme.y, impute_s=extreme.impute_s)
    order = np.insert(np.arange(size), at, size)  # the extreme row at position `at`
    both = Batch(X=np.vstack([normal.X, extreme.X])[order], keys=np.concatenate([normal.keys, extreme.keys])[order],
                 s=None if normal.s is None else np.concatenate([normal.s, extreme.s])[order],
                 u=None if normal.u is None else np.concatenate([normal.u, extreme.u])[order], impute_s=normal.impute_s)
    mixed = ex.module.apply(both)
    with np.errstate(all="raise"):  # whatever the process's numpy error setting, the chain does not raise
        chained = apply_chain([ex.module], both)
    for outcome in (mixed, chained):
        assert np.isfinite(outcome.X[outcome.ok]).all(), label
        for name, column in outcome.columns.items():
            assert np.isfinite(np.asarray(column, dtype=float)[outcome.ok]).all(), (label, name)
    alone = ex.module.apply(normal)
    kept = np.delete(np.arange(size + 1), at)
    assert mixed.ok[kept].tolist() == alone.ok.tolist() and [mixed.reasons[i] for i in kept] == alone.reasons
    assert np.array_equal(mixed.X[kept], alone.X, equal_nan=True), label
    for name, column in alone.columns.items():
        assert np.array_equal(mixed.columns[name][kept], column, equal_nan=True), (label, name)
    if alone.imputed is not None:
        assert np.array_equal(mixed.imputed[kept], alone.imputed) and mixed.s[kept].tolist() == alone.s.tolist()


# ----------------------------------------------------------------------------- the load-time probe


@pytest.mark.parametrize("label", EXAMPLES)
def test_every_kind_serves_its_own_small_probe(label):
    ex = example(label)
    probe = ex.module.probe()
    assert 1 <= len(probe) <= 64 and np.isfinite(probe.X).all()
    outcome = apply_chain([ex.module], probe)
    assert outcome.ok.all(), outcome.reasons
    check_probe(ex.module)  # what load_module runs
