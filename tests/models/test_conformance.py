"""The conformance suite: every check run over every registered kind (scikit-learn's ``parametrize_with_checks``).

The table of fitted examples is tests/models/kind_examples.py (one entry per kind, more for a kind's
layouts); a new kind is covered by adding its entry there. Every case below derives from the example
and the kind's declared :class:`~fairstream.repair.protocol.Capabilities`:

- the table covers every kind in ``MODULE_KINDS``, and each example's schema declares what its kind reads;
- the artifact round trip (encoded blob, and .json/.npz files) rebuilds the same arrays and the same
  outputs, bit for bit;
- a row's output is bit-identical in any batch, alone included; an empty batch and one row are served;
- rows with NaN, infinite or out-of-domain values (unseen group or stratum, missing s where the kind
  needs s, a NaN or out-of-range score for a kind that reads one) are refused with a reason by
  ``apply_chain``, never an exception, and the other rows' outputs are those they get without them;
  one row of extreme finite values never stops or changes the others;
- ``check_compatible`` refuses another feature list, group set, strata or vector width, as the kind reads;
- a hostile but consistent publisher mutates one array (truncated, NaN, inf, negative, another dtype,
  another shape) and re-seals the payload: the module is refused at load, with an :class:`ArtifactError`
  naming an array, never built to fail later;
- a fresh process computes the same outputs from the saved artifacts, bit for bit;
- the declared capabilities match what the module does (the columns it adds, the features it leaves, the
  s and columns it ignores and those it reads, ``fitted_range``, ``matched_counterparts``);
- every kind serves its own load-time probe.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.models.kinds import MODULE_KINDS, load_module
from fairstream.repair import artifacts
from fairstream.repair.artifacts import ArtifactError
from fairstream.repair.protocol import Applied, Batch, IncompatibleArtifact, apply_chain, check_probe

from .kind_examples import EXAMPLES, example
from .replay import load_outputs, save_example

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_covers_every_registered_kind():
    """A kind registered without an example in kind_examples.py would escape every check here."""
    assert {example(label).module.kind for label in EXAMPLES} == set(MODULE_KINDS)


@pytest.mark.parametrize("label", EXAMPLES)
def test_each_example_serves_its_schema_and_declares_what_its_kind_reads(label):
    # Without a feature list, groups or a width in the schema, the refusals below would check nothing.
    ex = example(label)
    caps = ex.module.capabilities
    load_module(ex.module.to_artifact(), ex.schema)
    assert bool(ex.schema.features) >= ("features" in caps.reads), label
    assert bool(ex.schema.groups) >= caps.needs_s, label
    assert (ex.schema.dimension is not None) == ("vectors" in caps.reads), label
    assert all(name in ex.pool.added for name in caps.reads - {"features", "vectors"}), label
    assert (ex.pool.s is not None) >= caps.needs_s and len(ex.pool) >= 40, label


# ----------------------------------------------------------------------------- comparing outcomes


def bits(array) -> tuple:
    """An array as its dtype, shape and bytes: equal bit for bit (NaN payloads included), or not."""
    array = np.ascontiguousarray(array)
    return array.dtype.str, array.shape, array.tobytes()


def assert_same_rows(a: Applied, b: Applied, rows_a=None, rows_b=None, what="") -> None:
    """Rows ``rows_a`` of ``a`` are rows ``rows_b`` of ``b`` bit for bit: values, refusals, reasons, columns."""
    rows_a = np.arange(len(a.ok)) if rows_a is None else np.asarray(rows_a)
    rows_b = np.arange(len(b.ok)) if rows_b is None else np.asarray(rows_b)
    assert a.ok[rows_a].tolist() == b.ok[rows_b].tolist(), what
    assert [a.reasons[i] for i in rows_a] == [b.reasons[i] for i in rows_b], what
    assert bits(a.X[rows_a]) == bits(b.X[rows_b]), what
    assert bits(a.out_of_range[rows_a]) == bits(b.out_of_range[rows_b]), what
    assert set(a.columns) == set(b.columns), what
    for name in a.columns:
        assert bits(np.asarray(a.columns[name])[rows_a]) == bits(np.asarray(b.columns[name])[rows_b]), (what, name)
    assert (a.imputed is None) == (b.imputed is None), what
    if a.imputed is not None:
        assert bits(a.imputed[rows_a]) == bits(b.imputed[rows_b]), what
        assert a.s[rows_a].tolist() == b.s[rows_b].tolist(), what


def concatenate(first: Batch, second: Batch) -> Batch:
    """The rows of ``first`` then those of ``second`` (whose labels and columns it must have too)."""
    join = (lambda a, b: None if a is None else np.concatenate([a, b]))
    return dataclasses.replace(first, X=np.vstack([first.X, second.X]), keys=join(first.keys, second.keys),
                               s=join(first.s, second.s), u=join(first.u, second.u), y=join(first.y, second.y),
                               added={name: np.concatenate([v, second.added[name]]) for name, v in first.added.items()})


def drawn_rows(data, ex, low: int, high: int, what: str) -> np.ndarray:
    size = data.draw(st.integers(low, high), label=f"{what} size")
    return np.array(data.draw(st.lists(st.integers(0, len(ex.pool) - 1), min_size=size, max_size=size), label=what),
                    dtype=np.int64)


# ----------------------------------------------------------------------------- the artifact round trip


def round_trips(art: artifacts.Artifact, tmp_path: Path):
    """``art`` as one blob (a Kafka message) and as the .json/.npz file pair, each read back."""
    yield "blob", artifacts.decode(artifacts.encode(art), kind=art.kind)
    yield "files", artifacts.load(artifacts.save(art, tmp_path), kind=art.kind)


@pytest.mark.parametrize("label", EXAMPLES)
def test_the_artifact_round_trip_is_bit_exact(label, tmp_path):
    ex = example(label)
    art = ex.module.to_artifact()
    before = ex.module.apply(ex.pool)
    for how, copy in round_trips(art, tmp_path):
        loaded = load_module(copy, ex.schema)
        assert type(loaded) is type(ex.module) and loaded.seed == ex.module.seed, (label, how)
        again = loaded.to_artifact()
        assert again.parameters == art.parameters, (label, how)
        assert sorted(again.arrays) == sorted(art.arrays), (label, how)
        for name, array in art.arrays.items():
            assert bits(again.arrays[name]) == bits(array), (label, how, name)
        assert_same_rows(loaded.apply(ex.pool), before, what=(label, how))


# ----------------------------------------------------------------------------- batch independence


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_a_rows_output_is_bit_identical_in_any_batch(label, data):
    ex = example(label)
    batch = ex.pool.take(drawn_rows(data, ex, 1, 40, "batch"))
    together = ex.module.apply(batch)
    for i in range(len(batch)):
        assert_same_rows(ex.module.apply(batch.take(np.array([i]))), together, [0], [i], what=(label, i))


@pytest.mark.parametrize("label", EXAMPLES)
def test_an_empty_batch_and_a_single_row_are_served(label):
    ex = example(label)
    width = ex.pool.X.shape[1]
    for rows in (np.array([], dtype=np.int64), np.array([1])):
        batch = ex.pool.take(rows)
        for how, outcome in (("apply", ex.module.apply(batch)), ("chain", apply_chain([ex.module], batch))):
            n = len(rows)
            assert np.shape(outcome.X) == (n, width) and np.shape(outcome.ok) == (n,), (label, how, n)
            assert len(outcome.reasons) == n and np.shape(outcome.out_of_range) == (n,), (label, how, n)
            assert set(outcome.columns) == ex.module.capabilities.adds, (label, how, n)
            assert all(np.shape(column) == (n,) for column in outcome.columns.values()), (label, how, n)


# ----------------------------------------------------------------------------- NaN and out-of-domain rows

OUT_OF_DOMAIN = {"score": (np.nan, np.inf, -np.inf, 1.5, -0.5), "decision": (-1, 2)}
"""Values of a column an earlier module adds that a kind reading it must refuse (a refused row's column is NaN)."""


def unseen(labels: tuple):
    """A label of the same type as ``labels`` that is none of them."""
    return "never-seen" if all(isinstance(v, str) for v in labels) else max(labels) + 1000


def foreign(labels: tuple):
    """A label of another type than ``labels`` (text among numbers, a number among text)."""
    return 10**6 if all(isinstance(v, str) for v in labels) else "never-seen"


def with_label(name: str, value, impute_s: bool | None = None):
    def put(batch: Batch, at: int) -> Batch:
        column = getattr(batch, name).astype(object)
        column[at] = value
        imputes = batch.impute_s if impute_s is None else impute_s
        return dataclasses.replace(batch, **{name: column}, impute_s=imputes)
    return put


def with_value(k: int, value: float):
    def put(batch: Batch, at: int) -> Batch:
        X = batch.X.copy()
        X[at, k] = value
        return dataclasses.replace(batch, X=X)
    return put


def with_added(name: str, value):
    def put(batch: Batch, at: int) -> Batch:
        column = batch.added[name].astype(np.float64)
        column[at] = value
        return dataclasses.replace(batch, added={**batch.added, name: column})
    return put


def hostile_rows(ex) -> list:
    """(what, how to put it in a batch at a row) for every value the kind must refuse, from its capabilities."""
    caps, schema = ex.module.capabilities, ex.schema
    cases = []
    if caps.reads & {"features", "vectors"}:
        for k in sorted({0, ex.pool.X.shape[1] - 1}):
            cases += [(f"{value} in column {k}", with_value(k, value)) for value in (np.nan, np.inf, -np.inf)]
    if caps.needs_s:
        cases += [("an unseen group", with_label("s", unseen(schema.groups))),
                  ("a group of another type", with_label("s", foreign(schema.groups))),
                  ("a missing s (None)", with_label("s", None, impute_s=False)),
                  ("a missing s (NaN)", with_label("s", float("nan"), impute_s=False))]
    if schema.strata:
        cases += [("an unseen stratum", with_label("u", unseen(schema.strata))),
                  ("a stratum of another type", with_label("u", foreign(schema.strata))),
                  ("a missing stratum", with_label("u", None))]
    for name in sorted(caps.reads & set(OUT_OF_DOMAIN)):
        cases += [(f"{name} {value}", with_added(name, value)) for value in OUT_OF_DOMAIN[name]]
    return cases


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_a_row_with_a_nan_or_out_of_domain_value_is_refused_with_a_reason_alone(label, data):
    ex = example(label)
    rows = drawn_rows(data, ex, 1, 20, "rows")
    at = data.draw(st.integers(0, len(rows) - 1), label="the hostile row")
    others = np.delete(np.arange(len(rows)), at)
    cases = hostile_rows(ex)
    assert cases, f"{label}: its capabilities name nothing a row could get wrong"
    for what, put in cases:
        hostile = put(ex.pool.take(rows), at)
        with np.errstate(all="raise"):  # whatever the process's numpy error setting, the chain does not raise
            outcome = apply_chain([ex.module], hostile)
        assert not outcome.ok[at], (label, what)
        assert isinstance(outcome.reasons[at], str) and outcome.reasons[at], (label, what)
        assert bits(outcome.X[at]) == bits(hostile.X[at]), (label, what)  # a refused row keeps its input
        clean = apply_chain([ex.module], dataclasses.replace(ex.pool.take(rows), impute_s=hostile.impute_s))
        assert_same_rows(outcome, clean, others, others, what=(label, what))
    for name in sorted(ex.module.capabilities.reads & set(OUT_OF_DOMAIN)):  # no module before it added the column
        outcome = apply_chain([ex.module], dataclasses.replace(ex.pool.take(rows), added={}))
        assert not outcome.ok.any() and all(isinstance(r, str) and name in r for r in outcome.reasons), (label, name)


EXTREMES = (1.7e308, -1.7e308, 1e300, -1e300, 5e-324, -5e-324, 2.2250738585072014e-308, 0.0)


@pytest.mark.parametrize("label", EXAMPLES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_one_row_of_extreme_finite_values_never_stops_or_changes_the_others(label, data):
    # The red team's F5 (p6c_sweep.py): one valid record with age = +-1.7e308 made a flow emit inf and the
    # scorer behind it raise for the whole batch (37 of 80 flows), so the partition stopped at that record.
    ex = example(label)
    normal = ex.pool.take(drawn_rows(data, ex, 1, 20, "normal rows"))
    donor = data.draw(st.integers(0, len(ex.pool) - 1), label="the extreme row's labels")
    width = ex.pool.X.shape[1]
    values = data.draw(st.lists(st.sampled_from(EXTREMES), min_size=width, max_size=width), label="extreme values")
    at = data.draw(st.integers(0, len(normal)), label="position")
    extreme = dataclasses.replace(ex.pool.take(np.array([donor])), X=np.array([values]),
                                  keys=np.array(["extreme"], dtype=object))
    order = np.insert(np.arange(len(normal)), at, len(normal))  # the extreme row at position `at`
    both = concatenate(normal, extreme).take(order)
    mixed = ex.module.apply(both)
    with np.errstate(all="raise"):
        chained = apply_chain([ex.module], both)
    for outcome in (mixed, chained):
        assert np.isfinite(outcome.X[outcome.ok]).all(), label
        for name, column in outcome.columns.items():
            assert np.isfinite(np.asarray(column, dtype=float)[outcome.ok]).all(), (label, name)
    kept = np.delete(np.arange(len(normal) + 1), at)
    assert_same_rows(mixed, ex.module.apply(normal), kept, what=label)


# ----------------------------------------------------------------------------- check_compatible


def other_pipelines(ex) -> list:
    """(what, schema) for each pipeline the kind must refuse: another feature list, groups, strata or width."""
    caps, schema = ex.module.capabilities, ex.schema
    others = []
    if "features" in caps.reads:
        features = schema.features
        others += [("features renamed", dataclasses.replace(schema, features=tuple(f"{c}_2" for c in features))),
                   ("features reordered", dataclasses.replace(schema, features=features[::-1])),
                   ("a feature fewer", dataclasses.replace(schema, features=features[:-1])),
                   ("a feature more", dataclasses.replace(schema, features=(*features, "extra")))]
    if caps.needs_s:
        others += [("a group more", dataclasses.replace(schema, groups=(*schema.groups, unseen(schema.groups))))]
    if schema.strata:
        others += [("a stratum more", dataclasses.replace(schema, strata=(*schema.strata, unseen(schema.strata))))]
    if "vectors" in caps.reads:
        others += [(f"width {width}", dataclasses.replace(schema, dimension=width))
                   for width in (schema.dimension - 1, schema.dimension + 1)]
    return others


@pytest.mark.parametrize("label", EXAMPLES)
def test_check_compatible_refuses_another_feature_list_group_set_strata_or_width(label):
    ex = example(label)
    art = ex.module.to_artifact()
    for what, schema in other_pipelines(ex):
        assert refuses(ex.module.check_compatible, schema), (label, what)
        assert refuses(lambda schema: load_module(art, schema), schema), (label, what)  # the registry's path


def refuses(check, schema) -> bool:
    try:
        check(schema)
    except IncompatibleArtifact as refusal:
        return bool(str(refusal))
    return False


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


def out_of_range(name: str, arrays: dict, index: int, parameters: dict) -> np.ndarray | Valid:
    """The 'nan' of an integer or text array: a value outside its domain (there is no NaN to store)."""
    array = arrays[name].copy()
    flat = array.reshape(-1)
    if LABELS.fullmatch(name) and flat.size < 2:
        return Valid("one label has no duplicate; any value is a label")
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
    if kind == "b":  # all-false masks are the plan's own reproduction (tests/models/test_plan.py)
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


def test_the_exemptions_name_only_arrays_that_exist():
    """A stale entry of STILL_VALID (an array renamed) would silently stop exempting anything."""
    names = {name for label in EXAMPLES for name in example(label).module.to_artifact().arrays}
    for table in STILL_VALID.values():
        for pattern in table:
            assert any(re.fullmatch(pattern, name) for name in names), pattern


# ----------------------------------------------------------------------------- determinism across processes

REPLAY = "import sys; from tests.models.replay import replay; replay(sys.argv[1])"


def test_a_fresh_process_computes_the_same_outputs_bit_for_bit(tmp_path):
    # One subprocess for every example: it loads the saved artifacts and batches, nothing of this process.
    for label in EXAMPLES:
        ex = example(label)
        save_example(tmp_path / label, ex.module.to_artifact(), ex.pool)
    subprocess.run([sys.executable, "-c", REPLAY, str(tmp_path)], cwd=ROOT, check=True, timeout=300)
    for label in EXAMPLES:
        ex = example(label)
        here = apply_chain([ex.module], ex.pool)
        there, reasons = load_outputs(tmp_path / label)
        assert reasons == here.reasons and bits(there["ok"]) == bits(here.ok), label
        assert bits(there["X"]) == bits(here.X), label
        assert sorted(there) == sorted(["X", "ok", *(f"column.{name}" for name in here.columns)]), label
        for name, column in here.columns.items():
            assert bits(there[f"column.{name}"]) == bits(column), (label, name)


# ----------------------------------------------------------------------------- capabilities match behaviour


@pytest.mark.parametrize("label", EXAMPLES)
def test_the_columns_a_kind_adds_and_the_features_it_keeps_are_those_it_declares(label):
    ex = example(label)
    caps = ex.module.capabilities
    for outcome in (ex.module.apply(ex.pool), apply_chain([ex.module], ex.pool)):
        assert set(outcome.columns) == caps.adds, label
        if caps.writes & {"features", "vectors"}:
            assert not np.array_equal(outcome.X[outcome.ok], ex.pool.X[outcome.ok]), label
        else:  # it reads the features (or nothing of them) and leaves every row's as they came
            assert bits(outcome.X) == bits(ex.pool.X), label


@pytest.mark.parametrize("label", EXAMPLES)
def test_a_kind_ignores_the_s_and_columns_it_does_not_declare_reading(label):
    ex = example(label)
    caps = ex.module.capabilities
    n = len(ex.pool)
    junk = ex.pool
    if not caps.needs_s:
        junk = dataclasses.replace(junk, s=np.full(n, "junk", dtype=object))
    ignored = {"score": np.full(n, 7.0), "decision": np.full(n, 9, dtype=np.int64)}
    junk = dataclasses.replace(junk, added={**{k: v for k, v in ignored.items() if k not in caps.reads},
                                            **{k: v for k, v in junk.added.items() if k in caps.reads}})
    assert_same_rows(apply_chain([ex.module], junk), apply_chain([ex.module], ex.pool), what=label)


def changed_inputs(ex) -> list:
    """(what, the pool with it changed) for everything the kind declares reading."""
    caps, pool = ex.module.capabilities, ex.pool
    changes = []
    if caps.reads & {"features", "vectors"}:
        changes += [("the features", dataclasses.replace(pool, X=pool.X + 0.5))]
    if caps.needs_s:  # every known group swapped for the next one; unknown and missing labels stay
        groups = list(ex.schema.groups)
        swap = {g: groups[(i + 1) % len(groups)] for i, g in enumerate(groups)}
        changes += [("s", dataclasses.replace(pool, s=np.array([swap.get(v, v) for v in pool.s], dtype=object)))]
    for name in sorted(caps.reads - {"features", "vectors"}):
        flipped = (1 - pool.added[name]).astype(pool.added[name].dtype)  # a score's (and a decision's) mirror image
        changes += [(name, dataclasses.replace(pool, added={**pool.added, name: flipped}))]
    return changes


@pytest.mark.parametrize("label", EXAMPLES)
def test_a_kind_reads_what_it_declares_reading(label):
    # The other direction of the test above: a declared read that the module ignores is a wrong declaration
    # (the chain check would then demand a column nothing uses), or a module that lost an input.
    ex = example(label)
    before = apply_chain([ex.module], ex.pool)
    for what, changed in changed_inputs(ex):
        after = apply_chain([ex.module], changed)
        outputs = [(bits(after.X), bits(before.X))] + [(bits(after.columns[name]), bits(column))
                                                     for name, column in before.columns.items()]
        assert any(a != b for a, b in outputs), (label, what)


@pytest.mark.parametrize("label", EXAMPLES)
def test_a_kind_answers_what_its_capabilities_promise(label):
    ex = example(label)
    caps = ex.module.capabilities
    assert (caps.agent == "embeddings") == ("vectors" in caps.reads) == (caps.place is None), label
    if caps.fitted_range:  # the monitor's bins and out-of-range count
        strata, lowest, highest = ex.module.fitted_range()
        assert lowest.shape == highest.shape == (len(strata), ex.pool.X.shape[1]), label
        assert np.isfinite(lowest).all() and (lowest <= highest).all(), label
        assert set(ex.schema.strata) <= set(np.asarray(strata).tolist()), label
    if caps.counterparts:  # matched demographic parity
        probability = ex.module.predict_proba(ex.pool.X)
        assert probability.shape == (len(ex.pool),) and ((probability >= 0) & (probability <= 1)).all(), label
        assert hasattr(ex.module, "group_map_"), label
        if ex.module.group_map_ is not None:
            s = np.resize(np.array(ex.schema.groups), len(ex.pool))
            matched = ex.module.matched_counterparts(ex.pool.X, s)
            assert matched.X.shape[1] == ex.pool.X.shape[1] and len(matched.X) == len(matched.s) == len(matched.rows)
            assert set(np.asarray(matched.rows).tolist()) <= set(range(len(ex.pool))), label


@pytest.mark.parametrize("label", EXAMPLES)
def test_every_kind_serves_its_own_small_probe(label):
    ex = example(label)
    probe = ex.module.probe()
    assert 1 <= len(probe) <= 64 and np.isfinite(probe.X).all()
    outcome = apply_chain([ex.module], probe)
    assert outcome.ok.all(), outcome.reasons
    check_probe(ex.module)  # what load_module runs
