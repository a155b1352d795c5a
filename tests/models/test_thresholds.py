"""Group thresholds after the scorer: exact parity on the fit data, optimal accuracy, deterministic decisions.

The fitted rules are checked against quantities the tests compute themselves from the data and the
artifact's arrays (each cell's expected rates under its weighted rules), and the accuracy against an
independent solver: a linear programme over every randomised mixture of every threshold of every cell
(scipy's HiGHS), whose optimum the convex-hull construction must reach.
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from fairstream.models import thresholds
from fairstream.models.kinds import load_module
from fairstream.models.thresholds import GroupThresholds, fit_thresholds, upper_hull
from fairstream.repair import artifacts
from fairstream.repair.artifacts import ArtifactError
from fairstream.repair.protocol import Batch, IncompatibleArtifact, PipelineSchema, apply_chain
from fairstream.repair.validation import RepairInputError

RATES = {"dp": ("positive rate",), "eopp": ("tpr",), "eo": ("tpr", "fpr")}


def test_docstring_examples_run():
    result = doctest.testmod(thresholds)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- the tests' own arithmetic


def rule_passes(score: np.ndarray, threshold: float, inclusive: bool) -> np.ndarray:
    """The documented rule: 1 where score > t, or score == t when inclusive."""
    return (score > threshold) | (inclusive & (score == threshold))


def expected_decisions(module: GroupThresholds, score, s, u=None) -> np.ndarray:
    """Each row's probability of a positive decision: its cell's rule weights times what each rule decides."""
    a = np.zeros(len(score), dtype=int) if u is None else np.searchsorted(module.strata_, u)
    b = np.searchsorted(module.groups_, s)
    t, inclusive, w = module.threshold_[a, b], module.inclusive_[a, b], module.weight_[a, b]
    passes = (score[:, None] > t) | (inclusive & (score[:, None] == t))
    return (w * passes).sum(axis=1)


def cell_rates(p: np.ndarray, y: np.ndarray) -> dict:
    return {"positive rate": p.mean(), "tpr": p[y == 1].mean() if (y == 1).any() else np.nan,
            "fpr": p[y == 0].mean() if (y == 0).any() else np.nan}


def optimum_by_linear_programme(score, s, y, constraint: str) -> float:
    """The most correct decisions any randomised mixture of thresholds per group reaches under the constraint.

    Variables: per group, a weight on every rule ``score >= v`` (v a distinct score of the group) and
    "never"; each group's weights sum to 1; the constrained rates are linear in them.
    """
    groups = np.unique(s)
    columns, rows_eq, rhs = [], [], []
    blocks = []
    for g in groups:
        sc, yc = score[s == g], y[s == g]
        rules = [np.zeros(len(sc), dtype=bool)] + [sc >= v for v in np.unique(sc)]
        decided = np.array(rules, dtype=float)  # (rule, row)
        blocks.append({"correct": (decided * yc + (1 - decided) * (1 - yc)).sum(axis=1),
                       "positive rate": decided.mean(axis=1),
                       "tpr": decided[:, yc == 1].mean(axis=1) if (yc == 1).any() else None,
                       "fpr": decided[:, yc == 0].mean(axis=1) if (yc == 0).any() else None})
    offsets = np.cumsum([0] + [len(b["correct"]) for b in blocks])
    n_vars = offsets[-1]
    for k, block in enumerate(blocks):  # each group's weights sum to 1
        row = np.zeros(n_vars)
        row[offsets[k]:offsets[k + 1]] = 1.0
        rows_eq.append(row)
        rhs.append(1.0)
    for rate in RATES[constraint]:  # every group's rate equals the first group's
        for k in range(1, len(blocks)):
            row = np.zeros(n_vars)
            row[offsets[0]:offsets[1]] = blocks[0][rate]
            row[offsets[k]:offsets[k + 1]] = -blocks[k][rate]
            rows_eq.append(row)
            rhs.append(0.0)
    columns = np.concatenate([b["correct"] for b in blocks])
    result = linprog(-columns, A_eq=np.array(rows_eq), b_eq=np.array(rhs), bounds=(0, 1), method="highs")
    assert result.success, result.message
    return -result.fun


@st.composite
def labelled_scores(draw, max_groups=3):
    """Small windows with tied scores, 2 or 3 groups, and both labels in every group."""
    n_groups = draw(st.integers(2, max_groups))
    n = draw(st.integers(4 * n_groups, 40))
    levels = draw(st.integers(2, 12))
    score = np.array(draw(st.lists(st.integers(0, levels), min_size=n, max_size=n))) / levels
    s = np.array(draw(st.lists(st.integers(0, n_groups - 1), min_size=n, max_size=n)))
    y = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    s[:2 * n_groups] = np.repeat(np.arange(n_groups), 2)  # every group has rows of both labels
    y[:2 * n_groups] = np.tile([0, 1], n_groups)
    return score, s, y


# ----------------------------------------------------------------------------- parity and optimality on the fit data


@pytest.mark.parametrize("constraint", ["dp", "eopp", "eo"])
@settings(max_examples=30, deadline=None)
@given(data=labelled_scores())
def test_on_the_fit_data_every_group_has_the_common_rates_exactly(constraint, data):
    score, s, y = data
    module = fit_thresholds(score, s, y, constraint=constraint)
    p = expected_decisions(module, score, s)
    rates = [cell_rates(p[s == g], y[s == g]) for g in np.unique(s)]
    for rate in RATES[constraint]:
        values = [r[rate] for r in rates]
        assert max(values) - min(values) < 1e-9, (rate, values)
    assert np.allclose(module.weight_.sum(axis=-1), 1.0) and (module.weight_ >= 0).all()


@pytest.mark.parametrize("constraint", ["dp", "eopp", "eo"])
@settings(max_examples=30, deadline=None)
@given(data=labelled_scores())
def test_the_accuracy_is_the_optimum_of_an_independent_linear_programme(constraint, data):
    score, s, y = data
    module = fit_thresholds(score, s, y, constraint=constraint)
    p = expected_decisions(module, score, s)
    correct = float((p * y + (1 - p) * (1 - y)).sum())
    assert correct == pytest.approx(optimum_by_linear_programme(score, s, y, constraint), abs=1e-6)


def test_per_stratum_the_groups_share_a_point_and_strata_are_solved_apart():
    rng = np.random.default_rng(3)
    n = 3000
    s, u = rng.integers(0, 2, n), rng.integers(0, 2, n)
    y = (rng.uniform(size=n) < 0.2 + 0.5 * u).astype(int)  # stratum 1 mostly positive: its best point has a higher TPR
    score = np.clip(0.3 * y + 0.2 * s + rng.uniform(0, 0.6, n), 0, 1)
    module = fit_thresholds(score, s, y, u=u, constraint="eo")
    p = expected_decisions(module, score, s, u)
    for a in (0, 1):
        rates = [cell_rates(p[(s == g) & (u == a)], y[(s == g) & (u == a)]) for g in (0, 1)]
        assert abs(rates[0]["tpr"] - rates[1]["tpr"]) < 1e-9 and abs(rates[0]["fpr"] - rates[1]["fpr"]) < 1e-9
    tpr = [cell_rates(p[u == a], y[u == a])["tpr"] for a in (0, 1)]
    assert abs(tpr[0] - tpr[1]) > 0.01  # each stratum its own point, not one for all


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30))
def test_the_upper_hull_lies_above_every_point_and_bends_down_at_every_vertex(points):
    # Checked against its definition, not another hull algorithm: on an integer grid, exactly.
    x, y = (np.array(column, dtype=float) for column in zip(*points))
    hull = upper_hull(x, y)
    hx, hy = x[hull], y[hull]
    assert np.all(np.diff(hx) > 0) and hx[0] == x.min() and hx[-1] == x.max()
    assert np.all(np.interp(x, hx, hy) >= y)  # no point above the hull
    slopes = np.diff(hy) / np.diff(hx)
    assert np.all(np.diff(slopes) < 0)  # strictly concave: no collinear vertex kept


def test_the_upper_hull_keeps_the_highest_of_equal_x_and_drops_collinear_points():
    x = np.array([0.0, 0.25, 0.5, 0.5, 0.75, 1.0])
    y = np.array([0.0, 0.3125, 0.625, 0.1, 0.875, 1.0])  # (0.25, 0.3125) is on the chord from (0, 0) to (0.5, 0.625)
    assert upper_hull(x, y).tolist() == [0, 2, 4, 5]


# ----------------------------------------------------------------------------- gaps on a biased scorer


def biased_scorer(n=20000, seed=0):
    """A scorer that favours s = 1 at the same label, with different base rates per group."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n)
    y = (rng.uniform(size=n) < np.where(s == 1, 0.4, 0.25)).astype(int)
    score = 1 / (1 + np.exp(-(2.0 * y - 1.0 + 0.8 * s + rng.normal(0, 1.0, n))))
    return score, s, y


def gaps(decision, s, y) -> dict:
    def spread(mask):
        rates = [decision[mask & (s == g)].mean() for g in (0, 1)]
        return abs(rates[1] - rates[0])
    every = np.ones(len(s), dtype=bool)
    return {"positive rate": spread(every), "tpr": spread(y == 1), "fpr": spread(y == 0)}


@pytest.mark.parametrize("constraint", ["dp", "eopp", "eo"])
def test_each_constraint_closes_its_gap_on_a_biased_scorer(constraint):
    score, s, y = biased_scorer()
    before = gaps((score >= 0.5).astype(int), s, y)
    module = fit_thresholds(score, s, y, constraint=constraint, seed=7)
    after = gaps(module.decide(score, s, keys=np.arange(len(score))), s, y)  # realised, drawn decisions
    for rate in RATES[constraint]:
        assert before[rate] > 0.1 and after[rate] < 0.03, (rate, before, after)


# ----------------------------------------------------------------------------- the draws


def test_realised_decisions_follow_the_rule_weights():
    # Over many keys at one score, the share of positives is the weight of the rules that pass it. This catches
    # a draw that picks rules in another order or by another cumulative sum than the weights say.
    score, s, y = biased_scorer(4000, seed=1)
    module = fit_thresholds(score, s, y, constraint="eo", seed=11)
    n = 40000
    keys = np.array([f"k{i}" for i in range(n)])
    for b, group in enumerate(module.groups_):
        for t in np.unique(module.threshold_[0, b]):
            for value in (t, np.nextafter(t, 2.0), np.nextafter(t, -1.0)):
                if not 0.0 <= value <= 1.0:
                    continue
                p = expected_decisions(module, np.array([value]), np.array([group]))[0]
                realised = module.decide(np.full(n, value), np.full(n, group), keys=keys).mean()
                assert abs(realised - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-9, (group, value, p, realised)


def module_of(rules, weights) -> GroupThresholds:
    """A one-cell module (group 0, no strata) with the given (threshold, inclusive) rules and weights."""
    arrays = {"groups": np.array([0]), "strata": np.array([0]), "fitted": np.array([[True]]),
              "threshold": np.array([[[t for t, _ in rules]]]), "inclusive": np.array([[[i for _, i in rules]]]),
              "weight": np.array([[weights]])}
    constraint = "eo" if len(rules) == 4 else "dp"  # the layout: two rules a cell, four for eo
    art = artifacts.pack("thresholds", arrays, {"constraint": constraint, "seed": 1, "stratified": False})
    return GroupThresholds.from_artifact(art)


@pytest.mark.parametrize("rules, weights, score, share", [
    ([(0.5, False), (0.5, True)], [0.25, 0.75], 0.5, 0.75),  # at the threshold only the inclusive rule passes
    ([(0.5, False), (0.5, True)], [0.25, 0.75], 0.7, 1.0),
    ([(0.5, False), (0.5, True)], [0.25, 0.75], 0.3, 0.0),
    ([(1.0, False), (0.0, True)], [0.4, 0.6], 1.0, 0.6),  # "never" refuses even a score of 1
    ([(1.0, False), (0.0, True)], [0.4, 0.6], 0.0, 0.6),  # "always" takes even a score of 0
    ([(0.2, True), (0.9, True)], [0.0, 1.0], 0.5, 0.0),  # a rule of weight 0 is never drawn
    # eo's four rules: the draw spans all four weights (0.3 and "always" pass 0.5)
    ([(0.3, True), (0.6, True), (1.0, False), (0.0, True)], [0.1, 0.2, 0.3, 0.4], 0.5, 0.5),
])
def test_the_documented_rule_decides_each_share_of_keys(rules, weights, score, share):
    module = module_of(rules, weights)
    n = 20000
    realised = module.decide(np.full(n, score), np.zeros(n, dtype=int), keys=np.arange(n)).mean()
    assert abs(realised - share) < 4 * np.sqrt(share * (1 - share) / n) + 1e-12


def test_a_decision_is_the_same_in_any_batch_and_from_the_key_alone():
    score, s, y = biased_scorer(600, seed=2)
    module = fit_thresholds(score, s, y, constraint="eo", seed=5)
    keys = np.array([f"rec-{i}" for i in range(len(score))], dtype=object)
    together = module.decide(score, s, keys=keys)
    order = np.random.default_rng(0).permutation(len(score))
    assert module.decide(score[order], s[order], keys=keys[order]).tolist() == together[order].tolist()
    alone = [int(module.decide(score[i:i + 1], s[i:i + 1], keys=keys[i:i + 1])[0]) for i in range(0, 600, 37)]
    assert alone == together[::37].tolist()
    other_seed = fit_thresholds(score, s, y, constraint="eo", seed=6).decide(score, s, keys=keys)
    assert not np.array_equal(other_seed, together)  # the draws are keyed by the seed too


def test_for_one_key_a_higher_score_never_gets_a_lower_decision():
    score, s, y = biased_scorer(2000, seed=4)
    module = fit_thresholds(score, s, y, constraint="eo")
    grid = np.linspace(0, 1, 201)
    for key in ("a", "b", "c", "d"):
        for group in (0, 1):
            decisions = module.decide(grid, np.full(len(grid), group), keys=np.full(len(grid), key))
            assert (np.diff(decisions) >= 0).all()


# ----------------------------------------------------------------------------- the module protocol


def fitted(stratified=True, constraint="eo"):
    rng = np.random.default_rng(5)
    n = 800
    s, u, y = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 2, n)
    score = np.clip(0.4 * y + 0.2 * s + rng.uniform(0, 0.4, n), 0, 1)
    module = fit_thresholds(score, s, y, u=u if stratified else None, constraint=constraint, seed=9)
    return module, Batch(X=rng.normal(size=(n, 2)), keys=np.arange(n), s=s, u=u, added={"score": score})


def test_apply_adds_a_decision_and_leaves_the_features():
    module, batch = fitted()
    applied = module.apply(batch)
    assert applied.ok.all() and applied.columns["decision"].dtype == np.int64
    assert set(applied.columns) == {"decision"}
    assert np.array_equal(applied.X, batch.X) and applied.X is not batch.X
    expected = module.decide(batch.added["score"], batch.s, batch.u, keys=batch.keys)
    assert applied.columns["decision"].tolist() == expected.tolist()


def test_after_a_scorer_in_a_chain_the_thresholds_decision_replaces_the_scorers():
    from fairstream.models.scorer import LogisticScorer

    rng = np.random.default_rng(6)
    X = rng.normal(size=(1000, 2))
    s, u = (X[:, 1] > 0).astype(int), rng.integers(0, 2, 1000)
    y = (X[:, 0] + X[:, 1] + rng.normal(size=1000) > 0).astype(int)
    scorer = LogisticScorer().fit(X, y)
    post = fit_thresholds(scorer.predict_proba(X), s, y, u=u, constraint="dp", seed=1)
    chained = apply_chain([scorer, post], Batch(X=X, keys=np.arange(1000), s=s, u=u))
    assert chained.ok.all()
    assert chained.columns["decision"].tolist() == post.decide(scorer.predict_proba(X), s, u, np.arange(1000)).tolist()
    assert gaps(chained.columns["decision"], s, y)["positive rate"] < 0.05 < gaps((chained.columns["score"] >= 0.5)
                                                                                   .astype(int), s, y)["positive rate"]


def hostile(batch: Batch, what: str, at: int) -> Batch:
    s, u, score = batch.s.astype(object), batch.u.astype(object), batch.added["score"].astype(float)
    if what.startswith("score"):
        score[at] = float(what.split()[1])
    elif what == "s unseen":
        s[at] = 7
    elif what == "s missing":
        s[at] = None
    elif what == "u unseen":
        u[at] = "x"
    elif what == "u missing":
        u[at] = None
    return Batch(X=batch.X, keys=batch.keys, s=s, u=u, added={"score": score})


@pytest.mark.parametrize("what, says", [("score nan", "score nan"), ("score 1.5", "score 1.5"),
                                        ("score -0.25", "score -0.25"), ("score inf", "score inf"),
                                        ("s unseen", "s value 7"), ("s missing", "s is missing"),
                                        ("u unseen", "u value 'x'"), ("u missing", "u is missing")])
def test_a_row_that_cannot_be_decided_is_refused_alone_with_a_reason(what, says):
    module, batch = fitted()
    batch = batch.take(np.arange(30))
    clean = module.apply(batch)
    with np.errstate(all="raise"):
        outcome = apply_chain([module], hostile(batch, what, 4))
    assert not outcome.ok[4] and says in outcome.reasons[4]
    others = np.delete(np.arange(30), 4)
    assert outcome.ok[others].all()
    assert outcome.columns["decision"][others].tolist() == clean.columns["decision"][others].tolist()


def test_a_batch_without_a_score_is_refused_row_by_row_naming_the_score():
    module, batch = fitted()
    outcome = module.apply(Batch(X=batch.X[:5], keys=batch.keys[:5], s=batch.s[:5], u=batch.u[:5]))
    assert not outcome.ok.any() and all("score" in reason for reason in outcome.reasons)
    assert outcome.columns["decision"].tolist() == [-1] * 5


def test_a_cell_without_fit_rows_is_refused_and_named():
    module = fit_thresholds([0.2, 0.8, 0.3, 0.7], [0, 0, 1, 1], [0, 1, 0, 1], u=[0, 0, 0, 0], strata=[0, 1])
    outcome = module.apply(Batch(X=np.zeros((2, 0)), keys=np.arange(2), s=np.array([0, 1]), u=np.array([0, 1]),
                                 added={"score": np.array([0.5, 0.5])}))
    assert outcome.ok.tolist() == [True, False] and "u=1, s=1" in outcome.reasons[1]


def test_without_strata_u_is_ignored():
    module, batch = fitted(stratified=False)
    junk = Batch(X=batch.X, keys=batch.keys, s=batch.s, u=np.full(len(batch), "junk"), added=batch.added)
    assert module.apply(junk).columns["decision"].tolist() == module.apply(batch).columns["decision"].tolist()


def test_check_compatible_refuses_another_group_set_or_strata():
    module, _ = fitted()
    module.check_compatible(PipelineSchema(groups=(0, 1), strata=(0, 1)))
    module.check_compatible(PipelineSchema(groups=(1,)))  # a pipeline serving fewer groups is served
    for schema in (PipelineSchema(groups=(0, 1, 2)), PipelineSchema(groups=(0, 1), strata=(0, 1, 2))):
        with pytest.raises(IncompatibleArtifact, match="thresholds was fitted without"):
            module.check_compatible(schema)
    fitted(stratified=False)[0].check_compatible(PipelineSchema(groups=(0, 1), strata=(0, 1, 2)))


@pytest.mark.parametrize("constraint", ["dp", "eo"])
def test_the_artifact_round_trip_decides_bit_for_bit_alike(constraint, tmp_path):
    module, batch = fitted(constraint=constraint)
    art = module.to_artifact(version=3)
    for copy in (artifacts.decode(artifacts.encode(art), kind="thresholds"),
                 artifacts.load(artifacts.save(art, tmp_path / "t"), kind="thresholds")):
        loaded = load_module(copy, PipelineSchema(groups=(0, 1), strata=(0, 1)))
        assert isinstance(loaded, GroupThresholds) and loaded.get_params() == module.get_params()
        for name, array in art.arrays.items():
            assert np.array_equal(loaded.to_artifact().arrays[name], array), name
        assert loaded.apply(batch).columns["decision"].tolist() == module.apply(batch).columns["decision"].tolist()


@pytest.mark.parametrize("name, value, says", [("weight", 0.6, "summing to 1"), ("threshold", 1.5, "<= 1"),
                                               ("weight", -0.1, ">= 0")])
def test_a_corrupt_array_is_refused_at_load_naming_it(name, value, says):
    module, _ = fitted()
    art = module.to_artifact()
    arrays = {k: np.array(v) for k, v in art.arrays.items() if k != artifacts.PARAMETERS_ARRAY}
    arrays[name][0, 0, 0] = value
    bad = artifacts.pack("thresholds", arrays, dict(art.parameters))
    with pytest.raises(ArtifactError, match=f"array '{name}' must be .*{says}"):
        GroupThresholds.from_artifact(bad)


def test_the_probe_covers_every_fitted_cell_at_both_ends():
    module, _ = fitted()
    probe = module.probe()
    assert len(probe) == 3 * int(module.fitted_.sum())
    assert sorted(set(probe.added["score"].tolist())) == [0.0, 0.5, 1.0]
    assert apply_chain([module], probe).ok.all()


# ----------------------------------------------------------------------------- errors name what is wrong


@pytest.mark.parametrize("kwargs, says", [
    ({"constraint": "eo", "y": [1, 1, 0, 1]}, "group s=0 has no fit rows with y = 0"),
    ({"constraint": "eopp", "y": [0, 0, 1, 1]}, "group s=0 has no fit rows with y = 1"),
    ({"score": [0.2, 1.5, 0.3, 0.4]}, "score has the value 1.5 at row 1"),
    ({"score": [0.2, float("nan"), 0.3, 0.4]}, "score has the value nan at row 1"),
    ({"constraint": "odds"}, "constraint must be one of"),
    ({"groups": [0]}, "s has the value 1, which is not among the declared s labels [0]"),
    ({"s": [0, None, 1, 1]}, "s is missing at row 1"),
    ({"y": [0, 2, 1, 1]}, "y must be binary"),
])
def test_fit_errors_name_the_offending_value(kwargs, says):
    args = {"score": [0.2, 0.8, 0.3, 0.7], "s": [0, 0, 1, 1], "y": [0, 1, 0, 1], "constraint": "dp", **kwargs}
    with pytest.raises(RepairInputError, match=None) as error:
        fit_thresholds(**args)
    assert says in str(error.value)


def test_dp_serves_a_group_with_one_label_only():
    module = fit_thresholds([0.2, 0.8, 0.3, 0.7], [0, 0, 1, 1], [1, 1, 0, 1], constraint="dp")
    p = expected_decisions(module, np.array([0.2, 0.8, 0.3, 0.7]), np.array([0, 0, 1, 1]))
    assert abs(p[:2].mean() - p[2:].mean()) < 1e-12


def test_the_capabilities_place_it_after_the_scorer():
    caps = GroupThresholds.capabilities
    assert caps.reads == {"score"} and caps.adds == {"decision"} and caps.place == "post" and caps.needs_s
    assert GroupThresholds(constraint="eo", random_state=3).get_params() == {"constraint": "eo", "random_state": 3}


@pytest.mark.parametrize("constraint", ["dp", "eo"])
def test_a_score_a_few_ulps_from_a_fit_score_decides_as_that_score(constraint):
    # The worker may compute a record's score on another BLAS kernel than the re-fit did: the thresholds lie
    # midway between fit scores, so a score an ulp away from one is never on the other side of a threshold.
    score, s, y = biased_scorer(800, seed=4)
    module = fit_thresholds(score, s, y, constraint=constraint, seed=2)
    keys = np.arange(len(score))
    at = module.decide(score, s, keys=keys)
    for direction in (-1.0, 2.0):
        assert (module.decide(np.clip(np.nextafter(score, direction), 0, 1), s, keys=keys) == at).all()
