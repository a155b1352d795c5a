"""Tests of the Centroid Fairness targets (Proposition B.1, weights), the training loop and the re-fit entry points."""

import doctest
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.models import centroid, centroid_targets
from fairstream.models.centroid import (
    CentroidFairness,
    _sampling_probabilities,
    centroid_fairness_loss,
    fit_embedding_module,
    validate_embedding_module,
)
from fairstream.models.centroid_targets import (
    CentroidTargets,
    GroupQuantileScoreNormaliser,
    IdentityStructure,
    _scaled,
    far_matching,
    far_weights,
    frr_matching,
    frr_weights,
    pretrained_centroids,
    pseudo_score_block_rows,
)
from fairstream.models.embedding import FairnessModule
from fairstream.repair.validation import RepairInputError
from fairstream.repair.embedding_datasets import simulate_train_test
from fairstream.repair.measure.verification import ScoreCurve, curve_distance, l2_normalise, same_group_pair_scores

torch.set_num_threads(1)
PROPERTY = settings(max_examples=80, deadline=None)


@pytest.mark.parametrize("module", [centroid, centroid_targets])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------------------------
# Proposition B.1 and the weights
# --------------------------------------------------------------------------------------------

# Source scores are distinct (the proposition's setting); the reference may have ties. float64 throughout.
distinct_scores = st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=300, unique=True).map(np.array)
reference_scores = st.lists(st.integers(-50, 50), min_size=1, max_size=300).map(lambda v: np.array(v) / 50.0)


def transformed_curve(mapping, source: ScoreCurve, reference: ScoreCurve) -> ScoreCurve:
    """The curve of every source score replaced by its transform (multiplicities kept)."""
    counts = np.diff(source.cumulative, prepend=0)
    return ScoreCurve.from_scores(np.repeat(mapping(source, reference, source.values), counts))


@PROPERTY
@given(distinct_scores, reference_scores)
def test_proposition_b1_transformed_curves_within_one_over_n(source_scores, reference_scores):
    source, reference = ScoreCurve.from_scores(source_scores), ScoreCurve.from_scores(reference_scores)
    n_a = source_scores.size
    # FRR side (genuine pairs) and FAR side (impostor pairs): the sup distance is the same for both curves.
    for mapping in (frr_matching, far_matching):
        assert curve_distance(transformed_curve(mapping, source, reference), reference) <= 1.0 / n_a + 1e-12


@PROPERTY
@given(reference_scores)
def test_reference_group_maps_onto_itself_even_with_ties(scores):
    curve = ScoreCurve.from_scores(scores)
    np.testing.assert_array_equal(frr_matching(curve, curve, scores), scores)
    np.testing.assert_array_equal(far_matching(curve, curve, scores), scores)


@PROPERTY
@given(distinct_scores)
def test_weights_peak_at_one_and_sum_to_the_harmonic_number(scores):
    curve = ScoreCurve.from_scores(scores)
    harmonic = np.sum(1.0 / np.arange(1, scores.size + 1))
    for weights in (frr_weights(curve, scores), far_weights(curve, scores)):
        assert weights.max() == 1.0  # lowest genuine / highest impostor score (FAR clipped at 1/n)
    assert frr_weights(curve, scores).sum() == pytest.approx(harmonic)
    # FAR side: #{s' > s} runs over 0..n-1, the 0 clipped to 1, so the sum is H_{n-1} + 1.
    assert far_weights(curve, scores).sum() == pytest.approx(harmonic - 1.0 / scores.size + 1.0)


def test_rank_arithmetic_is_exact_beyond_int64_products():
    m = np.array([1, 3, 10**10 - 1, 10**10], dtype=np.int64)
    for ceil in (True, False):
        expected = [-(-int(x) * 10**10 // (10**10 + 7)) if ceil else int(x) * 10**10 // (10**10 + 7) for x in m]
        assert _scaled(m, 10**10, 10**10 + 7, ceil=ceil).tolist() == expected


# --------------------------------------------------------------------------------------------
# Targets on a small synthetic training set
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_data():
    return simulate_train_test(train_identities=(30, 25, 60, 20), train_images=8, test_identities=(40,) * 4,
                               test_images=5, dimension=16, seed=1)


def build_targets(train, reference=2, **kw):
    Z = l2_normalise(train.vectors)
    structure = IdentityStructure.of(train.identities, train.groups, len(Z))
    mu0 = l2_normalise(pretrained_centroids(Z, structure.y, structure.n_identities))
    return CentroidTargets(Z, structure, mu0, reference, **kw), Z, structure, mu0


def test_targets_align_each_groups_pseudo_curves_with_the_reference(small_data):
    targets, *_ = build_targets(small_data[0])
    gen_r, imp_r = targets.curves[2]
    for a, (gen, imp) in enumerate(targets.curves):
        assert imp.n == targets.images[a].size * (targets.members[a].size - 1)
        for mapping, curve, ref in ((frr_matching, gen, gen_r), (far_matching, imp, imp_r)):
            assert curve_distance(transformed_curve(mapping, curve, ref), ref) <= 1.0 / curve.n + 1e-12
    sums = targets.weight_sums()
    for a, (gen, imp) in enumerate(targets.curves):
        assert sums[a, 0] == pytest.approx(np.sum(1.0 / np.arange(1, gen.n + 1)), rel=1e-6)


def test_block_lookup_matches_the_curves_and_binning_is_close(small_data):
    targets, Z, structure, mu0 = build_targets(small_data[0])
    binned, *_ = build_targets(small_data[0], exact_limit=1, bins=2 ** 16)
    images = targets.images[1][:7]
    t, w, genuine = targets.block(1, images)
    assert genuine.sum() == 7 and genuine.shape == (7, targets.members[1].size)
    _, first_block, _ = next(targets._blocks(1))  # the code path (and rounding) the curves were built with
    scores = first_block[:7]
    gen_curve, imp_curve = targets.curves[1]
    np.testing.assert_allclose(t[~genuine], far_matching(imp_curve, targets.curves[2][1], scores[~genuine]),
                               rtol=1e-6)
    own = pseudo_score_block_rows(Z[images], mu0, structure.y[images])
    np.testing.assert_allclose(w[genuine], frr_weights(gen_curve, own), rtol=1e-6)
    tb, _, _ = binned.block(1, images)
    assert np.max(np.abs(tb - t)) < 0.01  # bins of width 3e-5, plus the rank shift inside a bin
    np.testing.assert_array_equal(tb[genuine], t[genuine])  # genuine pairs are always exact


# --------------------------------------------------------------------------------------------
# The loss and the training loop
# --------------------------------------------------------------------------------------------


def test_loss_is_the_sum_of_two_weighted_means():
    s = torch.tensor([0.1, 0.5, 0.9, 0.3])
    t = torch.tensor([0.2, 0.5, 0.7, 0.3])
    w = torch.tensor([1.0, 3.0, 2.0, 0.5])
    genuine = torch.tensor([False, False, True, True])
    expected = (1 * 0.01 + 0) / 4 + (2 * 0.04 + 0) / 2.5
    assert centroid_fairness_loss(s, t, w, genuine).item() == pytest.approx(expected)
    assert centroid_fairness_loss(t, t, w, genuine).item() == 0.0


@pytest.fixture(scope="module")
def fitted(small_data):
    train, _ = small_data
    return CentroidFairness(epochs=6, batch_size=256, learning_rate=3e-3, seed=0).fit(
        train.vectors, train.identities, train.groups)


def test_training_reduces_the_loss_and_aligns_training_pseudo_far_curves(small_data, fitted):
    train, _ = small_data
    assert fitted.reference_ == 2 and fitted.n_steps_ == 6 * 5
    assert fitted.history_[-1]["loss"] < 0.7 * fitted.history_[0]["loss"]
    # New pseudo-scores (transformed images against trained centroids) vs the reference's pre-trained curve.
    out = l2_normalise(fitted.transform(train.vectors))
    targets = fitted.targets_
    _, ref_imp = targets.curves[2]
    for a in (0, 1, 3):
        rows, cols = targets.images[a], targets.members[a]
        scores = out[rows] @ fitted.centroids_[cols].T
        impostor = targets.structure.y[rows][:, None] != cols[None, :]
        before = curve_distance(targets.curves[a][1], ref_imp)
        after = curve_distance(ScoreCurve.from_scores(scores[impostor]), ref_imp)
        assert after < 0.6 * before


def test_training_starts_at_the_identity_and_is_reproducible(small_data, fitted):
    train, _ = small_data
    again = CentroidFairness(epochs=6, batch_size=256, learning_rate=3e-3, seed=0).fit(
        train.vectors, train.identities, train.groups)
    np.testing.assert_array_equal(again.module_.w2, fitted.module_.w2)
    zero_epochs = CentroidFairness(epochs=1, batch_size=256, learning_rate=1e-12).fit(
        train.vectors, train.identities, train.groups)
    np.testing.assert_allclose(zero_epochs.transform(train.vectors[:5]), l2_normalise(train.vectors[:5]), atol=1e-8)


def test_fit_errors_are_clear(small_data):
    train, _ = small_data
    with pytest.raises(RepairInputError, match="sampling"):
        CentroidFairness(sampling="stratified").fit(train.vectors, train.identities, train.groups)
    with pytest.raises(RepairInputError, match="two groups"):
        CentroidFairness().fit(train.vectors, train.identities, np.zeros(len(train)))
    with pytest.raises(RepairInputError, match="more than one group"):
        CentroidFairness().fit(np.eye(4), [1, 1, 2, 3], [0, 1, 0, 1])
    with pytest.raises(RepairInputError, match="reference group 'x'"):
        CentroidFairness(reference="x").fit(train.vectors, train.identities, train.groups)
    with pytest.raises(RepairInputError, match="not fitted"):
        CentroidFairness().transform(train.vectors)


# --------------------------------------------------------------------------------------------
# Re-fit entry points and the score-level baseline
# --------------------------------------------------------------------------------------------


def test_refit_and_validation_entry_points(small_data, fitted):
    train, test = small_data
    module = fit_embedding_module(train.vectors, train.identities, train.groups, epochs=1, batch_size=512,
                                  sampling="uniform")
    assert isinstance(module, FairnessModule) and module.dimension == 16 and not module.is_identity
    report = validate_embedding_module(fitted.module_, test.vectors, test.identities, test.groups, far=1e-2)
    assert report.impostor_pairs == 4 * (200 * 199 // 2 - 40 * 10) and report.genuine_pairs == 4 * 40 * 10
    assert report.before.threshold != report.after.threshold
    same = validate_embedding_module(fitted.module_, test.vectors, test.identities, test.groups, far=1e-2,
                                     active=fitted.module_)
    assert same.bfar_reduction == 0.0 and same.fnmr_change == 0.0
    json.dumps(report.as_dict(), allow_nan=False)


def test_group_quantile_baseline_aligns_impostor_curves_on_its_fit_set(small_data):
    _, test = small_data
    baseline = GroupQuantileScoreNormaliser(bins=2 ** 16).fit(test.vectors, test.identities, test.groups)
    assert baseline.reference_ == 0  # balanced groups: the first one
    ref = baseline.curves_[0]
    assert max(curve_distance(baseline.curves_[g], ref) for g in (1, 2, 3)) > 0.05  # misaligned before
    for g in (1, 2, 3):
        mapped = ScoreCurve.from_scores(np.repeat(baseline.transform_scores(baseline.curves_[g].values, g),
                                                  np.diff(baseline.curves_[g].cumulative, prepend=0)))
        # Binned scores tie within a bin, so the bound of Proposition B.1 grows to the largest bin's share.
        largest_bin = np.diff(baseline.curves_[g].cumulative, prepend=0).max()
        assert curve_distance(mapped, ref) <= largest_bin / baseline.curves_[g].n + 1e-12


# --------------------------------------------------------------------------------------------
# Tests that would catch a wrong formula (each fails on a planted bug: see docs/mutation.md)
# --------------------------------------------------------------------------------------------


def test_a_trained_module_lowers_the_held_out_bfar_against_the_plain_encoder():
    # Groups differ enough here (d = 32) that 10 epochs cut the held-out BFAR by about a third; "before" is the
    # frozen encoder as is, recomputed here without the function under test.
    train, test = simulate_train_test(train_identities=(60, 50, 120, 40), train_images=10, test_identities=(100,) * 4,
                                      test_images=5, dimension=32, seed=1)
    module = fit_embedding_module(train.vectors, train.identities, train.groups, epochs=10, batch_size=512,
                                  learning_rate=3e-3, seed=0)
    report = validate_embedding_module(module, test.vectors, test.identities, test.groups, far=1e-2)
    plain = same_group_pair_scores(l2_normalise(test.vectors), test.identities, test.groups, max_far=1e-2)
    assert report.before.bfar == plain.rates_at_far(1e-2).bfar and report.far == 1e-2
    assert report.after.bfar < report.before.bfar and report.bfar_reduction > 0.2
    assert abs(report.fnmr_change) < 0.01  # fairer without costing accuracy


def test_balanced_sampling_gives_each_group_the_same_mass():
    codes = np.array([0, 0, 0, 0, 1, 2, 2])
    p = _sampling_probabilities(codes, "balanced")
    np.testing.assert_allclose(np.bincount(codes, p), [1 / 3] * 3)  # equal per group, uniform within one
    np.testing.assert_allclose(p[:4], 1 / 12)
    np.testing.assert_allclose(_sampling_probabilities(codes, "uniform"), 1 / 7)


@pytest.mark.parametrize("sampling", ["balanced", "uniform"])
def test_training_batches_follow_the_sampling(small_data, monkeypatch, sampling):
    train, _ = small_data
    drawn = []

    def recording(out, mu, idx, codes, targets):
        drawn.append(codes[idx])
        return batch_terms(out, mu, idx, codes, targets)

    batch_terms = centroid._batch_terms
    monkeypatch.setattr(centroid, "_batch_terms", recording)
    CentroidFairness(epochs=1, batch_size=4096, sampling=sampling).fit(train.vectors, train.identities, train.groups)
    images = np.bincount(IdentityStructure.of(train.identities, train.groups, len(train)).group_codes())
    expected = np.full(4, 0.25) if sampling == "balanced" else images / images.sum()  # groups of 240/200/480/160
    shares = np.bincount(np.concatenate(drawn), minlength=4) / 4096
    assert np.abs(shares - expected).max() < 0.03  # 4 standard errors of a share of 4,096 draws


def test_loss_terms_with_a_small_weight_sum_or_of_one_kind_only():
    s, t = torch.tensor([0.5, 0.1]), torch.tensor([0.2, 0.3])
    w = torch.tensor([0.25, 0.5])  # weight sums below one still count
    expected = (0.25 * 0.09 + 0.5 * 0.04) / 0.75
    impostors_only = centroid_fairness_loss(s, t, w, torch.tensor([False, False])).item()
    genuine_only = centroid_fairness_loss(s, t, w, torch.tensor([True, True])).item()
    assert impostors_only == pytest.approx(expected) and genuine_only == pytest.approx(expected)


def test_the_history_splits_the_loss_into_its_far_and_frr_terms(small_data):
    train, _ = small_data  # a fit of its own: mutmut selects the tests that call the training loop themselves
    est = CentroidFairness(epochs=2, batch_size=256, learning_rate=3e-3).fit(train.vectors, train.identities,
                                                                             train.groups)
    assert est.module_.hidden == 2 * 16  # the default width
    for epoch in est.history_:
        assert epoch["far_term"] > 0 and epoch["frr_term"] > 0
        assert epoch["far_term"] + epoch["frr_term"] == pytest.approx(epoch["loss"], rel=1e-5)


def test_parameters_reach_the_fit_and_bad_ones_are_named(small_data):
    train, _ = small_data
    two = np.isin(train.groups, train.groups[:1])  # one group against the rest: two groups train too
    est = CentroidFairness(hidden=5, epochs=1, batch_size=256, exact_limit=1, bins=2 ** 4).fit(
        train.vectors, train.identities, np.where(two, "a", "b"))
    assert est.module_.hidden == 5 and est.groups_.tolist() == ["a", "b"] and 0 < est.fit_seconds_ < 600
    assert CentroidFairness(hidden=1, epochs=1).fit(train.vectors, train.identities, train.groups).module_.hidden == 1
    t, _, genuine = est.targets_.block(1, est.targets_.images[1][:20])
    assert np.unique(t[~genuine]).size <= 2 ** 4  # binned from the first pair on: impostor targets on 16 bins
    for name, value in (("hidden", 0), ("hidden", True), ("hidden", 2.0), ("epochs", 0), ("batch_size", True),
                        ("bins", 1.5), ("learning_rate", 0), ("learning_rate", np.inf), ("learning_rate", "0.1")):
        with pytest.raises(RepairInputError, match=name):
            CentroidFairness(**{name: value}).fit(train.vectors, train.identities, train.groups)


def test_artifact_parameters_record_every_constructor_argument():
    params = CentroidFairness(reference=2, hidden=8, epochs=3, batch_size=64, learning_rate=0.01, sampling="uniform",
                              exact_limit=5, bins=16, seed=7).artifact_parameters()
    assert params == {"reference": "2", "hidden": 8, "epochs": 3, "batch_size": 64, "learning_rate": 0.01,
                      "sampling": "uniform", "exact_limit": 5, "bins": 16, "seed": 7}
    assert CentroidFairness().artifact_parameters()["reference"] is None
    json.dumps(params)
