"""The rows of a stock vLLM server's clients (formtax.vllm_plugin): their arguments, every check made before the
request reaches the engine, and the rows built from them inside it.

A client names formtax's strategy in ``vllm_xargs`` (:data:`KEYS`); :func:`validate` checks the whole request in
the logits processor's ``validate_params``, on vLLM's API process before the request is queued, so everything
that could make the row unbuildable is a 400 with its reason: an unknown argument, a strategy that runs its own
loop, a missing or unparseable answer, a budget the answer cannot fit, a grammar that matches nothing, closing's
witness that does not fit, vLLM's own masks beside formtax's (``structured_outputs`` from ``response_format`` or
``guided_*``, ``allowed_token_ids``, ``bad_words``), ``stop`` strings or extra stop tokens, ``min_tokens`` or
``ignore_eos`` with a stepped strategy, and a request whose client sent no ``max_tokens`` (vLLM then fills in the
whole context). The check builds the very policy the engine will build, with the engine's tokenizer, so the two
cannot disagree; it is bounded in time (:data:`SETUP_BOUND_ENV`): a request whose set-up (compile, closing's
witness search) takes longer is refused, never left to hold the engine's step. The start witnesses it found
travel with the request (``formtax_witnesses``, set here, refused from clients), so the engine does not search
again; the engine checks each before use. So does the fact that the request passed (``formtax_checked``): the engine
builds the row without running the strategy's check a second time (issue 56: one request, checked once).

In the engine a row that still cannot be built, or whose policy raises while it steps, ends with an error its
client sees: the row writes ``[formtax error: <reason>]`` (:func:`error_row`) and stops, and the reason is logged.
Only that request is affected.

InWriting's answer is written on its own line (:class:`SeamBreak`): the row emits the line break that formtax's
``Result.text`` puts at the switch, so the text a client gets is ``Result.text``'s and ``formtax.parse`` reads it.

Ours, and why: vLLM's ``validate_params`` is a classmethod that sees only the ``SamplingParams``; the tokenizer's
path and the client's own request (to tell a missing ``max_tokens`` from one vLLM filled in) are read from the
caller's frames (:func:`caller_context`; vLLM's ``InputProcessor`` and its OpenAI request). Where they cannot be
found (another vLLM layout) the checks that need them are made in the engine instead, and end the row visibly.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.decoding.plan import Phase, Plan, Policy, Wrapping, relay

log = logging.getLogger(__name__)

PREFIX = "formtax_"
KEYS = ("strategy", "answer", "closing", "triggers", "reasoning")
HANDED = ("witnesses", "checked")  # set by validate(), never by a client
VALIDATED = secrets.token_hex(16)
"""The value of ``formtax_checked`` that :func:`validate` writes: vLLM's offline ``LLM`` validates one request's
parameters twice in one process, and the second call must take what the first handed over as its own, while a
client (who cannot know this process's token) still cannot send it."""
SETUP_BOUND_ENV = "FORMTAX_VLLM_SETUP_S"
SETUP_BOUND_S = 5.0  # default bound of a request's set-up in validate_params (seconds)
ANSWER_BYTES_ENV = "FORMTAX_VLLM_MAX_ANSWER_BYTES"
ANSWER_BYTES = 16384  # the largest answer SPEC a request may send: its compile cannot be interrupted (1000 JSON
# properties, 30 KB, compiled in 1.8 s on this machine; the API loop waits for it)
VLLM_MASKS = ("structured_outputs", "allowed_token_ids", "bad_words")  # vLLM's own masks (refused beside formtax's)
FREE_STRATEGIES = ("free",)  # strategies whose row does not care where it stops
ERROR_TEXT = "[formtax error: {}]"


def answer_cap() -> int:
    """The largest answer SPEC accepted, in bytes (:data:`ANSWER_BYTES_ENV`)."""
    try:
        return max(64, int(os.environ.get(ANSWER_BYTES_ENV, ANSWER_BYTES)))
    except ValueError:
        return ANSWER_BYTES


def setup_bound() -> float:
    """The bound of a request's set-up in ``validate_params`` (seconds; :data:`SETUP_BOUND_ENV`)."""
    try:
        return max(0.05, float(os.environ.get(SETUP_BOUND_ENV, SETUP_BOUND_S)))
    except ValueError:
        return SETUP_BOUND_S


class EngineSide(Backend):
    """What a strategy's policy needs of a backend, inside vLLM's engine (or its API process): the tokenizer, and
    that the row is stepped token by token (the policy edits every step's logits, as in formtax's loop)."""

    name = "vllm-plugin"
    capabilities = frozenset({Capability.STEP_LOGITS})

    def __init__(self, tok: TokenizerInfo, model_id: str) -> None:
        self._tok, self._id = tok, model_id

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return self._id

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> Batch:
        raise RuntimeError("the vLLM engine decodes; formtax's plugin only steps its rows")


_ENGINES: dict[str, EngineSide] = {}
_ENGINES_LOCK = threading.Lock()


def engine_for(path: str) -> EngineSide:
    """The EngineSide of a tokenizer folder, loaded once per process, with the tables every JSON row needs built
    (:func:`warm`): a first request does not pay them."""
    with _ENGINES_LOCK:
        hit = _ENGINES.get(path)
        if hit is None:
            from formtax.backends.model_files import tokenizer_info

            hit = _ENGINES[path] = EngineSide(tokenizer_info(path), path)
            warm(hit)
        return hit


def warm(engine: EngineSide) -> None:
    """Build the per-tokenizer tables (llguidance's tokenizer, the JSON string tables, closing's ranks) by setting
    up one small json row: several seconds once, at start-up, instead of in a client's request."""
    from types import SimpleNamespace

    spec = RowSpec("json", "{int}", True, (), None)
    try:
        spec.policy(engine, SimpleNamespace(max_tokens=64, seed=0, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0))
    except Exception as e:  # noqa: BLE001 - a warm-up that fails changes nothing but the first request's time
        log.warning("formtax: warming the tokenizer's tables failed (%s)", e)


def warm_in_background(path: str | None) -> None:
    """:func:`engine_for` on a thread of its own (vLLM's API process loads the processor class at start-up)."""
    if path:
        threading.Thread(target=engine_for, args=(path,), name="formtax-warm", daemon=True).start()


@dataclass(frozen=True)
class RowSpec:
    """A request's formtax arguments (module docstring), checked."""

    strategy: str
    answer: str | None
    closing: bool
    triggers: tuple[str, ...]
    reasoning: str | None
    witnesses: dict[str, list[int] | None] | None = None
    checked: bool = False  # validate() checked the request with the strategy's own check: the engine does not again
    constraint: Any = field(default=None, compare=False, repr=False)  # the answer SPEC, parsed once (of)

    @classmethod
    def of(cls, extra_args: dict[str, Any] | None, from_client: bool = True) -> RowSpec | None:
        """The spec of a request's ``extra_args``; None when it names no formtax argument. Raises ValueError with
        one line naming the problem. ``from_client``: the arguments as the client sent them (the engine's copy
        also holds what :func:`validate` handed over)."""
        from formtax.constraints.native import as_constraint
        from formtax.strategies import get_strategy
        from formtax.strategies.base import SinglePass

        args = {k.removeprefix(PREFIX): v for k, v in (extra_args or {}).items() if k.startswith(PREFIX)}
        if not args or "recipe" in args:
            return None
        known = KEYS if from_client else KEYS + HANDED
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"vllm_xargs: unknown formtax argument(s) {', '.join(PREFIX + u for u in unknown)}; "
                             f"known: {', '.join(PREFIX + k for k in KEYS)}")
        name = str(args.get("strategy") or ("constrained" if args.get("answer") else "free"))
        try:
            strat = get_strategy(name)
        except Exception as e:  # noqa: BLE001 - the registry's own one-line message
            raise ValueError(f"vllm_xargs: formtax_strategy: {e}") from None
        if not isinstance(strat, SinglePass) or name == "nl2format":
            raise ValueError(f"vllm_xargs: formtax_strategy {name!r} runs its own decode loop (several passes or a "
                             "rewind); inside vLLM use a single-pass strategy (constrained, json, inwriting, short)")
        answer = args.get("answer")
        if answer is not None and len(str(answer).encode("utf-8", "replace")) > answer_cap():
            raise ValueError(f"vllm_xargs: formtax_answer is {len(str(answer).encode('utf-8', 'replace'))} bytes, "
                             f"over {answer_cap()} (its grammar would hold the server while it compiles; raise "
                             f"{ANSWER_BYTES_ENV} where that is acceptable)")
        constraint = None
        if answer is not None:
            try:
                constraint = as_constraint(str(answer))
                constraint.check()
            except Exception as e:  # noqa: BLE001 - the SPEC parser's message, whole
                raise ValueError(f"vllm_xargs: formtax_answer: {' '.join(str(e).split())}") from None
        elif name not in ("free", "short"):
            raise ValueError(f"vllm_xargs: formtax_strategy {name!r} needs formtax_answer (an answer SPEC)")
        closing = args.get("closing", 1)
        if closing not in (0, 1, "0", "1", True, False):
            raise ValueError(f"vllm_xargs: formtax_closing must be 0 or 1, got {closing!r}")
        triggers = args.get("triggers") or []
        triggers = [triggers] if isinstance(triggers, str) else list(triggers)
        if not all(isinstance(t, str) and t for t in triggers):
            raise ValueError("vllm_xargs: formtax_triggers must be non-empty strings")
        reasoning = args.get("reasoning")
        witnesses = args.get("witnesses")
        return cls(name, None if answer is None else str(answer), str(closing) in ("1", "True"), tuple(triggers),
                   None if reasoning is None else str(reasoning),
                   dict(witnesses) if isinstance(witnesses, dict) else None,
                   bool(args.get("checked")) and not from_client, constraint)

    @property
    def seamed(self) -> bool:
        """Whether the row writes InWriting's line break before the answer (:class:`SeamBreak`)."""
        return self.strategy == "inwriting" and self.answer is not None

    @property
    def reserved(self) -> int:
        """Tokens of ``max_tokens`` the policy does not get: InWriting's line break (:class:`SeamBreak`), and the
        EOS after a constrained answer, so that a complete answer always ends with ``finish_reason "stop"`` (a
        closing answer that took the last token would otherwise end as ``length``, which clients read as cut)."""
        from formtax.strategies import get_strategy

        constrained = self.answer is not None and getattr(get_strategy(self.strategy), "constrained_answer", False)
        return int(self.seamed) + int(constrained)

    def request(self, params: Any) -> Any:
        """formtax's Request for this spec and the request's SamplingParams (the budget less :attr:`reserved`)."""
        from formtax.constraints.native import as_constraint
        from formtax.strategies.base import Request

        sampling = params_sampling(params)
        budget = int(params.max_tokens) - self.reserved
        constraint = self.constraint if self.constraint is not None or self.answer is None else as_constraint(
            self.answer)
        return Request("", constraint,
                       max_tokens=budget, seed=int(params.seed or 0),
                       temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                       min_p=sampling.min_p, reasoning_prefix=self.reasoning, triggers=self.triggers,
                       closing=self.closing)

    def policy(self, engine: EngineSide, params: Any) -> Policy:
        """The row's policy, built and checked with the strategy's own code (ConfigError, ConstraintError,
        CapabilityError: one line each)."""
        from formtax.constraints.closing import START_WITNESSES
        from formtax.strategies import get_strategy
        from formtax.strategies.base import SinglePass

        strat = get_strategy(self.strategy)
        assert isinstance(strat, SinglePass)  # RowSpec.of refused the others
        req = self.request(params)
        if req.max_tokens <= 0:
            raise ValueError(f"max_tokens={params.max_tokens} leaves no token for the answer (the row keeps "
                             f"{self.reserved} for its line break and EOS)")
        token = START_WITNESSES.set(dict(self.witnesses or {}))
        try:
            if not self.checked:  # once per request: validate() checked it before it was queued
                strat.check(engine, [req])
            policy = strat.policy(engine, req)
            self.handed().update(START_WITNESSES.get() or {})
        finally:
            START_WITNESSES.reset(token)
        if self.seamed:
            tok = engine.tokenizer
            policy = SeamBreak(policy, newline_id(tok), tok.decode_text)
        return policy

    def handed(self) -> dict[str, list[int] | None]:
        """The start witnesses known for this spec (filled by :meth:`policy`)."""
        if self.witnesses is None:
            object.__setattr__(self, "witnesses", {})
        assert self.witnesses is not None
        return self.witnesses

    def live_row(self, engine: EngineSide, prompt_ids: Sequence[int], params: Any) -> Any:
        """The request's :class:`EngineRow`, built with the strategy's own code from the engine's tokenizer."""
        from formtax.backends.vllm.logits_processor import EngineRow
        from formtax.decoding.plan import RowRequest

        sampling = params_sampling(params)
        policy = self.policy(engine, params)
        # the row's own budget leaves the EOS's token (:attr:`reserved`); InWriting's break is inside it
        budget = int(params.max_tokens) - self.reserved + int(self.seamed)
        row = RowRequest(list(prompt_ids), policy, budget, int(params.seed or 0), sampling)
        tok = engine.tokenizer
        live = EngineRow(row, min(tok.eos_ids), tok.n_logits, sampling)
        live.rebuild = lambda: self.policy(engine, params)
        return live


def params_sampling(params: Any) -> Any:
    """formtax's Sampling of a request's SamplingParams."""
    from formtax.decoding.sampling import Sampling

    return Sampling(float(params.temperature or 0.0), float(params.top_p or 1.0), max(0, int(params.top_k or 0)),
                    float(params.min_p or 0.0))


def newline_id(tok: TokenizerInfo) -> int:
    """The token that is exactly a line break."""
    ids = tok.encode("\n")
    if len(ids) != 1:
        raise ValueError("this tokenizer has no single line-break token (InWriting's answer line)")
    return int(ids[0])


# -- the checks made before the request is queued ------------------------------------------------------------
def check_sampling(spec: RowSpec, params: Any, client_max_tokens: Any = ..., eos_ids: frozenset[int] = frozenset()
                   ) -> None:
    """What vLLM's own settings must not be beside a formtax row (ValueError, one line). ``client_max_tokens``:
    the client's own ``max_tokens`` (``...``: unknown here)."""
    if params.max_tokens is None or client_max_tokens is None:
        raise ValueError("formtax's strategies need max_tokens (the row's budget is the engine's; without it vLLM "
                         "gives the row the whole context)")
    set_masks = [k for k in VLLM_MASKS if getattr(params, k, None)]
    if set_masks:
        named = {"structured_outputs": "structured_outputs (response_format, guided_*)"}
        raise ValueError(f"vllm_xargs: formtax's arguments cannot be combined with vLLM's own "
                         f"{', '.join(named.get(k, k) for k in set_masks)}: both would mask the same tokens; "
                         "send formtax_answer alone")
    if spec.strategy in FREE_STRATEGIES:
        return
    if getattr(params, "stop", None):
        raise ValueError(f"stop: a stop string would cut formtax_strategy {spec.strategy!r}'s row before its answer "
                         "is written; the strategy ends the row itself")
    extra = sorted(set(getattr(params, "stop_token_ids", None) or ()) - set(eos_ids))
    if extra:
        raise ValueError(f"stop_token_ids {extra}: a stop token would cut formtax_strategy {spec.strategy!r}'s row "
                         "before its answer is written")
    if int(getattr(params, "min_tokens", 0) or 0) > 0:
        raise ValueError("min_tokens: formtax's row must be free to end where its answer is complete")
    if getattr(params, "ignore_eos", False):
        raise ValueError("ignore_eos: formtax's row ends at EOS when its answer is complete")


def validate(params: Any, engine: EngineSide | None, client_max_tokens: Any = ...) -> RowSpec | None:
    """Every check of a client's request (module docstring); the spec, or None for a request that names no formtax
    argument. With ``engine`` (its tokenizer) the row's policy is built here, bounded by :func:`setup_bound`, and
    the start witnesses it found are handed to the engine in ``params.extra_args``."""
    from formtax.constraints.clock import SEARCH_DEADLINE, SearchTimeout

    if (params.extra_args or {}).get(PREFIX + "checked") == VALIDATED:  # validated by this process already
        return RowSpec.of(params.extra_args, from_client=False)
    spec = RowSpec.of(params.extra_args)
    if spec is None:
        return None
    check_sampling(spec, params, client_max_tokens, engine.tokenizer.eos_ids if engine is not None else frozenset())
    if engine is None:
        return spec
    bound = setup_bound()
    t0 = time.monotonic()
    token = SEARCH_DEADLINE.set(t0 + bound)
    try:
        spec.policy(engine, params)
    except SearchTimeout:
        raise ValueError(f"vllm_xargs: closing's search for a completion of formtax_answer took over {bound:g} s "
                         f"(the answer is too large to close at max_tokens={params.max_tokens}); send "
                         f"formtax_closing 0, a smaller answer, or raise {SETUP_BOUND_ENV}") from None
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - ConfigError, ConstraintError, CapabilityError: their one line
        kept = (f" (of max_tokens={params.max_tokens} the row keeps {spec.reserved} for "
                f"{'the line break before the answer and ' if spec.seamed else ''}the EOS after it)"
                if spec.reserved else "")
        raise ValueError(f"vllm_xargs: {' '.join(str(e).split())}{kept}") from None
    finally:
        SEARCH_DEADLINE.reset(token)
    spent = time.monotonic() - t0
    if spent > bound:  # a compile that alone ran past the bound would hold the engine's step as long
        raise ValueError(f"vllm_xargs: formtax_answer took {spent:.1f} s to set up (over {bound:g} s: it would "
                         f"hold every request of the engine's step as long); send a smaller answer or raise "
                         f"{SETUP_BOUND_ENV}")
    if spec.witnesses:
        params.extra_args[PREFIX + "witnesses"] = dict(spec.witnesses)
    params.extra_args[PREFIX + "checked"] = VALIDATED  # the engine builds the row without checking it again
    return spec


def caller_context(depth: int = 40) -> tuple[str | None, Any]:
    """(the tokenizer path of the vLLM instance checking this request, the client's own OpenAI request or
    ``...``), read from the caller's frames (module docstring)."""
    path: str | None = None
    client: Any = ...
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        local = frame.f_locals
        owner = local.get("self")
        model = getattr(owner, "model_config", None) or local.get("model_config")
        tokenizer = getattr(model, "tokenizer", None)
        if path is None and isinstance(tokenizer, str):
            path = tokenizer
        req = local.get("request")
        if client is ... and req is not None and hasattr(req, "vllm_xargs") and hasattr(req, "max_tokens"):
            client = getattr(req, "max_completion_tokens", None) or req.max_tokens
        frame = frame.f_back  # type: ignore[assignment]
    return path, client


# -- rows that end visibly -------------------------------------------------------------------------------------
def error_row(engine: EngineSide, reason: str, max_tokens: int) -> Any:
    """A row that writes ``[formtax error: reason]`` (as much as ``max_tokens`` holds) and stops: what a client of
    a stock server sees of a row that could not be built in the engine."""
    from formtax.backends.vllm.logits_processor import EngineRow
    from formtax.decoding.plan import Finish, RowRequest

    tok = engine.tokenizer
    row = EngineRow(RowRequest([], StopPolicy(), max(1, int(max_tokens))), min(tok.eos_ids), tok.n_logits)
    row.explain = explainer(tok)
    row.finish(Finish.BACKEND_ERROR, reason)
    return row


def explainer(tok: TokenizerInfo) -> Callable[[str], list[int]]:
    """The tokens a failed row writes for its client (:data:`ERROR_TEXT`)."""
    return lambda reason: tok.encode(ERROR_TEXT.format(" ".join(reason.split())))


class StopPolicy(Policy):
    """Ends the row at once, with no token (after an error row's text)."""

    phase = Phase.MAIN

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        from formtax.decoding.plan import Finish

        return Plan(stop=Finish.BACKEND_ERROR)

    def advance(self, token: int) -> str | None:
        return None


class SeamBreak(Wrapping):
    """InWriting's answer on its own line (module docstring): at the switch, when the reasoning so far does not end
    in white space, a line break is written first, then the answer. The inner policy was built with one token
    less and sees the steps as if the break were not there, so its budget and closing's are its own."""

    def __init__(self, inner: Policy, newline: int, decode: Callable[[list[int]], str]) -> None:
        self.inner = inner
        self.newline = newline
        self.decode = decode
        self.phase = inner.phase
        self.tail: list[int] = []  # the last tokens before the switch (to see if they end in white space)
        self.sealed = False  # the seam is decided (a break written or not needed)
        self.breaking = False  # the token being taken is the break
        self.shift = 0  # steps the inner policy does not see (the break)

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        was = self.inner.phase
        plan = self.inner.plan(logits, step - self.shift)
        if self.sealed:
            self.phase = self.inner.phase
            return plan
        if plan.divert is not None:
            return relay(self._wrap(plan, was), self._sync)
        return self._seam(plan, was)

    def _sync(self) -> None:
        if not self.breaking:
            self.phase = self.inner.phase

    def _wrap(self, plan: Plan, was: str) -> Plan:
        from formtax.decoding.plan import Divert

        assert plan.divert is not None
        div = plan.divert
        then, other = div.then, div.otherwise
        return plan.replace(divert=Divert(
            div.tokens, lambda: self._seam(then(), was),
            None if other is None else (lambda: self._seam(other(), was)), div.by_argmax))

    def _seam(self, plan: Plan, was: str) -> Plan:
        self.phase = self.inner.phase
        if was == Phase.ANSWER or self.inner.phase != Phase.ANSWER or plan.stop is not None:
            return plan
        self.sealed = True
        text = self.decode(self.tail)
        if not text or text[-1].isspace():
            return plan
        self.breaking, self.phase = True, Phase.REASONING
        return Plan(forced=self.newline, event=plan.event)

    def advance(self, token: int) -> str | None:
        if self.breaking:
            self.breaking, self.shift = False, 1
            self.phase = self.inner.phase
            return None
        if not self.sealed:
            self.tail = [*self.tail[-7:], token]
        reason = self.inner.advance(token)
        self.phase = self.inner.phase
        return reason

    def mask_matcher(self) -> Any:
        return self.inner.mask_matcher()
