"""Chat and text completions (``/v1/chat/completions``, ``/v1/completions``): a parsed request becomes jobs in the
shared batch, and their results OpenAI's bodies or chunks (:class:`~formtax.serve.serving.Outcome`).

``reasoning_effort`` (and the Responses API's ``reasoning.effort``) bounds the reasoning phase of a reasoning
strategy (one whose ``answer_overhead`` is not None: json, inwriting, nl2format, the suffix searches) at
:data:`REASONING_EFFORT` tokens; the answer keeps its own reserve on top, and ``max_tokens`` still bounds the
whole output, as OpenAI's ``max_completion_tokens`` counts reasoning tokens. A strategy with no reasoning phase
refuses it and says which strategies take it. The token counts are ours: OpenAI publishes none.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from formtax.decoding.engine import RenderedChat
from formtax.decoding.sampling import choice_seed, fresh_seed
from formtax.errors import ConfigError
from formtax.serve import shapes as out
from formtax.serve.chunks import ChatChunks, TextChunks, chat_chunks, chunk_base, text_chunk_base, text_chunks
from formtax.serve.hooks import RequestHooks, cut_at_stop
from formtax.serve.schema import ChatRequest, CompletionRequest, chat_constraint
from formtax.serve.serving import Outcome, Serving, StreamChoice, then
from formtax.serve.shapes import FinishReason
from formtax.serve.tools import ToolPlan, read_calls, tools_prompt, with_tools_prompt
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Result

REASONING_EFFORT = {"none": 0, "minimal": 16, "low": 64, "medium": 256, "high": 1024, "xhigh": 4096}
"""The reasoning budget, in tokens, of each ``reasoning_effort`` (module docstring)."""


class ChatServing(Serving):
    """``/v1/chat/completions``."""

    def effort_budget(self, prompt: Prompt, kwargs: dict[str, Any], effort: str) -> int:
        """``max_tokens`` under ``reasoning_effort`` (module docstring)."""
        strategy = kwargs["strategy"]
        strat = get_strategy(strategy)
        gen = self.generation_request(prompt, kwargs)
        overhead = strat.answer_overhead(gen, self.backend) if gen.constraint is not None else None
        if overhead is None:
            raise ConfigError(f"reasoning_effort: strategy {strategy!r} has no reasoning phase to bound; use a "
                              "reasoning strategy (formtax.strategy json, inwriting or nl2format, with an answer "
                              "format), or leave reasoning_effort out")
        return min(kwargs["max_tokens"], max(overhead + REASONING_EFFORT[effort], strat.min_budget(gen)))

    async def create(self, request: Request, req: ChatRequest) -> Outcome | JSONResponse:
        if (missing := self.check_model(req)) is not None:
            return missing
        # everything that compiles a grammar or tokenizes runs off the event loop, so /health and the other
        # requests are answered meanwhile (1,500 tools compile for seconds)
        prompt, kwargs, tools, hooks, separated = await asyncio.to_thread(self.prepare, req)
        strategy = kwargs["strategy"]
        if req.stream and self.streams_live(strategy):
            seed = fresh_seed() if req.seed is None else req.seed
            choices = [StreamChoice(prompt, h, choice_seed(seed, k), k) for k, h in enumerate(hooks)]
            base = chunk_base(self.model_name(req))
            tok, legacy = self.backend.tokenizer, req.legacy_functions
            live = self.live(choices, kwargs, base,
                             lambda c: ChatChunks(base, c.index, c.hooks, tok, separated, tools, legacy))
            first = await anext(live)  # the first token, or a refusal as a 400 before the stream starts
            return Outcome(chunks=then(first, live))
        results = await self.run_all(request, req, prompt, kwargs, hooks)
        if isinstance(results, JSONResponse):
            return results
        body = out.envelope("chat.completion", self.model_name(req), results)
        body["choices"] = [self.choice(k, r, h, tools, req.legacy_functions)
                           for k, (r, h) in enumerate(zip(results, hooks, strict=True))]
        headers = out.headers(results[0])
        return Outcome(chunks=chat_chunks(body), headers=headers) if req.stream else Outcome(body, None, headers)

    def prepare(self, req: ChatRequest) -> tuple[Prompt, dict[str, Any], ToolPlan | None, list[RequestHooks], bool]:
        """A chat request as a job, checked before it is queued (in a worker thread: it compiles the answer's
        grammar and tokenizes the prompt): (prompt, the job's arguments, the tool plan, each choice's hooks,
        whether the reasoning comes back apart)."""
        strategy, constraint, tools = chat_constraint(req, self.cfg.strategy, self.cfg.answer)
        messages: list[dict[str, str]] = [{"role": m.prompt_role(), "content": m.text()} for m in req.messages]
        if tools is not None:
            messages = with_tools_prompt(messages, tools_prompt(tools, req.tools or []))
        kwargs = self.plan_kwargs(req, strategy, constraint, raw=False)
        prompt: Prompt = messages
        if req.chat_template_kwargs:  # vLLM's: the template's own variables, this request only
            prompt = RenderedChat(self.backend.tokenizer.chat_prompt(messages, req.chat_template_kwargs))
            kwargs["raw"] = True
        if req.reasoning_effort is not None:
            kwargs["max_tokens"] = self.effort_budget(prompt, kwargs, req.reasoning_effort)
        free_text = constraint is None or (tools is not None and tools.text_allowed and strategy == "constrained")
        hooks = [self.hooks_of(req, free_text, req.logprobs, req.top_logprobs or 0) for _ in range(req.n)]
        self.refuse_unhookable(strategy, hooks[0], answered=constraint is not None)
        self.check_job(prompt, kwargs)
        separated = constraint is not None and getattr(get_strategy(strategy), "constrained_answer", False)
        return prompt, kwargs, tools, hooks, separated

    def choice(self, index: int, res: Result, hooks: RequestHooks, tools: ToolPlan | None, legacy: bool
               ) -> dict[str, Any]:
        """One chat choice: the content (cut at a stop string), the separated reasoning, tool calls (or the legacy
        ``function_call`` of a request that sent ``functions``), logprobs."""
        text = out.content(res)
        message: dict[str, Any] = {"role": "assistant", "content": cut_at_stop(text, hooks.stops) if text else text}
        if out.reasoning(res) is not None:
            message["reasoning_content"] = out.reasoning(res)
        finish = out.finish(res)
        if tools is not None and res.parse_ok:
            calls = read_calls(text, res.parsed, tools.names if tools.answer is not None else None)
            if calls:
                message["content"] = None
                if legacy:
                    message["function_call"] = calls[0]["function"]
                else:
                    message["tool_calls"] = calls
                # a call that ran into the budget says so, as OpenAI does (issue 47), though its arguments parse
                ran_out = out.FINISH.get(res.finish_reason) == FinishReason.LENGTH
                finish = FinishReason.LENGTH if ran_out else (
                    FinishReason.FUNCTION_CALL if legacy else FinishReason.TOOL_CALLS)
        return {"index": index, "message": message, "finish_reason": finish,
                "logprobs": out.chat_logprobs(self.backend.tokenizer, hooks.recorded) if hooks.logprobs else None,
                "formtax": out.extension(res)}


class CompletionServing(Serving):
    """``/v1/completions``: the prompt is raw text (no chat template)."""

    def prepare(self, req: CompletionRequest, prompts: list[str]) -> tuple[dict[str, Any], list[list[RequestHooks]]]:
        """The job's arguments and each prompt's choices' hooks, checked before queueing (off the event loop, as
        chat's :meth:`ChatServing.prepare`)."""
        opts = req.formtax
        guided = req.guided()
        answer: Any = opts.answer if opts and opts.answer else None
        if guided is not None:
            if answer is not None:
                raise ConfigError(f"give one answer format, not formtax.answer and {guided[0]}")
            answer = guided[1]
        strategy = (opts.strategy if opts and opts.strategy else ("constrained" if answer else "free"))
        kwargs = self.plan_kwargs(req, strategy, answer, raw=True)
        hooks = [[self.hooks_of(req, answer is None, req.logprobs is not None, req.logprobs or 0)
                  for _ in range(req.n)] for _ in prompts]
        self.refuse_unhookable(strategy, hooks[0][0], answered=answer is not None)
        for p in prompts:
            self.check_job(p, kwargs)
        return kwargs, hooks

    async def create(self, request: Request, req: CompletionRequest) -> Outcome | JSONResponse:
        if (missing := self.check_model(req)) is not None:
            return missing
        if req.echo:
            raise ConfigError("echo: not supported by formtax serve")
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts:
            raise ConfigError("prompt: give at least one prompt")
        kwargs, hooks = await asyncio.to_thread(self.prepare, req, prompts)
        strategy = kwargs["strategy"]
        if req.stream and self.streams_live(strategy):
            seed = fresh_seed() if req.seed is None else req.seed
            choices = [StreamChoice(p, h, choice_seed(seed, k), i * req.n + k, i)
                       for i, (p, hs) in enumerate(zip(prompts, hooks, strict=True)) for k, h in enumerate(hs)]
            base = text_chunk_base(self.model_name(req))
            live = self.live(choices, kwargs, base, lambda c: TextChunks(base, c.index, c.hooks))
            first = await anext(live)
            return Outcome(chunks=then(first, live))
        runs = await asyncio.gather(*(self.run_all(request, req, p, kwargs, hs)
                                      for p, hs in zip(prompts, hooks, strict=True)))
        finished: list[list[Result]] = []
        for run in runs:
            if isinstance(run, JSONResponse):
                return run
            finished.append(run)
        results = [r for run in finished for r in run]
        flat = [h for hs in hooks for h in hs]
        body = out.envelope("text_completion", self.model_name(req), results)
        body["usage"] = out.usage(results, [run[0] for run in finished])
        tok = self.backend.tokenizer
        body["choices"] = [{"index": k, "text": cut_at_stop(out.content(r) or "", h.stops), "finish_reason":
                            out.finish(r), "logprobs": out.text_logprobs(tok, h.recorded) if h.logprobs else None}
                           for k, (r, h) in enumerate(zip(results, flat, strict=True))]
        return Outcome(chunks=text_chunks(body)) if req.stream else Outcome(body)
