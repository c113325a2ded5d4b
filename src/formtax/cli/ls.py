"""``formtax ls strategies|tasks``."""

from __future__ import annotations

import argparse

from formtax.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["strategies", "tasks"], help="what to list")


@command("ls", _args, "list strategies or tasks")
def ls(args: argparse.Namespace) -> int:
    if args.what == "strategies":
        from formtax.strategies.catalog import list_catalog

        rows = list_catalog()  # the catalog, not the registry: importing the strategies loads torch
    else:
        from formtax.tasks import get_task, list_tasks

        rows = {n: get_task(n).description for n in list_tasks()}
    width = max(len(n) for n in rows)
    for name, summary in rows.items():
        print(f"{name:<{width}}  {summary}")
    return 0
