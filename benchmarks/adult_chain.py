"""The Adult chain the CPU benchmarks run: a plan and a scorer carrying its frozen group map, as published."""

from __future__ import annotations

from fairstream.models.scorer import LogisticScorer
from fairstream.repair import datasets
from fairstream.models.plan import DistributionalRepair
from fairstream.repair.group_maps import GroupTransportMap
from fairstream.streams.control.registry import Active


def adult_chain(n_research: int = 10_000):
    """(archive, plan, scorer): the plan fitted on the research split, the scorer on what it repairs there.

    The scorer carries its frozen group map (what MDP matches with), fitted on the features it reads.
    """
    research, archive = datasets.load("adult").split(n_research, seed=0)
    plan = Active("plan", 1, "0" * 64, None, DistributionalRepair(n_q=250).fit(research.X, research.s, research.u))
    repaired = plan.module.transform(research.X, research.s, research.u, keys=[str(i) for i in range(len(research))])
    scorer = Active("scorer", 1, "1" * 64, None, LogisticScorer().fit(repaired, research.y).attach_group_map(
        GroupTransportMap(seed=0).fit(repaired, research.s)))
    return archive, plan, scorer
