"""The ``formtax`` command. Logging and progress bars are configured here and nowhere else.

Subcommand modules import torch, transformers and llguidance only inside their handlers, so ``formtax --help``,
``formtax ls`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from formtax.errors import FormtaxError

DESCRIPTION = """\
formtax: let a language model reason freely and still answer in a strict, machine-readable format,
and measure, with real statistics, when a format constraint helps or hurts.

  formtax generate --strategy inwriting --answer 'The answer is: {int}' "What is 12 + 30?"
                                                    one answer: free reasoning, then the answer in its format
  formtax ls strategies | tasks                     what can be run
  formtax run --task gsm8k --strategies free,constrained --limit 50 --out runs/g   an evaluation grid (resumable)
  formtax report runs/g ; formtax verify runs/g    tables, figures, report.html; recompute and check them
  formtax serve                                     an OpenAI-compatible server with formtax's constraints

`formtax COMMAND --help` shows every option with its default."""


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


def build_parser() -> argparse.ArgumentParser:
    from formtax import __version__
    from formtax.cli import calibrate, fem, generate, lab, ls, serve  # noqa: F401  (registration)

    parser = argparse.ArgumentParser(prog="formtax", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"formtax {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("transformers", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return int(args._run(args))
    except FormtaxError as e:
        print(f"formtax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("formtax: interrupted", file=sys.stderr)
        return 130


