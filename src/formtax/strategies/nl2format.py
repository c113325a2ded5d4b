"""NL-to-Format (docs/ALGORITHMS.md section 5; paper 003): free reasoning, then a constrained extraction call.

At level ``none`` the second call is only prompted, as in the paper: it runs to EOS (or its budget, the answer's
reserve) and its whole output is the answer that the parsers read, so a pretty-printed ``{\n  "answer": 36\n}``
or a leading newline is parsed as a JSON parser would (paper 003, Table 11's parse rates of 95.9-99.7%).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from formtax.constraints.jsonreason import JsonAnswerObject
from formtax.constraints.spec import ANSWER_LINE, Constraint, TemplateConstraint
from formtax.decoding.engine import Backend
from formtax.decoding.loop import RowRequest
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import ERROR_FINISHES, Phase
from formtax.decoding.policies import ConstrainedPolicy, FreePolicy
from formtax.decoding.rowengine import RowEngine
from formtax.strategies.base import (
    Prompt,
    Request,
    Result,
    RowDecoder,
    Strategy,
    batch_sampling,
    call_info,
    counts,
    engine_results,
    loop_decoder,
    phase_texts,
    read_answer,
    register,
    request_sampling,
    with_prefix,
)
from formtax.strategies.basic import constrained_policy
from formtax.strategies.reserve import request_reserve


def _answer_policy(constraint: Constraint, closing: int | None, backend: Backend) -> ConstrainedPolicy:
    """The second call's row recipe (``RowRequest.recipe``): its constrained policy, built by another process's
    backend (vLLM's engine)."""
    return constrained_policy(backend, constraint, closing_limit=closing)


def default_conversion(request: Request, reasoning: str) -> Prompt:
    """A generic conversion prompt; tasks pass their own (``Request.conversion``)."""
    question = request.prompt if isinstance(request.prompt, str) else request.prompt[-1]["content"]
    fmt = request.constraint.describe() if request.constraint is not None else "the final answer"
    return [
        {
            "role": "user",
            "content": (
                f"{question}\n\nA response to this question:\n{reasoning}\n\n"
                f"Write only the final answer of that response, in this exact format: {fmt}"
            ),
        }
    ]


def read_whole(res: Result, constraint: Constraint | None, constrain: bool) -> None:
    """Read call 2's answer as its whole output, as the runner's strict parser reads NL-to-Format's answer-alone
    forms (paper 003; issue 56: the same text reads the same through ``formtax.generate`` and the runner). Only
    prompted (``constrain=False``), the answer line must be the one line written, and the JSON answer object the
    whole output: text before the object, or a second line, is no answer. Other answers are searched for, as every
    free answer is (:func:`read_answer`)."""
    whole = (res.answer_text or "").strip()
    if constrain or constraint is None or res.answer_text is None:
        read_answer(res, constraint, constrain)
    elif isinstance(constraint, JsonAnswerObject):
        v = constraint.validate(whole)
        res.parse_ok, res.parsed, res.parse_error = v.ok, (v.value if v.ok else None), v.error
    elif (isinstance(constraint, TemplateConstraint) and constraint.template.parts
          and str(constraint.template.parts[0]).startswith(ANSWER_LINE) and ("\n" in whole or "\r" in whole)):
        res.parse_ok, res.parsed = False, None
        res.parse_error = "the answer call wrote more than its answer line"
    else:
        read_answer(res, constraint, constrain)


@register
class NL2Format(Strategy):
    name = "nl2format"
    summary = "call 1: free reasoning; call 2: a conversion prompt decoded with the answer constraint"
    prompt_format = "reasoning"  # call 1's prompt asks for reasoning only; call 2's asks for the answer
    answer_alone = True  # paper 003 parses call 2's whole output: the answer line (or object) and nothing else

    def __init__(self, extractor: Backend | None = None) -> None:
        self.extractor = extractor

    def min_budget(self, request: Request) -> int:
        return 1

    def answer_overhead(self, request: Request, backend: Backend | None = None) -> int | None:
        return 0  # call 1 is all reasoning; call 2 has its own budget, the answer's reserve

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        return None if request.constraint is None else (request.constraint, request_reserve(self.answer_backend(
            backend), request))

    def answer_backend(self, backend: Backend) -> Backend:
        return self.extractor or backend

    def run(self, backend: Backend, requests: Sequence[Request], checked: bool = False) -> list[Result]:
        if not checked:
            self.check(backend, requests)
        if isinstance(backend, RowEngine):
            return engine_results(backend, self.run_rows(backend, requests, backend.decode_rows))
        return self.run_rows(backend, requests, loop_decoder)

    def check_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> None:
        """Both calls lower without stepping: free reasoning, then a grammar (or free) extraction."""
        kinds = {Lowering.FREE} | ({Lowering.GRAMMAR} if any(r.constrain for r in requests) else set())
        engine.check_rows(self.name, kinds, [request_sampling(r) for r in requests])

    def run_rows(self, backend: Backend, requests: Sequence[Request], decoder: RowDecoder) -> list[Result]:
        """The two calls with ``decoder`` in place of the decode loop; call 2's rows name their constraint so a
        grammar-parameter engine can enforce it natively (a second request on the same engine)."""
        ext = self.extractor or backend
        tok = backend.tokenizer
        t0 = time.perf_counter()
        first = decoder(
            backend,
            [
                RowRequest(tok.prompt_ids(r.prompt), with_prefix(backend, r, FreePolicy(tok.eos_ids, phase=Phase.REASONING)),
                           r.max_tokens, r.seed)
                for r in requests
            ],
            batch_sampling(requests),
            [None] * len(requests),
        )
        reasonings = [tok.decode_text(o.tokens) for o in first]
        second_rows = []
        for r, text in zip(requests, reasonings, strict=True):
            prompt = r.conversion(text) if r.conversion is not None else default_conversion(r, text)
            assert r.constraint is not None
            policy = (
                constrained_policy(ext, r.constraint,
                                   closing_limit=request_reserve(ext, r) if r.closing else None)
                if r.constrain
                else FreePolicy(ext.tokenizer.eos_ids, phase=Phase.ANSWER)  # only prompted: runs to EOS
            )
            recipe = (functools.partial(_answer_policy, r.constraint, request_reserve(ext, r) if r.closing else None)
                      if r.constrain else None)
            second_rows.append(RowRequest(ext.tokenizer.prompt_ids(prompt), policy, request_reserve(ext, r), r.seed,
                                          recipe=recipe))
        second = decoder(ext, second_rows, batch_sampling(requests),
                         [r.constraint if r.constrain and not r.closing else None for r in requests])
        wall = time.perf_counter() - t0
        results = []
        for r, o1, o2, text in zip(requests, first, second, reasonings, strict=True):
            answer = ext.tokenizer.decode_text(o2.tokens)  # the whole output, constrained or not
            res = Result(
                strategy=self.name,
                model=backend.model_id,
                text=text,
                reasoning=text,
                answer_text=answer,
                finish_reason=o2.finish_reason,
                tokens=counts([o1, o2], [{"rc": "rc", "reasoning": "reasoning"}, {"answer": "answer"}]),
                timings={"wall_s": o1.wall_s + o2.wall_s, "batch_wall_s": wall},
                masked_mass=o2.masked_mass,
                phases={**phase_texts(backend, o1), "answer": answer},
                calls=[call_info(o1), call_info(o2)],
                token_ids=list(o1.tokens),
            )
            res.stats["extractor"] = ext.model_id
            for e in o2.events:  # what the backend reports about the extraction call (e.g. an approximate mass)
                res.stats.update(e.get("stats", {}))
            res.stats["call1_finish"] = o1.finish_reason
            read_whole(res, r.constraint, r.constrain)
            if o2.finish_reason in ERROR_FINISHES:
                res.error = f"the extraction call ended with {o2.finish_reason}"
            results.append(res)
        return results
