"""Command-line options of the re-fit trainers, declared by each trainer next to the parameter they set.

A trainer class names its options in ``OPTIONS``: trainer parameter -> :class:`TrainerOption`. ``fairstream
refit`` offers the union of every re-fittable kind's options (:func:`collect_options`); an option two trainers
share (``--max-accuracy-drop``) is one object, defined once, shown in a help group of its own that names the
kinds, and a flag two trainers define differently is an error. An option has no default of its own: unset, the
trainer's own default (its ``__init__`` signature) applies, and the help text quotes it.

>>> from fairstream.streams.refit.trainers import trainer_class
>>> options = collect_options([trainer_class("flow"), trainer_class("scorer")])
>>> options["max_accuracy_drop"].defaults
{'flow': 0.02, 'scorer': 0.02}
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass, field
from typing import Callable, Iterable


@dataclass(frozen=True)
class TrainerOption:
    """One ``fairstream refit`` option that sets a trainer parameter (``type`` parses and checks the text)."""

    flag: str
    help: str
    type: Callable | None = None
    choices: tuple | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        """The option's name in the parsed arguments (``--max-accuracy-drop`` -> ``max_accuracy_drop``)."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass
class OfferedOption:
    """An option as the parser offers it: its definition and, per kind that reads it, parameter and default."""

    option: TrainerOption
    params: dict = field(default_factory=dict)  # kind -> trainer parameter
    defaults: dict = field(default_factory=dict)  # kind -> the trainer's default

    def help_text(self) -> str:
        """The option's help, with the kinds that read it and their defaults."""
        kinds = list(self.params)
        by_value: dict[str, list[str]] = {}
        for kind, value in self.defaults.items():
            by_value.setdefault(_shown(value), []).append(kind)
        if len(by_value) == 1:
            default = f"default: {next(iter(by_value))}"
        else:
            default = "default: " + ", ".join(f"{value} for {' and '.join(mine)}" for value, mine in by_value.items())
        shared = f"--kind {', '.join(kinds)}; " if len(kinds) > 1 else ""  # one kind: its group's title says it
        return f"{self.option.help} ({shared}{default})"


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class OptionConflict(ValueError):
    """Two trainers define one command-line flag differently."""


def collect_options(trainers: Iterable[type]) -> dict[str, OfferedOption]:
    """Every trainer's options by dest, each defined once; a flag defined differently twice is an :class:`OptionConflict`."""
    offered: dict[str, OfferedOption] = {}
    for cls in trainers:
        defaults = inspect.signature(cls.__init__).parameters
        for param, option in cls.OPTIONS.items():
            if param not in defaults or defaults[param].default is inspect.Parameter.empty:
                raise OptionConflict(f"{cls.__name__} declares {option.flag} for parameter {param!r}, which its "
                                     f"__init__ does not take with a default")
            mine = offered.setdefault(option.dest, OfferedOption(option))
            if mine.option != option:
                raise OptionConflict(f"{option.flag} is defined differently by the {cls.kind} trainer and the "
                                     f"{', '.join(mine.params)} trainer(s): {option} != {mine.option}")
            mine.params[cls.kind], mine.defaults[cls.kind] = param, defaults[param].default
    return offered


SHARED_TITLE = "options of several kinds"
"""The help group of the options several trainers read (each one's help names the kinds)."""


def add_trainer_arguments(parser: argparse.ArgumentParser, trainers: Iterable[type]) -> None:
    """Add every trainer's options to ``parser``: one group per trainer, then the options several trainers share.

    A shared option is one flag, so it is shown once, in a group of its own, and its help names every kind that
    reads it (in no one kind's group, where the reader of another kind's group would miss it).
    """
    trainers = list(trainers)
    offered = collect_options(trainers)
    shared = [entry for entry in offered.values() if len(entry.params) > 1]
    for cls in trainers:
        mine = [offered[option.dest] for option in cls.OPTIONS.values() if len(offered[option.dest].params) == 1]
        if mine:
            _add_options(parser.add_argument_group(f"{cls.TITLE} (--kind {cls.kind})"), mine)
    if shared:
        _add_options(parser.add_argument_group(SHARED_TITLE), shared)


def _add_options(group, entries: list[OfferedOption]) -> None:
    for entry in entries:
        option = entry.option
        group.add_argument(option.flag, dest=option.dest, type=option.type, choices=option.choices,
                           metavar=option.metavar, default=None, help=entry.help_text())


def trainer_params(cls: type, args: argparse.Namespace) -> dict:
    """The parameters of trainer ``cls`` set on the command line (unset ones keep the trainer's defaults)."""
    return {param: getattr(args, option.dest) for param, option in cls.OPTIONS.items()
            if getattr(args, option.dest, None) is not None}


def foreign_option(cls: type, args: argparse.Namespace, offered: dict[str, OfferedOption]) -> str | None:
    """Why an option set on the command line does not apply to trainer ``cls`` (another kind's), or None."""
    for dest, entry in offered.items():
        if getattr(args, dest, None) is not None and cls.kind not in entry.params:
            return f"{entry.option.flag} is an option of --kind {', '.join(entry.params)}, not {cls.kind}"
    return None


# =============================================================================== value types


def fraction_arg(text: str) -> float:
    """A fraction strictly between 0 and 1."""
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction strictly between 0 and 1, got {text}")
    return value


def unit_interval_arg(text: str) -> float:
    """A fraction in [0, 1] (an accuracy difference)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")  # not a number: refused below, with the same message
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1], got {text}")
    return value


SEED_LIMIT = 2 ** 64
"""Seeds are integers in [0, 2**64): what numpy's generators and every kind's ``random_state`` take."""


def seed_arg(text: str) -> int:
    """An integer in [0, 2**64)."""
    try:
        value = int(text)
    except ValueError:
        value = -1  # not an integer: refused below, with the same message
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**64), got {text}")
    return value


def non_negative_arg(text: str) -> float:
    """A number >= 0."""
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_int_arg(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value
