"""The re-fit side's one registry: the trainers its package defines, their kinds, their command-line options.

The registry finds one trainer per re-fittable kind in the modules of ``streams/refit/trainers/``; a kind
registered without a trainer is not re-fittable, and two trainers of one kind, or a trainer of an unregistered
kind, are refused. A new trainer's options are offered without touching the command; two trainers defining one
flag differently is an error.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import SimpleNamespace

import pytest

from fairstream.models import kinds
from fairstream.repair.protocol import Capabilities
from fairstream.streams.cli import build_parser
from fairstream.streams.refit import trainers
from fairstream.streams.refit.command import trainer_options
from fairstream.streams.refit.options import OptionConflict, TrainerOption, collect_options, positive_int_arg
from fairstream.streams.refit.trainers import (
    MAX_ACCURACY_DROP,
    RecordTrainer,
    TrainerError,
    make_trainer,
    published_before,
    refit_kinds,
    trainer_class,
    trainer_table,
    trainers_in,
)
from fairstream.streams.refit.trainers.plan import PlanTrainer
from tests.streams.test_cli import ADULT_TOML, UNREACHABLE, run_main


def fake_kind(name: str) -> type:
    caps = Capabilities(agent="records", reads=frozenset({"features"}), writes=frozenset({"features"}),
                        place="repair")
    return type(f"Fake{name.title()}", (), {"kind": name, "capabilities": caps})


Widen, Frozen = fake_kind("widen"), fake_kind("frozen")


class WidthTrainer(RecordTrainer):
    """The trainer of a kind that exists only in these tests; its option is declared here, nowhere else."""

    module = Widen
    TITLE = "wideners"
    OPTIONS = {"width": TrainerOption("--widen-by", type=positive_int_arg, metavar="N", help="how much wider"),
               "max_accuracy_drop": MAX_ACCURACY_DROP}

    def __init__(self, config, tolerance: float = 0.1, seed: int = 0, width: int = 2, max_accuracy_drop: float = 0.05):
        self.config, self.width, self.max_accuracy_drop = config, width, max_accuracy_drop


@pytest.fixture
def widen(monkeypatch):
    """Register kind ``widen`` (trained by :class:`WidthTrainer`) and ``frozen`` (no trainer) for one test."""
    monkeypatch.setitem(kinds.MODULE_KINDS, "widen", Widen)
    monkeypatch.setitem(kinds.MODULE_KINDS, "frozen", Frozen)
    monkeypatch.setitem(trainers.TRAINERS, "widen", WidthTrainer)


def test_the_registry_finds_one_trainer_per_refittable_kind_in_the_modules_of_its_package():
    found = {}
    for info in pkgutil.iter_modules(trainers.__path__):
        for cls in trainers_in(importlib.import_module(f"{trainers.__name__}.{info.name}")):
            found.setdefault(cls.kind, []).append(cls)
    assert found == {kind: [cls] for kind, cls in trainers.TRAINERS.items()}
    assert set(refit_kinds()) == set(trainers.REFIT_KINDS) == set(trainers.TRAINERS) <= set(kinds.MODULE_KINDS)
    for kind, cls in trainers.TRAINERS.items():  # each trains the class registered for its kind
        assert trainer_class(kind) is cls and cls.module is kinds.MODULE_KINDS[kind] and cls.kind == kind
    assert trainers_in(importlib.import_module(f"{trainers.__name__}.base")) == []  # the shared classes train nothing


def test_the_registry_refuses_two_trainers_of_one_kind_and_a_trainer_of_an_unregistered_kind(monkeypatch):
    class AnotherPlanTrainer(PlanTrainer):
        module = PlanTrainer.module

    with pytest.raises(TypeError, match="kind 'plan' has two trainers: PlanTrainer and .*AnotherPlanTrainer"):
        trainer_table([PlanTrainer, AnotherPlanTrainer])
    with pytest.raises(TypeError, match=r"WidthTrainer trains kind 'widen', which is not registered in "
                                        r"fairstream.models.kinds.MODULE_KINDS"):
        trainer_table([PlanTrainer, WidthTrainer])
    monkeypatch.setitem(kinds.MODULE_KINDS, "widen", Widen)
    assert trainer_table([PlanTrainer, WidthTrainer]) == {"plan": PlanTrainer, "widen": WidthTrainer}


def test_a_trainer_trains_the_kind_of_the_module_class_it_names():
    assert WidthTrainer.kind == "widen" and PlanTrainer.kind == PlanTrainer.module.kind == "plan"


def test_a_kind_registered_with_a_trainer_is_refittable_and_one_without_is_not(widen):
    assert "widen" in refit_kinds() and "frozen" not in refit_kinds()
    assert isinstance(make_trainer("widen", config=None), WidthTrainer)
    for kind in ("frozen", "no-such-kind"):
        with pytest.raises(TrainerError, match=rf"no trainer for artifact kind '{kind}' \(re-fittable: .*'widen'"):
            make_trainer(kind, config=None)


def test_a_new_trainers_option_is_offered_by_the_command_and_reaches_the_trainer(widen, capsys):
    parser = build_parser()
    args = parser.parse_args(["refit", "--kind", "widen", "--widen-by", "5"])
    assert trainer_options("widen", args) == {"width": 5}  # unset --max-accuracy-drop: the trainer's default
    assert trainer_options("flow", parser.parse_args(["refit", "--max-accuracy-drop", "0.1"])) == \
        {"max_accuracy_drop": 0.1}
    with pytest.raises(SystemExit):
        parser.parse_args(["refit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "wideners (--kind widen):" in text and "--widen-by N how much wider (default: 2)" in text
    # One flag for the accuracy drop, its defaults quoted per kind.
    assert text.count("--max-accuracy-drop FRACTION refuse") == 1
    drop = text.split("--max-accuracy-drop FRACTION refuse")[1].split(")")[0]
    assert "(--kind flow, widen, scorer" in drop and "default: 0.02 for flow and scorer" in drop and \
        "0.05 for widen" in drop, drop


def test_two_trainers_defining_one_flag_differently_is_an_error():
    class Other(WidthTrainer):
        module = fake_kind("other")
        OPTIONS = {"width": TrainerOption("--widen-by", type=int, help="how much wider")}

    with pytest.raises(OptionConflict, match="--widen-by is defined differently by the other trainer and the widen"):
        collect_options([WidthTrainer, Other])

    class Undeclared(WidthTrainer):
        module = fake_kind("undeclared")
        OPTIONS = {"height": TrainerOption("--height", type=int, help="how tall")}

    with pytest.raises(OptionConflict, match="--height for parameter 'height', which its __init__ does not take"):
        collect_options([Undeclared])


def test_the_real_trainers_options_are_consistent():
    offered = collect_options(trainer_class(kind) for kind in refit_kinds())
    assert offered["max_accuracy_drop"].params == {kind: "max_accuracy_drop" for kind in
                                                   offered["max_accuracy_drop"].params}
    assert {"flow", "scorer"} <= set(offered["max_accuracy_drop"].params)
    assert offered["n_q"].defaults == {"plan": 250}


def test_an_option_of_another_kind_is_refused_in_one_line_before_connecting(capsys):
    code, out, err = run_main(["refit", "--config", str(ADULT_TOML), "--broker", UNREACHABLE, "--kind", "plan",
                               "--lam", "0.3"], capsys)
    assert (code, out, err) == (1, "", "fairstream refit: error: --lam is an option of --kind flow, not plan\n")


def test_the_chain_before_a_kind_is_the_configured_chain_up_to_it():
    config = SimpleNamespace(records=SimpleNamespace(chain=("plan", "scorer", "thresholds")))
    actives = {kind: SimpleNamespace(module=f"{kind} module") for kind in ("plan", "scorer", "thresholds")}
    assert published_before(config, "plan", actives) == []
    assert published_before(config, "scorer", actives) == ["plan module"]  # not the thresholds after it
    assert published_before(config, "thresholds", actives) == ["plan module", "scorer module"]
    with pytest.raises(TrainerError, match=r"the chain's \['scorer'\] must be published before a thresholds"):
        published_before(config, "thresholds", {"plan": actives["plan"]})
    with pytest.raises(TrainerError, match=r"record chain \['plan', 'scorer', 'thresholds'\] has no flow: add it "
                                           r"to agents.records.artifact"):
        published_before(config, "flow", actives)


def test_whether_a_kind_needs_labels_is_its_capability_alone():
    assert not any(hasattr(trainer_class(kind), "needs_labels") for kind in refit_kinds())
    assert PlanTrainer.kind == "plan" and not kinds.capabilities("plan").needs_labels
