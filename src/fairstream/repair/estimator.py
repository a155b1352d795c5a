"""scikit-learn's estimator conventions, without importing scikit-learn: parameters, clone and repr.

Every fairstream estimator subclasses :class:`Estimator`. Its constructor stores each argument
unchanged under the argument's own name and checks nothing (``fit`` does), so :meth:`~Estimator.get_params`
reads the parameters back from the ``__init__`` signature and ``sklearn.base.clone`` builds an
unfitted copy as ``type(est)(**est.get_params(deep=False))``. What ``fit`` learns ends in ``_``
(private state starts with ``_``). The ``fit`` signatures are each estimator's own (e.g.
``fit(X, s, u)``: features, protected attribute, strata), not scikit-learn's ``fit(X, y)``.

>>> class Smoother(Estimator):
...     def __init__(self, width=1.0, kernel="gauss"):
...         self.width = width
...         self.kernel = kernel
>>> Smoother(), Smoother(width=2.0)
(Smoother(), Smoother(width=2.0))
>>> Smoother().set_params(kernel="box").get_params()
{'kernel': 'box', 'width': 1.0}
>>> Smoother().set_params(widht=3)
Traceback (most recent call last):
...
fairstream.repair.validation.RepairInputError: Smoother has no parameter 'widht' (did you mean 'width'?); ...
"""

from __future__ import annotations

import copy
import difflib
import inspect

from .validation import RepairInputError

__all__ = ["Estimator", "FrozenPartsEstimator"]


class Estimator:
    """Base of the estimators: ``get_params``, ``set_params``, a repr of the parameters not at their defaults."""

    # Parameters holding objects the estimator uses as they are, never re-fits (a frozen scorer, a warm start):
    # get_params(deep=True) does not list their own parameters, and FrozenPartsEstimator's clone shares them.
    _shared_parameters: tuple[str, ...] = ()

    @classmethod
    def _parameter_names(cls) -> list[str]:
        """The ``__init__`` arguments, sorted (as scikit-learn lists them)."""
        if cls.__init__ is object.__init__:
            return []
        names = []
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}.__init__ takes {parameter}: an estimator names every parameter "
                                "(scikit-learn's clone rebuilds it from them)")
            if name != "self":
                names.append(name)
        return sorted(names)

    def _has_own_parameters(self, name: str, value) -> bool:
        return name not in self._shared_parameters and hasattr(value, "get_params") and not isinstance(value, type)

    def get_params(self, deep: bool = True) -> dict:
        """The constructor parameters as stored; ``deep`` adds a nested estimator's own as ``name__parameter``."""
        params = {}
        for name in self._parameter_names():
            value = getattr(self, name)
            if deep and self._has_own_parameters(name, value):
                params.update({f"{name}__{key}": inner for key, inner in value.get_params().items()})
            params[name] = value
        return params

    def set_params(self, **params) -> Estimator:
        """Set parameters (``name__parameter``: a nested estimator's); returns self. Effective at the next fit."""
        names = self._parameter_names()
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, _, inner = key.partition("__")
            if name not in names:
                raise RepairInputError(self._unknown_parameter(name, names))
            if not inner:
                setattr(self, name, value)
            elif self._has_own_parameters(name, getattr(self, name)):
                nested.setdefault(name, {})[inner] = value
            else:
                raise RepairInputError(f"{type(self).__name__} cannot set {key!r}: its {name!r} has no parameters "
                                       "of its own to set here")
        for name, inner_params in nested.items():
            getattr(self, name).set_params(**inner_params)
        return self

    def _unknown_parameter(self, name: str, names: list[str]) -> str:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{type(self).__name__} has no parameter {name!r}{hint}; its parameters are {names}"

    def __repr__(self) -> str:
        """``ClassName(parameter=value, ...)`` of the parameters that differ from their defaults, as scikit-learn's."""
        defaults = inspect.signature(type(self).__init__).parameters
        changed = [f"{name}={value!r}" for name, value in self.get_params(deep=False).items()
                   if _differs(value, defaults[name].default)]
        return f"{type(self).__name__}({', '.join(changed)})"


def _differs(value, default) -> bool:
    """A parameter shows in the repr unless it has a default with the same repr (scikit-learn's rule; NaN = NaN)."""
    if default is inspect.Parameter.empty:
        return True
    return repr(value) != repr(default) and not (_is_nan(value) and _is_nan(default))


def _is_nan(value) -> bool:
    return isinstance(value, float) and value != value


class FrozenPartsEstimator(Estimator):
    """An estimator some of whose parameters (``_shared_parameters``) are fitted objects it uses frozen.

    ``sklearn.base.clone`` clones every parameter that is an estimator, and a cloned fitted estimator
    is unfitted: the copy could not fit. Here the copy shares those objects with the original; the
    other parameters are cloned as scikit-learn clones them (estimators cloned, other values deep-copied).
    """

    def __sklearn_clone__(self) -> FrozenPartsEstimator:
        """The unfitted copy ``sklearn.base.clone`` returns: same parameters, the frozen parts shared."""
        params = {name: value if name in self._shared_parameters else _clone_value(value)
                  for name, value in self.get_params(deep=False).items()}
        return type(self)(**params)


def _clone_value(value):
    """A parameter's copy as ``sklearn.base.clone`` makes it: an estimator unfitted, any other value deep-copied."""
    if isinstance(value, type) or not hasattr(value, "get_params"):
        return copy.deepcopy(value)
    if hasattr(value, "__sklearn_clone__"):
        return value.__sklearn_clone__()
    return type(value)(**{name: _clone_value(inner) for name, inner in value.get_params(deep=False).items()})
