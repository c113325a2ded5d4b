"""Greedy outputs of batched decoding are token-identical to the per-row loop they replaced (issue 18).

``tests/fixtures/golden_greedy_batch.json`` was written by the decode loop before its batched step (each row
chose with its own clone, argmax and host sync): 6 prompts per batch, two logit seeds, nine strategy / answer
cases including suffix-beam (whose coupled rows still step one by one). Regenerate only on purpose.
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
    rs = formtax.generate_batch(FakeBackend(random_logits(seed=int(seed))), PROMPTS, strategy,
                                None if spec == "None" else spec, max_tokens=60, closing=False)
    assert [r.token_ids for r in rs] == GOLDEN[key]
