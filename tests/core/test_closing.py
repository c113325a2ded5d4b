"""Closing mode (constraints/closing.py): a constrained answer always finishes inside its budget.

Oracles: ``regex`` / ``jsonschema`` / a fresh engine replay for every answer; brute-force enumeration (the
``regex`` module's partial matching) for the witness's length on the byte tokenizer.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import regex
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import parse_spec
from formtax.constraints.closing import search_witness, start_witness
from formtax.constraints.compile import compile_grammar, validate_with_engine
from formtax.decoding.loop import Plan, Policy, RowRequest, Veto, decode
from formtax.errors import ConfigError

OPEN = {  # unbounded languages: an open JSON object, free-string regexes, a recursive Lark grammar
    "json": 'json:{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":'
            '{"type":"integer"}}},"required":["a","b"]}',
    "json-nested": 'json:{"type":"object","properties":{"p":{"type":"object","properties":{"q":{"type":"string",'
                   '"minLength":2}},"required":["q"]}},"required":["p"],"additionalProperties":false}',
    "regex": "regex:[a-z]+ ok",
    "regex-words": r"regex:(\w+ )*end\.",
    "lark": 'lark:start: "(" item ("," item)* ")"\nitem: /[a-z]+/ | start',
}


def in_language(spec: str, text: str) -> bool:
    kind, body = spec.split(":", 1)
    if kind == "regex":
        return regex.fullmatch(body, text) is not None
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), json.loads(body))
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    return validate_with_engine(parse_spec(spec).grammar, text)[0]


def witness_len(backend: FakeBackend, spec: str) -> int:
    tok = backend.tokenizer
    w = start_witness(compile_grammar(parse_spec(spec).grammar, tok.engine), tok.n_logits)
    assert w is not None
    return len(w)


@given(seed=st.integers(0, 10_000), name=st.sampled_from(sorted(OPEN)), slack=st.integers(0, 12),
       temperature=st.sampled_from([0.0, 1.0]))
@settings(max_examples=120, deadline=None)
def test_every_answer_finishes_inside_the_budget(seed, name, slack, temperature):
    spec = OPEN[name]
    b = FakeBackend(random_logits(seed=seed))
    budget = witness_len(b, spec) + slack
    r = formtax.generate(b, "q", "constrained", spec, max_tokens=budget, temperature=temperature, seed=seed,
                         raw=True)
    assert r.parse_ok, (spec, budget, r.text, r.finish_reason)
    assert r.tokens.total <= budget and in_language(spec, r.answer_text or "")


def test_without_closing_the_same_requests_run_out():
    spec, b = OPEN["json"], FakeBackend(random_logits(seed=3))
    budget = witness_len(b, spec) + 4
    off = [formtax.generate(FakeBackend(random_logits(seed=s)), "q", "constrained", spec, max_tokens=budget,
                            raw=True, closing=False) for s in range(20)]
    assert sum(r.finish_reason == "length-incomplete" for r in off) >= 10
    on = [formtax.generate(FakeBackend(random_logits(seed=s)), "q", "constrained", spec, max_tokens=budget,
                           raw=True) for s in range(20)]
    assert all(r.parse_ok for r in on)
    assert b is not None


@pytest.mark.parametrize("strategy", ["json", "inwriting", "nl2format"])
@pytest.mark.parametrize("seed", range(8))
def test_closing_holds_for_the_two_phase_strategies(strategy, seed):
    spec = OPEN["regex-words"]
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", strategy, spec, max_tokens=200, raw=True)
    assert r.parse_ok, (strategy, r.text, r.finish_reason)
    value = r.parsed if strategy != "json" else json.loads(r.answer_text or "")["answer"]
    assert regex.fullmatch(r"(\w+ )*end\.", value)


def test_a_budget_no_completion_fits_is_refused_before_decoding():
    spec = OPEN["json"]  # the shortest completion is {"a": "", "b": []}: 18 bytes
    b = FakeBackend(random_logits(seed=0))
    assert witness_len(b, spec) == 18
    with pytest.raises(ConfigError, match=r"closing mode: no completion .* fits in 17 tokens \(the shortest found "
                                          r"takes 18\)"):
        formtax.generate(b, "q", "constrained", spec, max_tokens=17)
    assert formtax.generate(b, "q", "constrained", spec, max_tokens=18).parse_ok


@given(seed=st.integers(0, 10_000), name=st.sampled_from(sorted(OPEN)))
@settings(max_examples=40, deadline=None)
def test_closing_changes_nothing_when_the_budget_does_not_bind(seed, name):
    spec = OPEN[name]
    kw = dict(max_tokens=400, raw=True)
    off = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", spec, closing=False, **kw)
    on = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", spec, **kw)
    assume(off.finish_reason in ("eos", "constraint-complete") and off.tokens.total < 300)
    assert on.token_ids == off.token_ids


def shortest_by_enumeration(pattern: str, prefix: str, alphabet: str, limit: int = 16) -> int | None:
    """Breadth-first over strings, pruned by the ``regex`` module's partial matching: the exact shortest."""
    level = [""]
    for n in range(limit + 1):
        for s in level:
            if regex.fullmatch(pattern, prefix + s):
                return n
        level = [s + c for s in level for c in alphabet if regex.fullmatch(pattern, prefix + s + c, partial=True)]
    return None


CASES = [("[a-z]+ ok", "", "ako "), ("[a-z]+ ok", "abc", "ako "), ("(ab|cd)+e{2,3}", "", "abcde"),
         ("(xb|ybbbbb)c", "y", "xybc"), ("a{3}b?", "", "ab"), ("(0|[1-9][0-9]*)\\.[0-9]{2}", "1", "019."),
         ("\\((a,)*a\\)", "(a,", "a,()"), ("(yes|no|maybe) because [0-9]+", "ma", "abcemnosuy 01")]


@pytest.mark.parametrize(("pattern", "prefix", "alphabet"), CASES)
def test_the_witness_is_the_shortest_completion_on_bytes(pattern, prefix, alphabet):
    b = FakeBackend(random_logits(seed=0))
    tok = b.tokenizer
    m = compile_grammar(parse_spec(f"regex:{pattern}").grammar, tok.engine).matcher(tok.n_logits)
    assert m.consume_many(tok.encode(prefix)) if prefix else True
    w = search_witness(m.ll, tok.engine)
    assert w is not None
    assert regex.fullmatch(pattern, prefix + tok.decode_text(w))
    assert len(w) == shortest_by_enumeration(pattern, prefix, alphabet)


class _Refuse(Policy):
    """Allows everything, refuses the first ``n`` tokens the loop chooses; stops after one token."""

    def __init__(self, n: int, fallback: int) -> None:
        self.n, self.fallback, self.asked = n, fallback, []

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        def accept(t: int) -> bool:
            self.asked.append(t)
            return len(self.asked) > self.n

        return Plan(veto=Veto(accept, lambda: self.fallback, tries=4))

    def advance(self, token: int) -> str | None:
        return "done"


def test_a_vetoed_choice_is_made_again_then_falls_back():
    b = FakeBackend(random_logits(seed=1))
    logits = random_logits(seed=1)([0])
    order = torch.argsort(logits, descending=True).tolist()
    p = _Refuse(2, fallback=7)
    (out,) = decode(b, [RowRequest([0], p, 5)])
    assert p.asked == order[:3] and out.tokens == [order[2]] and not out.steps[0].forced
    p = _Refuse(10, fallback=7)
    (out,) = decode(b, [RowRequest([0], p, 5)])
    assert p.asked == order[:4] and out.tokens == [7] and out.steps[0].forced


def test_a_choice_answers_at_its_shortest_budget_with_closing():
    b = FakeBackend(random_logits(seed=5))
    with pytest.raises(ConfigError, match="needs up to 6 tokens"):
        formtax.generate(b, "q", "constrained", "choice:yes|no|maybe", max_tokens=2, closing=False)
    r = formtax.generate(b, "q", "constrained", "choice:yes|no|maybe", max_tokens=2)
    assert r.parse_ok and r.parsed == "no"
    with pytest.raises(ConfigError, match="closing mode: no completion"):
        formtax.generate(b, "q", "constrained", "choice:yes|no|maybe", max_tokens=1)
