"""fairstream.models: the artifact kinds (fitted modules applied with numpy; trained with torch, imported lazily)."""

from .embedding import FairnessModule
from .flow import FlowPreprocessor
from .kinds import MODULE_KINDS, load_module, module_class
from .plan import DistributionalRepair, RepairResult
from .scorer import LogisticScorer, Scorer

__all__ = ["MODULE_KINDS", "DistributionalRepair", "FairnessModule", "FlowPreprocessor", "LogisticScorer",
           "RepairResult", "Scorer", "load_module", "module_class"]
