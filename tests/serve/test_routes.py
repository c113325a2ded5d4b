"""Issue 56 point 5: serve/ laid out as vLLM's entrypoints. The routers are module-level and read everything from
``request.app.state``, so two apps in one process keep their own backend, names, key and batcher; a streamed
choice is worded by its output format's class (chat's and completions' chunks), and the Responses stream's
events by :class:`ResponsesStream`, each checked here on its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, scripted  # noqa: E402
from formtax.decoding.plan import Finish, Phase  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402
from formtax.serve.chunks import ChatChunks, TextChunks  # noqa: E402
from formtax.serve.hooks import RequestHooks  # noqa: E402
from formtax.serve.responses_protocol import ResponsesRequest  # noqa: E402
from formtax.serve.serving_responses import ResponseBuilder, ResponsesStream  # noqa: E402
from formtax.serve.shapes import FinishReason, finish  # noqa: E402
from formtax.serve.tools import Tool, tool_plan  # noqa: E402
from formtax.strategies.base import Result  # noqa: E402
from formtax.streaming import Delta  # noqa: E402

BASE = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
USER = [{"role": "user", "content": "Say something."}]


def test_two_apps_in_one_process_keep_their_own_state():
    """The routes are shared by every app; what they serve is each app's own state."""
    one = create_app(FakeBackend(scripted("One says hi."), model_id="one"), window_s=0.0, temperature=0.0)
    two = create_app(FakeBackend(scripted("Two says bye."), model_id="two"), window_s=0.0, temperature=0.0,
                     api_key="k2", served_model_names=("second",))
    assert one.state.batcher is not two.state.batcher
    with ServerThread(one) as a, ServerThread(two) as b:
        names_a = [m["id"] for m in httpx.get(a.url + "/models").json()["data"]]
        assert names_a == ["one", "default"]
        assert httpx.get(b.url + "/models").status_code == 401  # only the second app has a key
        keyed = {"Authorization": "Bearer k2"}
        assert [m["id"] for m in httpx.get(b.url + "/models", headers=keyed).json()["data"]] == ["second"]
        assert httpx.get(b.url.removesuffix("/v1") + "/health").status_code == 200  # probes stay open
        body = {"messages": USER, "max_tokens": 12}
        said_a = httpx.post(a.url + "/chat/completions", json=body, timeout=60).json()
        said_b = httpx.post(b.url + "/chat/completions", json=body, headers=keyed, timeout=60).json()
        assert said_a["choices"][0]["message"]["content"].startswith("One")
        assert said_b["choices"][0]["message"]["content"].startswith("Two")
        assert said_b["model"] == "second"
        wrong = httpx.post(a.url + "/chat/completions", json=body | {"model": "second"}, timeout=60)
        assert wrong.status_code == 404 and "served: one, default" in wrong.json()["error"]["message"]


def _result(text: str, reason: str = Finish.EOS) -> Result:
    return Result(strategy="free", model="m", text=text, finish_reason=reason)


def test_chat_chunks_word_reasoning_content_and_a_stop_string():
    tok = FakeBackend(scripted("x")).tokenizer
    chunks = ChatChunks(BASE, 2, RequestHooks(stops=("END",)), tok, separated=True)
    assert chunks.opening() == [BASE | {"choices": [{"index": 2, "delta": {"role": "assistant", "content": ""},
                                                      "finish_reason": None}]}]
    deltas = [c["choices"][0]["delta"] for c in chunks.delta(Delta("think", Phase.REASONING, (1,)))]
    assert deltas == [{"reasoning_content": "think"}]
    sent = [c["choices"][0]["delta"] for d in ("Hi E", "N", "D more") for c in chunks.delta(Delta(d, Phase.ANSWER, ()))]
    assert sent == [{"content": "Hi "}]  # "E" and "N" held back until they proved a stop string, then cut
    last = chunks.finish(_result("Hi END more", Finish.STOP_SEQUENCE))
    assert [c["choices"][0]["finish_reason"] for c in last] == [FinishReason.STOP]
    assert last[-1]["formtax"]["finish_reason"] == Finish.STOP_SEQUENCE


def test_chat_chunks_read_a_call_into_tool_call_deltas():
    tok = FakeBackend(scripted("x")).tokenizer
    add = Tool.model_validate({"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})
    tools = tool_plan([add], "required", False)
    assert tools is not None and not tools.text_allowed
    chunks = ChatChunks(BASE, 0, RequestHooks(), tok, separated=False, tools=tools)
    out = [c["choices"][0]["delta"] for piece in ('{"add": ', '{"a": 3}', "}")
           for c in chunks.delta(Delta(piece, Phase.MAIN, ()))]
    assert out[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": ""}
    assert out[0]["tool_calls"][0]["id"].startswith("call_")
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in out[1:]) == '{"a": 3}'
    assert chunks.finish(_result('{"add": {"a": 3}}'))[-1]["choices"][0]["finish_reason"] == FinishReason.TOOL_CALLS
    legacy = ChatChunks(BASE, 0, RequestHooks(), tok, separated=False, tools=tools, legacy=True)
    for piece in ('{"add": ', '{"a": 3}}'):
        legacy.delta(Delta(piece, Phase.MAIN, ()))
    assert legacy.finish(_result('{"add": {"a": 3}}'))[-1]["choices"][0]["finish_reason"] == "function_call"


def test_text_chunks_have_no_role_and_keep_reasoning_as_text():
    chunks = TextChunks(BASE | {"object": "text_completion"}, 1, RequestHooks())
    assert chunks.opening() == []
    sent = chunks.delta(Delta("so ", Phase.REASONING, ()))  # completions separate nothing: all of it is text
    assert [c["choices"][0]["text"] for c in sent] == ["so "]
    last = chunks.finish(_result("so it goes", Finish.LENGTH))
    assert last[-1]["choices"][0] == {"index": 1, "text": "", "finish_reason": "length", "logprobs": None}


def test_finish_reasons_are_openais_words_for_formtaxs_finishes():
    assert finish(_result("x", Finish.LENGTH_INCOMPLETE)) == FinishReason.LENGTH
    assert finish(_result("x", Finish.CONSTRAINT_COMPLETE)) == FinishReason.STOP


def _collect(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [e async for e in events]

    return asyncio.run(run())


def test_the_responses_stream_opens_and_closes_each_item_in_order():
    async def chunks() -> AsyncIterator[dict[str, Any]]:
        for delta in ({"role": "assistant", "content": ""}, {"reasoning_content": "hm"}, {"content": "Hi"},
                      {"content": "!"}):
            yield BASE | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield BASE | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "formtax": {"x": 1}}
        yield BASE | {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}

    builder = ResponseBuilder(ResponsesRequest(input="hi"), "m")
    events = _collect(ResponsesStream(builder).events(chunks()))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete"]
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["content"][0]["text"] == "Hi!" and final["usage"]["output_tokens"] == 4
    assert final["formtax"] == {"x": 1}


def test_a_server_nobody_stopped_is_shut_down_at_exit(tmp_path) -> None:
    """A script that ends with its ServerThread running (the docs' examples do) exits cleanly: the server is stopped
    at exit, its batcher closed, before the interpreter finalises (CI once aborted there, SIGABRT, when a daemon
    thread freed a tensor during finalisation). The check runs after the server's own exit hook (hooks run last
    registered first), so it sees what finalisation will find."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "left_running.py"
    script.write_text(
        "import atexit, httpx\n"
        "from formtax.backends.fake import FakeBackend, random_logits\n"
        "from formtax.serve.app import ServerThread, create_app\n"
        "state = {}\n"
        "atexit.register(lambda: print('alive:', state['s'].thread.is_alive(), state['app'].state.batcher.alive))\n"
        "state['app'] = create_app(FakeBackend(random_logits(seed=1)), window_s=0.0)\n"
        "state['s'] = ServerThread(state['app'])\n"
        "r = httpx.post(state['s'].url + '/chat/completions', json={'model': 'default', 'max_tokens': 4,\n"
        "               'messages': [{'role': 'user', 'content': 'hi'}]}, timeout=60)\n"
        "assert r.status_code == 200, r.text\n", encoding="utf-8")
    src = str(Path(__file__).resolve().parents[2] / "src")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": src})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("alive: False False"), run.stdout
