"""The re-fit trainers: one module per artifact kind in this package, and the one registry that finds them.

A trainer (:class:`~fairstream.streams.refit.trainers.base.Trainer`) names the module class it trains
(``module = GroupThresholds``), so it trains that class's kind. The registry imports every module of this
package and keeps each trainer it defines (:data:`TRAINERS`), checking that no kind has two trainers and that
each trains a kind registered in :data:`fairstream.models.kinds.MODULE_KINDS`; a registered kind no trainer
names is simply not re-fittable. A new re-fittable kind is therefore its module class, its row in
``MODULE_KINDS`` and its trainer's module here: no table in this package names it.

>>> from fairstream.models.kinds import capabilities
>>> all(capabilities(kind).agent in ("records", "embeddings") for kind in REFIT_KINDS)
True
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType
from typing import TYPE_CHECKING, Iterable

from fairstream.models.kinds import MODULE_KINDS, kinds_for

from .base import (
    MAX_ACCURACY_DROP,
    RecordTrainer,
    Trainer,
    TrainerError,
    Validation,
    configured_chain,
    format_value,
    labelled,
    published_before,
)

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

__all__ = ["MAX_ACCURACY_DROP", "REFIT_KINDS", "TRAINERS", "RecordTrainer", "Trainer", "TrainerError", "Validation",
           "configured_chain", "discover", "format_value", "labelled", "make_trainer", "published_before",
           "refit_kinds", "trainer_class", "trainer_table", "trainers_in"]

SHARED_MODULES = ("base",)
"""Modules of this package that hold what trainers share, not trainers."""


def trainers_in(module: ModuleType) -> list[type]:
    """The trainer classes ``module`` defines: subclasses of :class:`Trainer` declaring the ``module`` they train."""
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Trainer) and cls.__module__ == module.__name__ and "module" in vars(cls)]


def trainer_table(classes: Iterable[type]) -> dict[str, type]:
    """Kind -> trainer class; a kind with two trainers, or a trainer of an unregistered kind, is a TypeError.

    Both are mistakes in the code, not in a deployment: a second trainer would make which one runs depend
    on import order, and a trainer of an unknown kind would publish artifacts no worker can load.
    """
    table: dict[str, type] = {}
    for cls in classes:
        if cls.kind not in MODULE_KINDS:
            raise TypeError(f"{cls.__qualname__} trains kind {cls.kind!r}, which is not registered in "
                            f"fairstream.models.kinds.MODULE_KINDS (known: {sorted(MODULE_KINDS)})")
        if cls.kind in table:
            raise TypeError(f"kind {cls.kind!r} has two trainers: {table[cls.kind].__qualname__} and "
                            f"{cls.__qualname__}")
        table[cls.kind] = cls
    return table


def discover() -> dict[str, type]:
    """Kind -> trainer class of every trainer defined by a module of this package."""
    modules = (importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
               if info.name not in SHARED_MODULES)
    return trainer_table(cls for module in modules for cls in trainers_in(module))


TRAINERS: dict[str, type] = discover()
"""Artifact kind -> the class that re-fits it, as found when this package was imported."""


def refit_kinds() -> tuple[str, ...]:
    """The registered kinds that have a trainer, records' in chain order, then embeddings'."""
    return tuple(kind for agent in ("records", "embeddings") for kind in kinds_for(agent) if kind in TRAINERS)


REFIT_KINDS = refit_kinds()
"""The kinds a re-fit can train, as registered when this package was imported."""


def trainer_class(kind: str) -> type:
    """The trainer class of ``kind``; a kind without one (or unknown) is a TrainerError naming the re-fittable ones."""
    if kind not in MODULE_KINDS or kind not in TRAINERS:
        raise TrainerError(f"no trainer for artifact kind {kind!r} (re-fittable: {list(refit_kinds())})")
    return TRAINERS[kind]


def make_trainer(kind: str, config: "PipelineConfig", **params):
    """The trainer of ``kind`` with its parameters; a kind without a trainer names the re-fittable ones."""
    return trainer_class(kind)(config, **params)
