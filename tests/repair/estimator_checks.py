"""The scikit-learn conventions every estimator keeps, checked against scikit-learn itself (a test dependency only).

A :class:`Case` says how to build, fit and read one estimator on tiny data; the ``check_*`` functions
are the conventions. tests/repair and tests/models each run them on their own estimators.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.utils import estimator_checks

from fairstream.repair.validation import RepairInputError

# scikit-learn's own checks that need no fit (theirs call fit(X, y); ours take s, u or identities).
SKLEARN_CHECKS = ("check_no_attributes_set_in_init", "check_get_params_invariance", "check_set_params",
                  "check_parameters_default_constructible")


@dataclass
class Case:
    """One estimator: ``make(**params)`` builds it (with any required argument), ``fit(est)`` fits it on tiny
    data and returns what ``fit`` returns, ``output(est)`` is what it computes once fitted. ``changed`` are
    non-default parameters it is fitted with; ``exact``: a re-fit promises bit-identical output."""

    make: Callable
    changed: dict
    fit: Callable
    output: Callable
    exact: bool
    required: str = ""  # the repr of the required arguments, as the default repr shows them
    shared: tuple = field(default_factory=tuple)  # parameters a clone shares (frozen fitted objects)

    @property
    def name(self) -> str:
        return type(self.make()).__name__


def parameter_names(est) -> set:
    return set(est.get_params(deep=False))


def check_sklearn_checks(case: Case) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scikit-learn warns where a convention is bent
        for check in SKLEARN_CHECKS:
            getattr(estimator_checks, check)(case.name, case.make(**case.changed))


def check_clone_is_unfitted_with_equal_params(case: Case) -> None:
    est = case.make(**case.changed)
    assert case.fit(est) is est
    copy = clone(est)
    assert type(copy) is type(est) and copy is not est
    assert set(vars(copy)) == parameter_names(est), "a clone carries no fitted state"
    params, copied = est.get_params(deep=False), copy.get_params(deep=False)
    assert copied.keys() == params.keys()
    for name, value in params.items():
        if name in case.shared:
            assert copied[name] is value, name
        else:
            assert copied[name] == value, name


def check_set_params_round_trip(case: Case) -> None:
    est = case.make()
    assert est.set_params(**case.changed) is est
    params = est.get_params()
    assert {name: params[name] for name in case.changed} == case.changed
    assert est.get_params(deep=False) == case.make(**case.changed).get_params(deep=False)


def check_unknown_parameter_is_named(case: Case) -> None:
    est = case.make()
    valid = sorted(parameter_names(est))
    message = rf"{case.name} has no parameter 'no_such_knob'.*{re.escape(str(valid))}"
    with pytest.raises(RepairInputError, match=message):
        est.set_params(no_such_knob=1)
    assert est.get_params(deep=False).keys() == set(valid)


def check_repr_shows_changed_params(case: Case) -> None:
    assert repr(case.make()) == f"{case.name}({case.required})"
    changed = case.make(**case.changed)
    text = repr(changed)
    for name, value in case.changed.items():
        assert f"{name}={value!r}" in text
    assert " ".join(BaseEstimator.__repr__(changed).split()) == text  # scikit-learn's own repr of it


def check_fit_learns_only_underscored_attributes(case: Case) -> None:
    est = case.make(**case.changed)
    names = parameter_names(est)
    assert set(vars(est)) == names, "the constructor stores its parameters only"
    assert case.fit(est) is est
    learned = set(vars(est)) - names
    assert learned and all(name.endswith("_") or name.startswith("_") for name in learned), sorted(learned)
    assert est.get_params(deep=False) == case.make(**case.changed).get_params(deep=False)


def check_clone_refits_to_the_same_output(case: Case) -> None:
    est = case.make(**case.changed)
    case.fit(est)
    copy = clone(est)
    case.fit(copy)
    expected, got = case.output(est), case.output(copy)
    if case.exact:
        np.testing.assert_array_equal(got, expected)
    else:  # another fit of the same data and seed: the same floats up to reduction order
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


CHECKS = (check_sklearn_checks, check_clone_is_unfitted_with_equal_params, check_set_params_round_trip,
          check_unknown_parameter_is_named, check_repr_shows_changed_params,
          check_fit_learns_only_underscored_attributes, check_clone_refits_to_the_same_output)
