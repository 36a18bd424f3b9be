"""The reference page (docs/reference.md), written from the option definitions themselves: every
pytest option the plugin adds (:mod:`ddpbench.option_table`), the markers, and every ``ddpbench``
command with its arguments (:mod:`ddpbench.commands`). The README is the manual and links here;
tests/test_reference_page.py fails when the page is not current.

    python -m ddpbench.reference_page > docs/reference.md
"""

from __future__ import annotations

import argparse
import sys

from .cli import build_parser
from .option_table import PLUGIN_GROUPS

HEADER = """# ddpbench reference

Every pytest option ddpbench adds and every `ddpbench` command, written from their definitions by
`python -m ddpbench.reference_page > docs/reference.md` (tests/test_reference_page.py keeps this page current:
do not edit it by hand). The README is the manual; docs/design/ says why each rule is what it is.
"""

MARKERS = [
    ("gpu", "needs at least one CUDA device (NCCL cases); skipped with a reason otherwise"),
    ("multi_gpu", "needs at least two CUDA devices; skipped with a reason otherwise"),
    ("slow", "1 GB sizes and long loops; run only when selected with `-m slow`"),
    ("dist_extra_world_sizes(*sizes)", "also run the test at these world sizes (e.g. 1 as a scaling reference)"),
]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _help(action_help: str | None) -> str:
    return _cell((action_help or "").replace("%%", "%"))


def _option_form(names: list[str], metavar, choices, takes_value: bool) -> str:
    if not takes_value:
        return ", ".join(f"`{n}`" for n in names)
    if choices:
        value = "|".join(str(c) for c in choices)
    elif metavar:
        value = metavar if isinstance(metavar, str) else " ".join(metavar)
    else:
        value = names[-1].lstrip("-").split("-")[-1].upper()
    return ", ".join(f"`{n} {value}`".replace("|", "\\|") for n in names)


def pytest_options_markdown() -> str:
    """The plugin's option groups (:data:`ddpbench.option_table.PLUGIN_GROUPS`) and markers as
    markdown tables."""
    lines = ["## pytest options", ""]
    for group in PLUGIN_GROUPS:
        lines += [f"### {group.title}", "", "| option | meaning |", "|---|---|"]
        for option in group.options:
            form = _option_form([option.pytest_flag], option.metavar, option.choices, option.takes_value)
            lines.append(f"| {form} | {_help(option.help)} |")
        lines.append("")
    lines += ["## Markers", "", "| marker | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(text)} |" for name, text in MARKERS]
    lines.append("")
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands_markdown() -> str:
    """Each ``ddpbench`` command: its description and a table of its arguments."""
    lines = ["## Commands", ""]
    for name, sub in _subcommands(build_parser()).items():
        lines += [f"### ddpbench {name}", ""]
        if sub.description:
            lines += [_cell(sub.description), ""]
        lines += ["| argument | meaning |", "|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            if action.option_strings:
                takes_value = action.nargs != 0
                form = _option_form(list(action.option_strings), action.metavar, action.choices, takes_value)
            else:
                form = f"`{action.metavar or action.dest}`" + (" ..." if action.nargs in ("*", "+", "...") else "")
            lines.append(f"| {form} | {_help(action.help)} |")
        lines.append("")
    return "\n".join(lines)


def reference_markdown() -> str:
    return "\n".join([HEADER, pytest_options_markdown(), commands_markdown()]).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(reference_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
