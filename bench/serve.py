"""``formtax serve`` vs the same requests in-process, on the embedded default (paper-free engineering target).

ratio = server throughput / in-process throughput (target >= 0.8): 16 concurrent clients (official openai client,
one request each) against one in-process ``generate_batch`` of the same 16 requests, side by side in one run,
repeated, median. Also the latency overhead of one request through HTTP (server - in-process, median).

    python bench/serve.py
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from _common import PROMPTS, finish, load_default

import formtax
from formtax.serve.app import ServerThread, create_app

SPEC = "The answer is: {int:0..999}"
N_CLIENTS = 16
MAX_TOKENS = 48
REPEATS = 3


def main() -> None:
    import openai

    m = load_default()
    prompts = [PROMPTS[k % len(PROMPTS)] + f" (request {k})" for k in range(N_CLIENTS)]
    app = create_app(m, max_batch=N_CLIENTS, window_s=0.05, temperature=0.0)
    ratios, overheads = [], []
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=600)

        def ask(p: str) -> object:
            return client.chat.completions.create(model="default", messages=[{"role": "user", "content": p}],
                                                  max_tokens=MAX_TOKENS,
                                                  extra_body={"formtax": {"strategy": "inwriting", "answer": SPEC}})

        ask(prompts[0])  # warm-up
        for _ in range(REPEATS):
            t = time.perf_counter()
            formtax.generate_batch(m, prompts, "inwriting", SPEC, max_tokens=MAX_TOKENS)
            t_in = time.perf_counter() - t
            t = time.perf_counter()
            with ThreadPoolExecutor(N_CLIENTS) as ex:
                list(ex.map(ask, prompts))
            t_srv = time.perf_counter() - t
            ratios.append(t_in / t_srv)
            t = time.perf_counter()
            formtax.generate(m, prompts[1], "inwriting", SPEC, max_tokens=MAX_TOKENS)
            one_in = time.perf_counter() - t
            t = time.perf_counter()
            ask(prompts[1])
            overheads.append(time.perf_counter() - t - one_in)
    finish({"bench": "serve", "ratio": round(statistics.median(ratios), 3), "target": 0.8, "better": "higher",
            "clients": N_CLIENTS, "batches": app.state.batcher.batches[-N_CLIENTS:],
            "latency_overhead_s": round(statistics.median(overheads), 4), "ratios": [round(r, 3) for r in ratios]})


if __name__ == "__main__":
    main()
