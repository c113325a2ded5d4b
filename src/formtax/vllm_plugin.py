"""formtax's strategies inside a stock ``vllm serve``: a v1 logits processor that builds each request's row inside
the engine, from the request's own arguments.

    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --logits-processors formtax.vllm_plugin:FormtaxLogitsProcessor

A request chooses its strategy through vLLM's custom-arguments channel (``vllm_xargs`` over HTTP, which becomes
``SamplingParams.extra_args`` offline); nothing crosses processes but these arguments:

* ``formtax_strategy``: a single-pass strategy (``constrained``, ``json``, ``inwriting``, ``short``, ``free``,
  with ``+rc`` forms); the suffix searches and Deco-G run their own loops and are refused;
* ``formtax_answer``: the answer SPEC (as ``formtax generate --answer``: ``The answer is: {int}``, ``{choice:a|b}``,
  a JSON Schema as JSON text, ...);
* ``formtax_closing`` (0/1, default 1: the answer always finishes inside ``max_tokens``), ``formtax_triggers``
  (InWriting's switch strings), ``formtax_reasoning`` (a forced reasoning prefix, RC).

``max_tokens`` is required: the row's budget must be the engine's. Bad arguments are refused in
:meth:`validate_params`, which vLLM turns into an HTTP 400 with the message.

In the engine the processor loads the model's tokenizer once (:func:`formtax.backends.vllm_backend.tokenizer_info`),
builds the row's policy with the strategy's own code (as in formtax's loop), and steps it every engine step
(:class:`~formtax.backends.logits_processor.LiveRow`: catch up on the emitted tokens, plan, edit the logits). Rows
are found by vLLM's batch index, which the processor tracks through every add, remove and move (rows are
reordered every step). Compiled grammars are cached per engine (llguidance's compile cache, keyed by grammar);
matchers are per request.

formtax's own vLLM backend sends its rows through this same processor, with other arguments: ``formtax_recipe``
(the row's policy recipe, pickled and signed with a secret only that backend and its engine know), ``formtax_row``
(the row's key) and ``formtax_report`` (where the finished row's output goes); such a row chooses its own tokens
(backends/logits_processor.py) and reports its RowOutput (backends/row_reports.py). So the backend runs with
vLLM's engine in another process, with tensor parallelism and with Ray. A recipe that does not verify is refused
in :meth:`validate_params`.

What the plugin cannot return: vLLM's response has the whole text (reasoning and answer together), not formtax's
parse, masked mass or switch statistics; parse the answer from the text (``formtax.parse``), or use
``formtax serve`` / the in-process backend for those. A row whose policy cannot be built in the engine (a grammar
llguidance refuses) ends at once with no text.

vLLM is imported only when vLLM loads the class (a module ``__getattr__``), so this module imports without it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo

log = logging.getLogger(__name__)

PREFIX = "formtax_"
KEYS = ("strategy", "answer", "closing", "triggers", "reasoning")
RECIPE_KEYS = ("recipe", "row", "report", "stream")  # formtax's own backend (module docstring)


def _recipe_of(extra_args: dict[str, Any] | None) -> tuple[Any, str, str] | None:
    """(recipe, row key, report address) of a request from formtax's own backend; None for other requests.
    ValueError (one line) for a recipe that does not verify or incomplete arguments."""
    from formtax.backends.row_reports import unseal

    args = extra_args or {}
    if PREFIX + "recipe" not in args:
        return None
    extra = sorted(k for k in args if k.startswith(PREFIX) and k.removeprefix(PREFIX) not in RECIPE_KEYS)
    if extra:
        raise ValueError(f"vllm_xargs: formtax_recipe comes alone; also got {', '.join(extra)}")
    key, address = args.get(PREFIX + "row"), args.get(PREFIX + "report")
    if not isinstance(key, str) or not key or not isinstance(address, str) or not address:
        raise ValueError("vllm_xargs: formtax_recipe needs formtax_row and formtax_report")
    return unseal(args[PREFIX + "recipe"]), key, address


def build_row(engine: EngineSide, extra_args: dict[str, Any] | None, prompt_ids: Sequence[int], sampling: Any,
              max_tokens: int, seed: int) -> Any:
    """The LiveRow of a request from formtax's own backend (None for any other request): its policy built from
    its recipe with the engine's tokenizer; it chooses its tokens and reports its output when it finishes."""
    from formtax.backends.logits_processor import LiveRow
    from formtax.backends.row_reports import encode, encode_step, send
    from formtax.decoding.plan import RowRequest

    got = _recipe_of(extra_args)
    if got is None:
        return None
    recipe, key, address = got

    def report(row: LiveRow) -> None:
        send(address, encode(key, row.out, row.error))

    def step(token: int, phase: str) -> None:
        send(address, encode_step(key, token, phase))

    tok = engine.tokenizer
    row = RowRequest(list(prompt_ids), recipe(engine), max_tokens, seed, sampling)
    live = LiveRow(row, min(tok.eos_ids), tok.n_logits, sampling, chooses=True, on_done=report)
    live.key = key
    if str((extra_args or {}).get(PREFIX + "stream", "0")) == "1":
        live.on_token = step
    return live


class EngineSide(Backend):
    """What a strategy's policy needs of a backend, inside vLLM's engine: the tokenizer, and that the row is
    stepped token by token (the policy edits every step's logits, as in formtax's loop)."""

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


@dataclass(frozen=True)
class RowSpec:
    """A request's formtax arguments (module docstring), checked."""

    strategy: str
    answer: str | None
    closing: bool
    triggers: tuple[str, ...]
    reasoning: str | None

    @classmethod
    def of(cls, extra_args: dict[str, Any] | None) -> RowSpec | None:
        """The spec of a request's ``extra_args``; None when it names no formtax argument. Raises ValueError with
        one line naming the problem."""
        from formtax.constraints.native import as_constraint
        from formtax.strategies import get_strategy
        from formtax.strategies.base import SinglePass

        args = {k.removeprefix(PREFIX): v for k, v in (extra_args or {}).items() if k.startswith(PREFIX)}
        if not args or "recipe" in args:
            return None
        unknown = sorted(set(args) - set(KEYS))
        if unknown:
            raise ValueError(f"vllm_xargs: unknown formtax argument(s) {', '.join(PREFIX + u for u in unknown)}; "
                             f"known: {', '.join(PREFIX + k for k in KEYS)}")
        name = str(args.get("strategy") or ("constrained" if args.get("answer") else "free"))
        try:
            strat = get_strategy(name)
        except Exception as e:  # noqa: BLE001 - the registry's own one-line message
            raise ValueError(f"vllm_xargs: formtax_strategy: {e}") from None
        if not isinstance(strat, SinglePass):
            raise ValueError(f"vllm_xargs: formtax_strategy {name!r} runs its own decode loop (several passes or a "
                             "rewind); inside vLLM use a single-pass strategy (constrained, json, inwriting, short)")
        answer = args.get("answer")
        if answer is not None:
            try:
                as_constraint(str(answer)).check()
            except Exception as e:  # noqa: BLE001 - the SPEC parser's one-line message
                raise ValueError(f"vllm_xargs: formtax_answer: {str(e).splitlines()[0]}") from None
        elif getattr(strat, "needs_constraint", False) or name not in ("free", "short"):
            raise ValueError(f"vllm_xargs: formtax_strategy {name!r} needs formtax_answer (an answer SPEC)")
        closing = args.get("closing", 1)
        if closing not in (0, 1, "0", "1", True, False):
            raise ValueError(f"vllm_xargs: formtax_closing must be 0 or 1, got {closing!r}")
        triggers = args.get("triggers") or []
        triggers = [triggers] if isinstance(triggers, str) else list(triggers)
        if not all(isinstance(t, str) and t for t in triggers):
            raise ValueError("vllm_xargs: formtax_triggers must be non-empty strings")
        reasoning = args.get("reasoning")
        return cls(name, None if answer is None else str(answer), str(closing) in ("1", "True"), tuple(triggers),
                   None if reasoning is None else str(reasoning))

    def live_row(self, engine: EngineSide, prompt_ids: Sequence[int], params: Any) -> Any:
        """The request's :class:`LiveRow`, built with the strategy's own code from the engine's tokenizer."""
        from formtax.backends.logits_processor import LiveRow
        from formtax.constraints.native import as_constraint
        from formtax.decoding.plan import RowRequest
        from formtax.strategies import get_strategy
        from formtax.strategies.base import Request, SinglePass

        sampling = params_sampling(params)
        strat = get_strategy(self.strategy)
        assert isinstance(strat, SinglePass)  # RowSpec.of refused the others
        req = Request("", as_constraint(self.answer) if self.answer is not None else None,
                      max_tokens=int(params.max_tokens), seed=int(params.seed or 0),
                      temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                      min_p=sampling.min_p, reasoning_prefix=self.reasoning, triggers=self.triggers,
                      closing=self.closing)
        strat.check(engine, [req])
        policy = strat.policy(engine, req)
        row = RowRequest(list(prompt_ids), policy, req.max_tokens, req.seed, sampling)
        tok = engine.tokenizer
        return LiveRow(row, min(tok.eos_ids), tok.n_logits, sampling)


def params_sampling(params: Any) -> Any:
    """formtax's Sampling of a request's SamplingParams."""
    from formtax.decoding.sampling import Sampling

    return Sampling(float(params.temperature or 0.0), float(params.top_p or 1.0), max(0, int(params.top_k or 0)),
                    float(params.min_p or 0.0))


def plugin_class() -> type:
    """The logits processor class vLLM loads (defined on first use: needs vllm)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from formtax.backends.logits_processor import processor_class
    from formtax.backends.vllm_backend import tokenizer_info

    base: Any = processor_class()

    class FormtaxLogitsProcessor(base):
        """formtax's rows for the requests whose ``extra_args`` name formtax arguments (module docstring)."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            super().__init__(vllm_config, device, is_pin_memory)
            model = vllm_config.model_config
            self.engine = EngineSide(tokenizer_info(model.tokenizer), str(model.model))
            self.rows: dict[str, Any] = {}  # formtax's own rows by key: a preempted row comes back to its state

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            mine = _recipe_of(sampling_params.extra_args) is not None
            spec = None if mine else RowSpec.of(sampling_params.extra_args)
            if (mine or spec is not None) and sampling_params.max_tokens is None:
                raise ValueError("formtax's strategies need max_tokens (the row's budget is the engine's)")

        def row_for(self, params: Any, prompt_ids: Sequence[int] | None) -> Any:
            key = (params.extra_args or {}).get(PREFIX + "row")
            if isinstance(key, str) and key in self.rows:
                return self.rows[key]
            try:
                row = build_row(self.engine, params.extra_args, prompt_ids or [], params_sampling(params),
                                int(params.max_tokens), int(params.seed or 0))
            except Exception as e:  # never the engine: the row ends at once, and formtax refuses it for that
                log.warning("formtax: a row could not be built from its recipe (%s); it ends with no text", e)
                _report_failure(params.extra_args, f"the row could not be built in the engine: {e}")
                return _ended(self.engine)
            if row is not None:
                self.rows[row.key] = row
                return row
            spec = RowSpec.of(params.extra_args)
            if spec is None:
                return None
            try:
                return spec.live_row(self.engine, prompt_ids or [], params)
            except Exception as e:  # never the engine: this request ends at once, its reason logged
                log.warning("formtax: the row could not be built (%s); it ends with no text", e)
                return _ended(self.engine)

        def row_removed(self, row: Any) -> None:
            if row.done and getattr(row, "key", None) is not None:
                self.rows.pop(row.key, None)

    _CLASS = FormtaxLogitsProcessor
    return _CLASS


def _report_failure(extra_args: dict[str, Any] | None, error: str) -> None:
    """Tell formtax's backend that its row could not be built (so it says why instead of waiting for a report)."""
    from formtax.backends.row_reports import encode, send
    from formtax.decoding.plan import Finish, RowOutput

    args = extra_args or {}
    key, address = args.get(PREFIX + "row"), args.get(PREFIX + "report")
    if isinstance(key, str) and isinstance(address, str):
        send(address, encode(key, RowOutput(prompt_ids=[], finish_reason=Finish.BACKEND_ERROR), error))


def _ended(engine: EngineSide) -> Any:
    """A row that is already finished (it forces EOS at its first step)."""
    from formtax.backends.logits_processor import LiveRow
    from formtax.decoding.plan import Finish, RowRequest
    from formtax.decoding.policies import FreePolicy

    tok = engine.tokenizer
    row = LiveRow(RowRequest([], FreePolicy(tok.eos_ids), 1), min(tok.eos_ids), tok.n_logits)
    row.finish(Finish.BACKEND_ERROR, "the row could not be built in the engine")
    return row


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    if name == "FormtaxLogitsProcessor":
        return plugin_class()
    raise AttributeError(name)
