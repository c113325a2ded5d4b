"""``formtax fem build`` (distil a format estimation module's HMM) and ``formtax fem info`` (show an artifact)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from formtax.cli.generate import add_model_args
from formtax.cli.registry import command


def _args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="fem_command", required=True)
    b = sub.add_parser("build", help="distil an HMM from the model (Deco-G: instruction-aware; Ctrl-G: unconditional)",
                       description="Distil the FEM's HMM from the model's own outputs and save it as .npz + .json.")
    add_model_args(b)
    b.add_argument("--task", required=True, help="task whose training questions prompt the model (see `formtax ls tasks`)")
    b.add_argument("--form", default="instruction-aware", choices=["instruction-aware", "unconditional"],
                   help="instruction-aware = Deco-G (task-only prompts, for decog); unconditional = Ctrl-G (for ctrlg)")
    b.add_argument("--states", type=int, default=128, help="hidden states h (default 128)")
    b.add_argument("--samples", type=int, default=64, help="generations to distil from (default 64)")
    b.add_argument("--max-tokens", type=int, default=256, help="token budget per generation (default 256)")
    b.add_argument("--em-iters", type=int, default=5, help="Baum-Welch iterations (default 5)")
    b.add_argument("--init", default="auto", choices=["auto", "kmeans", "ngram"],
                   help="initial labelling: bigram statistics (ngram: Deco-G's n-gram frequencies, auto for "
                        "instruction-aware) or k-means of LM hidden states (kmeans: Ctrl-G's, auto for unconditional "
                        "where the backend has them)")
    b.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0 = greedy for instruction-aware, 1 for unconditional)")
    b.add_argument("--seed", type=int, default=0, help="sampling and EM seed")
    b.add_argument("--batch-size", type=int, default=8, help="sampled sequences per model batch")
    b.add_argument("--data-dir", default=None, help="benchmark data folder (default: $FORMTAX_DATA or ../shared/data)")
    b.add_argument("--out", required=True, type=Path, help="artifact path (.npz; a .json twin is written next to it)")
    i = sub.add_parser("info", help="print an artifact's metadata", description="Print an FEM artifact's metadata.")
    i.add_argument("path", type=Path, help="a FEM artifact file")


@command("fem", _args, "format estimation modules (Deco-G / Ctrl-G HMMs): build, info")
def fem_cmd(args: argparse.Namespace) -> int:
    if args.fem_command == "info":
        from formtax.fem.artifact import load_fem

        art = load_fem(args.path)
        meta = {k: v for k, v in art.meta.items() if k not in ("items", "loglik")}
        print(json.dumps(meta, indent=2, sort_keys=True, default=str))
        return 0
    from tqdm import tqdm

    from formtax.api import load_model
    from formtax.fem.artifact import save_fem
    from formtax.runner.distill import DistillConfig, build_fem

    cfg = DistillConfig(task=args.task, form=args.form, states=args.states, samples=args.samples,
                        max_tokens=args.max_tokens, em_iters=args.em_iters, init=args.init,
                        temperature=args.temperature, seed=args.seed, batch_size=args.batch_size,
                        data_dir=args.data_dir)
    cfg.check()
    bars: dict[str, tqdm] = {}
    names = {"sample": "generate", "hidden": "hidden states", "em": "Baum-Welch"}

    def progress(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=names.get(stage, stage), file=sys.stderr,
                                     unit="it" if stage == "em" else "seq")
        bar.update(done - bar.n)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
        if args.thinking is not None:  # the distillation prompts go through the same chat template
            model.tokenizer.set_thinking(args.thinking == "on")
        try:
            hmm, meta = build_fem(model, cfg, progress)
        finally:
            for bar in bars.values():
                bar.close()
    path = save_fem(args.out, hmm, meta)
    ll = meta["loglik_per_token"]
    print(f"FEM ({cfg.form}, h={cfg.states}) from {meta['n_samples']} samples / {meta['n_tokens']} tokens, "
          f"init {meta['init']}, log-lik/token {ll[0]:.3f} -> {ll[-1]:.3f}, {meta['build_s']:.0f} s -> {path}")
    return 0
