"""The suffix strategies against a naive reference: the step-synchronous beam of 2, decoded from scratch.

The reference shares nothing with the library's decoding: no decode loop, no KV cache, no crop, no rewind. Every
logits row is computed from the whole sequence (the fake model's function, or a full forward of the real model),
the constrained hypothesis advances one token per step next to the free one and is replaced by a fresh branch when
the rule says so, and T' (an optional leading space or newline, then T) is run as three separate matchers (T,
" " + T, "\\n" + T) instead of the library's one union grammar. It must give the same tokens as the lazy form
(suffix-pipeline / -last / -min) and as suffix-beam.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from formtax.backends.fake import EOS, N_LOGITS, FakeBackend, random_logits
from formtax.constraints import parse_spec
from formtax.constraints.compile import Matcher, compile_grammar
from formtax.constraints.spec import TemplateConstraint
from formtax.strategies import get_strategy

Q = [{"role": "user", "content": "q"}]
WS = (" ", "\n")

LogitsFn = Callable[[Sequence[int]], torch.Tensor]


# -- the reference ---------------------------------------------------------------------------------------------


def _variants(spec: str) -> list[str]:
    """T and its whitespace-prefixed variants, as template sources (other constraints: T alone)."""
    c = parse_spec(spec)
    if not isinstance(c, TemplateConstraint):
        return [spec]
    return [c.source, " " + c.source, "\n" + c.source]


def _matchers(backend, spec: str) -> list[Matcher]:
    tok = backend.tokenizer
    return [compile_grammar(parse_spec(v).grammar, tok.engine).matcher(tok.n_logits) for v in _variants(spec)]


def reference_start_set(backend, spec: str) -> torch.Tensor:
    """S: tokens that can begin T, or begin " " + T / "\\n" + T while carrying a byte of T (no bare separator)."""
    tok = backend.tokenizer
    ms = _matchers(backend, spec)
    s = ms[0].allowed_mask().clone()
    for m in ms[1:]:
        for i in m.allowed_ids():
            if tok.decode([i]) not in WS:
                s[i] = True
    return s


class _Hypothesis:
    """The constrained hypothesis of the beam: branched at ``t``, advanced one token per step."""

    def __init__(self, backend, spec: str, t: int, start: torch.Tensor) -> None:
        self.t = t
        self.tokens: list[int] = []
        self.matchers = _matchers(backend, spec)
        self.start = start
        self.eos = backend.tokenizer.eos_ids
        self.done = False

    def advance(self, logits: torch.Tensor, room: int) -> None:
        if self.done:
            return
        if len(self.tokens) >= room or all(m.stopped for m in self.matchers):
            self.done = True
            return
        allowed = torch.zeros_like(self.start)
        for m in self.matchers:
            allowed |= m.allowed_mask()
        if not self.tokens:
            allowed &= self.start
        assert bool(allowed.any())
        token = int(torch.argmax(logits.clone().masked_fill_(~allowed, float("-inf"))).item())
        self.tokens.append(token)
        if token in self.eos:
            self.done = True
            return
        self.matchers = [m for m in self.matchers if bool(m.allowed_mask()[token])]  # the variants still alive
        assert self.matchers and all(m.consume(token) for m in self.matchers)


def reserve(c) -> int:
    """The answer's worst case (64 when unbounded), EOS, and one token for a leading whitespace variant."""
    return (c.max_tokens if c.max_tokens is not None else 64) + 1 + (1 if isinstance(c, TemplateConstraint) else 0)


def reference(backend, fn: LogitsFn, prompt: list[int], spec: str, max_tokens: int, rule: str, tau: float,
              prefix: Sequence[int] = ()) -> tuple[list[int], int]:
    """The output tokens and t* of the step-synchronous beam of 2 (greedy), everything recomputed from scratch."""
    start = reference_start_set(backend, spec)
    budget = max_tokens - reserve(parse_spec(spec))
    eos = backend.tokenizer.eos_ids
    y: list[int] = []
    con: _Hypothesis | None = None
    best = math.inf
    free_alive = True
    while free_alive or (con is not None and not con.done):
        if con is not None and not con.done:  # the constrained hypothesis: one token
            con.advance(fn(prompt + y[: con.t] + con.tokens), max_tokens - con.t)
        if not free_alive:
            continue
        t = len(y)  # the free hypothesis: one token, or its end
        logits = fn(prompt + y)
        if t < len(prefix) and t < budget:
            y.append(prefix[t])
            continue
        p = torch.softmax(logits.double(), dim=-1)
        delta = float(p.max() - p[start].max())
        greedy = int(torch.argmax(logits).item())
        end = t >= budget or greedy in eos
        if rule == "pipeline":
            take = end
        elif rule == "last":
            take = delta <= tau or (end and con is None)
        else:
            take = con is None or delta <= best
        if take:
            con, best = _Hypothesis(backend, spec, t, start), delta
            con.advance(logits, max_tokens - t)
        if end:
            free_alive = False
        else:
            y.append(greedy)
    assert con is not None
    return y[: con.t] + con.tokens, con.t


# -- a fake model that branches often --------------------------------------------------------------------------


def biased(seed: int, boost: Sequence[int], eos_boost: float, scale: float = 3.0) -> LogitsFn:
    """Random logits with some tokens (those that begin templates, EOS) made likelier, so that branch points,
    ties of delta = 0 and early EOS all happen."""
    base = random_logits(seed=seed, scale=scale)
    bias = torch.zeros(N_LOGITS)
    bias[list(boost)] = scale * 1.5
    bias[EOS] = eos_boost

    def fn(seq: Sequence[int]) -> torch.Tensor:
        return (base(seq) + bias).float()

    return fn


TEMPLATES = ["The answer is: {int}", "{int:0..999}", "Pick {choice:red|green|blue}.", "{letters:3}", " {int:0..99}",
             "regex:[0-9]{1,3}"]
BOOST = [ord(ch) for ch in "T1234 P\n"]

settings.register_profile("suffix", deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lazy_and_beam(backend, spec: str, max_tokens: int, rule: str, tau: float, reasoning: str | None = None):
    name = {"pipeline": "suffix-pipeline", "last": "suffix-last", "min": "suffix-min"}[rule]
    opts = {"tau": tau}
    lazy = get_strategy(name).run(backend, [_req(spec, max_tokens, opts, reasoning)])[0]
    beam = None
    if rule != "pipeline":
        beam = get_strategy("suffix-beam").run(
            backend, [_req(spec, max_tokens, {**opts, "rule": rule}, reasoning)])[0]
    return lazy, beam


def _req(spec, max_tokens, options, reasoning=None):
    from formtax.strategies.base import Request

    return Request(Q, parse_spec(spec), max_tokens=max_tokens, options=options, reasoning_prefix=reasoning)


@settings(max_examples=150, parent=settings.get_profile("suffix"))
@given(seed=st.integers(0, 100_000), spec=st.sampled_from(TEMPLATES), rule=st.sampled_from(["pipeline", "last", "min"]),
       tau=st.sampled_from([0.0, 0.02, 0.2, 0.6]), extra=st.integers(0, 40), eos_boost=st.sampled_from([0.0, 4.0, 6.0]),
       rc=st.booleans())
def test_lazy_and_beam_equal_the_naive_reference(seed, spec, rule, tau, extra, eos_boost, rc):
    fn = biased(seed, BOOST, eos_boost)
    fb = FakeBackend(fn)
    c = parse_spec(spec)
    max_tokens = reserve(c) + extra
    reasoning = "Go." if rc else None
    lazy, beam = lazy_and_beam(fb, spec, max_tokens, rule, tau, reasoning)
    prompt = fb.tokenizer.prompt_ids(Q)
    prefix = fb.tokenizer.encode(reasoning) if reasoning else []
    want, t_star = reference(fb, fn, prompt, spec, max_tokens, rule, tau, prefix)
    assert lazy.token_ids == want, (lazy.text, fb.tokenizer.decode(want))
    assert lazy.stats["t_star"] == t_star
    assert lazy.error is None and lazy.answer_text is not None, lazy
    assert lazy.tokens.total <= max_tokens
    assert lazy.parse_ok and c.validate(lazy.answer_text).ok, lazy
    if extra >= 3:  # the free budget holds the whole RC prefix
        assert lazy.text.startswith(reasoning or "")
    if beam is not None:
        assert beam.token_ids == want
        assert beam.stats["t_star"] == t_star
        assert beam.parse_ok == lazy.parse_ok


def test_the_reference_branches_in_every_way():
    """The generated cases cover what matters: t* before the end, at an EOS end, at a budget end, and at 0."""
    seen = set()
    for seed in range(60):
        fn = biased(seed, BOOST, 4.0)
        fb = FakeBackend(fn)
        lazy, _ = lazy_and_beam(fb, "The answer is: {int}", 60, "last", 0.0)
        s = lazy.stats
        if s["t_star"] < s["free_end"]:
            seen.add("before-end")
        else:
            seen.add("end-" + s["free_end_reason"])
        if s["t_star"] == 0:
            seen.add("zero")
    assert {"before-end", "end-eos", "end-budget", "zero"} <= seen, seen


# -- on the real model -----------------------------------------------------------------------------------------


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# (prompt, rule, tau, what the case exercises with SmolLM2-135M-Instruct at max_tokens=64)
MODEL_CASES = [
    (_user("How many legs does a dog have?"), "last", 0.0),  # "The" at step 0: t* = 0, a crop into the prompt
    (_user("Tom has 3 apples and buys 4 more. How many apples does he have?"), "min", 0.0),  # t* inside the run
    (_user("What is 12 + 30?"), "last", 0.05),  # t* at the EOS end, the answer after " The"
    (_user("What is 7 + 5? Answer with a number."), "pipeline", 0.0),  # the free budget runs out
]
MODEL_SPEC = "The answer is: {int}"
MODEL_BUDGET = 64


def _full_forward(model) -> LogitsFn:
    @torch.inference_mode()
    def fn(seq: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(seq)])
        return model.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()

    return fn


def _run(m, name: str, cases: list[tuple[list[dict[str, str]], str, float]]):
    """One batch of requests (each with its own options) through a suffix strategy."""
    from formtax.strategies.base import Request

    c = parse_spec(MODEL_SPEC)
    reqs = [Request(p, c, max_tokens=MODEL_BUDGET,
                    options={"tau": tau, **({"rule": rule} if name == "suffix-beam" else {})})
            for p, rule, tau in cases]
    return get_strategy(name).run(m, reqs)


@pytest.mark.model
def test_lazy_and_beam_equal_the_reference_on_the_default_model(default_model):
    m = default_model
    tok = m.tokenizer
    start = reference_start_set(m, MODEL_SPEC)
    assert {tok.decode([i]) for i in start.nonzero().flatten().tolist()} == {"The", " The"}
    fn = _full_forward(m)
    want = [reference(m, fn, tok.prompt_ids(p), MODEL_SPEC, MODEL_BUDGET, rule, tau) for p, rule, tau in MODEL_CASES]
    got = {}
    for name in ("suffix-last", "suffix-min", "suffix-pipeline"):  # each in one batch: rows of different lengths
        idx = [k for k, (_, rule, _) in enumerate(MODEL_CASES) if "suffix-" + rule == name]
        got.update(zip(idx, _run(m, name, [MODEL_CASES[k] for k in idx]), strict=True))
    beam_idx = [k for k, (_, rule, _) in enumerate(MODEL_CASES) if rule != "pipeline"]
    beam = dict(zip(beam_idx, _run(m, "suffix-beam", [MODEL_CASES[k] for k in beam_idx]), strict=True))
    for k, (tokens, t_star) in enumerate(want):
        r = got[k]
        assert r.token_ids == tokens, (k, r.text, tok.decode(tokens))
        assert r.stats["t_star"] == t_star and r.parse_ok and r.tokens.total <= MODEL_BUDGET
        if k in beam:
            assert beam[k].token_ids == tokens, (k, beam[k].text)
    # what the cases are there for
    s = [got[k].stats for k in range(len(MODEL_CASES))]
    assert s[0]["t_star"] == 0 < s[0]["free_end"]
    assert 0 < s[1]["t_star"] < s[1]["free_end"]
    assert s[2]["t_star"] == s[2]["free_end"] and s[2]["free_end_reason"] == "eos" and s[2]["answer_lead"] == " "
    assert s[3]["free_end_reason"] == "budget"


GEMMA_CASES = [
    ("Question: A box holds 6 pens. How many pens are in 5 boxes?\nAnswer:", "last", 0.0),
    ("Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:", "min", 0.0),
    ("Question: What is 12 + 30?\nAnswer: Let's think.", "last", 0.05),
]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.gemma
def test_lazy_and_beam_equal_the_reference_on_gemma(gemma_model):
    """Gemma 3 270M (SentencePiece, 262k): S holds the ``▁``-prefixed spelling, and the lazy and beam forms equal
    the from-scratch reference on plain-text (base-model) prompts."""
    m = gemma_model
    tok = m.tokenizer
    start = reference_start_set(m, MODEL_SPEC)
    pieces = {tok.hf.convert_ids_to_tokens(i) for i in start.nonzero().flatten().tolist()}
    assert {"The", "▁The"} <= pieces
    fn = _full_forward(m)
    want = [reference(m, fn, tok.prompt_ids(p), MODEL_SPEC, MODEL_BUDGET, rule, tau) for p, rule, tau in GEMMA_CASES]
    for k, (p, rule, tau) in enumerate(GEMMA_CASES):
        (lazy,) = _run(m, "suffix-" + rule, [(p, rule, tau)])  # type: ignore[list-item]
        (beam,) = _run(m, "suffix-beam", [(p, rule, tau)])  # type: ignore[list-item]
        tokens, t_star = want[k]
        assert lazy.token_ids == tokens and beam.token_ids == tokens, (k, lazy.text, tok.decode(tokens))
        assert lazy.stats["t_star"] == t_star and lazy.parse_ok
