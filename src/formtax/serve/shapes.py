"""OpenAI's chat and completions shapes for ``formtax serve``: errors, the completion envelope, finish reasons,
usage, logprobs and the ``formtax`` extension (how a :class:`~formtax.strategies.base.Result` is worded for an
OpenAI client). Streams are worded in :mod:`formtax.serve.chunks`."""

from __future__ import annotations

import json
import time
import uuid
from enum import StrEnum
from typing import Any

from fastapi.responses import JSONResponse

from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.plan import Finish, Phase
from formtax.decoding.stops import stop_cut
from formtax.serve.hooks import TokenLogprob
from formtax.strategies.base import Result


class FinishReason(StrEnum):
    """OpenAI's ``finish_reason`` (the words a client reads; formtax's own reason is ``formtax.finish_reason``,
    a :class:`~formtax.decoding.plan.Finish`)."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    FUNCTION_CALL = "function_call"  # the legacy ``functions`` field's call
    ERROR = "error"  # vLLM's word for a request that ended in error


FINISH: dict[str, FinishReason] = {Finish.LENGTH: FinishReason.LENGTH, Finish.LENGTH_INCOMPLETE: FinishReason.LENGTH}
"""formtax's finishes that OpenAI calls ``length``; every other one ends as ``stop``."""

APPROXIMATED_HEADER = "X-Formtax-Schema-Approximated"
UNCHECKED_HEADER = "X-Formtax-Formats-Unchecked"
ORACLE_UNCHECKED_HEADER = "X-Formtax-Answer-Unchecked"  # a part of the answer's check could not be decided in time


RETRY_AFTER_S = 1
"""What a 429 (full queue) and a stuck worker's 503 tell a client to wait, in seconds (``Retry-After``)."""


def error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
          code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, with ``status``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def headers(res: Result) -> dict[str, str]:
    """``X-Formtax-Schema-Approximated``: what the answer's grammar left to the oracle (constraints/spec.py's
    ``approximate_schema``), ``; ``-separated; absent when the grammar is the schema. ``X-Formtax-Formats-Unchecked``:
    the formats neither the grammar nor the oracle checks (``, ``-separated; absent when every format is checked)."""
    out = {}
    approximated = res.stats.get("schema_approximated")
    if approximated:
        out[APPROXIMATED_HEADER] = "; ".join(approximated)
    unchecked = res.stats.get("formats_unchecked")
    if unchecked:
        out[UNCHECKED_HEADER] = ", ".join(unchecked)
    if res.stats.get("oracle_unchecked"):
        out[ORACLE_UNCHECKED_HEADER] = "1"
    return out


def content(res: Result) -> str | None:
    """The answer where the strategy has one (reasoning apart), else the whole text."""
    return res.answer_text if res.answer_text is not None else res.text


def reasoning(res: Result) -> str | None:
    return res.reasoning if res.answer_text is not None and res.reasoning else None


def refused_answer(res: Result) -> bool:
    """Whether a constrained answer came back whole but its check refused it (a rule only the oracle checks, on
    an approximated schema): the client must see that, not a ``stop`` with an error of null."""
    return (bool(res.stats.get("answer_constrained")) and not res.parse_ok
            and res.finish_reason not in FINISH and res.parse_error is not None)


def finish(res: Result) -> FinishReason:
    """OpenAI's finish reason; ``"error"`` (vLLM's word for a request that ended in error) for an answer its check
    refused (:func:`refused_answer`). A constrained answer that is complete when the budget ends (closing mode
    finishes it on the last token) is ``stop``: the answer is whole, and clients (instructor) read ``length`` as
    cut (issue 57)."""
    if refused_answer(res):
        return FinishReason.ERROR
    if res.finish_reason == Finish.LENGTH and res.answer_text is not None and res.parse_ok:
        return FinishReason.STOP
    return FINISH.get(res.finish_reason, FinishReason.STOP)


def usage(results: list[Result], prompts: list[Result] | None = None) -> dict[str, Any]:
    """OpenAI's usage of ``results`` (every choice's tokens); the prompt tokens of ``prompts`` (one result per
    distinct prompt; default: the first result's prompt, counted once)."""
    completion = sum(r.tokens.total for r in results)
    prompt = sum(r.tokens.prompt for r in (prompts if prompts is not None else results[:1]))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "completion_tokens_details": {"reasoning_tokens": sum(reasoning_tokens(r) for r in results)}}


def envelope(kind: str, model: str, results: list[Result]) -> dict[str, Any]:
    """The fields around the choices: id, object, created, model, usage (all choices), and the ``formtax``
    object of the first choice (each choice also carries its own)."""
    return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
            "created": int(time.time()), "model": model, "usage": usage(results), "formtax": extension(results[0])}


def reasoning_tokens(res: Result) -> int:
    """OpenAI's ``reasoning_tokens``: the tokens of the reasoning phases, where the strategy separates them."""
    if reasoning(res) is None:
        return 0
    return sum(n for phase, n in res.tokens.by_phase.items() if phase in (Phase.REASONING, Phase.RC))


def extension(res: Result) -> dict[str, Any]:
    """The response's ``formtax`` field; ``closing_parse`` where closing mode ran on a schema the grammar only
    approximates (``oracle``: closing kept to answers the oracle accepts; ``grammar-only``: it could not, and said so
    before decoding); ``unchecked`` where a part of the answer's check could not be decided in its time bound; the
    error of an answer its check refused (:func:`refused_answer`)."""
    error_text = res.error or (f"the answer failed its check: {res.parse_error}" if refused_answer(res) else None)
    out = {"strategy": res.strategy, "parsed": _jsonable(res.parsed), "parse_ok": res.parse_ok,
           "finish_reason": res.finish_reason, "error": error_text, "token_ids": res.token_ids}
    if res.stats.get("oracle_unchecked"):
        out["unchecked"] = res.stats["oracle_unchecked"]
    if res.stats.get("closing_parse"):
        out["closing_parse"] = res.stats["closing_parse"]
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def _entry(tok: TokenizerInfo, token: int, logprob: float) -> dict[str, Any]:
    text = tok.decode([token])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tok: TokenizerInfo, recorded: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    return {"content": [_entry(tok, r.token, r.logprob) | {"top_logprobs": [_entry(tok, t, lp) for t, lp in r.top]}
                        for r in recorded]}


def text_logprobs(tok: TokenizerInfo, recorded: list[TokenLogprob]) -> dict[str, Any]:
    """Legacy completions' ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = [tok.decode([r.token]) for r in recorded]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [r.logprob for r in recorded],
            "top_logprobs": [{tok.decode([t]): lp for t, lp in r.top} for r in recorded], "text_offset": offsets}


class StopCutter:
    """Streams text while holding back what may be the start of a stop string, so no part of a stop string is
    ever sent (OpenAI leaves it out of the content)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.buffer = ""
        self.done = False

    def feed(self, text: str) -> str:
        if self.done:
            return ""
        if not self.stops:
            return text
        self.buffer += text
        cut = stop_cut(self.buffer, self.stops)  # the rule of the whole content's cut (decoding/stops.py)
        if cut is not None:
            out, self.buffer, self.done = self.buffer[:cut], "", True
            return out
        hold = max((k for s in self.stops for k in range(1, len(s)) if self.buffer.endswith(s[:k])), default=0)
        out, self.buffer = self.buffer[: len(self.buffer) - hold], self.buffer[len(self.buffer) - hold:]
        return out

    def flush(self) -> str:
        out, self.buffer = ("" if self.done else self.buffer), ""
        return out
