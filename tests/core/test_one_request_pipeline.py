"""Issue 56: one request is set up once, whatever its route: its prompt tokenized once, its grammar compiled at most
once for the model's tokenizer, its strategy checked once (``generate``, ``stream``, ``formtax serve``'s chat and
Responses routes, streamed or not)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import compile as compile_mod
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
    monkeypatch.setattr(compile_mod._CACHE, "put", put)
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


def test_serve_responses(srv, counts):
    prompt, schema = _fresh()
    r = httpx.post(srv.url + "/responses", json={
        "input": prompt, "max_output_tokens": 30,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}, timeout=60)
    assert r.status_code == 200, r.text
    _once(counts)


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
