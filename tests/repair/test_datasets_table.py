"""The table of real data sets in fairstream.repair.datasets: every row is read the same way.

The digests pin what each loader returned before the eight hand-built loaders became one table
(features, s, u, y, names and labels); parsing text to float64 is exact, so they hold on any machine.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fairstream.repair import datasets
from fairstream.repair.validation import RepairInputError

LOADERS = {
    "adult": datasets.load_adult,
    "compas": datasets.load_compas,
    "german": datasets.load_german,
    "crime": datasets.load_crime,
    "law": datasets.load_law,
    "health": datasets.load_health,
    "crime-minority": datasets.load_crime_minority,
    "health-age": datasets.load_health_by_age,
}
# sha256 of each loader's default output, taken from the loaders before the table (see digest()).
DIGESTS = {
    "adult": "19b0e4661cf5c1e8b987fdd9f02a0578c5f350111ea9c0bdf13110f783d3f130",
    "compas": "fec1c680b43fa29160b626572a054227aa924e518dc00c35a18888b128bb9416",
    "german": "2eecfba2fa4e8e6117e64909589301c492a3110ba2f1f2d5474d5c5320bbfc78",
    "crime": "7628005d3e349fe709308da332bad4e0d9af906dd6dc4f6c1dc4667598b97bd3",
    "law": "e4795339e1e00d1b8e39752dd6a2cba73039647fd1622ab9704e122631e9e575",
    "health": "7980846ba7b0edd0dbba0764b4cf4684dd98dfcaedc9be31cb513f840f6076c5",
    "crime-minority": "195afe3725b57330655aa4b0b839a2a425f3fde2824d86e34649900be5f9656c",
    "health-age": "013e4da555af0645a3eb8cb810d835ed428bddba500504644ab31e4a18d14a03",
}


def digest(ds: datasets.Dataset) -> str:
    """One hash over the arrays (dtype, shape, bytes) and every name and label of a Dataset."""
    h = hashlib.sha256()
    for array in (ds.X, ds.s, ds.u, ds.y):
        h.update(str(array.dtype).encode())
        h.update(str(array.shape).encode())
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(repr((ds.name, ds.feature_names, ds.s_name, ds.s_labels, ds.u_name, ds.u_labels, ds.y_name)).encode())
    return h.hexdigest()


def test_every_real_loader_is_a_row_of_the_table():
    assert sorted(datasets._SPECS) == sorted(LOADERS)


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_each_loader_returns_what_it_returned_before_the_table(name):
    assert digest(LOADERS[name]()) == DIGESTS[name]


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_column_a_row_reads_is_in_its_file(name):
    spec = datasets._SPECS[name]
    header = set(datasets._header(spec.file))
    read = [*spec.features, *spec.s.columns, *spec.u.columns, *spec.y.columns]
    assert set(read) <= header, sorted(set(read) - header)


def test_a_row_that_names_a_missing_column_is_refused_with_the_file(monkeypatch):
    broken = datasets._Spec("law.csv.zip", ("LSAT",), s=datasets._flag("Race_Whit", "race", {0: "a", 1: "b"}),
                            u=datasets._SPECS["law"].u, y=datasets._SPECS["law"].y)
    monkeypatch.setitem(datasets._SPECS, "law", broken)
    with pytest.raises(RepairInputError, match=r"law\.csv\.zip has no column 'Race_Whit'.*Race_White"):
        datasets.load("law")


def test_the_year_filter_applies_to_both_health_rows():
    by_sex = datasets.load_health(year="Y3")
    by_age = datasets.load_health_by_age(features=["no_Claims"], year="Y3")
    assert len(by_sex) == len(by_age) and by_sex.name == "health-Y3" and by_age.name == "health-age-Y3"
    np.testing.assert_array_equal(by_sex.s, by_age.u)  # the same rows, with s and u swapped
    np.testing.assert_array_equal(by_sex.u, by_age.s)
    np.testing.assert_array_equal(by_sex.y, 1 - by_age.y)
