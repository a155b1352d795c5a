"""repair's estimators follow scikit-learn's conventions: clone, get/set_params, repr, fit returns self, learned_."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone

from fairstream.repair.validation import RepairInputError
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.estimator import Estimator, FrozenPartsEstimator
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.repair.posterior import GroupPosterior

from .estimator_checks import CHECKS, Case

_rng = np.random.default_rng(20)
S, U = _rng.integers(0, 2, 300), _rng.integers(0, 2, 300)
X = _rng.normal(S[:, None] * 1.0, 1.0, size=(300, 2))
KEYS = np.array([f"record-{i}" for i in range(len(X))])


def _counterparts(gmap: GroupTransportMap) -> np.ndarray:
    matched = gmap.counterparts(X[:40], S[:40])
    return np.concatenate([matched.X.ravel(), matched.weights, matched.rows])


CASES = [
    # Same plan, same keys: the product promises the same output bit for bit.
    Case(make=DistributionalRepair, changed={"n_q": 30, "pooling": "none", "posterior": False},
         fit=lambda est: est.fit(X, S, U), output=lambda est: est.transform(X, S, U, keys=KEYS), exact=True),
    Case(make=GroupTransportMap, changed={"n_points": 50, "extension": "shift", "seed": 3},
         fit=lambda est: est.fit(X, S), output=_counterparts, exact=True),
    Case(make=GroupPosterior, changed={"degree": 1, "l2": 1e-2, "n_folds": 0},
         fit=lambda est: est.fit(X, S, U), output=lambda est: est.predict_proba(X, U), exact=True),
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_estimator_conventions(case, check):
    check(case)


def test_a_repaired_plan_clone_writes_the_same_plan():
    rep = DistributionalRepair(n_q=30, posterior=False).fit(X, S, U)
    again = clone(rep).fit(X, S, U)
    assert again.fingerprint_ == rep.fingerprint_
    assert again.to_artifact().manifest.parameters == rep.to_artifact().manifest.parameters


# ------------------------------------------------------------------ the base itself, on estimators of its own


class Inner(Estimator):
    def __init__(self, a=1, b="x"):
        self.a = a
        self.b = b


class Outer(Estimator):
    def __init__(self, inner=None, c=0.5):
        self.inner = inner
        self.c = c


class UsesFrozen(FrozenPartsEstimator):
    _shared_parameters = ("frozen",)

    def __init__(self, frozen=None, sizes=(1, 2), inner=None):
        self.frozen = frozen
        self.sizes = sizes
        self.inner = inner


class Loose(Estimator):
    def __init__(self, *args, **kwargs):
        self.args = args


def test_deep_params_reach_a_nested_estimator_and_set_params_sets_them():
    outer = Outer(inner=Inner())
    assert outer.get_params() == {"c": 0.5, "inner": outer.inner, "inner__a": 1, "inner__b": "x"}
    assert outer.get_params(deep=False) == {"c": 0.5, "inner": outer.inner}
    assert outer.set_params(inner__a=7, c=2.0) is outer and outer.inner.a == 7 and outer.c == 2.0
    assert repr(outer) == "Outer(c=2.0, inner=Inner(a=7))"
    copy = clone(outer)
    assert copy.inner is not outer.inner and copy.inner.get_params() == outer.inner.get_params()


def test_set_params_names_the_unknown_parameter_and_suggests_the_closest():
    with pytest.raises(RepairInputError, match=r"^Inner has no parameter 'aa' \(did you mean 'a'\?\); "
                                              r"its parameters are \['a', 'b'\]$"):
        Inner().set_params(aa=1)
    with pytest.raises(RepairInputError, match=r"^Outer has no parameter 'zzz'; its parameters are \['c', 'inner'\]$"):
        Outer().set_params(zzz=1)
    with pytest.raises(RepairInputError, match="Outer cannot set 'c__x': its 'c' has no parameters of its own"):
        Outer().set_params(c__x=1)


def test_a_clone_shares_the_frozen_parts_and_copies_the_rest():
    fitted = Inner(a=3)
    fitted.learned_ = np.arange(3)  # a fitted object: scikit-learn's clone would return it unfitted
    est = UsesFrozen(frozen=fitted, sizes=[4, 5], inner=Inner(b="y"))
    assert "frozen__a" not in est.get_params() and est.get_params()["inner__b"] == "y"
    with pytest.raises(RepairInputError, match="cannot set 'frozen__a'"):
        est.set_params(frozen__a=4)
    copy = clone(est)
    assert copy.frozen is fitted and hasattr(copy.frozen, "learned_")
    assert copy.sizes == [4, 5] and copy.sizes is not est.sizes
    assert copy.inner is not est.inner and copy.inner.get_params() == est.inner.get_params()


def test_an_estimator_must_name_its_parameters():
    with pytest.raises(TypeError, match=r"Loose.__init__ takes \*args"):
        Loose().get_params()
