"""The subcommand registry and the help formatter every subcommand shares: each ``cli/<command>.py`` registers
itself here with :func:`command`, and ``cli/main.py`` imports them all and builds the parser, so no subcommand
imports ``main``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless its help already says it, or the default is empty), keeping the
    descriptions' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Command]] = {}


def command(name: str, add_args: Callable[[argparse.ArgumentParser], None], help: str) -> Callable[[Command], Command]:
    """Register a subcommand (registries, not if-chains)."""

    def deco(fn: Command) -> Command:
        def add(sub: argparse._SubParsersAction) -> None:
            p = sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
            add_args(p)
            p.set_defaults(_run=fn)

        COMMANDS[name] = (add, fn)
        return fn

    return deco
