"""The plugin's rows for a stock server's clients (formtax.backends.vllm.rows) on a simulated engine (no vLLM):
the engine's semantics of a stock request (the processor edits the logits, the engine draws greedily, EOS or
``max_tokens`` ends it), with the partial prefills of chunked prefill, and a row whose policy raises beside
others. Issue 57: InWriting's text parses with ``formtax.parse``; a complete constrained answer ends with EOS
inside the budget (``stop``); a discarded first sample never advances a row; a failing row says why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import formtax
from formtax.backends.fake import FakeBackend, random_logits, scripted
from formtax.backends.vllm.logits_processor import apply_rows
from formtax.backends.vllm.rows import ERROR_TEXT, EngineSide, RowSpec, explainer

Q = [{"role": "user", "content": "What is 2+3?"}]


def params(max_tokens, seed=0, **kw):
    return SimpleNamespace(max_tokens=max_tokens, seed=seed, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, **kw)


def run_engine(fn, rows, prompts, max_tokens, discard_first=0):
    """vLLM's loop over stock rows: every step the processor edits the batch's logits, the engine takes the argmax;
    the first ``discard_first`` steps are partial prefills whose samples are discarded (chunked prefill)."""
    outs = [[] for _ in rows]
    done = [False] * len(rows)
    finish = ["length"] * len(rows)
    tok = FakeBackend(fn).tokenizer
    step = 0
    while not all(done):
        live = [k for k in range(len(rows)) if not done[k]]
        logits = torch.stack([fn(prompts[k] + outs[k]).float() for k in live])
        for k in live:
            rows[k].catch_up(outs[k])
        apply_rows(logits, [(rows[k], j, None) for j, k in enumerate(live)])
        step += 1
        if step <= discard_first:
            continue  # a partial prefill: the sample is never appended
        for j, k in enumerate(live):
            t = int(torch.argmax(logits[j]))
            outs[k].append(t)
            if t in tok.eos_ids:
                done[k], finish[k] = True, "stop"
            elif len(outs[k]) >= max_tokens:
                done[k] = True
    return outs, finish


def stock_row(fn, xargs, max_tokens, prompt):
    tok = FakeBackend(fn).tokenizer
    row = RowSpec.of(xargs).live_row(EngineSide(tok, "sim"), prompt, params(max_tokens))
    row.explain = explainer(tok)
    return row


def text_of(fn, tokens):
    tok = FakeBackend(fn).tokenizer
    return tok.decode_text([t for t in tokens if t not in tok.eos_ids])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_inwriting_text_is_result_text_and_parses(seed):
    fn = random_logits(seed=seed)
    tok = FakeBackend(fn).tokenizer
    prompt = tok.prompt_ids(Q)
    spec = "The answer is: {int}"
    for budget in (30, 60):
        row = stock_row(fn, {"formtax_strategy": "inwriting", "formtax_answer": spec}, budget, prompt)
        (out,), (finish,) = run_engine(fn, [row], [prompt], budget)
        text = text_of(fn, out)
        got = formtax.parse(text, spec, strategy="inwriting")
        assert got.parse_ok, text
        # the same reasoning as formtax's own InWriting with the row's budget, then the answer on its own line
        ref = formtax.generate(FakeBackend(fn), Q, "inwriting", spec, max_tokens=budget - 2)
        assert text.startswith(ref.reasoning)
        if ref.reasoning and not ref.reasoning[-1].isspace():
            assert text[len(ref.reasoning)] == "\n"
        assert got.reasoning == ref.reasoning
        assert finish == "stop"


def test_the_seam_matches_result_text_on_a_scripted_model():
    fn = scripted("Let me think. 2+3=5. So")
    tok = FakeBackend(fn).tokenizer
    prompt = tok.prompt_ids(Q)
    row = stock_row(fn, {"formtax_strategy": "inwriting", "formtax_answer": "The answer is: {int:0..9}"}, 40, prompt)
    (out,), _ = run_engine(fn, [row], [prompt], 40)
    ref = formtax.generate(FakeBackend(fn), Q, "inwriting", "The answer is: {int:0..9}", max_tokens=38)
    assert text_of(fn, out) == ref.text  # Result.text's line break, written by the row
    assert formtax.parse(ref.text, "The answer is: {int:0..9}", strategy="inwriting").parsed == ref.parsed


@pytest.mark.parametrize(("strategy", "spec"), [("constrained", "The answer is: {int}"), ("json", "{int}"),
                                                ("inwriting", "The answer is: {int}")])
@pytest.mark.parametrize("discard", [1, 3])
def test_a_partial_prefills_discarded_sample_never_advances_a_row(strategy, spec, discard):
    fn = random_logits(seed=5)
    tok = FakeBackend(fn).tokenizer
    prompt = tok.prompt_ids(Q)
    xargs = {"formtax_strategy": strategy, "formtax_answer": spec}
    want, _ = run_engine(fn, [stock_row(fn, xargs, 40, prompt)], [prompt], 40)
    got, finish = run_engine(fn, [stock_row(fn, xargs, 40, prompt)], [prompt], 40, discard_first=discard)
    assert got == want and finish == ["stop"]
    assert formtax.parse(text_of(fn, got[0]), spec, strategy=strategy).parse_ok


@pytest.mark.parametrize("budget", [17, 18, 20, 25])
def test_a_complete_closing_answer_ends_with_eos_inside_the_budget(budget):
    fn = random_logits(seed=2)
    tok = FakeBackend(fn).tokenizer
    prompt = tok.prompt_ids(Q)
    row = stock_row(fn, {"formtax_strategy": "constrained", "formtax_answer": "The answer is: {int}"}, budget, prompt)
    (out,), (finish,) = run_engine(fn, [row], [prompt], budget)
    assert finish == "stop" and out[-1] in tok.eos_ids
    assert formtax.parse(text_of(fn, out), "The answer is: {int}").parse_ok


def test_a_row_whose_policy_raises_fails_alone_and_says_why():
    fn = random_logits(seed=1)
    tok = FakeBackend(fn).tokenizer
    prompt = tok.prompt_ids(Q)
    xargs = {"formtax_strategy": "constrained", "formtax_answer": "The answer is: {int}"}
    alone, _ = run_engine(fn, [stock_row(fn, xargs, 90, prompt)], [prompt], 90)
    bad = stock_row(fn, xargs, 90, prompt)
    calls = {"n": 0}
    plan = bad.policy.plan

    def broken(logits, step):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("policy bug")
        return plan(logits, step)

    bad.policy.plan = broken
    outs, finish = run_engine(fn, [stock_row(fn, xargs, 90, prompt), bad, stock_row(fn, xargs, 90, prompt)],
                              [prompt] * 3, 90)
    assert outs[0] == alone[0] and outs[2] == alone[0]  # the others are untouched
    text = text_of(fn, outs[1])
    assert ERROR_TEXT.format("RuntimeError: policy bug") in text and bad.error == "RuntimeError: policy bug"
    assert finish[1] == "stop"
