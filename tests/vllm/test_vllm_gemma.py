"""The offline ``vllm`` backend on the second real model, Gemma 3 270M (pre-trained, 262k SentencePiece vocabulary,
no chat template), from formtax[gemma]: vLLM runs its architecture (Gemma3ForCausalLM) on CPU from the same
de-quantised folder the transformers backend loads; greedy outputs agree with transformers token for token
(float32 on both sides) and every constrained answer passes its oracle on this tokenizer."""

from __future__ import annotations

import json
import warnings

import pytest

import formtax
from formtax.constraints.parse import parse_spec

pytest.importorskip("vllm.sampling_params")
pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.gemma, pytest.mark.slow]

PROMPTS = [
    "Question: A box holds 6 pens. How many pens are in 5 boxes?\nAnswer:",
    "The capital of France is",
    "Question: Name a primary color.\nAnswer:",
    "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:",
]


@pytest.fixture(scope="module")
def vllm_gemma(gemma_model):
    """vLLM's engine on Gemma (``gemma_model`` first: it makes sure the extra is installed and the folder exists)."""
    from formtax.backends import load_backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backend("vllm", "gemma3-270m", dtype="float32", enforce_eager=True)


def test_greedy_agrees_with_transformers_on_gemma(vllm_gemma, gemma_model):
    assert vllm_gemma.tokenizer.n_logits == 262144 and not vllm_gemma.tokenizer.has_chat_template
    ref = formtax.generate_batch(gemma_model, PROMPTS, "free", None, max_tokens=24, raw=True)
    got = formtax.generate_batch(vllm_gemma, PROMPTS, "free", None, max_tokens=24, raw=True)
    identical = sum(a.token_ids == b.token_ids for a, b in zip(ref, got, strict=True))
    print("vllm-vs-hf agreement on gemma:", json.dumps({"prompts": len(PROMPTS), "identical": identical}))
    assert all(r.tokens.prompt == len(gemma_model.tokenizer.prompt_ids(p)) for r, p in zip(got, PROMPTS, strict=True))
    assert identical >= len(PROMPTS) - 1


@pytest.mark.parametrize(("strategy", "spec"), [
    ("constrained", "The answer is: {int:0..999}"),
    ("constrained", "{choice:red|blue|yellow}"),
    ("constrained", "regex:[A-Z][a-z]{1,8} [0-9]{2}"),
    ("inwriting", "The answer is: {int:0..999}"),
])
def test_constrained_outputs_pass_the_oracle_on_gemma(vllm_gemma, strategy, spec):
    oracle = parse_spec(spec)
    for r in formtax.generate_batch(vllm_gemma, PROMPTS[:2], strategy, spec, max_tokens=40, raw=True):
        assert r.error is None and r.parse_ok, (r.text, r.answer_text)
        assert oracle.validate(r.answer_text).ok, r.answer_text
        assert r.masked_mass is not None and 0.0 <= r.masked_mass <= 1.0
