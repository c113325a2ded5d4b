"""One request through formtax's routes, on the fake model or the simulated vLLM engine (issue 56's route tests:
tests/core/test_route_equality.py, tests/core/test_one_request_pipeline.py).

* :func:`runner_route`: a one-item ``formtax run`` (a JSON Lines task), returning its record and the strategy
  Request it planned (prompt, answer, budget, seed), which the other routes are then given;
* :func:`plugin_route`: formtax's vLLM plugin as a stock server runs it, without vLLM: the API process checks the
  request (``validate_params``: :func:`~formtax.backends.vllm.rows.validate`), the engine builds the row from the
  request's ``extra_args`` and steps it every step (the processor edits the logits, the engine takes the argmax; EOS
  ends the request with ``stop``, ``max_tokens`` with ``length``, a stop string with ``stop`` as vLLM's detokenizer
  finds it: tests/vllm/sim_stops.py), and the client gets the decoded text (cut before a stop string).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from formtax.backends.fake import FakeBackend
from formtax.backends.vllm.logits_processor import apply_rows
from formtax.backends.vllm.rows import EngineSide, RowSpec, explainer, validate
from formtax.decoding.engine import Backend
from formtax.records import read_records
from formtax.records.schema import Record
from formtax.runner import RunConfig, run
from formtax.strategies.base import Prompt, Request
from tests.vllm.sim_stops import SimStops

LogitsFn = Callable[[Sequence[int]], torch.Tensor]
ITEM = {"id": "a", "question": "What is 2+3?", "answer": 5}


@dataclass(frozen=True)
class Case:
    """One request of the route comparisons: a strategy at a budget (and a temperature; 0 is greedy)."""

    strategy: str
    max_tokens: int
    temperature: float = 0.0

    @property
    def id(self) -> str:
        return self.strategy + (f"-T{self.temperature}" if self.temperature else "")


def runner_route(tmp: Path, fn: LogitsFn | Backend, strategy: str, slot: str, max_tokens: int,
                 temperature: float = 0.0, closing: bool | None = None, monkeypatch: Any = None
                 ) -> tuple[Record, Request]:
    """A one-item run of ``strategy`` (a grid spec, e.g. ``nl2format@none``) with the answer slot ``slot`` (e.g.
    ``{int:0..99}``) on the fake model ``fn`` or a loaded backend; the record and the Request the runner decoded
    (``closing=None``: the run's own default, as every route's)."""
    import formtax.runner.execute as execute

    planned: list[Request] = []
    real = execute.request_for

    def request_for(*args: Any) -> Request:
        planned.append(real(*args))
        return planned[-1]

    monkeypatch.setattr(execute, "request_for", request_for)
    tmp.mkdir(parents=True, exist_ok=True)
    items = tmp / "items.jsonl"
    items.write_text(json.dumps(ITEM) + "\n")
    extra = {} if closing is None else {"closing": closing}
    backend = fn if isinstance(fn, Backend) else FakeBackend(fn)
    config = RunConfig(task="jsonl", task_options={"path": str(items), "answer_spec": slot}, strategies=[strategy],
                       backend=backend.name, limit=1, seeds=1, batch_size=1, max_tokens=max_tokens,
                       temperature=temperature, **extra)
    out = tmp / "run"
    run(config, out, backend=backend)
    (record,) = read_records(out / "records.jsonl")
    return record, planned[-1]


@dataclass
class PluginOutput:
    text: str
    finish_reason: str  # vLLM's: stop or length
    token_ids: list[int]


def plugin_params(extra_args: dict[str, Any], max_tokens: int, temperature: float = 0.0, seed: int = 0,
                  stop: Sequence[str] = ()) -> SimpleNamespace:
    """A stock request's SamplingParams, as far as formtax's plugin reads them."""
    return SimpleNamespace(max_tokens=max_tokens, seed=seed, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                           stop=list(stop) or None, stop_token_ids=None, min_tokens=0, ignore_eos=False,
                           extra_args=dict(extra_args))


def plugin_route(fn: LogitsFn, prompt: Prompt, extra_args: dict[str, Any], max_tokens: int,
                 stop: Sequence[str] = ()) -> PluginOutput:
    """One greedy request through the plugin on the simulated stock engine (module docstring). The prompt is
    tokenized once, as vLLM tokenizes it; ValueError where ``validate_params`` refuses the request (a 400)."""
    engine = EngineSide(FakeBackend(fn).tokenizer, "sim")
    tok = engine.tokenizer
    ids = tok.prompt_ids(prompt)  # vLLM's own tokenization of the chat prompt
    params = plugin_params(extra_args, max_tokens, stop=stop)
    text = SimStops(tok, ids, stop)  # a stock server detokenizes every request (skipping special tokens)
    validate(params, engine, max_tokens)  # the API process, before the request is queued
    spec = RowSpec.of(params.extra_args, from_client=False)  # the engine's copy of the arguments
    assert spec is not None
    row = spec.live_row(engine, ids, params)
    row.explain = explainer(tok)
    out: list[int] = []
    finish = "length"
    while len(out) < max_tokens:
        logits = fn(ids + out).float().clone()
        row.catch_up(out)
        batch = logits.unsqueeze(0)
        apply_rows(batch, [(row, 0, None)])
        token = int(torch.argmax(batch[0]))
        out.append(token)
        if text.update(token, token in tok.eos_ids):
            finish = "stop"  # a stop string (vLLM's stop_reason names it)
            break
        if token in tok.eos_ids:
            finish = "stop"
            break
    if stop:
        return PluginOutput(text.text, finish, out)
    return PluginOutput(tok.decode_text([t for t in out if t not in tok.eos_ids]), finish, out)


def two_calls(reasoning: str, answer: str) -> FakeBackend:
    """A model that writes ``reasoning`` after the first prompt it sees and ``answer`` after the second (NL-to-Format's
    conversion prompt), then EOS; each route gets a fresh one."""
    from formtax.backends.fake import EOS, N_LOGITS

    seen: dict[tuple[int, ...], list[int]] = {}

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = max(i for i, t in enumerate(seq) if t == 259) + 1  # after the last <|assistant|>
        key = tuple(seq[:start])
        if key not in seen:
            seen[key] = list((answer if seen else reasoning).encode())
        target, gen = seen[key], list(seq[start:])
        logits = torch.zeros(N_LOGITS)
        k = len(gen)
        logits[target[k] if k < len(target) and gen == target[:k] else EOS] = 30.0
        return logits

    return FakeBackend(fn, model_id="fake-two-calls")
