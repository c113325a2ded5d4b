"""``formtax serve`` through the official ``openai`` client: every strategy it serves parses and equals the
in-process result token for token (the embedded default); bad requests are 400s; concurrent requests batch."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import formtax  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402

pytestmark = pytest.mark.model

Q = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def model_server(default_model) -> Iterator[tuple[openai.OpenAI, object]]:
    app = create_app(default_model, max_batch=8, window_s=0.05, timeout_s=120, temperature=0.0,
                     served_model_names=("default", "m"))
    with ServerThread(app) as srv:  # a random free port, bounded start-up, always shut down
        yield openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=120), app


CASES = [("free", None), ("constrained", "The answer is: {int:0..99}"), ("json", "{int:0..99}"),
         ("inwriting", "The answer is: {int:0..99}"), ("short", "{choice:yes|no}"),
         ("nl2format", "The answer is: {int:0..99}"), ("suffix-last", "The answer is: {int:0..99}")]


@pytest.mark.parametrize(("strategy", "answer"), CASES)
def test_every_strategy_matches_the_in_process_result(model_server, default_model, strategy, answer):
    client, _ = model_server
    ref = formtax.generate(default_model, Q, strategy, answer, max_tokens=80)
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": Q}], max_tokens=80,
                                       extra_body={"formtax": {"strategy": strategy, "answer": answer}})
    ext = r.model_extra["formtax"]
    assert ext["token_ids"] == ref.token_ids, (strategy, r.choices[0].message.content, ref.text)
    assert ext["parse_ok"] == ref.parse_ok and ext["parsed"] == ref.parsed
    msg = r.choices[0].message
    assert msg.content == (ref.answer_text if ref.answer_text is not None else ref.text)
    if strategy not in ("free", "short"):  # the constrained answers always parse
        assert ext["parse_ok"], (strategy, msg.content)
    if ref.answer_text is not None and ref.reasoning:
        assert msg.model_extra.get("reasoning_content") == ref.reasoning
    assert r.usage.completion_tokens == ref.tokens.total


def test_response_format_json_schema_and_json_object(model_server):
    import json

    import jsonschema

    client, _ = model_server
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=40,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "a", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=60,
                                       response_format={"type": "json_object"})
    if r.model_extra["formtax"]["finish_reason"] == "length-incomplete":  # an open object can outrun any budget
        assert r.choices[0].finish_reason == "length" and not r.model_extra["formtax"]["parse_ok"]
    else:
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_tool_calls_carry_valid_arguments(model_server):
    import json

    import jsonschema

    client, _ = model_server
    params = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
              "required": ["a", "b"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "add_numbers", "description": "Add two integers",
                                               "parameters": params}},
             {"type": "function", "function": {"name": "get_weather", "parameters": {
                 "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    for choice in ("required", {"type": "function", "function": {"name": "add_numbers"}}):
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3 plus 4?"}],
                                           max_tokens=80, tools=tools, tool_choice=choice)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and calls
        for c in calls:
            schema = params if c.function.name == "add_numbers" else tools[1]["function"]["parameters"]
            jsonschema.validate(json.loads(c.function.arguments), schema)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=60,
                                       tools=tools)  # auto: text or a call
    m = r.choices[0].message
    assert m.tool_calls or m.content


def test_streaming_and_completions(model_server, default_model):
    client, _ = model_server
    ref = formtax.generate(default_model, Q, "inwriting", "The answer is: {int:0..99}", max_tokens=80)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": Q}], max_tokens=80, stream=True,
        extra_body={"formtax": {"strategy": "inwriting", "answer": "The answer is: {int:0..99}"}}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                        for c in chunks if c.choices)
    assert content == ref.answer_text and reasoning == ref.reasoning
    assert chunks[-1].choices[0].finish_reason == "stop"
    live = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(live) > 1  # token by token, not one final chunk
    with pytest.raises(openai.BadRequestError, match="needs an answer"):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], stream=True,
                                            extra_body={"formtax": {"strategy": "inwriting"}}))
    raw = formtax.generate(default_model, "The capital of France is", "free", max_tokens=12, raw=True)
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=12)
    assert r.choices[0].text == raw.text


@pytest.mark.parametrize(("body", "needle"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "formtax": {"strategy": "nope"}}, "unknown strategy"),
    ({"messages": [{"role": "user", "content": "x"}], "formtax": {"answer": "regex:("}}, "regex"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "formtax": {"strategy": "constrained"}}, "answer"),
])
def test_bad_requests_are_400_with_one_line(model_server, body, needle):
    client, _ = model_server
    known = {k: v for k, v in body.items() if k != "formtax"}
    extra = {"formtax": body["formtax"]} if "formtax" in body else None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", **known, extra_body=extra)
    msg = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    assert needle in msg and "\n" not in msg


def test_concurrent_requests_share_batches(model_server, default_model):
    client, app = model_server
    prompts = [f"What is {k} plus {k}?" for k in range(6)]
    before = len(app.state.batcher.batches)

    def ask(p):
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": p}], max_tokens=40,
                                              extra_body={"formtax": {"strategy": "constrained",
                                                                      "answer": "The answer is: {int:0..999}"}})

    with ThreadPoolExecutor(6) as ex:
        rs = list(ex.map(ask, prompts))
    assert all(r.model_extra["formtax"]["parse_ok"] for r in rs)
    sizes = app.state.batcher.batches[before:]
    assert sum(sizes) == 6 and max(sizes) > 1  # at least two requests decoded together
    ref = formtax.generate_batch(default_model, prompts, "constrained", "The answer is: {int:0..999}", max_tokens=40)
    assert [r.model_extra["formtax"]["parsed"] for r in rs] == [x.parsed for x in ref]


def test_instructor_tools_and_json_schema_modes(model_server):
    """instructor, the most used structured-output client, in its default TOOLS mode and in JSON_SCHEMA mode."""
    instructor = pytest.importorskip("instructor")
    from pydantic import BaseModel, Field

    class Sum(BaseModel):
        a: int = Field(description="the first number")
        b: int = Field(description="the second number")

    client, _ = model_server
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        patched = instructor.from_openai(client, mode=mode)
        got = patched.chat.completions.create(model="m", response_model=Sum, max_retries=0, max_tokens=60,
                                              messages=[{"role": "user", "content": "Add 3 and 4."}])
        assert isinstance(got, Sum), mode


def test_a_tool_argument_called_name_or_arguments(model_server):
    """Issue 47 point 4: LangChain's ``with_structured_output(method="function_calling")`` forces a call of a tool
    whose arguments are called ``name`` and ``arguments``. The call is written name first (``{"Record": {...}}``),
    so no argument shares a key with the call itself. Under the old ``{"name": <tool>, "arguments": {...}}`` form
    the model wrote ``"name": "none"`` for Carol's record."""
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    class Person(BaseModel):
        """A person."""

        name: str
        age: int

    class Record(BaseModel):
        """A record."""

        arguments: str
        name: str

    client, _ = model_server
    llm = lc.ChatOpenAI(base_url=str(client.base_url), api_key="none", model="m", temperature=0, max_tokens=64,
                        max_retries=0)
    for model, text, want in ((Person, "Alice is 30 years old.", {"name": "Alice", "age": 30}),
                              (Record, "Record: name Carol, arguments none.", {"name": "Carol"})):
        out = llm.with_structured_output(model, method="function_calling", include_raw=True).invoke(text)
        raw = out["raw"]
        assert raw.response_metadata["finish_reason"] == "tool_calls"
        assert raw.tool_calls[0]["name"] == model.__name__
        got = out["parsed"].model_dump()
        assert {k: got[k] for k in want} == want, got


def test_the_responses_api_on_the_real_model(model_server):
    """Issue 47: ``responses.parse`` into a Pydantic model and a streamed response, on the embedded model."""
    from pydantic import BaseModel

    class Sum(BaseModel):
        a: int
        b: int

    client, _ = model_server
    parsed = client.responses.parse(model="m", input="Add 3 and 4.", text_format=Sum, max_output_tokens=60)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Sum)
    whole = client.responses.create(model="m", input=Q, max_output_tokens=24)
    events = list(client.responses.create(model="m", input=Q, max_output_tokens=24, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
