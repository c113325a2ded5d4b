"""Tools together with a structured-output format (issue 59), through the official ``openai`` SDK against a live
``formtax serve`` over the fake backend: under ``auto`` every answer is a valid call or JSON valid under the format's
schema, under ``required`` / a named tool a valid call, on chat (``response_format``) and the Responses API
(``text.format``), streamed and not; a stream says the same as the whole response; both branches are reachable."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits, scripted  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402
from formtax.serve.tools import CallStream  # noqa: E402

ADD_PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                  "required": ["city"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD_PARAMS, "strict": True}},
              {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}}]
RESP_TOOLS = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"],
               **({"strict": True} if t["function"].get("strict") else {})} for t in CHAT_TOOLS]
SCHEMAS = {"add": ADD_PARAMS, "get_weather": WEATHER_PARAMS}
ANSWER = {"type": "object", "properties": {"total": {"type": "integer"}, "unit": {"enum": ["apples", "pears"]}},
          "required": ["total", "unit"], "additionalProperties": False}
USER = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many?"}]
CHOICES: dict[str, Any] = {"auto": "auto", "required": "required", "named": "add"}


@pytest.fixture(scope="module")
def client():
    app = create_app(FakeBackend(random_logits(seed=11), model_id="fake", context=8192), window_s=0.0,
                     timeout_s=60, temperature=1.0)
    with ServerThread(app) as srv:
        yield openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)


def _chat_choice(name: str) -> Any:
    c = CHOICES[name]
    return {"type": "function", "function": {"name": c}} if name == "named" else c


def _resp_choice(name: str) -> Any:
    c = CHOICES[name]
    return {"type": "function", "name": c} if name == "named" else c


def _check(kind: str, calls: list[tuple[str, str]], text: str | None, choice: str) -> str:
    """The answer is a valid call (or calls) or, under auto, JSON valid under the format; which it was."""
    if calls:
        assert text in (None, "")
        for name, args in calls:
            assert name in (("add",) if choice == "named" else SCHEMAS)
            jsonschema.validate(json.loads(args), SCHEMAS[name])
        if choice == "named":
            assert len(calls) == 1
        return "call"
    assert choice == "auto", f"{kind}: {choice} must call a tool, got {text!r}"
    assert text is not None
    jsonschema.validate(json.loads(text), ANSWER)
    return "answer"


def _chat(client: Any, choice: str, seed: int, stream: bool) -> tuple[str, list[tuple[str, str]], str | None]:
    kwargs: dict[str, Any] = dict(model="fake", messages=USER, tools=CHAT_TOOLS, tool_choice=_chat_choice(choice),
                                  response_format={"type": "json_schema", "json_schema": {
                                      "name": "answer", "schema": ANSWER, "strict": True}},
                                  max_tokens=200, seed=seed)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or ()]
        return r.choices[0].finish_reason, calls, m.content
    parts: dict[int, list[str]] = {}
    text, finish = "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or ():
            if tc.id:
                parts[tc.index] = [tc.function.name, ""]
            parts[tc.index][1] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return str(finish), [(n, a) for n, a in parts.values()], text or None


def _responses(client: Any, choice: str, seed: int, stream: bool) -> tuple[str, list[tuple[str, str]], str | None]:
    kwargs: dict[str, Any] = dict(model="fake", input=USER[0]["content"], tools=RESP_TOOLS,
                                  tool_choice=_resp_choice(choice), max_output_tokens=200,
                                  text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER,
                                                   "strict": True}})
    kwargs["temperature"] = 0.0 if seed == 0 else 1.0  # the Responses API has no seed: greedy once, then sampled
    if stream:
        events = list(client.responses.create(**kwargs, stream=True))
        assert any(e.type in ("response.output_text.delta", "response.function_call_arguments.delta")
                   for e in events), "nothing streamed"
        r = events[-1].response
    else:
        r = client.responses.create(**kwargs)
    calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
    texts = [o.content[0].text for o in r.output if o.type == "message"]
    return r.status, calls, texts[0] if texts else None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_chat_tools_with_a_format_answer_a_call_or_the_schema(client, choice, stream):
    for seed in range(3):  # which branch a random model takes is its own; both are reached below (scripted)
        finish, calls, text = _chat(client, choice, seed, stream)
        _check("chat", calls, text, choice)
        assert finish == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_responses_tools_with_text_format_answer_a_call_or_the_schema(client, choice, stream):
    completed = 0
    for seed in range(3):  # sampled runs may reach the budget (incomplete, a valid prefix); greedy's does not
        status, calls, text = _responses(client, choice, seed, stream)
        assert status in ("completed", "incomplete") and (status == "completed" or seed > 0)
        if status == "completed":
            completed += 1
            _check("responses", calls, text, choice)
    assert completed >= 1


def test_a_stream_says_what_the_whole_response_says(client):
    for seed in range(3):
        assert _chat(client, "auto", seed, True)[1:] == _chat(client, "auto", seed, False)[1:]


def test_the_answer_branch_and_a_call_from_a_model_that_wants_each():
    """A model that wants to answer gets its answer as content; one that wants a call gets the call (auto)."""
    answer, call = '{"total": 7, "unit": "apples"}', '{"add": {"a": 3, "b": 4}}'
    for want in (answer, call, f"[{call}]"):
        app = create_app(FakeBackend(scripted(want)), window_s=0.0, temperature=0.0)
        with ServerThread(app) as srv:
            c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
            r = c.chat.completions.create(model="default", messages=USER, tools=CHAT_TOOLS, max_tokens=80,
                                          response_format={"type": "json_schema", "json_schema": {
                                              "name": "answer", "schema": ANSWER, "strict": True}})
            p = c.responses.parse(model="default", input=USER[0]["content"], tools=RESP_TOOLS, max_output_tokens=80,
                                  text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}})
        m = r.choices[0].message
        if want == answer:
            assert m.content == answer and not m.tool_calls and r.choices[0].finish_reason == "stop"
            assert [o.type for o in p.output] == ["message"] and p.output[0].content[0].text == answer
        else:
            assert m.content is None and r.choices[0].finish_reason == "tool_calls"
            assert [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls] == [
                ("add", {"a": 3, "b": 4})]
            assert [(o.type, o.name) for o in p.output] == [("function_call", "add")]


def test_json_object_and_pydantic_formats_with_tools(client):
    """``json_object`` (any object, but never a tool's name as a key) and a pydantic model with ``$defs``."""
    from pydantic import BaseModel

    class Item(BaseModel):
        name: str

    class Basket(BaseModel):
        items: list[Item]

    for seed in range(4):
        r = client.chat.completions.create(model="fake", messages=USER, tools=CHAT_TOOLS, max_tokens=150, seed=seed,
                                           response_format={"type": "json_object"})
        m = r.choices[0].message
        if not m.tool_calls and r.choices[0].finish_reason == "stop":
            value = json.loads(m.content)
            assert isinstance(value, dict) and not {"add", "get_weather"} & set(value)
    want = '{"items": [{"name": "apple"}, {"name": "pear"}]}'  # the answer branch resolves Basket's $defs/Item
    app = create_app(FakeBackend(scripted(want)), window_s=0.0, temperature=0.0)
    with ServerThread(app) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
        p = c.chat.completions.parse(model="default", messages=USER, tools=CHAT_TOOLS[:1], response_format=Basket,
                                     max_tokens=80)
    assert p.choices[0].message.parsed == Basket(items=[Item(name="apple"), Item(name="pear")])


def test_what_cannot_combine_is_refused_in_one_line(client):
    clash = {"type": "object", "properties": {"add": {"type": "integer"}}, "required": ["add"]}
    for fmt, needle in (({"type": "json_schema", "json_schema": {"name": "x", "schema": clash}}, "name of a tool"),
                        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
                         "type object at its root")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake", messages=USER, tools=CHAT_TOOLS, response_format=fmt)
        assert needle in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # the Responses API names the field its client sent
        client.responses.create(model="fake", input="hi", text={"format": {"type": "json_object"}},
                                extra_body={"formtax": {"answer": "{int}"}})
    assert "text.format and formtax.answer" in e.value.body["message"]


def test_the_call_reader_decides_at_the_first_key():
    names = ("add", "get_weather")
    for text, kinds in (('{"total": 7, "unit": "apples"}', ["text"]), ('{"add": {"a": 3, "b": 4}}', ["call", "args"]),
                        ('[{"add": {"a": 1, "b": 2}}, {"get_weather": {"city": "P"}}]',
                         ["call", "args", "call", "args"]), ("{}", ["text"])):
        for step in (1, 3, len(text)):
            s = CallStream(False, names)
            events = [e for i in range(0, len(text), step) for e in s.feed(text[i:i + step])]
            merged = [k for i, (k, _) in enumerate(events) if i == 0 or k != events[i - 1][0]]
            assert merged == kinds, (text, step, events)
            if kinds == ["text"]:
                assert "".join(v for _, v in events) == text
    s = CallStream(False, names)
    assert s.feed('{"tot') == [] and s.flush() == '{"tot'  # a budget that ends inside the first key: text


def test_inwriting_under_auto_answers_a_whole_sentence():
    """Issue 59 point 5: after InWriting's reasoning, ``auto``'s text is one whole sentence (a model that would
    continue its reasoning with a lower-case fragment cannot), and the reasoning is ``reasoning_content`` / the
    Responses reasoning item. A plain (constrained) request's text is left free: the rule is InWriting's."""
    import re

    from formtax.backends.fake import EOS
    from formtax.serve.tools import SENTENCE

    reasoning, fragment = "3 + 4 = 7", ' is the answer to the question "3 + 4 = 7"'
    noise = random_logits(seed=2, scale=1.0)

    def model(seq):  # reasons, wants to stop, then would glue a fragment onto its reasoning
        gen = list(seq[max(i for i, t in enumerate(seq) if t == 259) + 1:])
        logits = noise(seq).clone()
        r, f = list(reasoning.encode()), list(fragment.encode())
        k = len(gen)
        if k < len(r) and gen == r[:k]:
            logits[r[k]] += 20
        elif k >= len(r) and gen[:len(r)] == r:
            j = k - len(r)
            logits[EOS] += 30
            if j < len(f) and gen[len(r):] == f[:j]:
                logits[f[j]] += 20
        return logits

    app = create_app(FakeBackend(model), window_s=0.0, temperature=0.0)
    sentence = re.compile(SENTENCE.strip("/"))
    add = [CHAT_TOOLS[0]]
    with ServerThread(app) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
        for strategy in ("inwriting", None):
            extra = {"formtax": {"strategy": strategy}} if strategy else {}
            r = c.chat.completions.create(model="default", messages=USER, tools=add, max_tokens=60, extra_body=extra)
            m = r.choices[0].message
            if strategy is None:  # no reasoning phase: the text is the model's own, up to where it stops
                assert m.content == reasoning and "reasoning_content" not in m.model_extra
                continue
            assert m.model_extra["reasoning_content"] == reasoning
            assert m.tool_calls or sentence.fullmatch(m.content), m.content
            resp = c.responses.create(model="default", input=USER[0]["content"], tools=RESP_TOOLS[:1],
                                      max_output_tokens=60, extra_body=extra)
            assert resp.output[0].type == "reasoning" and resp.output[0].content[0].text == reasoning
            texts = [o.content[0].text for o in resp.output if o.type == "message"]
            assert texts == ([m.content] if m.content else [])


def test_a_response_echoes_the_effective_sampling_values():
    """Issue 59 point 4: unset ``temperature`` / ``top_p`` are echoed as what was used (the server's default, 1),
    as OpenAI echoes them; sent values come back as sent."""
    app = create_app(FakeBackend(random_logits(seed=1)), window_s=0.0, temperature=0.3)
    with ServerThread(app) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0)
        r = c.responses.create(model="default", input="hi", max_output_tokens=3)
        assert (r.temperature, r.top_p) == (0.3, 1.0)
        r = c.responses.create(model="default", input="hi", max_output_tokens=3, temperature=0.0, top_p=0.5)
        assert (r.temperature, r.top_p) == (0.0, 0.5)
        events = list(c.responses.create(model="default", input="hi", max_output_tokens=3, stream=True))
        assert (events[0].response.temperature, events[-1].response.top_p) == (0.3, 1.0)


def test_definitions_of_the_tools_and_the_format_meet_at_the_root():
    """``$defs`` of a tool's parameters and of the format resolve in the combined schema; two different
    definitions under one name are refused rather than one silently winning."""
    from formtax.errors import ConfigError
    from formtax.serve.tools import Tool, tool_plan

    item = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    tool = Tool.model_validate({"type": "function", "function": {"name": "put", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"],
        "$defs": {"Item": item}}}})
    fmt = {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
           "required": ["items"], "$defs": {"Item": item}}
    plan = tool_plan([tool], "auto", None, fmt)
    assert plan is not None and plan.answer is not None
    assert plan.constraint.validate('{"put": {"item": {"name": "a"}}}').ok
    assert plan.constraint.validate('{"items": [{"name": "a"}]}').ok
    assert not plan.constraint.validate('{"items": [{"nom": "a"}]}').ok
    alone = tool_plan([tool], "required", False)  # a tool's own $defs resolve without a format too
    assert alone is not None and alone.constraint.validate('{"put": {"item": {"name": "a"}}}').ok
    assert not alone.constraint.validate('{"put": {"item": {"nom": "a"}}}').ok
    other = {**fmt, "$defs": {"Item": {"type": "string"}}}
    with pytest.raises(ConfigError, match="define \\$defs/Item differently"):
        tool_plan([tool], "auto", None, other)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), parallel=st.booleans(), strict=st.booleans(), cut=st.integers(1, 7))
def test_random_models_write_a_call_or_the_answer_and_the_stream_agrees(seed, parallel, strict, cut):
    """Hypothesis over random logits: every finished output of ``auto`` with a format is a call whose arguments
    validate or an answer valid under the format (jsonschema, the oracle), never both; the stream reader, fed the
    text in pieces, decides the same as the whole-text reader."""
    import formtax
    from formtax.serve.tools import Tool, is_call, read_calls, tool_plan

    tools = [Tool.model_validate(t) for t in CHAT_TOOLS]
    fmt = {"type": "object", "properties": {"total": {"type": "integer"}, "note": {"type": "string"}},
           "required": ["total"], **({"additionalProperties": False} if strict else {})}
    plan = tool_plan(tools, "auto", parallel, fmt)
    assert plan is not None
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", plan.constraint, max_tokens=120)
    if not r.parse_ok:
        assert r.finish_reason.startswith("length"), r
        return
    value = json.loads(r.text)
    calls = read_calls(r.text, value, plan.names)
    if calls is None:
        jsonschema.validate(value, fmt)
        assert not {"add", "get_weather"} & set(value)
    else:
        assert is_call(value, plan.names) and (parallel or isinstance(value, dict))
        for c in calls:
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    stream = CallStream(False, plan.names)
    events = [e for i in range(0, len(r.text), cut) for e in stream.feed(r.text[i:i + cut])]
    assert ({k for k, _ in events} == {"text"}) == (calls is None), events
    if calls is not None:
        assert [v for k, v in events if k == "call"] == [c["function"]["name"] for c in calls]
        streamed: list[str] = []
        for k, v in events:
            if k == "call":
                streamed.append("")
            elif k == "args":
                streamed[-1] += v
        assert [json.loads(a) for a in streamed] == [json.loads(c["function"]["arguments"]) for c in calls]
