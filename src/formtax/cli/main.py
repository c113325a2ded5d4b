"""The ``formtax`` command. Logging and progress bars are configured here and nowhere else."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from formtax.errors import FormtaxError

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Command]] = {}


def command(name: str, add_args: Callable[[argparse.ArgumentParser], None], help: str) -> Callable[[Command], Command]:
    """Register a subcommand (registries, not if-chains)."""

    def deco(fn: Command) -> Command:
        def add(sub: argparse._SubParsersAction) -> None:
            p = sub.add_parser(name, help=help, description=help)
            add_args(p)
            p.set_defaults(_run=fn)

        COMMANDS[name] = (add, fn)
        return fn

    return deco


def build_parser() -> argparse.ArgumentParser:
    from formtax.cli import calibrate, fem, generate, lab, ls, serve  # noqa: F401  (registration)
    parser = argparse.ArgumentParser(prog="formtax", description=__doc__)
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


