"""Agent frameworks as clients of ``formtax serve`` (issue 59), each run as its own docs show against a live server:
the OpenAI Agents SDK (tools with an ``output_type``, ``run_sync`` and ``run_streamed``, the Responses and Chat
Completions models), DSPy (``Predict`` and ``ChainOfThought`` with int and ``Literal`` outputs, through the provider
declaration that says the server takes ``response_format``) and the Vercel AI SDK on node (``generateObject`` with
zod, ``streamText`` with a tool and ``stopWhen``, tools with ``Output.object``).

The Python clients live in their own venv (scripts/env-agents.sh sets FORMTAX_AGENTS_PYTHON), the AI SDK in
tests/serve/clients/node_modules (the same script, with npm); each test skips with a message where its client is
missing. The server runs the fake backend with a model that behaves like an agent's: it wants to call the tool
until the prompt holds the tool's result, then wants to answer (``agent_model``); every output is still generated
under the server's grammar, so what the clients parse is what formtax made valid, not what the model wished."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("uvicorn")

from formtax.backends.fake import EOS, FakeBackend, LogitsFn, random_logits  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402

AGENTS = os.environ.get("FORMTAX_AGENTS_PYTHON")
CLIENTS = Path(__file__).parent / "clients"
NODE = shutil.which("node")
TOOL_MARK = "TOOL-RESULT"
ASSISTANT = 259  # the byte tokenizer's assistant marker: the prompt ends after the last one


def agent_model(call: str, answer: str, text: str = "The total is 7.", margin: float = 12.0) -> LogitsFn:
    """A model that wants to write ``call`` until its prompt holds a tool's result (``TOOL-RESULT``), then
    ``answer`` where the tools' system note asks for a JSON answer (a request with a format), else ``text``, then
    EOS; noise elsewhere (as :func:`formtax.backends.fake.scripted`, with the target chosen by the prompt)."""
    noise = random_logits(seed=4, scale=1.0)

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = max(i for i, t in enumerate(seq) if t == ASSISTANT) + 1 if ASSISTANT in seq else 0
        prompt = bytes(t for t in seq[:start] if t < 256).decode("utf-8", "replace")
        done = answer if "as a JSON object under this schema" in prompt else text
        target = list((done if TOOL_MARK in prompt else call).encode())
        gen = list(seq[start:])
        logits = noise(seq).clone()
        k = len(gen)
        logits[target[k] if k < len(target) and gen == target[:k] else EOS] = logits.max() + margin
        return logits

    return fn


def _serve(call: str, answer: str) -> ServerThread:
    app = create_app(FakeBackend(agent_model(call, answer), model_id="fake-agent", context=16384), window_s=0.0,
                     temperature=0.0, timeout_s=120, default_max_tokens=200)
    return ServerThread(app)


def _run(cmd: list[str], url: str, timeout: int = 300) -> list[dict]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no cost-map fetch from the network
    run = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=timeout, cwd=CLIENTS, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not AGENTS, reason="no agents venv (scripts/env-agents.sh sets FORMTAX_AGENTS_PYTHON)")
def test_the_openai_agents_sdk_runs_tools_to_a_typed_output():
    assert AGENTS is not None
    with _serve('{"add": {"a": 3, "b": 4}}', '{"total": 7, "explanation": "3 plus 4 is 7."}') as srv:
        runs = _run([AGENTS, "agents_sdk.py"], srv.url)
    assert {(r["api"], r["mode"]) for r in runs} == {(a, m) for a in ("responses", "chat")
                                                     for m in ("run_sync", "run_streamed")}
    for r in runs:  # the tool ran with the model's arguments, then the typed output came back
        assert r["type"] == "Sum" and r["calls"] == [[3, 4]], r
        assert r["output"] == {"total": 7, "explanation": "3 plus 4 is 7."}, r
        if r["mode"] == "run_sync":
            assert r["items"][:2] == ["tool_call_item", "tool_call_output_item"], r
        else:
            assert "raw_response_event" in r["events"] and "run_item_stream_event" in r["events"], r


@pytest.mark.skipif(not AGENTS, reason="no agents venv (scripts/env-agents.sh sets FORMTAX_AGENTS_PYTHON)")
def test_dspy_typed_outputs_parse_on_the_first_structured_request():
    assert AGENTS is not None
    app = Recorder(create_app(FakeBackend(random_logits(seed=9), model_id="fake-dspy", context=16384),
                              window_s=0.0, temperature=0.0, timeout_s=120, default_max_tokens=200))
    with ServerThread(app) as srv:  # type: ignore[arg-type]
        runs = _run([AGENTS, "dspy_client.py"], srv.url)
    assert {(r["module"], r["field"]) for r in runs} == {(m, f) for m in ("Predict", "ChainOfThought")
                                                         for f in ("int", "Literal")}
    for r in runs:  # one request per call, parsed as it came: no retry, no fallback adapter
        assert r["requests"] == 1 and r["structured"] and r["ok"], r
    sent = [body for path, body in app.bodies if path.endswith("/chat/completions")]
    assert len(sent) == 4 and all(b["response_format"]["type"] == "json_schema" for b in sent), sent
    cot = [b["response_format"]["json_schema"]["schema"] for b in sent[2:]]
    assert all("reasoning" in s["properties"] for s in cot)  # ChainOfThought's reasoning field, under the schema


@pytest.mark.skipif(NODE is None, reason="node not found (the Vercel AI SDK runs on node)")
def test_the_vercel_ai_sdk_against_the_server():
    if not (CLIENTS / "node_modules" / "ai").is_dir():
        pytest.skip("the AI SDK is not installed (scripts/env-agents.sh runs npm ci in tests/serve/clients)")
    assert NODE is not None
    with _serve('{"add": {"a": 3, "b": 4}}', '{"total": 7}') as srv:
        runs = _run([NODE, "ai_sdk.mjs"], srv.url)
    by = {r["case"]: r for r in runs}
    assert set(by) == {"generateObject", "streamText", "toolsWithOutput"}, runs
    assert isinstance(by["generateObject"]["object"]["total"], int)
    assert by["streamText"]["toolCalls"] == [{"a": 3, "b": 4}] and by["streamText"]["steps"] == 2
    assert by["streamText"]["toolResults"] == ["TOOL-RESULT 7"] and by["streamText"]["text"] == "The total is 7."
    assert by["toolsWithOutput"]["toolCalls"] == [{"a": 3, "b": 4}]
    assert by["toolsWithOutput"]["output"] == {"total": 7}


class Recorder:
    """An ASGI wrapper that keeps every request's path and JSON body (what a client really sent)."""

    def __init__(self, app: Any) -> None:
        self.app, self.bodies = app, []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def recorded() -> Any:
            msg = await receive()
            if msg["type"] == "http.request":
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body") and chunks[0]:
                    self.bodies.append((scope["path"], json.loads(b"".join(chunks))))
            return msg

        return await self.app(scope, recorded, send)
