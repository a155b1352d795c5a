"""fairstream.models: learned fairness modules (applied with numpy; trained with torch, imported lazily)."""

from .embedding import FairnessModule
from .flow import FlowPreprocessor
from .kinds import MODULE_KINDS, load_module, module_class
from .scorer import LogisticScorer, Scorer

__all__ = ["MODULE_KINDS", "FairnessModule", "FlowPreprocessor", "LogisticScorer", "Scorer", "load_module",
           "module_class"]
