"""``formtax generate``: one prompt, one strategy, one answer constraint."""

from __future__ import annotations

import argparse
import json
import warnings
from typing import TYPE_CHECKING

from formtax.cli.registry import command

if TYPE_CHECKING:
    from formtax.decoding.sampling import Sampling


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder, .gguf file or hub id (default: embedded SmolLM2-135M)")
    p.add_argument("--backend", default="hf", help="model engine (default: hf = transformers in-process)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    p.add_argument("--server", default=None, help="--backend openai: the server's URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--served-model", default=None, help="--backend openai: the served model's name (default: its only one)")
    p.add_argument("--tensor-parallel-size", type=int, default=None, help="--backend vllm: passed to the engine")
    p.add_argument("--thinking", choices=["on", "off"], default=None,
                   help="the chat template's thinking switch (enable_thinking; Qwen3 and similar); paper 003 runs off")
    add_threads_arg(p)
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="--backend vllm: a vllm.LLM keyword (VALUE read as JSON when it parses, e.g. enforce_eager=true)"
                        "; --backend openai: timeout, retries, concurrency, flavor, top_logprobs (repeatable)")


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads for the model (default: torch's own, one per physical core); on a "
                        "machine other work shares, fewer avoid oversubscription (a busy 2-core machine ran a call "
                        "about 20x slower with 2 threads than with 1)")


def apply_threads(args: argparse.Namespace) -> None:
    """``--threads``: set before the model loads (refused below 1 in one line)."""
    n = getattr(args, "threads", None)
    if n is None:
        return
    from formtax.errors import ConfigError

    if n < 1:
        raise ConfigError(f"--threads must be at least 1, got {n}")
    import torch

    torch.set_num_threads(n)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this much mass (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="sampling: drop tokens below MIN_P x the top token's probability (0 = off)")
    p.add_argument("--model-defaults", action="store_true",
                   help="sample with the model's own generation_config defaults instead of the four above")


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    """The sampling settings the arguments name, checked (a clear error before the model loads)."""
    from formtax.decoding.sampling import Sampling

    return Sampling(args.temperature, args.top_p, args.top_k, args.min_p)


def backend_options(args: argparse.Namespace) -> dict[str, object]:
    """The backend keyword options the model arguments name (engine settings, the server URL)."""
    from formtax.errors import ConfigError

    opts: dict[str, object] = {}
    for item in args.engine_opt:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--engine-opt needs KEY=VALUE, got {item!r}")
        try:
            opts[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            opts[key.replace("-", "_")] = value
    for key in ("server", "served_model", "tensor_parallel_size"):
        if getattr(args, key, None) is not None:
            opts[key] = getattr(args, key)
    return opts


def _args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--strategy", "-s", default="free", help="see `formtax ls strategies`")
    p.add_argument("--answer", "-a", default=None,
                   help="answer SPEC: a template ('The answer is: {int}') or regex:..., json:..., choice:a|b, lark:...")
    p.add_argument("--max-tokens", type=int, default=256, help="the whole token budget")
    p.add_argument("--reasoning", default=None, help="reasoning constraint: a forced prefix, e.g. \"Let's think step by step.\"")
    p.add_argument("--trigger", action="append", default=[], help="InWriting trigger token (repeatable)")
    p.add_argument("--no-constrain", action="store_true", help="same prompt and budget, no mask")
    p.add_argument("--no-closing", action="store_true",
                   help="let a constrained answer run out of budget unfinished (default on transformers and vLLM: "
                        "closing mode, the answer always finishes inside --max-tokens; servers do not close)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampler seed (only matters when sampling; default: fresh entropy, recorded in the stats)")
    # the strategies' own flags (--tau, --beam-rule, --fem, --json-layout, ...), generated from their options models
    from formtax.strategies.options import add_option_args

    add_option_args(p)
    add_sampling_args(p)
    p.add_argument("--raw", action="store_true", help="send PROMPT as plain text, without the chat template")
    p.add_argument("--system-prompt", default=None, metavar="TEXT",
                   help="a system message before the prompt; '' (empty) keeps the chat template from injecting its "
                        "own default (SmolLM2's), as formtax run --system-prompt does")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("prompt", help="the user message (or, with --raw, the whole prompt text)")


@command("generate", _args, "generate one answer with a strategy and an answer constraint")
def generate_cmd(args: argparse.Namespace) -> int:
    from formtax.api import generate, load_model
    from formtax.constraints import parse_spec
    from formtax.errors import ConfigError
    from formtax.strategies import get_strategy
    from formtax.strategies.base import Request
    from formtax.strategies.options import options_from_args

    strategy = get_strategy(args.strategy)  # unknown names fail before the model loads
    constraint = parse_spec(args.answer) if args.answer is not None else None
    if strategy.requires_constraint and constraint is None:
        raise ConfigError(f"strategy {args.strategy!r} needs --answer SPEC")
    # the strategy's options (Request.options), refused before the model loads where it does not take them
    options = options_from_args(args, args.strategy)
    sampling = sampling_from_args(args)
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.backend in ("hf", "vllm"):
        from formtax.backends.model_files import check_model_name

        check_model_name(args.model)
    apply_threads(args)
    if args.raw and args.system_prompt is not None:
        raise ConfigError("--system-prompt applies to chat prompts; --raw sends the text as it is")
    system = [] if args.system_prompt is None else [{"role": "system", "content": args.system_prompt}]
    prompt = args.prompt if args.raw else [*system, {"role": "user", "content": args.prompt}]
    probe = Request(prompt, constraint, max_tokens=args.max_tokens, options=options)
    strategy.options_of(probe)
    settings = getattr(strategy, "settings", None)
    if callable(settings):  # decog / ctrlg: a missing or mismatched --fem fails here, before the model loads
        settings(probe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opts = backend_options(args)
        if opts:
            from formtax.backends import load_backend

            model = load_backend(args.backend, args.model, device=args.device, dtype=args.dtype, **opts)
        else:
            model = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
        if args.thinking is not None:
            model.tokenizer.set_thinking(args.thinking == "on")
        r = generate(model, prompt, strategy=args.strategy, answer=constraint, max_tokens=args.max_tokens,
                     reasoning=args.reasoning, triggers=args.trigger, seed=args.seed,
                     constrain=not args.no_constrain, model_defaults=args.model_defaults,
                     closing=False if args.no_closing else None, **sampling.to_json(), **options)
    if args.json:
        out = r.model_dump(exclude={"token_ids"})
        out["tokens_detail"] = out.pop("tokens")
        out["tokens"] = r.tokens.total
        print(json.dumps(out, ensure_ascii=False, default=str))
    else:
        print(f"[{r.strategy}] finish={r.finish_reason} tokens={r.tokens.total} parse_ok={r.parse_ok} "
              f"parsed={r.parsed!r}" + (f" error={r.error}" if r.error else ""))
        if "t_star" in r.stats:
            s = r.stats
            print(f"[suffix] rule={s['rule']} tau={s['tau']} t*={s['t_star']} free_end={s['free_end']} "
                  f"({s['free_end_reason']}) candidates={s['n_candidates']} delta(t*)={s['delta_at_t_star']:.4f}")
        print(r.text)
    return 0 if r.error is None else 1
