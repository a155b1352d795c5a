"""Array layouts: each kind's declared arrays are checked in full, the misfit named with its value and index."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from fairstream.repair import array_layout
from fairstream.repair.array_layout import (
    ArrayLayout,
    ArraySpec,
    above,
    any_true,
    at_least,
    below,
    check_arrays,
    finite,
    int_parameter,
    names_parameter,
    nonempty,
    sizes_parameter,
    sorted_labels,
    strictly_increasing,
    sums_to_one,
)
from fairstream.repair.artifacts import ArtifactError


def test_docstring_examples_run():
    assert doctest.testmod(array_layout).failed == 0


def toy_layout(**dims) -> ArrayLayout:
    """A pmf per group over a grid of nodes, with the group labels and a count that binds a dimension."""
    return ArrayLayout((
        ArraySpec("n_nodes", "iu", (), (at_least(1),), binds="n_nodes"),
        ArraySpec("groups", "iuU", ("n_groups",), (nonempty(), sorted_labels())),
        ArraySpec("grid", "f", ("n_nodes",), (finite(), strictly_increasing())),
        ArraySpec("pmf", "f", ("n_groups", "n_nodes"), (finite(), at_least(0.0), sums_to_one())),
        ArraySpec("used", "b", ("n_groups",), (any_true(),)),
        ArraySpec("index", "iu", (), (at_least(0), below("n_groups"))),
    ), dims=dims, delegated=("extra.",))


def toy_arrays(**changes) -> dict:
    arrays = {"n_nodes": np.array(3), "groups": np.array([0, 1]), "grid": np.array([0.0, 0.5, 1.0]),
              "pmf": np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]), "used": np.array([True, False]),
              "index": np.array(1)}
    return {**arrays, **changes}


def test_declared_arrays_that_fit_pass_and_bind_their_dimensions():
    assert check_arrays(toy_arrays(), toy_layout(), "toy") == {"n_nodes": 3, "n_groups": 2}
    assert check_arrays(toy_arrays(**{"extra.anything": np.zeros(1)}), toy_layout(), "toy")  # delegated
    check_arrays(toy_arrays(groups=np.array(["f", "m"])), toy_layout(), "toy")  # text labels


@pytest.mark.parametrize("changes, dims, message", [
    ({"pmf": np.array([[0.5, 0.5, 0.0]])}, {},
     r"toy: array 'used' has shape \(2,\), expected \(n_groups=1 as in 'pmf',\)|"
     r"toy: array 'pmf' has shape \(1, 3\), expected \(n_groups=2 as in 'groups', n_nodes=3 as in 'n_nodes'\)"),
    ({"pmf": np.array([[0.5, np.nan, 0.5], [0.25, 0.25, 0.5]])}, {},
     r"'pmf' must be finite, got nan at index \(0, 1\)"),
    ({"pmf": np.array([[1.5, -0.5, 0.0], [0.25, 0.25, 0.5]])}, {}, r"'pmf' must be >= 0, got -0.5 at index \(0, 1\)"),
    ({"pmf": np.array([[0.5, 0.4, 0.0], [0.25, 0.25, 0.5]])}, {}, r"'pmf' must be summing to 1 along axis -1, "
                                                                    r"got 0.9 at index \(0,\)"),
    ({"grid": np.array([0.0, 0.5, 0.5])}, {}, r"'grid' must be strictly increasing, got 0.5 at index \(2,\)"),
    ({"groups": np.array([1, 0])}, {}, r"'groups' must be sorted unique labels .*, got 0 at index \(1,\)"),
    ({"groups": np.array([0.0, 1.0])}, {}, r"'groups' has dtype float64 \(float\), expected integer or unsigned "
                                           r"integer or text"),
    ({"used": np.array([False, False])}, {}, r"'used' must be true somewhere"),
    ({"index": np.array(2)}, {}, r"'index' must be < n_groups \(2\), got 2$"),
    ({"n_nodes": np.array(-1)}, {}, r"'n_nodes' must be a count \(>= 0\), got -1"),
    ({"n_nodes": np.array(4)}, {}, r"'grid' has shape \(3,\), expected \(n_nodes=4 as in 'n_nodes',\)"),
    ({}, {"n_groups": 3}, r"'groups' has shape \(2,\), expected \(n_groups=3,\)"),  # a dimension the parameters set
    ({"stray": np.zeros(2)}, {}, r"undeclared array 'stray'"),
])
def test_each_declared_rule_refuses_naming_the_array_value_and_index(changes, dims, message):
    with pytest.raises(ArtifactError, match="toy: (array )?" + message):
        check_arrays(toy_arrays(**changes), toy_layout(**dims), "toy")


def test_a_missing_array_is_named_and_constructors_raise_their_own_error():
    arrays = toy_arrays()
    del arrays["used"]
    with pytest.raises(ArtifactError, match="toy: the array 'used' is missing"):
        check_arrays(arrays, toy_layout(), "toy")
    with pytest.raises(KeyError, match="must be finite"):
        check_arrays(toy_arrays(grid=np.array([0.0, np.inf, 1.0])), toy_layout(), "toy", error=KeyError)


def test_a_rule_can_be_restricted_and_size_parameters_are_checked():
    positive_where_used = above(0.0, where=("used", lambda ctx: ctx.arrays["used"][:, None]))
    layout = ArrayLayout((ArraySpec("used", "b", ("n",)), ArraySpec("w", "f", ("n", 2), (positive_where_used,))))
    used = np.array([True, False])
    check_arrays({"used": used, "w": np.array([[1.0, 2.0], [0.0, -1.0]])}, layout, "toy")
    with pytest.raises(ArtifactError, match=r"'w' must be > 0 where used, got 0.0 at index \(0, 1\)"):
        check_arrays({"used": used, "w": np.array([[1.0, 0.0], [0.0, -1.0]])}, layout, "toy")
    assert sizes_parameter({"hidden": [4, 2]}, "hidden", "toy") == [4, 2]
    for bad in ([0], [2.5], "4", None, [True]):
        with pytest.raises(ArtifactError, match="toy: parameter 'hidden' must be a list of positive layer sizes"):
            sizes_parameter({"hidden": bad}, "hidden", "toy")
    with pytest.raises(ArtifactError, match="toy: parameter 'n' must be an integer >= 1, got 0"):
        int_parameter({"n": 0}, "n", "toy")
    assert names_parameter({"columns": ["a", "b"]}, "columns", "toy") == {"n_features": 2}
    assert names_parameter({"columns": None}, "columns", "toy") == {}
