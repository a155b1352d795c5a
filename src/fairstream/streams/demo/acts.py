"""The acts ``fairstream demo --act`` runs, light enough for the command line to offer them without the demo.

An act is named after the kind its re-fits train: ``plan`` (the default kind), ``flow`` (a flow in front of a
frozen classifier); ``approve`` is the plan act under ``promotion = "approve"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairstream.models.flow import FlowPreprocessor
from fairstream.models.kinds import DEFAULT_KIND
from fairstream.models.scorer import Scorer

FLOW_ACT = dict(n_steps=60, n_blocks=3, hidden=(16,), lam=0.5)
"""The flow act's re-fit settings: a smaller flow than the paper's, so each re-fit takes seconds on 2 cores."""


@dataclass(frozen=True)
class Act:
    """One act of the demo: the record chain and statistic it runs (None: as configured), whose hours shift, and
    the re-fit settings."""

    chain: tuple[str, ...] | None
    statistic: str | None
    shifted_group: int
    shifted_stratum: int | None
    refit_params: dict | None = None
    promotion: str = "auto"  # the pipeline's promotion policy during the act


ACTS = {
    # women's hours in the college stratum rise; the plan is re-fitted
    DEFAULT_KIND: Act(chain=None, statistic=None, shifted_group=0, shifted_stratum=1),
    # men's hours rise everywhere; a flow in front of a frozen classifier is re-fitted, watched on the DP gap
    FlowPreprocessor.kind: Act(chain=(FlowPreprocessor.kind, Scorer.kind), statistic="dp_difference",
                               shifted_group=1, shifted_stratum=None, refit_params=FLOW_ACT),
    # the plan act again, but the re-fitted plan is a candidate in shadow until a named operator approves it
    "approve": Act(chain=None, statistic=None, shifted_group=0, shifted_stratum=1, promotion="approve"),
}
"""The acts ``fairstream demo --act`` runs, by name."""

DEFAULT_ACT = DEFAULT_KIND
"""The act the demo runs unless told: a repair plan re-fitted."""
