"""fairstream.repair: optimal-transport math, measurement, the module protocol, artifacts and datasets."""

from .geometric import geometric_repair
from .protocol import Applied, Batch, FrozenModule, IncompatibleArtifact, PipelineSchema, apply_chain

__all__ = ["Applied", "Batch", "FrozenModule", "IncompatibleArtifact", "PipelineSchema",
           "apply_chain", "geometric_repair"]
