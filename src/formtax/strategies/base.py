"""Strategies: what a request asks for, what a result holds, and the registry.

A strategy is small: it turns a request into per-row policies for the shared decode loop (one or two calls) and
turns the loop's output into a :class:`Result`. The constraint's own Python oracle (``Constraint.validate``) reads
every constrained answer, so an engine bug shows up as ``parse_ok = False``, never as a silently wrong value.

Engines that own their decode loop (vLLM, servers: :class:`~formtax.decoding.rowengine.RowEngine`) decode whole
rows. A strategy says itself how it runs there (:meth:`Strategy.check_on_engine`, ``run_on_engine``): single-pass
strategies and NL-to-Format build the same rows and hand them to the engine's ``decode_rows`` in place of the
decode loop (``run_rows(backend, requests, decoder)``; vLLM's runs the very same Policy objects inside its logits
processor); InWriting owns its two-call form for engines that cannot step a policy live. No backend imports a
strategy.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from formtax.constraints.compile import compile_grammar
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Capability, require
from formtax.decoding.loop import Policy, RowOutput, RowRequest, decode
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import ERROR_FINISHES, Finish
from formtax.decoding.policies import ConstrainedPolicy, ForcedPrefix
from formtax.decoding.rowengine import RowEngine, lower_row
from formtax.decoding.sampling import GREEDY, Sampling
from formtax.errors import CapabilityError, ConfigError, ConstraintError
from formtax.strategies.options import StrategyOptions, check_options
from formtax.strategies.reserve import refuse_below_bound, refuse_no_completion

Prompt = str | list[dict[str, str]]

@dataclass
class Request:
    """One generation request."""

    prompt: Prompt
    constraint: Constraint | None = None
    max_tokens: int = 256
    seed: int = 0
    temperature: float = 0.0  # 0 = greedy; otherwise sampled with a generator seeded by ``seed``
    top_p: float = 1.0  # sampling filters (decoding/sampling.py), applied to the constrained distribution
    top_k: int = 0
    min_p: float = 0.0
    reasoning_prefix: str | None = None  # RC: forced at the start of the (first) generation
    triggers: Sequence[str] = ()  # InWriting: single-token strings that switch to the constraint
    constrain: bool = True  # False: same prompt and budget, no mask (the "unconstrained" level of paper 003)
    closing: bool = False  # closing mode: the answer always finishes inside the budget (constraints/closing.py)
    # the answer's reserve as a runner planned it (equal reasoning budgets across levels); None: the strategy's own
    reserve: int | None = None
    conversion: Callable[[str], Prompt] | None = None  # NL-to-Format: reasoning text -> second-call prompt
    meta: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # strategy-specific settings (suffix-*: tau, rule)


class TokenCounts(BaseModel):
    prompt: int = 0
    total: int = 0  # generated tokens over all calls (EOS included when emitted)
    forced: int = 0
    by_phase: dict[str, int] = Field(default_factory=dict)


class CallInfo(BaseModel):
    prompt_tokens: int
    generated: int
    finish_reason: str
    wall_s: float
    forward_passes: int


class Result(BaseModel):
    """Everything one request produced."""

    strategy: str
    model: str
    text: str  # the visible output of the main call (all phases, special tokens removed)
    reasoning: str = ""
    answer_text: str | None = None
    parsed: Any = None
    parse_ok: bool = False
    parse_error: str | None = None
    finish_reason: str = ""
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    timings: dict[str, float] = Field(default_factory=dict)
    masked_mass: float | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    phases: dict[str, str] = Field(default_factory=dict)
    calls: list[CallInfo] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    error: str | None = None


class Strategy(ABC):
    """A decoding strategy. Subclasses are registered by name with :func:`register`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    needs: ClassVar[frozenset[Capability]] = frozenset({Capability.STEP_LOGITS})
    requires_constraint: ClassVar[bool] = True
    output_format: ClassVar[str] = "reason-answer"  # the expected output format its prompt must describe
    # the format its (first) prompt describes when that differs from what the answer is read in (nl2format:
    # free reasoning, the second call asking for the answer); None: output_format
    prompt_format: ClassVar[str | None] = None
    # True: the answer the parsers read is the whole output of a call asked for the answer alone (NL-to-Format's
    # second call), so it is parsed in the answer-only form of the output format (tasks.vocab.ANSWER_ALONE)
    answer_alone: ClassVar[bool] = False
    # True: the task picks the output format (Task.fem_output_format: the FEM strategies, Deco-G's key phrase)
    task_output_format: ClassVar[bool] = False
    # the strategy's own settings (Request.options), declared once for the API, the CLI and the check
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions

    def options_of(self, request: Request) -> Any:
        """The request's options, validated against :attr:`Options` (a ConfigError names a bad one)."""
        return check_options(self.name, request.options, self.Options)

    def check(self, backend: Backend, requests: Sequence[Request]) -> None:
        """Refuse before any model call: bad sampling settings, capabilities, a missing constraint, a budget the
        answer cannot fit."""
        batch_sampling(requests)
        if isinstance(backend, RowEngine):
            self.check_on_engine(backend, requests)
        else:
            require(backend, self.needs, self.name)
        for r in requests:
            self.options_of(r)
            if self.requires_constraint and r.constraint is None:
                raise ConfigError(f"strategy {self.name!r} needs an answer constraint (--answer)")
            if r.max_tokens <= 0:
                raise ConfigError(f"max_tokens must be positive, got {r.max_tokens}")
            target = self.closing_target(backend, r) if r.closing and r.constrain else None
            if target is not None:  # before anything compiles: a hopeless budget costs a walk over the schema
                refuse_below_bound(self.answer_backend(backend), *target)
            if self.requires_constraint and r.constraint is not None:
                refuse_empty_language(backend, r.constraint)
            need = self.closing_min_budget(backend, r) if r.closing and r.constrain else self.min_budget(r)
            if need > r.max_tokens:
                raise ConfigError(
                    f"strategy {self.name!r}: max_tokens={r.max_tokens} cannot fit the answer, which needs up to "
                    f"{need} tokens; raise max_tokens"
                )
            if target is not None:
                refuse_no_completion(self.answer_backend(backend), *target)

    def closing_target(self, backend: Backend, request: Request) -> tuple[Constraint, int] | None:
        """Closing mode: the constraint its answer call decodes and that call's token limit; None where the
        strategy has no such call (free, short) or does not close (suffix-*, decog: their own searches)."""
        return None

    def answer_backend(self, backend: Backend) -> Backend:
        """The backend whose tokenizer decodes the answer (NL-to-Format's extractor may be another model)."""
        return backend

    def min_budget(self, request: Request) -> int:
        return 1

    def closing_min_budget(self, backend: Backend, request: Request) -> int:
        """:meth:`min_budget` under closing mode (where the answer's reserve may be its likely length)."""
        return self.min_budget(request)

    def answer_overhead(self, request: Request, backend: Backend | None = None) -> int | None:
        """Tokens of ``max_tokens`` that are not the reasoning phase's (the answer's reserve, JSON's scaffold); with
        ``backend`` and closing mode on, what the answer plausibly takes (:func:`~formtax.strategies.reserve.closing_room`).

        The runner gives every constraint level of a strategy the same reasoning budget R and sets
        ``max_tokens = R + answer_overhead`` (paper 003's equal ``max_preamble_tokens``). None: the strategy has
        no separate reasoning phase, and ``max_tokens`` is its whole budget.
        """
        return None

    def check_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> None:
        """Refuse what this strategy cannot do on an engine that owns its loop. The default: a strategy that
        runs its own decode loop (the suffix searches, Deco-G) does not run there at all."""
        require(engine, self.needs, self.name)
        raise CapabilityError(
            f"strategy {self.name!r} runs its own decode loop; backend {engine.name!r} decodes whole rows itself "
            "and runs the strategies that build rows (every single-pass strategy, inwriting and nl2format)"
        )

    def error_result(self, backend: Backend, error: ConstraintError) -> Result:
        """The result of a request whose constraint cannot be decoded with this tokenizer (the batch goes on)."""
        return Result(strategy=self.name, model=backend.model_id, text="", error=str(error),
                      finish_reason=Finish.CONSTRAINT_ERROR, parse_error=str(error))

    @abstractmethod
    def run(self, backend: Backend, requests: Sequence[Request], checked: bool = False) -> list[Result]:
        """Decode ``requests``. ``checked``: the caller ran :meth:`check` on these very requests already (the
        runner's up-front check), so a request is checked once whatever its route (issue 56)."""


def engine_results(engine: RowEngine, results: list[Result]) -> list[Result]:
    """Results decoded by an engine that owns its loop: its statistics recorded, and a row the replay caught
    outside its constraint made an error."""
    for res in results:
        res.stats.update(engine.engine_stats())
        if engine.ignored_constraint is not None and res.stats.get("constraint_ignored"):
            res.error = engine.ignored_constraint
    return results


_REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    if cls.name in _REGISTRY:
        raise ValueError(f"strategy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _ensure_builtin() -> None:
    """Import the built-in strategy modules (they register themselves); lazily, so that this module and the
    catalog have no import cycle with them."""
    import importlib

    from formtax.strategies.catalog import CATALOG

    for module in sorted({m for m, _ in CATALOG.values()}):
        importlib.import_module(module)


def get_strategy(name: str) -> Strategy:
    _ensure_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def list_strategies() -> dict[str, str]:
    _ensure_builtin()
    return {n: c.summary for n, c in sorted(_REGISTRY.items())}


# -- shared assembly -----------------------------------------------------------------------------------------


def refuse_empty_language(backend: Backend, constraint: Constraint) -> None:
    """A constraint no output can satisfy (e.g. ``regex:[^\\s\\S]``) is refused before any model call; it used
    to return an empty answer with exit status 0. The compiled grammar decides, once (``matches_nothing``)."""
    tok = backend.tokenizer
    if compile_grammar(constraint.grammar, tok.engine).matches_nothing(tok.n_logits, tok.eos_ids):
        raise ConstraintError(f"constraint {constraint.brief()!r} matches nothing: no output can satisfy it")


def request_sampling(request: Request) -> Sampling:
    """The request's sampling settings (refused here, before any model call, if out of range)."""
    return Sampling(request.temperature, request.top_p, request.top_k, request.min_p)


def batch_sampling(requests: Sequence[Request]) -> Sampling:
    """The one sampling setting of a batch (the decode loop draws every row alike)."""
    settings = {request_sampling(r) for r in requests}
    if len(settings) > 1:
        raise ConfigError("all requests of one batch must share their sampling settings (temperature, top_p, "
                          "top_k, min_p)")
    return settings.pop() if settings else GREEDY


def prefix_ids(backend: Backend, request: Request) -> list[int]:
    return backend.tokenizer.encode(request.reasoning_prefix) if request.reasoning_prefix else []


def closing_limit(backend: Backend, request: Request) -> int | None:
    """Closing mode's token limit for a single-call row (its budget after the forced prefix), or None when off."""
    return request.max_tokens - len(prefix_ids(backend, request)) if request.closing else None


def with_prefix(backend: Backend, request: Request, policy: Policy) -> Policy:
    ids = prefix_ids(backend, request)
    return ForcedPrefix(ids, policy) if ids else policy


def call_info(out: RowOutput) -> CallInfo:
    return CallInfo(
        prompt_tokens=len(out.prompt_ids),
        generated=len(out.tokens),
        finish_reason=out.finish_reason,
        wall_s=out.wall_s,
        forward_passes=out.forward_passes,
    )


def phase_texts(backend: Backend, out: RowOutput) -> dict[str, str]:
    tok = backend.tokenizer
    phases: dict[str, list[int]] = {}
    for s in out.steps:
        phases.setdefault(s.phase, []).append(s.token)
    return {p: tok.decode_text(ids) for p, ids in phases.items()}


def counts(outs: Sequence[RowOutput], phase_names: Sequence[dict[str, str]] | None = None) -> TokenCounts:
    by_phase: dict[str, int] = {}
    for k, out in enumerate(outs):
        rename = phase_names[k] if phase_names else {}
        for s in out.steps:
            p = rename.get(s.phase, s.phase)
            by_phase[p] = by_phase.get(p, 0) + 1
    return TokenCounts(
        prompt=sum(len(o.prompt_ids) for o in outs),
        total=sum(len(o.tokens) for o in outs),
        forced=sum(1 for o in outs for s in o.steps if s.forced),
        by_phase=by_phase,
    )


def read_answer(result: Result, constraint: Constraint | None, constrained: bool) -> None:
    """Fill parsed/parse_ok: a constrained answer must fullmatch; a free one is searched for the answer. A
    constrained answer whose row ended incomplete (``result.finish_reason`` in ERROR_FINISHES) is never parsed,
    even when its text happens to match: at a 1-token budget ``.{1,5}`` can end on half a UTF-8 character,
    which decodes to U+FFFD, a character the pattern accepts."""
    if constraint is None:
        result.parse_error = "no answer constraint given"
        return
    if constrained and result.finish_reason in ERROR_FINISHES:
        result.parse_ok, result.parsed = False, None
        result.parse_error = f"the constrained answer is incomplete ({result.finish_reason})"
        return
    if constrained and result.answer_text is not None:
        v = constraint.validate(result.answer_text)
    else:
        v = constraint.search(result.text if result.answer_text is None else result.answer_text)
    result.parse_ok, result.parsed, result.parse_error = v.ok, (v.value if v.ok else None), v.error
    if v.unchecked:  # a part of the check could not be decided in its time bound: flagged, never a hang
        result.stats["oracle_unchecked"] = v.unchecked


def finish_error(finish_reason: str) -> str | None:
    """The Result.error of a row that ended without a complete constrained answer (None otherwise)."""
    if finish_reason == Finish.LENGTH_INCOMPLETE:
        return "the constraint could not be completed within the token budget"
    if finish_reason == Finish.CONSTRAINT_ERROR:
        return "the grammar engine reached an error state (empty allowed set or rejected token)"
    return None

RowDecoder = Callable[[Backend, Sequence[RowRequest], Sampling, Sequence[Constraint | None]], list[RowOutput]]
"""Decodes rows to completion: ``(backend, rows, sampling, whole_output_constraints) -> outputs``. The fourth
argument names, per row, a constraint that alone governs the row's output after its forced prefix (None: the
policy must be stepped); an engine with a grammar parameter may enforce it natively instead."""


def policy_recipe(strategy: SinglePass, request: Request) -> Callable[[Backend], Policy]:
    """A row's recipe (``RowRequest.recipe``): the strategy's own policy for the request, built again from another
    process's backend (vLLM's engine builds the row it steps from this; backends/vllm/backend.py). What only the
    caller's process needs (the second call's prompt builder, the caller's notes) stays behind."""
    return functools.partial(_rebuilt_policy, strategy, dataclasses.replace(request, conversion=None, meta={}))


def _rebuilt_policy(strategy: SinglePass, request: Request, backend: Backend) -> Policy:
    return strategy.policy(backend, request)


def loop_decoder(backend: Backend, rows: Sequence[RowRequest], sampling: Sampling,
                 whole: Sequence[Constraint | None]) -> list[RowOutput]:
    """The decode loop as a :data:`RowDecoder` (it steps every policy, so it needs no constraint hint)."""
    return decode(backend, rows, temperature=sampling)


class SinglePass(Strategy):
    """A strategy that is one call of the decode loop with one policy per row."""

    constrained_answer: ClassVar[bool] = True

    @abstractmethod
    def policy(self, backend: Backend, request: Request) -> Policy: ...

    def effective_constraint(self, request: Request) -> Constraint | None:
        """The constraint this strategy decodes with (the json strategy wraps the answer's)."""
        return request.constraint

    def whole_output_constraint(self, request: Request, policy: Policy) -> Constraint | None:
        """The constraint that alone governs this row after its forced prefix: when the policy is a plain
        ConstrainedPolicy (behind an optional ForcedPrefix) decoding ``effective_constraint``. Engines with a
        grammar parameter may then enforce it natively (the policy still replays the output as a check).
        None whenever the policy does anything more (InWriting's switch, a wrapper that records statistics)."""
        inner = policy.inner if isinstance(policy, ForcedPrefix) else policy
        if not request.constrain or type(inner) is not ConstrainedPolicy or inner.closer is not None:
            return None
        return self.effective_constraint(request)

    def run(self, backend: Backend, requests: Sequence[Request], checked: bool = False) -> list[Result]:
        if not checked:
            self.check(backend, requests)
        if isinstance(backend, RowEngine):
            return engine_results(backend, self.run_on_engine(backend, requests))
        return self.run_rows(backend, requests, loop_decoder)

    def check_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> None:
        """Every row must lower onto the engine (a server cannot step a live policy); the engine then checks
        the rest. An engine that owns its loop gives step logits only through its lowerings, so STEP_LOGITS is
        not required of it; other needs (KV_CROP) are."""
        require(engine, self.needs - {Capability.STEP_LOGITS}, self.name)
        if Lowering.LIVE in engine.lowerings:  # every row lowers (a live row is stepped in the engine): building
            # each policy here only to lower it would build it once more than the run does (issue 56)
            engine.check_rows(self.name, engine.lowerings, [request_sampling(r) for r in requests])
            return
        kinds: set[Lowering] = set()
        for r in requests:
            try:
                policy = self.policy(engine, r)
            except ConstraintError:
                continue  # an error result for that request, as on every backend
            lowered = lower_row(RowRequest([0], policy, r.max_tokens), self.whole_output_constraint(r, policy))
            if lowered.kind not in engine.lowerings:
                raise CapabilityError(
                    f"strategy {self.name!r} cannot run on backend {engine.name!r}: its policy "
                    f"({type(lowered.inner).__name__}) must see the logits of every step, which this engine does not "
                    "expose")
            kinds.add(lowered.kind)
        engine.check_rows(self.name, kinds, [request_sampling(r) for r in requests])

    def run_on_engine(self, engine: RowEngine, requests: Sequence[Request]) -> list[Result]:
        """The rows of :meth:`run_rows`, decoded by the engine itself."""
        return self.run_rows(engine, requests, engine.decode_rows)

    def run_rows(self, backend: Backend, requests: Sequence[Request], decoder: RowDecoder) -> list[Result]:
        """Build one row per request, decode them with ``decoder``, assemble the results (no check here)."""
        results: list[Result | None] = [None] * len(requests)
        rows: list[RowRequest] = []
        index: list[int] = []
        whole: list[Constraint | None] = []
        for k, r in enumerate(requests):
            try:
                policy = self.policy(backend, r)
            except ConstraintError as e:  # unsatisfiable for this tokenizer: an error result, the batch goes on
                results[k] = self.error_result(backend, e)
                continue
            rows.append(RowRequest(backend.tokenizer.prompt_ids(r.prompt), policy, r.max_tokens, r.seed,
                                   recipe=policy_recipe(self, r)))
            index.append(k)
            whole.append(self.whole_output_constraint(r, policy))
        t0 = time.perf_counter()
        outs = decoder(backend, rows, batch_sampling(requests), whole)
        wall = time.perf_counter() - t0
        for k, o in zip(index, outs, strict=True):
            results[k] = self.assemble(backend, requests[k], o, wall)
        return [r for r in results if r is not None]

    def assemble(self, backend: Backend, request: Request, out: RowOutput, batch_wall: float) -> Result:
        tok = backend.tokenizer
        phases = phase_texts(backend, out)
        constrained = request.constrain and self.constrained_answer and request.constraint is not None
        res = Result(
            strategy=self.name,
            model=backend.model_id,
            text=tok.decode_text(out.tokens),
            reasoning=phases.get("rc", "") + phases.get("reasoning", ""),
            finish_reason=out.finish_reason,
            tokens=counts([out]),
            timings={"wall_s": out.wall_s, "batch_wall_s": batch_wall},
            masked_mass=out.masked_mass,
            phases=phases,
            calls=[call_info(out)],
            token_ids=list(out.tokens),
        )
        for e in out.events:
            if "switch" in e:
                res.stats["switch_step"] = e["step"]
                res.stats["switch_reason"] = e["switch"]
            if "stats" in e:  # what a backend reports about how it decoded the row (e.g. an approximate mass)
                res.stats.update(e["stats"])
        res.stats["forward_passes"] = out.forward_passes
        self.fill_answer(res, request, out, phases, constrained)
        if request.constraint is not None:  # free / short: the answer is searched for in the text, not enforced
            res.stats["answer_constrained"] = constrained
        approximated = getattr(request.constraint, "approximations", ())
        if approximated:  # the grammar is wider than the schema: the oracle alone checks these (spec.py)
            res.stats["schema_approximated"] = list(approximated)
        unchecked = getattr(request.constraint, "unchecked_formats", ())
        if unchecked:  # a format no one checks: the answer's value for it is the model's word alone
            res.stats["formats_unchecked"] = list(unchecked)
        self.read(res, request, constrained)
        if out.finish_reason in ERROR_FINISHES:
            res.error = finish_error(out.finish_reason)
        return res

    def read(self, res: Result, request: Request, constrained: bool) -> None:
        """Read ``res``'s answer (``answer_text``, else its text): the oracle's check, then :meth:`after_parse`.
        The one reader of assembly and of ``formtax.parse`` (strategies/reading.py)."""
        read_answer(res, self.effective_constraint(request), constrained)
        self.after_parse(res)

    def after_parse(self, res: Result) -> None:
        """A hook for strategies whose parsed value is a part of the constrained output."""

    def fill_answer(
        self, res: Result, request: Request, out: RowOutput, phases: dict[str, str], constrained: bool
    ) -> None:
        res.answer_text = phases.get("answer") if constrained else None
