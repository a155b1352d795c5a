"""The demo's acts, by name: the command line offers exactly them, and each runs a pipeline the config accepts."""

import pytest

from fairstream.streams.cli import build_parser
from fairstream.streams.config import adult_config
from fairstream.streams.demo.run import ACTS, act_config


def test_the_command_line_offers_every_act_and_nothing_else():
    demo = next(action for action in build_parser()._subparsers._group_actions[0].choices["demo"]._actions
                if action.dest == "act")
    assert set(demo.choices) == set(ACTS) and demo.default in ACTS


@pytest.mark.parametrize("act", sorted(ACTS))
def test_each_act_runs_a_chain_and_statistic_the_config_accepts(act):
    config = act_config(adult_config(), act)
    assert config.records.chain == (ACTS[act].chain or adult_config().records.chain)
    assert config.monitor.statistics[0] == (ACTS[act].statistic or adult_config().monitor.statistics[0])
