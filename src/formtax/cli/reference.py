"""The CLI reference page (``docs/cli-reference.md``), written from the argparse parsers themselves so it cannot
drift: ``python -m formtax.cli.reference > docs/cli-reference.md``; a test checks the committed page is current."""

from __future__ import annotations

import argparse
import os


def cli_reference() -> str:
    """Every command's usage and flags, as Markdown."""
    from formtax.cli.main import build_parser

    os.environ["COLUMNS"] = "110"  # argparse wraps at the terminal width: one fixed width for a stable page
    parser = build_parser()
    out = ["# CLI reference", "", "Written from the parsers by `python -m formtax.cli.reference` (a test keeps it "
           "current). `formtax COMMAND --help` prints the same.", "", "```text", parser.format_help().rstrip(),
           "```", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        out += [f"## formtax {name}", "", "```text", p.format_help().rstrip(), "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(cli_reference(), end="")
