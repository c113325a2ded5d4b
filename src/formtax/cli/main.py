"""The ``formtax`` command. Logging and progress bars are configured here and nowhere else.

Subcommand modules import torch, transformers and llguidance only inside their handlers, so ``formtax --help``,
``formtax ls`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from formtax.cli.registry import COMMANDS, HelpFormatter
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


ORDER = ("generate", "calibrate", "fem", "run", "report", "compare", "verify", "ls", "serve")


def build_parser() -> argparse.ArgumentParser:
    from formtax import __version__
    from formtax.cli import calibrate, fem, generate, lab, ls, serve  # noqa: F401  (registration)

    parser = argparse.ArgumentParser(prog="formtax", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"formtax {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    # the help lists commands in the order a user meets them, not in the order their modules happened to be imported
    # (a test or a plugin importing one first would reorder the help and the CLI reference)
    rank = {name: i for i, name in enumerate(ORDER)}
    for name in sorted(COMMANDS, key=lambda n: (rank.get(n, len(rank)), n)):
        COMMANDS[name][0](sub)
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
        # the library names the API's parameter (max_tokens, as HTTP does); the CLI names its flag
        print(f"formtax: error: {e}".replace("raise max_tokens", "raise --max-tokens"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("formtax: interrupted", file=sys.stderr)
        return 130


