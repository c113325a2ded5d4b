"""Issue 49: InWriting's switch at a spent preamble budget is reported as ``budget``, even where the model wanted to
stop at that very step (it used to say ``eos``, hiding that the budget cut the reasoning). A model that writes
"hi" and then wants EOS: with a preamble budget of exactly 2 the switch is the budget's; with room, the model's."""

from __future__ import annotations

import formtax
from formtax.backends.fake import FakeBackend, scripted


def test_a_budget_forced_switch_says_budget():
    m = FakeBackend(scripted("hi"))
    seen = []
    for max_tokens in range(6, 40):
        r = formtax.generate(m, "q", "inwriting", "{choice:yes|no}", max_tokens=max_tokens, closing=False)
        seen.append((r.stats["switch_step"], r.stats["switch_reason"]))
    steps = [s for s, _ in seen]
    first_two = steps.index(2)  # the smallest budget that holds "hi": the preamble budget is exactly 2 there
    assert all(reason == "budget" for step, reason in seen[:first_two + 1]), seen
    assert all(reason == "eos" and step == 2 for step, reason in seen[first_two + 1:]), seen
