"""``formtax calibrate``: the lab on a planted world, every number next to its exact truth (and coverage)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from formtax.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("world", nargs="?", default=None,
                   help="a world file (JSON/YAML) or a built-in world's name (see --list)")
    p.add_argument("--list", action="store_true", help="list the built-in worlds and exit")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: runs/calibrate-<world>)")
    p.add_argument("--strategies", default=None, help="comma list (default: the world's study.strategies)")
    p.add_argument("--seeds", type=int, default=None, help="seeds (default: the world's, else 1)")
    p.add_argument("--temperature", type=float, default=None, help="default: the world's, else 0 (greedy)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the world's, else 128")
    p.add_argument("--reasoning-tokens", type=int, default=None,
                   help="one reasoning budget for every level (default: the world's, else from --max-tokens)")
    p.add_argument("--fem", default=None,
                   help="decog / ctrlg: an FEM artifact (default: the world's study.fem, e.g. distilled from it)")
    p.add_argument("--replicates", type=int, default=10_000, help="bootstrap replicates of the report")
    p.add_argument("--studies", type=int, default=0,
                   help="also run a coverage study of this many synthetic studies (e.g. 400)")
    p.add_argument("--study-items", type=int, default=40, help="coverage study: items per study")
    p.add_argument("--study-seeds", type=int, default=3, help="coverage study: seeds per study")
    p.add_argument("--null", default=None, metavar="STRATEGY",
                   help="coverage study: duplicate STRATEGY with independent draws (a null pair for McNemar)")


@command("calibrate", _args, "run the lab on a planted world (exact known truths) and compare every estimate "
         "and interval with its truth")
def calibrate_cmd(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from formtax.errors import ConfigError
    from formtax.planted.calibrate import calibrate, coverage_study, render
    from formtax.planted.worlds import BUILTIN

    if args.list:
        for name, fn in BUILTIN.items():
            print(f"{name:16s} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if args.world is None:
        raise ConfigError("name a world file or a built-in world (formtax calibrate --list)")
    for flag in ("seeds", "max_tokens", "studies", "study_items", "study_seeds", "replicates"):
        v = getattr(args, flag)
        if v is not None and v < (0 if flag == "studies" else 1):
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least {0 if flag == 'studies' else 1}, got {v}")
    if args.temperature is not None and not args.temperature >= 0.0:
        raise ConfigError(f"--temperature must be >= 0, got {args.temperature}")
    name = Path(args.world).stem if Path(args.world).suffix else args.world
    out = args.out or Path("runs") / f"calibrate-{name}"
    bar: tqdm | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, initial=done, unit="req", desc="calibrate", file=sys.stderr)
        else:
            bar.update(done - bar.n)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cal = calibrate(args.world, out, [s for s in args.strategies.split(",") if s] if args.strategies else None,
                            args.seeds, args.temperature, args.max_tokens, args.replicates, progress,
                            reasoning_tokens=args.reasoning_tokens, fem=args.fem)
        finally:
            if bar is not None:
                bar.close()
    print(render(cal))
    if args.studies:
        from formtax.planted.backend import PlantedBackend
        from formtax.planted.calibrate import render_coverage, resolve_world, study_config, world_fem
        from formtax.planted.task import planted_task
        from formtax.planted.truth import grid_truth
        from formtax.planted.world import load_world

        path = resolve_world(args.world, out)
        world = load_world(path)
        cfg = study_config(world, path, [s for s in args.strategies.split(",") if s] if args.strategies else None,
                           args.seeds, args.temperature, args.max_tokens, reasoning_tokens=args.reasoning_tokens,
                           fem=args.fem or world_fem(world, path, out))
        g = grid_truth(PlantedBackend(world, str(path)), planted_task(world, str(path)), cfg)
        with tqdm(total=args.studies, unit="study", desc="coverage", file=sys.stderr) as sbar:
            cov = coverage_study(g, args.studies, args.study_items, args.study_seeds,
                                 min(args.replicates, 2000), null_of=args.null, progress=lambda k: sbar.update(1))
        print("\n" + render_coverage(cov, args.null))
        (out / "coverage.json").write_text(json.dumps(cov.__dict__, indent=1) + "\n", encoding="utf-8")
    print(f"\n-> {out / 'calibration.md'}")
    return 0
