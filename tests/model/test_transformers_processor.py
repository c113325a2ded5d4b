"""formtax's strategies inside the user's own transformers ``model.generate`` (integrations/transformers.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

import formtax
from formtax.errors import ConfigError
from formtax.integrations.transformers import FormtaxLogitsProcessor

pytestmark = pytest.mark.model

Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
CASES = [("free", None), ("constrained", "The answer is: {int:0..99}"), ("json", "{int:0..99}"),
         ("inwriting", "The answer is: {int:0..99}"), ("inwriting", int), ("short", "{choice:yes|no}")]


@pytest.mark.parametrize(("strategy", "answer"), CASES)
def test_processor_is_token_identical_to_formtax_generate(default_model, strategy, answer):
    m = default_model
    ref = formtax.generate(m, Q, strategy, answer, max_tokens=80)
    ids = torch.tensor([m.tokenizer.prompt_ids([{"role": "user", "content": Q}])])
    proc = FormtaxLogitsProcessor(m.model, m.tokenizer.hf, strategy, answer, max_tokens=80)
    out = m.model.generate(ids, attention_mask=torch.ones_like(ids), logits_processor=LogitsProcessorList([proc]),
                           max_new_tokens=proc.max_new_tokens, do_sample=False, pad_token_id=m.tokenizer.pad_id)
    (res,) = proc.results(out)
    assert res.token_ids == ref.token_ids, (strategy, res.text, ref.text)
    assert (res.answer_text, res.parsed, res.parse_ok, res.finish_reason) == (
        ref.answer_text, ref.parsed, ref.parse_ok, ref.finish_reason)
    assert res.error is None


def test_processor_refuses_multi_pass_strategies_and_needs_a_run(default_model):
    with pytest.raises(ConfigError, match="more than one pass"):
        FormtaxLogitsProcessor(default_model, None, "suffix-last", "The answer is: {int}")
    proc = FormtaxLogitsProcessor(default_model, None, "constrained", "{int:0..9}", max_tokens=20)
    with pytest.raises(ConfigError, match="has not run"):
        proc.results(torch.zeros(1, 3, dtype=torch.long))


OPEN_JSON = {"type": "object", "properties": {"name": {"type": "string"}, "story": {"type": "string"}},
             "required": ["name", "story"]}


@pytest.mark.parametrize("budget", [14, 16])
def test_closing_mode_is_token_identical_and_finishes_at_a_binding_budget(default_model, budget):
    m, q, strategy = default_model, "Write a long story about a dragon as JSON with a name and a story.", "constrained"
    off = formtax.generate(m, q, strategy, OPEN_JSON, max_tokens=budget, closing=False)
    assert off.finish_reason == "length-incomplete" and not off.parse_ok  # the budget binds
    ref = formtax.generate(m, q, strategy, OPEN_JSON, max_tokens=budget)
    assert ref.parse_ok and ref.tokens.total <= budget
    ids = torch.tensor([m.tokenizer.prompt_ids([{"role": "user", "content": q}])])
    proc = FormtaxLogitsProcessor(m.model, m.tokenizer.hf, strategy, OPEN_JSON, max_tokens=budget)
    out = m.model.generate(ids, attention_mask=torch.ones_like(ids), logits_processor=LogitsProcessorList([proc]),
                           max_new_tokens=proc.max_new_tokens, do_sample=False, pad_token_id=m.tokenizer.pad_id)
    (res,) = proc.results(out)
    assert res.token_ids == ref.token_ids and res.parse_ok


def test_closing_reserves_a_choice_at_its_likely_length(default_model):
    m = default_model
    choice = "choice:positive|negative|neutral"
    with pytest.raises(ConfigError, match="needs up to 9 tokens"):
        formtax.generate(m, "Sentiment of 'I love it'?", "constrained", choice, max_tokens=8, closing=False)
    longest = max(len(m.tokenizer.encode(o)) for o in ("positive", "negative", "neutral"))
    r = formtax.generate(m, "Sentiment of 'I love it'?", "constrained", choice, max_tokens=longest)
    assert r.parse_ok and r.parsed in ("positive", "negative", "neutral")
    r = formtax.generate(m, "Sentiment of 'I love it'? Think first.", "inwriting", choice, max_tokens=longest + 2)
    assert r.parse_ok
