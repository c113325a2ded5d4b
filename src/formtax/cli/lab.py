"""``formtax run``, ``formtax report`` and ``formtax verify``."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from formtax.cli.generate import (
    add_model_args,
    add_sampling_args,
    apply_threads,
    backend_options,
    sampling_from_args,
)
from formtax.cli.registry import command


def _run_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--task", default=None,
                   help="see `formtax ls tasks`, or jsonl:PATH for your own items (required, except with --world)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import this Python module first (its @register_task classes become tasks; repeatable)")
    j = p.add_argument_group("your own task (--task jsonl:PATH)")
    j.add_argument("--answer-spec", default=None,
                   help="the answer's VC slot for every row, e.g. '{int:0..}', '{choice:yes|no}', '{letters:4}', "
                        "'{str}'; a row's own answer_spec field narrows it")
    j.add_argument("--answer-kind", default=None, choices=["integer", "choice", "letters", "text"],
                   help="the answer kind when there is no --answer-spec (choice: from each row's choices)")
    for flag, default, what in (("--question-field", "question", "the question"),
                                ("--gold-field", "answer", "the gold answer"),
                                ("--id-field", "id", "the item id (the line number when absent)"),
                                ("--choices-field", "choices", "the choices: a list of texts or label -> text")):
        j.add_argument(flag, default=None, help=f"the row field holding {what} (default: {default})")
    j.add_argument("--shots-file", type=Path, default=None,
                   help="few-shot examples in the same layout (optional 'solution' field); default: the file itself")
    j.add_argument("--instruction", default=None, help="the task description (default: 'Answer the question.')")
    p.add_argument("--world", type=Path, default=None,
                   help="a planted world file: sets --backend planted and --task planted (calibration)")
    p.add_argument("--strategies", required=True,
                   help="comma list of NAME[@none|fc|vc][:json|:plain][+rc], e.g. "
                        "free,constrained,json@fc,json@vc,inwriting:json,inwriting+rc")
    p.add_argument("--limit", type=int, default=None, help="items (the same fixed-seed sample for every strategy)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per request (only matter when sampling)")
    p.add_argument("--seeding", choices=["request", "index"], default="request",
                   help="sampler seeds: one per request, independent (default), or the seed index shared by "
                        "every item and strategy (formtax's older rule; common random numbers)")
    p.add_argument("--prompt-variants", default="t1f1",
                   help="'all' (3 task x 3 format), 'paper' (paper 003's plan: 3 x 3 for InWriting and NL-to-Format, "
                        "3 x 1 for JSON, 1 x 3 on AIME; InWriting and NL-to-Format answer in the JSON form unless "
                        "a spec says :plain) or e.g. t1f1,t2f3")
    p.add_argument("--shots", type=int, default=0, help="few-shot examples from the task's train split")
    p.add_argument("--system-prompt", default=None, metavar="TEXT",
                   help="a system message before every chat prompt; '' (empty) keeps the chat template from "
                        "injecting its own default (SmolLM2's). Default: the task's messages as they are")
    p.add_argument("--prompt-style", choices=["chat", "base"], default=None,
                   help="chat: instruction, format description and question as chat messages; base: a plain "
                        "'Question: ... Answer: ...' few-shot prompt, the same for every strategy (paper 000's "
                        "pre-trained setting). Default: base for a model known to have no chat template "
                        "(gemma3-270m), chat otherwise")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="the whole budget of a strategy without a reasoning phase (default 256); for InWriting, "
                        "JSON and NL-to-Format, unless --reasoning-tokens is given, the reasoning budget is this "
                        "minus the largest answer reserve of the strategy's levels in the grid, the same at every "
                        "level (without --max-tokens: 128 where 256 would leave none, e.g. EAE's JSON record)")
    p.add_argument("--reasoning-tokens", type=int, default=None,
                   help="the reasoning budget of InWriting, JSON and NL-to-Format at every constraint level "
                        "(paper 003's max_preamble_tokens: 600); each level's answer reserve is added on top")
    p.add_argument("--same-reasoning", action="store_true",
                   help="give every strategy the same reasoning budget (--reasoning-tokens, else --max-tokens): free "
                        "reasons and answers in it, JSON, InWriting and NL-to-Format get their answer's reserve on "
                        "top (default: each strategy reasons in --max-tokens less its own answer reserve)")
    p.add_argument("--json-layout", choices=["flexible", "compact"], default="flexible",
                   help="json strategy: JSON whitespace wherever a parser allows it (default; paper 003's schema) "
                        "or json.dumps' compact spelling")
    p.add_argument("--closing", action=argparse.BooleanOptionalAction, default=None,
                   help="closing mode: every constrained answer finishes inside its budget (default: on wherever "
                        "formtax steps the model, as in formtax generate and serve; a resumed run keeps its own); "
                        "--no-closing runs the papers' decoders; the tokens table reports per strategy how many "
                        "records closing changed")
    p.add_argument("--batch-size", type=int, default=8, help="requests decoded together")
    p.add_argument("--extractor-model", default=None,
                   help="nl2format: the model of the second (extraction) call, e.g. a larger one as in paper 003 "
                        "(default: the main model); records name it in stats.extractor")
    p.add_argument("--extractor-backend", default=None, help="nl2format: the extractor's engine (default: --backend)")
    add_sampling_args(p)
    p.add_argument("--data-dir", default=None, help="benchmark data folder (default: $FORMTAX_DATA or ../shared/data)")
    p.add_argument("--pairs", type=int, default=None, help="metatool: pair positions to sample (default 200)")
    p.add_argument("--translations", type=Path, default=None,
                   help="metatool: JSON file position -> translated query (adds a second language)")
    p.add_argument("--hypotheses", type=Path, default=None,
                   help="pre-registration file, hashed into the manifest before any record; verify fails "
                        "if it changes")
    p.add_argument("--workers", type=int, default=1, help="shard the grid over N Ray actors, one backend each")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    p.add_argument("--fem", default=None, metavar="SPEC",
                   help="decog / ctrlg: FEM artifact FILE (formtax fem build), or decog=FILE1,ctrlg=FILE2[,gamma=G,...]")
    p.add_argument("--out", required=True, type=Path, help="run directory (re-running resumes)")


@command("run", _run_args, "run an evaluation grid (task x strategies x prompt variants x seeds), resumable")
def run_cmd(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from formtax.errors import ConfigError
    from formtax.runner import RunConfig, run
    from formtax.runner.config import DEFAULT_REASONING_FLOOR

    sampling_from_args(args)  # out-of-range sampling settings: one clear line before anything loads
    apply_threads(args)
    task_options: dict[str, object] = {}
    if args.world is not None:
        world = str(args.world.resolve())
        if args.backend not in ("hf", "planted") or (args.model not in (None, world)):
            raise ConfigError("--world runs the planted backend on that world; leave out --backend / --model")
        if args.task not in (None, "planted"):
            raise ConfigError(f"--world evaluates the world's own items (task planted), not --task {args.task}")
        args.backend, args.model, args.task = "planted", world, "planted"
        task_options["world"] = world
    elif args.task is None:
        raise ConfigError("--task is required (see `formtax ls tasks`), or --world for a planted world")
    import importlib

    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--import {module}: {e}") from None
    jsonl = {"answer_spec": args.answer_spec, "answer_kind": args.answer_kind, "question_field": args.question_field,
             "gold_field": args.gold_field, "id_field": args.id_field, "choices_field": args.choices_field,
             "shots_file": str(args.shots_file.resolve()) if args.shots_file else None,
             "instruction": args.instruction}
    given = {k: v for k, v in jsonl.items() if v is not None}
    if args.task.startswith("jsonl:"):
        path = Path(args.task[len("jsonl:"):]).expanduser()
        if not path.is_file():
            raise ConfigError(f"--task jsonl:{path}: no such file")
        args.task = "jsonl"
        task_options.update(path=str(path.resolve()), **given)
    elif given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{flags}: only for --task jsonl:PATH (not --task {args.task})")
    if args.closing and args.backend == "openai":
        raise ConfigError("--closing needs the logits of every step; an OpenAI-compatible server does not expose them")
    if args.pairs is not None:
        task_options["pairs"] = args.pairs
    if args.translations is not None:
        task_options["translations"] = str(args.translations.resolve())
    cfg = RunConfig(task=args.task, strategies=[s for s in args.strategies.split(",") if s.strip()],
                    model=args.model, backend=args.backend, device=args.device, dtype=args.dtype, limit=args.limit,
                    seeds=args.seeds, seeding=args.seeding, prompt_variants=args.prompt_variants, shots=args.shots,
                    prompt_style=args.prompt_style, system_prompt=args.system_prompt,
                    max_tokens=256 if args.max_tokens is None else args.max_tokens,
                    reasoning_tokens=args.reasoning_tokens, same_reasoning=args.same_reasoning,
                    reasoning_floor=DEFAULT_REASONING_FLOOR if args.max_tokens is None else 0,
                    batch_size=args.batch_size, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                    min_p=args.min_p, model_defaults=args.model_defaults, thinking=args.thinking,
                    extractor_model=args.extractor_model, extractor_backend=args.extractor_backend,
                    data_dir=args.data_dir, task_options=task_options,
                    hypotheses=str(args.hypotheses.resolve()) if args.hypotheses is not None else None,
                    workers=args.workers, ray_address=args.ray_address, backend_options=backend_options(args),
                    fem=args.fem, json_layout=args.json_layout,
                    closing=args.closing)
    bar: tqdm | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, initial=done, unit="req", desc=f"{cfg.task}", file=sys.stderr)
        else:
            bar.update(done - bar.n)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s = run(cfg, args.out, progress)
        except KeyboardInterrupt:
            if bar is not None:
                bar.close()
                bar = None
            print(f"formtax: interrupted; every finished request is kept in {args.out / 'records.jsonl'}. "
                  "Run the same command again to resume.", file=sys.stderr)
            return 130
        finally:
            if bar is not None:
                bar.close()
    print(f"{s.done} requests run, {s.skipped} already recorded, {s.errors} errors, {s.wall_s:.1f} s -> "
          f"{args.out / 'records.jsonl'}")
    table = results_table(args.out)
    if table:
        print(table)
    return 0


def results_table(run_dir: Path) -> str:
    """The run's results at a glance, printed when ``run`` ends (issue 49): per strategy, its records, errors,
    strict parse rate, format-level parse rate and strict accuracy over the scored records, in the order the run
    recorded them. Point values only: ``formtax report`` gives each its interval and the paired tests."""
    import pandas as pd

    from formtax.report.load import load_records

    df = load_records(run_dir)
    if df.empty:
        return ""
    lines = [f"{'strategy':<28} {'records':>7} {'errors':>6} {'parse':>6} {'format':>6} {'accuracy':>8}"]
    for strategy, g in df.groupby("strategy", sort=False):
        scored = g[g["scored"].astype(bool)]

        def pct(col: str, frame: pd.DataFrame = scored) -> str:
            values = frame[col].dropna()
            return f"{100 * values.mean():.0f}%" if len(values) else "n/a"

        lines.append(f"{str(strategy):<28} {len(g):>7} {int(g['error'].notna().sum()):>6} "
                     f"{pct('parse_ok_strict'):>6} {pct('format_ok'):>6} {pct('score_strict'):>8}")
    lines.append(f"(intervals and paired tests: formtax report {run_dir})")
    return "\n".join(lines)


def _report_args(p: argparse.ArgumentParser) -> None:
    from formtax.stats.bootstrap import DEFAULT_RESAMPLING, Resampling

    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="a run directory (formtax run --out); several are pooled into one report (--out)")
    p.add_argument("--out", type=Path, default=None,
                   help="with several runs: the folder of the pooled report (refused when runs differ in data, "
                        "prompts or scoring; see formtax.report.combine)")
    p.add_argument("--replicates", type=int, default=10_000, help="bootstrap replicates")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--drill-items", type=int, default=500,
                   help="items shown with every output in report.html's Items section (0: none)")
    p.add_argument("--p-adjust", default="holm", choices=["holm", "bonferroni", "none"],
                   help="multiple-comparison adjustment of each task's baseline comparisons, printed beside the raw "
                        "p-values and used for the call 'distinguishable' (default: holm)")
    p.add_argument("--baseline", default=None,
                   help="the strategy the findings and the report's comparisons are against (default: the run's "
                        "first strategy); every pair stays in tables/paired.csv")
    p.add_argument("--resample", choices=[r.value for r in Resampling], default=DEFAULT_RESAMPLING.value,
                   help="what a bootstrap replicate resamples: items and seeds crossed with the spread corrected to "
                        "the design's variance components (nominal coverage), items and seeds crossed as they are "
                        "(paper 002's rule, conservative), or items keeping their seeds (the cluster bootstrap); "
                        "see docs/calibration.md")


def _report(args: argparse.Namespace) -> Path:
    from formtax.errors import ConfigError
    from formtax.report import write_report
    from formtax.report.combine import write_pooled
    from formtax.stats import Resampling

    if args.replicates < 1:
        raise ConfigError(f"--replicates must be at least 1, got {args.replicates}")
    if args.drill_items < 0:
        raise ConfigError(f"--drill-items must be 0 or more, got {args.drill_items}")
    if len(args.run_dirs) > 1:
        if args.out is None:
            raise ConfigError("several run directories make one pooled report: give --out FOLDER")
        target = write_pooled(args.run_dirs, args.out)
    elif args.out is not None:
        raise ConfigError("--out pools several runs; one run's report is written into its own directory")
    else:
        target = args.run_dirs[0]
    return write_report(target, n_resamples=args.replicates, seed=args.seed,
                        resampling=Resampling(args.resample), drill_items=args.drill_items, baseline=args.baseline,
                        p_adjust=args.p_adjust)


@command("report", _report_args, "write report.md/.html, tables/*.csv and figures/*.png from records.jsonl "
         "(one run, or several pooled with --out)")
def report_cmd(args: argparse.Namespace) -> int:
    print(f"report: {_report(args)}")
    return 0


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                   help="two or more run directories; each after the first is compared with the first")
    p.add_argument("--out", type=Path, default=None, help="also write ablation.csv and ablation.png here")
    p.add_argument("--replicates", type=int, default=10_000, help="bootstrap replicates")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")


@command("compare", _compare_args, "runs side by side (an ablation: another budget, prompt variant or setting): "
         "per task and strategy, each run's difference from the first, paired per item; no pooling")
def compare_cmd(args: argparse.Namespace) -> int:
    from formtax.errors import ConfigError
    from formtax.report.ablation import ablation_table, load_side, render_table, write_ablation

    if len(args.run_dirs) < 2:
        raise ConfigError("compare needs at least two run directories (one report pools several: report A B --out C)")
    if args.replicates < 1:
        raise ConfigError(f"--replicates must be at least 1, got {args.replicates}")
    table = ablation_table([load_side(p) for p in args.run_dirs], n_resamples=args.replicates, seed=args.seed)
    print(render_table(table))
    if args.out is not None:
        print(f"ablation: {write_ablation(table, args.out)}")
    return 0


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run directory (formtax run --out)")


@command("verify", _verify_args, "recompute every table from records.jsonl; non-zero exit naming any differing cell")
def verify_cmd(args: argparse.Namespace) -> int:
    from formtax.errors import DataError
    from formtax.report import verify_report
    from formtax.report.load import records_path
    from formtax.report.write import META_FILE, TABLES_DIR

    if not records_path(args.run_dir).is_file():
        raise DataError(f"{args.run_dir}: no records.jsonl (not a run directory; `formtax run --out` makes one)")
    if not (args.run_dir / TABLES_DIR / META_FILE).is_file():
        raise DataError(f"{args.run_dir}: no report to verify; run `formtax report {args.run_dir}` first")
    problems = verify_report(args.run_dir)
    if problems:
        for p in problems:
            print(f"MISMATCH {p}")
        return 1
    print(f"verified: every table in {args.run_dir} regenerates from records.jsonl")
    findings = args.run_dir / TABLES_DIR / "findings.csv"
    if findings.is_file():  # an incomplete run says so here too (its findings open with the same warning)
        import pandas as pd

        table = pd.read_csv(findings)
        for sentence in table.loc[table["finding"] == "incomplete", "sentence"]:
            print(f"warning: {sentence}")
    return 0
