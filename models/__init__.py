"""fairstream.models: learned fairness modules (applied with numpy; trained with torch, imported lazily)."""

from .embedding import FairnessModule
from .kinds import MODULE_KINDS, load_module, module_class
from .scorer import LogisticScorer

__all__ = ["MODULE_KINDS", "FairnessModule", "LogisticScorer", "load_module", "module_class"]
