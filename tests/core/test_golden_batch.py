"""Greedy outputs of batched decoding are token-identical to the per-row loop they replaced (issue 18).

``tests/fixtures/golden_greedy_batch.json`` was written by the decode loop before its batched step (each row
chose with its own clone, argmax and host sync): 6 prompts per batch, two logit seeds, nine strategy / answer
cases including suffix-beam (whose coupled rows still step one by one). Regenerate only on purpose.

The json cases are compared with the same prompts decoded one at a time instead: since the reason's cap is kept by
the policy (constraints/jsonstrings.py) a string no longer ends inside a UTF-8 character at the cap, so the old
outputs, which did (``243, 137, 165, 34``: three bytes of a four-byte character, then the quote), are not the
reference any more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "golden_greedy_batch.json").read_text())
PROMPTS = [f"question {k}" for k in range(6)]


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_batched_greedy_matches_the_golden_outputs(key):
    seed, strategy, spec = key.split("|", 2)
    answer = None if spec == "None" else spec
    rs = formtax.generate_batch(FakeBackend(random_logits(seed=int(seed))), PROMPTS, strategy, answer,
                                max_tokens=60, closing=False)
    if strategy != "json":
        assert [r.token_ids for r in rs] == GOLDEN[key]
        return
    alone = [formtax.generate(FakeBackend(random_logits(seed=int(seed))), p, strategy, answer, max_tokens=60,
                              closing=False).token_ids for p in PROMPTS]
    assert [r.token_ids for r in rs] == alone
    assert all(r.parse_ok for r in rs)
