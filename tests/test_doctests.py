"""Every docstring example in the package runs (river style: examples are tests)."""

import doctest
import importlib
import pkgutil

import pytest

import fairstream.repair

MODULES = [m.name for m in pkgutil.iter_modules(fairstream.repair.__path__, "fairstream.repair.")]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
