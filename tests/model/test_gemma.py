"""The core oracles on a second real model and tokenizer: Gemma 3 270M (pre-trained, no chat template, 262k
SentencePiece vocabulary with ``▁``-prefixed and byte-fallback tokens), from formtax[gemma]."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

import formtax
from formtax.constraints import parse_spec

pytestmark = [pytest.mark.model, pytest.mark.gemma]

QUESTION = "Question: A box holds 6 pens. How many pens are in 5 boxes?\nAnswer:"
PROMPTS = [
    QUESTION,
    "The capital of France is",
    "Question: Name a primary color.\nAnswer:",
    [{"role": "user", "content": "What is 7 + 5?"}],  # no chat template: the messages' text, concatenated
]


def test_the_model_is_the_pretrained_gemma_with_its_vocabulary(gemma_model) -> None:
    tok = gemma_model.tokenizer
    assert tok.n_logits == 262144 and not tok.has_chat_template
    assert gemma_model.model.config.architectures == ["Gemma3ForCausalLM"]
    assert "Gemma-3-270M (pre-trained" in gemma_model.model_id
    pieces = tok.hf.tokenize(" The answer is: 42")
    assert pieces[0] == "▁The"  # SentencePiece's space marker, the tokenizer issue's point
    # a plain prompt and concatenated messages both start with Gemma's BOS (no chat template to write it)
    bos = tok.hf.bos_token_id
    assert tok.prompt_ids(QUESTION)[0] == bos
    assert tok.prompt_ids([{"role": "user", "content": "What is 7 + 5?"}])[:2] == [bos, *tok.hf.encode(
        "What", add_special_tokens=False)[:1]]


def test_free_greedy_is_token_identical_to_transformers_generate(gemma_model) -> None:
    m = gemma_model
    ours = formtax.generate_batch(m, PROMPTS, "free", None, max_tokens=20, raw=True)
    for prompt, r in zip(PROMPTS, ours, strict=True):
        ids = m.tokenizer.prompt_ids(prompt)
        inp = torch.tensor([ids])
        ref = m.model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=20, do_sample=False,
                               pad_token_id=m.tokenizer.pad_id)
        assert r.token_ids == ref[0, len(ids):].tolist(), (prompt, r.text)


@pytest.mark.parametrize(("strategy", "spec"), [
    ("constrained", "The answer is: {int:0..999}"),
    ("inwriting", "The answer is: {int:0..999}"),
    ("nl2format", "The answer is: {int:0..999}"),
    ("constrained", "{choice:red|blue|yellow}"),
    ("constrained", "{letters:4}"),
    ("constrained", "regex:[A-Z][a-z]+ [0-9]{2}"),
])
def test_every_constrained_output_is_valid_by_the_oracle(gemma_model, strategy: str, spec: str) -> None:
    r = formtax.generate(gemma_model, QUESTION, strategy, spec, max_tokens=48, raw=True)
    assert r.error is None and r.parse_ok, r.text
    c = parse_spec(spec)
    assert c.validate(r.answer_text).ok, (spec, r.answer_text)  # the Python oracle, independent of the engine
    if spec.startswith("regex:"):
        assert re.fullmatch(spec[len("regex:"):], r.answer_text)


def test_json_outputs_validate_against_their_schema(gemma_model) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"], "additionalProperties": False}
    r = formtax.generate(gemma_model, "The largest city of France, as JSON:", "constrained",
                         "json:" + json.dumps(schema), max_tokens=60, raw=True)
    assert r.parse_ok, r.text
    jsonschema.validate(json.loads(r.answer_text), schema)
    r = formtax.generate(gemma_model, QUESTION, "json", "{int:0..999}", max_tokens=64, raw=True)
    obj = json.loads(r.answer_text if r.answer_text is not None else r.text)
    assert set(obj) == {"reason", "answer"} and 0 <= obj["answer"] <= 999


def test_inwriting_is_free_greedy_until_its_switch(gemma_model) -> None:
    free = formtax.generate(gemma_model, QUESTION, "free", None, max_tokens=40, raw=True)
    r = formtax.generate(gemma_model, QUESTION, "inwriting", "The answer is: {int}", max_tokens=60, raw=True,
                         triggers=["\n"])
    n = r.stats["switch_step"]
    assert r.token_ids[:n] == free.token_ids[:n] and r.parse_ok
    assert gemma_model.tokenizer.eos_ids.isdisjoint(r.token_ids[:n])  # EOS is masked in the preamble


def test_suffix_start_set_holds_the_space_prefixed_tokens(gemma_model) -> None:
    from formtax.strategies.suffix_policies import suffix_answer

    tok = gemma_model.tokenizer
    s = suffix_answer(parse_spec("The answer is: {int}"), tok).start
    ids = set(s.nonzero().flatten().tolist())
    for piece in ("The", "▁The"):  # the template after an optional space: both spellings (llguidance allows the
        # canonical pieces of the literal, as on SmolLM2, where S decodes to {"The", " The"})
        i = tok.hf.convert_tokens_to_ids(piece)
        assert i in ids, piece
    # and nothing that cannot begin " The answer..." / "The answer..." / "\nThe answer...": each token decodes to a
    # prefix of one of them, or extends one by the template's next bytes
    for i in ids:
        text = tok.hf.convert_tokens_to_string([tok.hf.convert_ids_to_tokens(i)]).replace("▁", " ")
        assert any(v.startswith(text) for v in ("The answer is: ", " The answer is: ", "\nThe answer is: ")), text


@pytest.mark.slow
def test_paper_000s_grid_runs_with_the_base_prompt(gemma_model, tmp_path) -> None:
    """`formtax run --model gemma3-270m --task gsm8k --shots 4` takes the plain few-shot prompt (no chat template),
    the same text for every strategy; the suffix strategies and the constrained baseline always parse."""
    from formtax.records import read_records
    from formtax.report import verify_report, write_report
    from formtax.runner import RunConfig, run

    cfg = RunConfig(task="gsm8k", model="gemma3-270m", strategies=["free", "suffix-last", "constrained"],
                    limit=2, shots=4, max_tokens=40, batch_size=2)
    assert run(cfg, tmp_path, backend=gemma_model).errors == 0
    records = read_records(tmp_path / "records.jsonl")
    assert {r.prompt_style for r in records} == {"base"}
    assert all(r.prompt.count("Question: ") == 5 and r.prompt.endswith("\nAnswer:") for r in records)
    assert len({(r.item_id, r.prompt) for r in records}) == 2
    assert all(r.parses["strict"].status == "ok" for r in records if r.strategy != "free")
    write_report(tmp_path, n_resamples=100)
    assert verify_report(tmp_path) == []
