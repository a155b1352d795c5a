"""MkDocs hook: the reference pages generated from the code at build time, so they cannot drift from it.

A page asks for a generated part with a marker line, an HTML comment that GitHub shows as nothing:

- ``<!-- generated: configuration -->``: every key of the pipeline TOML, with its type, default and valid
  values (``fairstream.streams.config.reference_markdown()``, the table the config tests check);
- ``<!-- generated: cli -->``: every command and subcommand of ``fairstream`` with its options, walked from
  the argparse parser the command line itself builds (``fairstream.streams.cli.build_parser()``);
- ``<!-- generated: kinds -->``: every artifact kind with what it reads, writes and needs
  (``fairstream.models.kinds.MODULE_KINDS`` and their ``capabilities``).

A marker the hook does not know is an error, so a typo cannot leave a page silently empty.
"""

from __future__ import annotations

import argparse
import functools
import html
import re

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
USAGE_WIDTH = 100


def configuration_reference() -> str:
    """The configuration table: one row per key of the pipeline TOML."""
    from fairstream.streams.config import reference_markdown

    return reference_markdown()


def _cell(text: str) -> str:
    """Text for a Markdown table cell: HTML special characters and pipes escaped, one line."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return text.replace("|", "\\|").replace("*", "\\*")


def _option_name(action: argparse.Action) -> str:
    """How the option is written on a command line: ``--rate RATE``, ``-n N``, ``action {start,stop}``."""
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"`{name}`"
    if action.nargs == 0:
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    if action.metavar is not None:
        metavar = action.metavar
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    return ", ".join(f"`{flag} {metavar}`" for flag in action.option_strings)


def _option_meaning(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option's help, with its choices and its default where the help does not already give them."""
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    if action.choices is not None and not action.option_strings:
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    default = action.default
    shown = default not in (None, False, argparse.SUPPRESS, [], "") and action.nargs != 0
    if shown and "default" not in text:
        text = f"{text} (default: {default})".strip()
    return _cell(text)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order the parser declares them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def _command_section(name: str, summary: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=USAGE_WIDTH)
    lines = [f"{'#' * depth} `{name}`", ""]
    if summary:
        lines += [_cell(summary[:1].upper() + summary[1:]) + ".", ""]
    if parser.description and parser.description != summary:
        lines += [_cell(parser.description), ""]
    lines += ["```", parser.format_usage().strip(), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        if action.help == argparse.SUPPRESS or action.dest == "debug":  # said once, above
            continue
        rows.append(f"| {_option_name(action)} | {_option_meaning(parser, action)} |")
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    for sub_name, sub_summary, sub in _subcommands(parser):
        lines += _command_section(f"{name} {sub_name}", sub_summary, sub, depth + 1)
    return lines


def cli_reference() -> str:
    """Every command and subcommand of ``fairstream``: what it does, its usage and every argument."""
    from fairstream.streams.cli import build_parser

    parser = build_parser()
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=USAGE_WIDTH)
    commands = _subcommands(parser)
    lines = ["```", parser.format_usage().strip(), "```", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`fairstream {name}`](#fairstream-{name}) | {_cell(summary)} |" for name, summary, _ in commands]
    lines += ["", "Every command and subcommand also takes `--debug`: show the full traceback of an error.", ""]
    for name, summary, sub in commands:
        lines += _command_section(f"fairstream {name}", summary, sub, depth=2)
    return "\n".join(lines)


def kinds_reference() -> str:
    """Every artifact kind: the agent it serves, its place in a record chain, what it reads, writes and needs."""
    from fairstream.models.kinds import MODULE_KINDS

    def columns(names) -> str:
        return ", ".join(f"`{name}`" for name in sorted(names)) or "-"

    lines = ["| kind | agent | place | reads | writes | applying needs s | training needs labels |",
             "|---|---|---|---|---|---|---|"]
    for kind, cls in MODULE_KINDS.items():
        caps = cls.capabilities
        lines.append(f"| `{kind}` | {caps.agent} | {caps.place or '-'} | {columns(caps.reads)} | "
                     f"{columns(caps.writes)} | {'yes' if caps.needs_s else 'no'} | "
                     f"{'yes' if caps.needs_labels else 'no'} |")
    return "\n".join(lines)


GENERATORS = {"configuration": configuration_reference, "cli": cli_reference, "kinds": kinds_reference}


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """Replace each marker line of a page with the part it names."""
    def generated(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown generated part {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
