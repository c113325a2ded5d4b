"""``formtax generate``: one prompt, one strategy, one answer constraint."""

from __future__ import annotations

import argparse
import json
import warnings

from formtax.cli.main import command


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder, .gguf file or hub id (default: embedded SmolLM2-135M)")
    p.add_argument("--backend", default="hf", help="model engine (default: hf = transformers in-process)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


def _args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--strategy", "-s", default="free", help="see `formtax ls strategies`")
    p.add_argument("--answer", "-a", default=None,
                   help="answer SPEC: a template ('The answer is: {int}') or regex:..., json:..., choice:a|b, lark:...")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--reasoning", default=None, help="reasoning constraint: a forced prefix, e.g. \"Let's think step by step.\"")
    p.add_argument("--trigger", action="append", default=[], help="InWriting trigger token (repeatable)")
    p.add_argument("--no-constrain", action="store_true", help="same prompt and budget, no mask")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="send PROMPT as plain text, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("prompt")


@command("generate", _args, "generate one answer with a strategy and an answer constraint")
def generate_cmd(args: argparse.Namespace) -> int:
    from formtax.api import generate, load_model
    from formtax.constraints import parse_spec
    from formtax.strategies import get_strategy

    strategy = get_strategy(args.strategy)  # unknown names fail before the model loads
    constraint = parse_spec(args.answer) if args.answer is not None else None
    if strategy.requires_constraint and constraint is None:
        from formtax.errors import ConfigError

        raise ConfigError(f"strategy {args.strategy!r} needs --answer SPEC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
        prompt = args.prompt if args.raw else [{"role": "user", "content": args.prompt}]
        r = generate(model, prompt, strategy=args.strategy, answer=constraint, max_tokens=args.max_tokens,
                     reasoning=args.reasoning, triggers=args.trigger, seed=args.seed, constrain=not args.no_constrain)
    if args.json:
        out = r.model_dump(exclude={"token_ids"})
        out["tokens_detail"] = out.pop("tokens")
        out["tokens"] = r.tokens.total
        print(json.dumps(out, ensure_ascii=False, default=str))
    else:
        print(f"[{r.strategy}] finish={r.finish_reason} tokens={r.tokens.total} parse_ok={r.parse_ok} "
              f"parsed={r.parsed!r}" + (f" error={r.error}" if r.error else ""))
        print(r.text)
    return 0 if r.error is None else 1
