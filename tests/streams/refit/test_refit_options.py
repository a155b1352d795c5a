"""``fairstream refit``'s own checks of its command line: seeds and accuracy drops in range, a kind the chain applies.

Each is refused in one line before anything connects: by the parser (exit 2, naming the option) or by the command
(exit 1, naming the chain and the config key to change).
"""

from __future__ import annotations

import pytest

from fairstream.streams.cli import build_parser, main
from fairstream.streams.config import adult_config
from fairstream.streams.refit.command import _trainers
from fairstream.streams.refit.options import SHARED_TITLE, collect_options
from fairstream.streams.refit.trainers import TrainerError, configured_chain
from tests.streams.test_cli import ADULT_TOML, UNREACHABLE, run_main


def refused_by_the_parser(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    return err.splitlines()[-1]


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64), "1.5", "seven"])
def test_a_seed_outside_0_to_2_to_the_64_is_refused_by_the_parser_naming_seed(seed, capsys):
    line = refused_by_the_parser(["refit", "--seed", seed], capsys)
    assert line.endswith(f"argument --seed: must be an integer in [0, 2**64), got {seed}"), line
    for accepted in (0, 2 ** 64 - 1):  # every seed the kinds take
        assert build_parser().parse_args(["refit", "--seed", str(accepted)]).seed == accepted


@pytest.mark.parametrize("drop", ["3", "1e9", "inf", "nan", "-0.01", "much"])
def test_an_accuracy_drop_is_a_fraction(drop, capsys):
    line = refused_by_the_parser(["refit", "--max-accuracy-drop", drop], capsys)
    assert line.endswith(f"argument --max-accuracy-drop: must be a fraction in [0, 1], got {drop}"), line
    for accepted in ("0", "0.03", "1"):
        assert build_parser().parse_args(["refit", "--max-accuracy-drop", accepted]).max_accuracy_drop == \
            float(accepted)


def help_groups(text: str) -> dict[str, str]:
    """The help's groups: title -> the text under it (its options)."""
    groups: dict[str, list[str]] = {}
    lines = groups.setdefault("", [])
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            lines = groups.setdefault(line[:-1], [])
        else:
            lines.append(line)
    return {title: "\n".join(lines) for title, lines in groups.items()}


def test_an_option_several_kinds_read_is_shown_apart_naming_them_all(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["refit", "--help"])
    groups = help_groups(capsys.readouterr().out)
    readers = collect_options(_trainers())["max_accuracy_drop"].params
    assert len(readers) > 1
    shared = " ".join(groups[SHARED_TITLE].split())
    assert "--max-accuracy-drop FRACTION" in shared and f"(--kind {', '.join(readers)};" in shared, shared
    kinds_groups = [body for title, body in groups.items() if "(--kind " in title]
    assert len(kinds_groups) == len(_trainers()) and not any("--max-accuracy-drop" in body for body in kinds_groups)


@pytest.mark.parametrize("kind, chain", [("thresholds", ["plan", "scorer"]), ("flow", ["plan", "scorer"])])
def test_a_kind_the_pipelines_chain_does_not_apply_is_refused_before_connecting(kind, chain, capsys):
    code, out, err = run_main(["refit", "--config", str(ADULT_TOML), "--broker", UNREACHABLE, "--kind", kind], capsys)
    assert (code, out) == (1, "") and err == (
        f"fairstream refit: error: the pipeline's record chain {chain} has no {kind}: add it to "
        f"agents.records.artifact before re-fitting one\n"), err


def test_the_embedding_agent_applies_an_embedding_module_only_when_configured_to():
    config = adult_config()  # the embeddings agent applies the identity
    with pytest.raises(TrainerError, match=r"^the pipeline's embedding chain \[\] has no embedding: add it to "
                                           r"agents.embeddings.artifact before re-fitting one$"):
        configured_chain(config, "embedding")
    assert configured_chain(config, "plan") == config.records.chain == ("plan",)
