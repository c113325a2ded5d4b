"""Issue 47: ``POST /v1/responses`` through the clients engineers use (the openai SDK's ``responses.create`` /
``parse`` / ``stream``, LangChain's ``use_responses_api=True``), over the fake backend (milliseconds a request):
plain text, structured output into a Pydantic model, a tool round trip, streaming with the Responses events, the
budget's end as ``incomplete``, ``reasoning.effort``, and the stateful fields refused with what to send instead."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits, scripted  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402

ADD = {"type": "function", "name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}


class Apples(BaseModel):
    count: int
    colour: str


@pytest.fixture(scope="module")
def srv(start_fake_server):
    return start_fake_server(3, backend={"model_id": "fake", "context": 4096}, window_s=0.0, temperature=0.0,
                             timeout_s=60)


def _client(s: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url, api_key="none", max_retries=0, timeout=60)


def test_plain_text_is_the_chat_answer(srv):
    client = _client(srv)
    r = client.responses.create(model="fake", input="How many apples?", instructions="Be brief.",
                                max_output_tokens=24)
    chat = client.chat.completions.create(model="fake", max_tokens=24, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many apples?"}])
    assert r.object == "response" and r.output_text == chat.choices[0].message.content
    assert r.usage.output_tokens == chat.usage.completion_tokens and r.usage.input_tokens > 0
    want = "completed" if chat.choices[0].finish_reason == "stop" else "incomplete"
    assert r.status == want


def test_a_budget_that_runs_out_is_incomplete():
    app = create_app(FakeBackend(scripted("Seven apples, because three and four make seven.")), window_s=0.0,
                     temperature=0.0)
    with ServerThread(app) as s:
        r = _client(s).responses.create(model="fake-random", input="How many?", max_output_tokens=5)
        whole = _client(s).responses.create(model="fake-random", input="How many?", max_output_tokens=80)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert whole.status == "completed" and whole.output_text.startswith("Seven apples")


@pytest.mark.parametrize("seed", range(3))
def test_parse_fills_a_pydantic_model(srv, seed):
    r = _client(srv).responses.parse(model="fake", input=f"Describe apples #{seed}.", text_format=Apples,
                                     max_output_tokens=120, temperature=1.0, extra_body={"formtax": {}})
    assert isinstance(r.output_parsed, Apples)
    jsonschema.validate(json.loads(r.output_text), Apples.model_json_schema())


def test_a_tool_round_trip():
    """A forced call comes back as a ``function_call`` item; sending it and its output back gets the answer."""
    app = create_app(FakeBackend(scripted('{"add": {"a": 3, "b": 4}}')), window_s=0.0, temperature=0.0)
    with ServerThread(app) as s:
        client = _client(s)
        first = client.responses.create(model="fake-random", input="What is 3 plus 4?", tools=[ADD],
                                        tool_choice="required", max_output_tokens=60)
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "add" and json.loads(call.arguments) == {"a": 3, "b": 4} and call.call_id
        assert first.status == "completed"
        second = client.responses.create(
            model="fake-random", tools=[ADD], tool_choice="none", max_output_tokens=40,
            input=[{"role": "user", "content": "What is 3 plus 4?"}, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": "7"}])
    assert second.status in ("completed", "incomplete") and second.output[0].type == "message"


def test_streaming_sends_the_responses_events(srv):
    client = _client(srv)
    whole = client.responses.create(model="fake", input="Count apples.", max_output_tokens=30)
    events = list(client.responses.create(model="fake", input="Count apples.", max_output_tokens=30, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text  # live, token by token
    assert events[-1].response.output_text == whole.output_text
    with client.responses.stream(model="fake", input="Describe apples.", text_format=Apples,
                                 max_output_tokens=400) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Apples)


def test_a_streamed_tool_call():
    app = create_app(FakeBackend(scripted('{"add": {"a": 3, "b": 4}}')), window_s=0.0, temperature=0.0)
    with ServerThread(app) as s:
        events = list(_client(s).responses.create(model="fake-random", input="3+4?", tools=[ADD],
                                                  tool_choice="required", max_output_tokens=60, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"a": 3, "b": 4}
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done[0].name == "add" and events[-1].type == "response.completed"


def test_reasoning_effort_bounds_the_reasoning_phase():
    """``reasoning.effort`` (and chat's ``reasoning_effort``) caps a reasoning strategy's reasoning at its
    documented budget; a strategy with no reasoning phase refuses it and names the ones that take it."""
    app = create_app(FakeBackend(random_logits(seed=5)), window_s=0.0, temperature=0.0)
    opts = {"formtax": {"strategy": "inwriting", "answer": "The answer is: {int:0..99}", "triggers": ["\n"]}}
    with ServerThread(app) as s:
        client = _client(s)
        low = client.responses.create(model="fake-random", input="3+4?", max_output_tokens=400,
                                      reasoning={"effort": "minimal"}, extra_body=opts)
        high = client.responses.create(model="fake-random", input="3+4?", max_output_tokens=400,
                                       reasoning={"effort": "high"}, extra_body=opts)
        assert 0 < low.usage.output_tokens_details.reasoning_tokens <= 16
        assert high.usage.output_tokens_details.reasoning_tokens > 16
        assert low.output[0].type == "reasoning" and low.output[-1].type == "message"
        chat = client.chat.completions.create(model="fake-random", max_tokens=400, reasoning_effort="minimal",
                                              messages=[{"role": "user", "content": "3+4?"}], extra_body=opts)
        assert chat.usage.completion_tokens_details.reasoning_tokens <= 16
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="fake-random", messages=[{"role": "user", "content": "hi"}],
                                           reasoning_effort="low")
        assert "reasoning strategy" in e.value.body["message"]


@pytest.mark.parametrize(("body", "needle"), [
    ({"input": "hi", "previous_response_id": "resp_1"}, "keeps no responses"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "hosted tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": "no"}}}, "JSON Schema"),
    ({"input": "hi", "frobnicate": 1}, "not supported"),
])
def test_what_is_refused_says_what_to_send(srv, body, needle):
    r = httpx.post(srv.url + "/responses", json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert "\n" not in r.json()["error"]["message"]


def test_nulls_are_unset_and_nothing_is_stored(srv):
    nulls = {k: None for k in ("instructions", "text", "tools", "tool_choice", "parallel_tool_calls", "reasoning",
                               "temperature", "top_p", "top_logprobs", "previous_response_id", "store", "metadata",
                               "user", "truncation", "include", "background", "conversation", "prompt_cache_key")}
    r = httpx.post(srv.url + "/responses", json={"input": "hi", "max_output_tokens": 8, **nulls})
    plain = httpx.post(srv.url + "/responses", json={"input": "hi", "max_output_tokens": 8, "store": True})
    assert r.status_code == 200 and plain.status_code == 200, r.text
    text = [c["text"] for o in r.json()["output"] for c in o.get("content", [])]
    assert text == [c["text"] for o in plain.json()["output"] for c in o.get("content", [])]
    missing = httpx.get(srv.url + "/responses/" + r.json()["id"])
    assert missing.status_code == 404 and "stores no responses" in missing.json()["error"]["message"]


def test_langchain_through_the_responses_api(srv):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = lc.ChatOpenAI(base_url=srv.url, api_key="none", model="fake", use_responses_api=True, temperature=0,
                        max_tokens=120, max_retries=0)
    plain = llm.invoke("How many apples?")
    assert plain.text and plain.response_metadata.get("status") in ("completed", "incomplete")
    structured = llm.with_structured_output(Apples).invoke("Describe apples.")
    assert isinstance(structured, Apples)
    streamed = "".join(c.text for c in llm.stream("How many apples?"))
    assert streamed == plain.text
    app = create_app(FakeBackend(scripted('{"add": {"a": 3, "b": 4}}')), window_s=0.0, temperature=0.0)
    with ServerThread(app) as s:
        tools_llm = lc.ChatOpenAI(base_url=s.url, api_key="none", model="fake-random", use_responses_api=True,
                                  temperature=0, max_tokens=60, max_retries=0)
        bound = tools_llm.bind_tools([ADD], tool_choice="required")
        ask = HumanMessage("What is 3 plus 4?")
        call = bound.invoke([ask])
        assert call.tool_calls[0]["name"] == "add" and call.tool_calls[0]["args"] == {"a": 3, "b": 4}
        answer = tools_llm.invoke([ask, call, ToolMessage("7", tool_call_id=call.tool_calls[0]["id"])])
        assert answer.response_metadata.get("status") in ("completed", "incomplete")
