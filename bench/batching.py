"""Free-strategy throughput at batch 8 vs batch 1 (same 8 prompts, equal lengths).

ratio = tokens/s at batch 8 / tokens/s at batch 1 (target >= 3).
"""

from __future__ import annotations

from _common import PROMPTS, finish, load_default, timed
from decode_loop import NoEos

from formtax.decoding import RowRequest, decode

N = 48


def main() -> None:
    m = load_default()
    tok = m.tokenizer
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]

    def b1() -> None:
        for p in ids:
            decode(m, [RowRequest(p, NoEos(tok.eos_ids), N)])

    def b8() -> None:
        decode(m, [RowRequest(p, NoEos(tok.eos_ids), N) for p in ids])

    b8()
    t1 = timed(b1, repeat=2)
    t8 = timed(b8, repeat=2)
    n = N * len(ids)
    finish({"ratio": round(t1 / t8, 3), "target": 3.0, "better": "higher", "tok_s_batch1": round(n / t1, 1),
            "tok_s_batch8": round(n / t8, 1), "tokens": n})


if __name__ == "__main__":
    main()
