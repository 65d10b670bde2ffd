"""MkDocs hooks: the command-line reference, rendered from the argparse definitions.

A page holding the line ``<!-- fastmem-cli -->`` gets, in its place, one section per command
of ``fastmem`` (from ``fastmem.cli.build_parser()``) and of ``fastmem ray`` (from
``fastmem.ray.cli``'s parser), each with its usage line and a table of its arguments. The
text comes from the same ``help=`` strings ``fastmem COMMAND --help`` prints, so the page
cannot drift from the command.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- fastmem-cli -->"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, Any]]:
    """(name, one-line help, sub-parser) for each sub-command, in definition order."""
    for action in parser._actions:  # argparse keeps no public list of sub-parsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs != 0:
            names += f" `{action.metavar or action.dest.upper()}`"
        return names
    return f"`{action.metavar or action.dest}`"


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "fastmem"}
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    if action.required and action.option_strings:
        text += " (required)"
    return _cell(text)


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().replace("usage:", "", 1).split())


def _section(prog: str, summary: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{prog}`", ""]
    if summary:
        out += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    out += ["```text", _usage(parser), "```", ""]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        out += ["| argument | meaning |", "|---|---|"]
        out += [f"| {_argument(a)} | {_help(a)} |" for a in rows]
        out.append("")
    for name, help_, sub in _subcommands(parser):
        if sub.add_help:  # `fastmem ray` is parsed by its own module: rendered below
            out += _section(f"{prog} {name}", help_, sub, min(level + 1, 4))
    return out


def render_cli() -> str:
    """The Markdown of the command-line reference (both parsers)."""
    # A fixed width, so that the usage lines do not depend on the terminal of the build.
    os.environ["COLUMNS"] = "100"
    from fastmem.cli import build_parser
    from fastmem.ray import cli as ray_cli

    parser = build_parser()
    lines = [f"```text\n{_usage(parser)}\n```", ""]
    for name, help_, sub in _subcommands(parser):
        if sub.add_help:
            lines += _section(f"fastmem {name}", help_, sub, 3)
    ray_parser = getattr(ray_cli, "build_parser", None) or ray_cli._parser
    lines += _section("fastmem ray", "a Ray cluster's stores: status and fleet jobs "
                      "(`pip install 'fastmem[ray]'`)", ray_parser(), 3)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the CLI marker with the rendered reference (MkDocs hook)."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render_cli())
    return markdown


# Some docstrings use Sphinx roles (":class:`Memory`"), which the Google-style parser leaves
# as text before the rendered code span; the role adds nothing a reader needs.
_SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|exc|data|obj):(?=<code)")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Drop Sphinx roles left in the rendered docstrings (MkDocs hook)."""
    return _SPHINX_ROLE.sub("", html)
