"""fairstream.repair: optimal-transport repair, measurement, the module protocol, artifacts and datasets."""

from .distributional import DistributionalRepair, RepairResult
from .geometric import geometric_repair
from .protocol import Applied, Batch, FrozenModule, IncompatibleArtifact, PipelineSchema, apply_chain

__all__ = ["Applied", "Batch", "DistributionalRepair", "FrozenModule", "IncompatibleArtifact", "PipelineSchema",
           "RepairResult", "apply_chain", "geometric_repair"]
