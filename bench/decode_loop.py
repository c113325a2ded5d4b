"""Our decode loop vs transformers' model.generate, greedy free decoding, same prompts and lengths.

ratio = our wall time / transformers' wall time (target <= 1.10). Lengths are forced equal: EOS is suppressed on both
sides (generate: min_new_tokens; ours: a policy that bans EOS), so both run exactly N steps.
"""

from __future__ import annotations

import torch
from _common import PROMPTS, finish, load_default, timed

from formtax.decoding import Plan, Policy, RowRequest, decode

N = 64


class NoEos(Policy):
    phase = "free"

    def __init__(self, eos: frozenset[int]) -> None:
        self.banned = sorted(eos)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        return Plan(banned=self.banned)

    def advance(self, token: int) -> str | None:
        return None


def main() -> None:
    m = load_default()
    tok = m.tokenizer
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS[:4]]
    outs_ours: list[list[int]] = []
    outs_ref: list[list[int]] = []

    def ours() -> None:
        outs_ours.clear()
        for p in ids:
            outs_ours.append(decode(m, [RowRequest(p, NoEos(tok.eos_ids), N)])[0].tokens)

    def ref() -> None:
        outs_ref.clear()
        for p in ids:
            inp = torch.tensor([p])
            g = m.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=N, min_new_tokens=N,
                                 do_sample=False, pad_token_id=tok.pad_id)
            outs_ref.append(g[0, len(p):].tolist())

    ref()  # warm-up
    t_ref = timed(ref)
    t_ours = timed(ours)
    finish({"ratio": round(t_ours / t_ref, 3), "target": 1.10, "better": "lower", "ours_s": round(t_ours, 3),
            "transformers_s": round(t_ref, 3), "tokens_per_prompt": N, "prompts": len(ids), "batch": 1,
            "identical_tokens": outs_ours == outs_ref})


if __name__ == "__main__":
    main()
