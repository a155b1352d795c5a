"""Tests of the data definitions used by the AdapFair reproduction (loaders appended to repair.datasets)."""

import numpy as np
import pytest

from fairstream.repair import datasets
from fairstream.repair.validation import RepairInputError


@pytest.fixture(scope="module")
def crime():
    return datasets.load_crime_minority()


def test_crime_groups_follow_the_minority_majority_rule(crime):
    table = datasets._read("crime.csv", [*datasets.CRIME_RACE_SHARES, "ViolentCrimesPerPop"])
    black, white, asian, hispanic = table.numeric(datasets.CRIME_RACE_SHARES).T
    np.testing.assert_array_equal(crime.s, (white / 5 < black + asian + hispanic).astype(int))
    rate = table.numeric(["ViolentCrimesPerPop"])[:, 0]
    np.testing.assert_array_equal(crime.y, rate > np.median(rate))
    assert crime.feature_names == list(datasets.CRIME_FLOW_FEATURES)
    # High crime is far more frequent in minority-majority communities under this coding.
    assert crime.y[crime.s == 1].mean() > 0.5 > crime.y[crime.s == 0].mean()


@pytest.mark.parametrize("loader, feature", [
    (datasets.load_crime_minority, "racePctWhite"),
    (datasets.load_crime_minority, "ViolentCrimesPerPop"),
    (datasets.load_health_by_age, "age_75"),
    (datasets.load_health_by_age, "CharlsonIndexI_max"),
])
def test_columns_that_define_the_group_or_label_cannot_be_features(loader, feature):
    with pytest.raises(RepairInputError, match=f"features \\['{feature}'\\] define s or y"):
        loader(features=["medIncome" if loader is datasets.load_crime_minority else "no_Claims", feature])


def test_health_year_is_checked():
    with pytest.raises(RepairInputError, match="year must be one of"):
        datasets.load_health_by_age(year="Y9")
