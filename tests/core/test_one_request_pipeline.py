"""Issue 56: one request is set up once, whatever its route: its prompt tokenized once, its grammar compiled at most
once for the model's tokenizer, its strategy checked once (``generate``, ``stream``, ``formtax serve``'s chat and
Responses routes, streamed or not, the runner's one-item run, and formtax's vLLM plugin on the simulated stock engine
of tests/core/routes.py, where vLLM tokenizes the prompt and formtax never does)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import compile as compile_mod
from formtax.constraints import native
from formtax.decoding.engine import TokenizerInfo
from formtax.strategies.base import Strategy

pytest.importorskip("uvicorn")

_FRESH = itertools.count()


@pytest.fixture
def counts(monkeypatch) -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()
    real_ids, real_check, real_put = TokenizerInfo._prompt_ids, Strategy.check, compile_mod._CACHE.put

    def ids(self, prompt):
        seen["tokenized"] += 1
        return real_ids(self, prompt)

    def check(self, backend, requests):
        seen["checked"] += 1
        return real_check(self, backend, requests)

    def put(key, value):
        seen["compiled"] += 1
        return real_put(key, value)

    monkeypatch.setattr(TokenizerInfo, "_prompt_ids", ids)
    monkeypatch.setattr(Strategy, "check", check)
    real_spec = native.parse_spec

    def spec(text):
        seen["spec_parsed"] += 1
        return real_spec(text)

    monkeypatch.setattr(compile_mod._CACHE, "put", put)
    monkeypatch.setattr(native, "parse_spec", spec)
    yield seen


def _fresh() -> tuple[str, dict]:
    """A prompt and a schema no earlier request used (so no cache hides a repeat)."""
    n = next(_FRESH)
    schema = {"type": "object", "properties": {f"k{n}": {"type": "integer"}}, "required": [f"k{n}"],
              "additionalProperties": False}
    return f"question {n}?", schema


@pytest.fixture(scope="module")
def srv(start_fake_server):
    return start_fake_server(0, window_s=0.0, temperature=0.0)


def _once(seen: Counter[str]) -> None:
    assert seen["tokenized"] == 1, seen
    assert seen["compiled"] == 1, seen  # a fresh schema: compiled, and only once
    assert seen["checked"] == 1, seen


def test_generate(counts):
    prompt, schema = _fresh()
    r = formtax.generate(FakeBackend(random_logits(seed=1)), prompt, "constrained", schema, max_tokens=30)
    assert r.parse_ok
    _once(counts)


def test_stream(counts):
    prompt, schema = _fresh()
    pieces = list(formtax.stream(FakeBackend(random_logits(seed=1)), prompt, "constrained", schema, max_tokens=30))
    assert pieces
    _once(counts)


@pytest.mark.parametrize("stream", [False, True])
def test_serve_chat(srv, counts, stream):
    prompt, schema = _fresh()
    r = httpx.post(srv.url + "/chat/completions", json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 30, "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}, timeout=60)
    assert r.status_code == 200, r.text
    _once(counts)


def test_serve_chat_two_calls(srv, counts):
    """NL-to-Format on the server runs as a batch job (two calls, not one row of the live loop), checked once too."""
    prompt, _ = _fresh()
    answer = f"The answer is: {{int:0..{1000 + next(_FRESH)}}}"
    r = httpx.post(srv.url + "/chat/completions", json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": 30,
        "formtax": {"strategy": "nl2format", "answer": answer}}, timeout=60)
    assert r.status_code == 200, r.text
    assert counts["checked"] == 1, counts
    assert counts["compiled"] == 1, counts
    assert counts["tokenized"] == 2, counts  # the question, then call 2's own prompt (the reasoning in it)


def test_serve_responses(srv, counts):
    prompt, schema = _fresh()
    r = httpx.post(srv.url + "/responses", json={
        "input": prompt, "max_output_tokens": 30,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}, timeout=60)
    assert r.status_code == 200, r.text
    _once(counts)


def test_runner(counts, tmp_path, monkeypatch):
    """A one-item run: the run's up-front check of its first request is that request's only check."""
    from tests.core.routes import runner_route

    slot = f"{{int:0..{1000 + next(_FRESH)}}}"  # a grammar no earlier request compiled
    rec, _ = runner_route(tmp_path, random_logits(seed=1), "constrained", slot, 30, monkeypatch=monkeypatch)
    assert rec.error is None and rec.constraint_ok
    _once(counts)


@pytest.mark.parametrize("strategy", ["constrained", "inwriting"])
def test_plugin_on_the_simulated_engine(counts, strategy):
    """``validate_params`` checks the request before it is queued and hands the engine ``formtax_checked``; the
    engine then builds the row without checking it again. The answer SPEC is parsed once on each side (the API
    process and the engine are two processes in vLLM: each has its own copy of the arguments, and of the compiled
    grammar's cache, which one process shares here)."""
    from tests.core.routes import plugin_route

    prompt, _ = _fresh()
    answer = f"The answer is: {{int:0..{1000 + next(_FRESH)}}}"
    out = plugin_route(random_logits(seed=1), [{"role": "user", "content": prompt}],
                       {"formtax_strategy": strategy, "formtax_answer": answer}, 40)
    _once(counts)  # tokenized once: vLLM's own tokenization, formtax adds none
    assert counts["spec_parsed"] == 2, counts
    assert formtax.parse(out.text, answer, strategy=strategy).parse_ok, out.text


def test_a_client_cannot_skip_the_plugins_check():
    """``formtax_checked`` is handed by ``validate_params`` to the engine, never taken from a client (the engine
    would otherwise build a row no check saw)."""
    from formtax.backends.vllm.rows import EngineSide, validate
    from tests.core.routes import plugin_params

    engine = EngineSide(FakeBackend().tokenizer, "sim")
    args = {"formtax_strategy": "constrained", "formtax_answer": "{int}", "formtax_checked": 1}
    with pytest.raises(ValueError, match="unknown formtax argument"):
        validate(plugin_params(args, 16), engine, 16)


def test_validating_one_request_twice_in_one_process(counts):
    """vLLM's offline ``LLM`` validates one request's parameters twice in its process (found by
    bench/vllm_plugin_profile.py: the second call refused the arguments the first had handed over). The second
    call takes them as its own and checks nothing again; a client's guess at the token is still refused."""
    from formtax.backends.vllm.rows import VALIDATED, EngineSide, validate
    from tests.core.routes import plugin_params

    engine = EngineSide(FakeBackend().tokenizer, "sim")
    params = plugin_params({"formtax_strategy": "constrained", "formtax_answer": "{int:0..9}"}, 16)
    first = validate(params, engine, 16)
    checked = counts["checked"]
    again = validate(params, engine, 16)
    assert first is not None and again is not None and again.checked and counts["checked"] == checked
    assert params.extra_args["formtax_checked"] == VALIDATED
    forged = plugin_params({"formtax_strategy": "constrained", "formtax_answer": "{int}",
                            "formtax_checked": "0" * len(VALIDATED)}, 16)
    with pytest.raises(ValueError, match="unknown formtax argument"):
        validate(forged, engine, 16)


def test_vllm_backend_on_the_simulated_engine(counts, monkeypatch):
    """formtax's vLLM backend (the real VLLMBackend over tests/vllm/test_vllm_rows.py's simulated engine): the row's
    policy is built twice, once in formtax's process (to lower the row) and once in the engine from its recipe (the
    engine is another process in vLLM); the strategy's check on an engine that steps live rows builds none."""
    from formtax.strategies import get_strategy
    from tests.vllm.test_vllm_rows import SimVLLM

    cls = type(get_strategy("constrained"))
    real = cls.policy

    def policy(self, backend, request):
        counts["policy"] += 1
        return real(self, backend, request)

    monkeypatch.setattr(cls, "policy", policy)
    prompt, schema = _fresh()
    r = formtax.generate(SimVLLM(random_logits(seed=1)), prompt, "constrained", schema, max_tokens=30)
    assert r.parse_ok and r.stats["closing"]
    _once(counts)
    assert counts["policy"] == 2, counts


def test_one_attribute_says_which_driver_runs_a_backend():
    """``Backend.driver``: streaming, the server's batching and its live streams ask it, so an engine that owns
    its loop gets stream's documented refusal, not an error from deep inside the loop."""
    from formtax.decoding.engine import Driver
    from formtax.errors import ConfigError

    class Engine(FakeBackend):
        @property
        def driver(self) -> Driver:
            return Driver.ENGINE

    assert FakeBackend().driver is Driver.LOOP
    with pytest.raises(ConfigError, match="decodes outside formtax's loop and cannot stream"):
        list(formtax.stream(Engine(), "q", "constrained", "{int}", max_tokens=8))
