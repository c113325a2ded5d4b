"""The same 32-request arith run (free and constrained, 16 items each) on the vllm backend vs the hf backend.

ratio = vllm throughput / hf throughput (generated tokens per second of the run, engine start-up excluded;
target >= 2.5). Both run float32 by default, so their greedy outputs are comparable token for token
(``outputs_differing`` counts the requests whose text differs). Also reported, on the same grid:

* ``openai_*``: the openai backend against a local vLLM server (same engine settings), start-up excluded;
  ``openai_vs_vllm`` has its own target (>= 0.85: the HTTP client's pooled connections keep the server's cost
  small);
* ``ray_*``: ``--workers 2`` vs one worker, both with the vllm backend, wall time of the whole run including
  each worker's engine start (that is what a user waits for).

Each backend is measured in a fresh subprocess (an engine started where torch already runs cannot bind its
threads, which made in-process comparisons unfair); vLLM uses its compiled graph unless ``--eager``.

Needs vLLM and Ray (the .venv-vllm of scripts/env-vllm.sh): ``.venv-vllm/bin/python bench/backends.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _common import finish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))  # stock_server.py: a stock vLLM server

from formtax.backends import load_backend
from formtax.runner import RunConfig, run


def grid(args: argparse.Namespace, **kw: Any) -> RunConfig:
    base: dict[str, Any] = dict(task="arith", strategies=["free", "constrained"], limit=args.limit,
                                max_tokens=args.max_tokens, batch_size=args.batch_size, dtype=args.dtype)
    base.update(kw)
    return RunConfig(**base)


def timed_run(cfg: RunConfig, backend: Any = None) -> dict[str, Any]:
    """Run the grid into a fresh folder; wall time, generated tokens and texts by request id."""
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        run(cfg, Path(d), backend=backend)
        wall = time.perf_counter() - t
        recs = [json.loads(x) for x in (Path(d) / "records.jsonl").read_text().splitlines()]
    tokens = sum(r["tokens"]["total"] for r in recs)
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "requests": len(recs),
            "texts": {r["request_id"]: r["text"] for r in recs}, "errors": sum(r["error"] is not None for r in recs)}


def differing(a: dict[str, Any], b: dict[str, Any]) -> int:
    return sum(1 for k, v in a["texts"].items() if b["texts"].get(k) != v)


def measure(part: str, args: argparse.Namespace) -> dict[str, Any]:
    """One backend's run, in this (fresh) process: each engine binds its own threads, and a vLLM engine started
    in a process where torch already runs (the hf measurement) cannot, which would slow it down unfairly."""
    out: dict[str, Any] = {}
    t = time.perf_counter()
    if part == "hf":
        backend = load_backend("hf", None, dtype=args.dtype)
        out["startup_s"] = round(time.perf_counter() - t, 1)
        return {**out, **timed_run(grid(args), backend)}
    if part == "vllm":
        backend = load_backend("vllm", None, dtype=args.dtype, **({"enforce_eager": True} if args.eager else {}))
        out["startup_s"] = round(time.perf_counter() - t, 1)
        timed_run(grid(args, limit=2), backend)  # warm-up: first-call costs (grammar compiles, allocator) out of the way
        return {**out, **timed_run(grid(args), backend)}
    if part == "openai":
        from stock_server import serve

        with serve(dtype=args.dtype, extra_args=["--enforce-eager"] if args.eager else []) as url:
            out["startup_s"] = round(time.perf_counter() - t, 1)
            backend = load_backend("openai", None, server=url)
            timed_run(grid(args, limit=2, backend="openai"), backend)
            return {**out, **timed_run(grid(args, backend="openai"), backend)}
    opts = {"enforce_eager": True} if args.eager else {}
    workers = int(part.removeprefix("ray"))
    return timed_run(grid(args, backend="vllm", backend_options=opts, workers=workers))


def in_subprocess(part: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--limit", str(args.limit),
           "--max-tokens", str(args.max_tokens), "--batch-size", str(args.batch_size), "--dtype", args.dtype, *(["--eager"] if args.eager else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench part {part!r} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--skip-server", action="store_true")
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--eager", action="store_true", help="vLLM without graph compilation (enforce_eager)")
    p.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one measurement and print it
    args = p.parse_args()
    warnings.simplefilter("ignore")
    if args.part:
        print(json.dumps(measure(args.part, args)), flush=True)
        return
    out: dict[str, Any] = {"target": 2.5, "better": "higher", "dtype": args.dtype, "limit": args.limit,
                           "max_tokens": args.max_tokens, "batch_size": args.batch_size,
                           "note": "each backend measured in a fresh process; engine start-up excluded"}
    r_hf = in_subprocess("hf", args)
    r_vl = in_subprocess("vllm", args)
    out.update(ratio=round(r_vl["tok_s"] / r_hf["tok_s"], 3), requests=r_hf["requests"],
               hf_startup_s=r_hf["startup_s"], vllm_startup_s=r_vl["startup_s"],
               hf_tok_s=round(r_hf["tok_s"], 1), vllm_tok_s=round(r_vl["tok_s"], 1),
               hf_wall_s=round(r_hf["wall_s"], 1), vllm_wall_s=round(r_vl["wall_s"], 1),
               outputs_differing=differing(r_hf, r_vl), errors=r_hf["errors"] + r_vl["errors"])
    print(json.dumps(out), flush=True)
    if not args.skip_server:
        r_ob = in_subprocess("openai", args)
        out.update(server_startup_s=r_ob["startup_s"], openai_tok_s=round(r_ob["tok_s"], 1),
                   openai_wall_s=round(r_ob["wall_s"], 1), openai_vs_hf=round(r_ob["tok_s"] / r_hf["tok_s"], 3),
                   openai_vs_vllm=round(r_ob["tok_s"] / r_vl["tok_s"], 3), openai_vs_vllm_target=0.85,
                   openai_vs_vllm_better=r_ob["tok_s"] / r_vl["tok_s"] >= 0.85,
                   openai_outputs_differing_from_vllm=differing(r_vl, r_ob))
        print(json.dumps(out), flush=True)
    if not args.skip_ray:
        r1, r2 = in_subprocess("ray1", args), in_subprocess("ray2", args)
        out.update(ray_1worker_wall_s=round(r1["wall_s"], 1), ray_2workers_wall_s=round(r2["wall_s"], 1),
                   ray_speedup=round(r1["wall_s"] / r2["wall_s"], 3), ray_outputs_differing=differing(r1, r2))
    finish(out)


if __name__ == "__main__":
    main()
