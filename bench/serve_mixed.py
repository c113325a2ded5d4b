"""``formtax serve`` (hf, the embedded default) with mixed sampling (issue 44 point 5): a short greedy request's
latency while a long sampled one decodes, against the same short request alone. Rows sample under their own
settings, so the short one joins the running batch instead of waiting for it.

ratio = median latency during the long request / median latency alone (target <= 1.3, lower is better), side by
side in one run, repeated.

    python bench/serve_mixed.py
"""

from __future__ import annotations

import statistics
import threading
import time

from _common import finish, load_default

from formtax.serve.app import ServerThread, create_app

REPEATS = 5
SHORT, LONG = 8, 200


def main() -> None:
    import openai

    m = load_default()
    app = create_app(m, max_batch=8, window_s=0.0, temperature=0.0)
    alone, during = [], []
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=600)

        def ask(tokens: int, temperature: float, content: str) -> float:
            t = time.perf_counter()
            client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                           max_tokens=tokens, temperature=temperature, seed=1,
                                           extra_body={"min_tokens": tokens} if temperature > 0 else None)
            return time.perf_counter() - t

        ask(SHORT, 0.0, "Warm up.")
        for k in range(REPEATS):
            alone.append(ask(SHORT, 0.0, f"Name a colour ({k})."))
            long = threading.Thread(target=ask, args=(LONG, 1.0, f"Tell a long story ({k})."))
            long.start()
            time.sleep(1.0)  # the long request is decoding
            during.append(ask(SHORT, 0.0, f"Name a colour ({k})."))
            long.join()
    ratio = statistics.median(during) / statistics.median(alone)
    finish({"bench": "serve_mixed", "ratio": round(ratio, 3), "target": 1.3, "better": "lower",
            "short_alone_s": round(statistics.median(alone), 3), "short_during_long_s": round(statistics.median(during), 3),
            "short_tokens": SHORT, "long_tokens": LONG, "repeats": REPEATS,
            "batches": app.state.batcher.batches[-2 * REPEATS:]})


if __name__ == "__main__":
    main()
