"""``formtax serve``: the OpenAI-compatible HTTP server (formtax.serve.app)."""

from __future__ import annotations

import argparse
import logging

from formtax.cli.generate import add_threads_arg, apply_threads
from formtax.cli.registry import command

log = logging.getLogger(__name__)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a model folder, .gguf or hub id (default: the embedded default)")
    p.add_argument("--backend", default="hf", help="hf, vllm or openai, as for formtax generate")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", help="weights dtype")
    p.add_argument("--tensor-parallel-size", type=int, default=None, help="--backend vllm: passed to the engine")
    p.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="--backend vllm: an engine keyword (VALUE read as JSON when it parses, e.g. "
                        "enforce_eager=true; repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=int, default=16, help="rows one batch may hold (requests batched together)")
    p.add_argument("--batch-window-ms", type=float, default=10.0,
                   help="how long the first request of a batch waits for compatible ones")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a request gets a 504")
    p.add_argument("--max-tokens", type=int, default=256, help="the budget of a request that names none")
    p.add_argument("--max-queue", type=int, default=256, help="requests that may wait; beyond that a 429")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="the temperature of a request that names none (default 1, OpenAI's; 0 = greedy)")
    p.add_argument("--served-model-name", action="append", default=None,
                   help="a name clients use as 'model' (repeatable; default: the model's clean id, e.g. "
                        "smollm2-135m-instruct, and 'default'); others get a 404")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: FORMTAX_API_KEY if set, else no key); prefer "
                        "FORMTAX_API_KEY: a command line is readable by every local user")
    p.add_argument("--strategy", default=None,
                   help="the strategy of a request that names none (e.g. inwriting): any OpenAI client gets it")
    p.add_argument("--answer", default=None,
                   help="the answer SPEC of a request that gives no response_format, tools or formtax.answer")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="a request body over this many bytes gets a 413 before it is parsed (default: 64 bytes per "
                        "context token + 1 MiB; 16 MiB when the context is unknown)")
    add_threads_arg(p)


@command("serve", _args, "serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses) over a formtax "
         "backend; strategies through the 'formtax' extension field")
def serve_cmd(args: argparse.Namespace) -> int:
    from formtax.errors import ConfigError

    for flag in ("port", "max_batch", "max_tokens", "max_queue", "max_body_bytes"):
        if getattr(args, flag) is not None and getattr(args, flag) < (0 if flag == "port" else 1):
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.timeout <= 0 or args.batch_window_ms < 0:
        raise ConfigError("--timeout must be > 0 and --batch-window-ms >= 0")
    apply_threads(args)
    try:
        import uvicorn

        from formtax.serve.app import create_app, served_names
    except ImportError as e:
        raise ConfigError(f"formtax serve needs the serve extra: pip install 'formtax[serve]' ({e})") from None
    import os
    import sys

    from formtax.api import load_model
    from formtax.constraints.native import as_constraint
    from formtax.serve.app import ServeConfig
    from formtax.strategies import get_strategy

    if args.strategy is not None:
        get_strategy(args.strategy)  # an unknown name is refused before the model loads
    if args.answer is not None:
        as_constraint(args.answer)
    if not 0.0 <= args.temperature <= 2.0:
        raise ConfigError(f"--temperature must be in [0, 2], got {args.temperature}")
    cfg = ServeConfig(max_batch=args.max_batch, window_s=args.batch_window_ms / 1000.0, timeout_s=args.timeout,
                      default_max_tokens=args.max_tokens, max_queue=args.max_queue, temperature=args.temperature,
                      served_model_names=tuple(args.served_model_name or ()),
                      api_key=args.api_key or os.environ.get("FORMTAX_API_KEY") or None,
                      strategy=args.strategy, answer=args.answer, max_body_bytes=args.max_body_bytes)
    # vLLM: its serving engine, so that every request joins its running batch (backends/vllm/async_engine.py)
    from formtax.cli.generate import backend_options

    engine = {"async_engine": True, **backend_options(args)} if args.backend == "vllm" else backend_options(args)
    backend = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype, **engine)
    app = create_app(backend, cfg)
    names = ", ".join(served_names(backend, cfg))
    print(f"formtax serve: http://{args.host}:{args.port}/v1 · model {backend.model_id} (served as {names}) · "
          f"strategy {args.strategy or 'by request (free)'}"
          + (f", answer {args.answer!r}" if args.answer else "")
          + f" · temperature {args.temperature:g}{' (OpenAI default)' if args.temperature == 1.0 else ''}"
          f" · max_tokens {args.max_tokens} · context {backend.context_length or 'unknown'}"
          f" · API key {'required' if cfg.api_key else 'none'}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
