"""Records without s: dead-lettered by default, or repaired under s drawn from the plan's Pr[s | x, u]."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import wasserstein_distance

from fairstream.repair import artifacts
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.protocol import Applied, Batch, IncompatibleArtifact, PipelineSchema, apply_chain


def separated(n, seed, shift=2.0):
    """Two groups per stratum, N(0, 1) and N(shift, 1) in both features: s is predictable from x."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 2, n); u = rng.integers(0, 2, n)
    return rng.normal(shift * s[:, None] + u[:, None], 1.0, size=(n, 2)), s, u


@pytest.fixture(scope="module")
def plan():
    X, s, u = separated(3000, seed=1)
    return DistributionalRepair(n_q=40).fit(X, s, u)


def hide(s, rows):
    out = s.astype(object)
    out[rows] = None
    return out


def test_a_missing_s_is_refused_by_default_and_the_others_are_untouched(plan):
    X, s, u = separated(50, seed=2)
    res = plan.repair(X, hide(s, [3, 7]), u, keys=np.arange(50))
    assert np.flatnonzero(~res.ok).tolist() == [3, 7]
    assert res.reasons[3] == "s is missing and this input does not impute it"
    assert not res.imputed.any()
    np.testing.assert_array_equal(res.values[3], X[3])
    full = plan.transform(X, s, u, keys=np.arange(50))
    keep = np.setdiff1d(np.arange(50), [3, 7])
    np.testing.assert_array_equal(res.values[keep], full[keep])


def test_imputed_rows_are_repaired_under_the_drawn_s_and_flagged(plan):
    X, s, u = separated(200, seed=3)
    hidden = np.arange(0, 200, 3)
    res = plan.repair(X, hide(s, hidden), u, keys=np.arange(200), impute_s=True)
    assert res.ok.all() and res.n_imputed == len(hidden)
    assert np.flatnonzero(res.imputed).tolist() == hidden.tolist()
    drawn = res.s[hidden].astype(int)
    assert set(drawn) <= {0, 1} and res.s[1] == s[1]
    # Same output as repairing the row with the drawn s given: the draw only fills in s.
    given_s = plan.transform(X[hidden], drawn, u[hidden], keys=hidden)
    np.testing.assert_array_equal(res.values[hidden], given_s)
    # Well-separated groups: the draw is almost always the true s.
    assert np.mean(drawn == s[hidden]) > 0.85


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_the_draw_and_the_output_depend_on_the_record_key_not_the_batch(plan, data):
    X, s, u = separated(120, seed=4)
    keys = np.array([f"rec-{i}" for i in range(120)])
    s_missing = hide(s, np.arange(120))
    whole = plan.repair(X, s_missing, u, keys=keys, impute_s=True)
    perm = np.array(data.draw(st.permutations(range(120))))
    cut = data.draw(st.integers(1, 119))
    for idx in (perm[:cut], perm[cut:]):
        part = plan.repair(X[idx], s_missing[idx], u[idx], keys=keys[idx], impute_s=True)
        np.testing.assert_array_equal(part.values, whole.values[idx])
        assert part.s.tolist() == whole.s[idx].tolist()


def test_draws_follow_the_posterior(plan):
    x = np.array([[1.0, 1.0]])  # between the groups of stratum 0: a genuinely uncertain s
    p1 = plan.posterior_.predict_proba(x, [0])[0, 1]
    n = 4000
    res = plan.repair(np.repeat(x, n, axis=0), np.full(n, None, dtype=object), np.zeros(n, int),
                      keys=np.arange(n), impute_s=True)
    share = np.mean(res.s.astype(int) == 1)
    assert 0.2 < p1 < 0.8 and abs(share - p1) < 4 * np.sqrt(p1 * (1 - p1) / n)


def test_float_nan_marks_a_missing_s(plan):
    X, s, u = separated(6, seed=5)
    s_float = s.astype(float); s_float[2] = np.nan
    res = plan.repair(X, s_float, u, impute_s=True)
    assert res.ok.all() and res.imputed.tolist() == [False, False, True, False, False, False]
    np.testing.assert_array_equal(np.delete(res.values, 2, axis=0), np.delete(plan.transform(X, s, u), 2, axis=0))


def test_the_better_s_is_predicted_the_closer_imputation_gets_to_the_true_s_repair():
    residual = {}
    for shift in (1.0, 4.0):  # cross-validated AUC of Pr[s | x, u] about 0.85 and 1.0
        plan = DistributionalRepair(n_q=40).fit(*separated(3000, seed=1, shift=shift))
        X, s, u = separated(8000, seed=6, shift=shift)
        gap = lambda Z: max(wasserstein_distance(Z[(u == a) & (s == 0), k], Z[(u == a) & (s == 1), k])
                            for a in (0, 1) for k in (0, 1))
        keys = np.arange(len(X))
        imputed = plan.repair(X, np.full(len(X), None, dtype=object), u, keys=keys, impute_s=True).values
        assert gap(plan.transform(X, s, u, keys=keys)) < 0.15 * gap(X)  # with the true s
        residual[shift] = gap(imputed) / gap(X)
    # An imputed s repairs only what it predicts: partly at AUC 0.85, almost fully at AUC 1.
    assert 0.3 < residual[1.0] < 0.9 and residual[4.0] < 0.1


def test_the_posterior_round_trips_through_the_artifact_bit_exact(plan, tmp_path):
    art = plan.to_artifact(version=2)
    assert {"posterior_coef", "posterior_mean", "posterior_scale"} <= set(art.arrays)
    X, s, u = separated(300, seed=7)
    keys = np.array([f"k{i}" for i in range(300)])
    s_missing = hide(s, np.arange(0, 300, 2))
    want = plan.repair(X, s_missing, u, keys=keys, impute_s=True)
    for loaded in (artifacts.decode(artifacts.encode(art), kind="plan"),
                   artifacts.load(artifacts.save(art, tmp_path / "plan"), kind="plan")):
        again = DistributionalRepair.from_artifact(loaded)
        assert again.fingerprint_ == plan.fingerprint_
        np.testing.assert_array_equal(again.posterior_.coef_, plan.posterior_.coef_)
        got = again.repair(X, s_missing, u, keys=keys, impute_s=True)
        np.testing.assert_array_equal(got.values, want.values)
        assert got.s.tolist() == want.s.tolist()


def test_a_plan_without_posterior_loads_keeps_its_draws_and_refuses_to_impute():
    X, s, u = separated(1000, seed=8)
    old = DistributionalRepair(n_q=30, posterior=False).fit(X, s, u)
    # Such a plan's fingerprint (which keys every draw) is that of the plan arrays alone, as before.
    plan_arrays = [old.grid_start_, old.grid_step_, old.grid_size_, old.source_pmf_, old.barycenter_, old.has_plan_]
    assert old.fingerprint_ == artifacts.fingerprint_arrays(*plan_arrays)
    art = old.to_artifact()
    assert not any(name.startswith("posterior") for name in art.arrays)
    again = DistributionalRepair.from_artifact(artifacts.decode(artifacts.encode(art)))
    assert again.posterior_ is None and again.fingerprint_ == old.fingerprint_
    res = again.repair(X[:3], [None, 0, 1], u[:3], impute_s=True)
    assert res.ok.tolist() == [False, True, True] and "re-fit" in res.reasons[0]
    again.check_compatible(PipelineSchema(groups=(0, 1)))
    with pytest.raises(IncompatibleArtifact, match="imputes missing s"):
        again.check_compatible(PipelineSchema(groups=(0, 1), impute_s=True))


class AddOne:
    """A second module of a chain: adds 1, knows nothing of s."""

    kind = "add-one"
    seed = ""

    def check_compatible(self, schema):
        pass

    def apply(self, batch):
        return Applied.all_ok(batch, batch.X + 1.0)


def test_the_protocol_reports_imputed_rows_through_a_chain(plan):
    X, s, u = separated(8, seed=9)
    s_missing = hide(s, [1, 5])
    keys = np.array([f"r{i}" for i in range(8)], dtype=object)
    off = apply_chain([plan, AddOne()], Batch(X=X, keys=keys, s=s_missing, u=u))
    assert off.ok.tolist() == [True, False, True, True, True, False, True, True] and not off.imputed.any()
    on = apply_chain([plan, AddOne()], Batch(X=X, keys=keys, s=s_missing, u=u, impute_s=True))
    assert on.ok.all() and on.imputed.tolist() == [i in (1, 5) for i in range(8)]
    direct = plan.repair(X, s_missing, u, keys=keys, impute_s=True)
    np.testing.assert_array_equal(on.X, direct.values + 1.0)
    assert on.s.tolist() == direct.s.tolist()
    # A sub-batch keeps the input's choice.
    assert Batch(X=X, keys=keys, s=s_missing, u=u, impute_s=True).take(np.array([1])).impute_s
