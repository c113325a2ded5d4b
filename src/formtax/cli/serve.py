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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=int, default=16, help="rows one batch may hold (requests batched together)")
    p.add_argument("--batch-window-ms", type=float, default=10.0,
                   help="how long the first request of a batch waits for compatible ones")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a request gets a 504")
    p.add_argument("--max-tokens", type=int, default=256, help="the budget of a request that names none")
    add_threads_arg(p)


@command("serve", _args, "serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions) over a formtax "
         "backend; strategies through the 'formtax' extension field")
def serve_cmd(args: argparse.Namespace) -> int:
    from formtax.errors import ConfigError

    for flag in ("port", "max_batch", "max_tokens"):
        if getattr(args, flag) < (0 if flag == "port" else 1):
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.timeout <= 0 or args.batch_window_ms < 0:
        raise ConfigError("--timeout must be > 0 and --batch-window-ms >= 0")
    apply_threads(args)
    try:
        import uvicorn

        from formtax.serve.app import create_app
    except ImportError as e:
        raise ConfigError(f"formtax serve needs the serve extra: pip install 'formtax[serve]' ({e})") from None
    from formtax.api import load_model

    backend = load_model(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    app = create_app(backend, max_batch=args.max_batch, window_s=args.batch_window_ms / 1000.0,
                     timeout_s=args.timeout, default_max_tokens=args.max_tokens)
    log.info("serving %s on http://%s:%d/v1", backend.model_id, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
