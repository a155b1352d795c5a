"""Every docstring example in every package runs (river style: examples are tests)."""

import doctest
import importlib
import pkgutil

import pytest

import fairstream.models
import fairstream.repair
import fairstream.streams

MODULES = sorted(
    info.name
    for package in (fairstream.repair, fairstream.models, fairstream.streams)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
