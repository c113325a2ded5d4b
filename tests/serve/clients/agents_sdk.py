"""The OpenAI Agents SDK as a client of ``formtax serve`` (issue 59; run by tests/serve/test_agents.py in
.venv-agents, scripts/env-agents.sh): an ``Agent`` with a function tool and an ``output_type`` runs to a typed final
output with ``Runner.run_sync`` and ``Runner.run_streamed``, through the Responses model and through
``OpenAIChatCompletionsModel``. Usage: ``python agents_sdk.py BASE_URL``; prints one JSON line per run."""

from __future__ import annotations

import asyncio
import json
import sys

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel

set_tracing_disabled(True)  # no traces to OpenAI's servers
calls: list[tuple[int, int]] = []


class Sum(BaseModel):
    total: int
    explanation: str


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    calls.append((a, b))
    return f"TOOL-RESULT {a + b}"


def agent(model: object) -> Agent:
    return Agent(name="calculator", instructions="Use the add tool, then give the total.", tools=[add],
                 output_type=Sum, model=model)  # type: ignore[arg-type]


async def streamed(a: Agent) -> tuple[object, list[str]]:
    result = Runner.run_streamed(a, "What is 3 plus 4?")
    kinds = [e.type async for e in result.stream_events()]
    return result.final_output, kinds


def model(api: str) -> object:
    """A fresh client per run: each run has its own event loop."""
    client = AsyncOpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
    return OpenAIResponsesModel("default", client) if api == "responses" else OpenAIChatCompletionsModel("default",
                                                                                                       client)


for api in ("responses", "chat"):
    calls.clear()
    run = Runner.run_sync(agent(model(api)), "What is 3 plus 4?")
    print(json.dumps({"api": api, "mode": "run_sync", "type": type(run.final_output).__name__,
                      "output": run.final_output.model_dump(), "calls": calls,
                      "items": [i.type for i in run.new_items]}))
    calls.clear()
    out, kinds = asyncio.run(streamed(agent(model(api))))
    print(json.dumps({"api": api, "mode": "run_streamed", "type": type(out).__name__,
                      "output": out.model_dump() if isinstance(out, BaseModel) else out, "calls": calls,
                      "events": sorted(set(kinds))}))
