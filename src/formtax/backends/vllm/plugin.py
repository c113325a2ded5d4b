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

``max_tokens`` is required: the row's budget must be the engine's. Every request is checked whole in
:meth:`validate_params` before it is queued (formtax.backends.vllm.rows: the arguments, the budget, the grammar,
closing's witness, vLLM's own masks, stop strings), which vLLM turns into an HTTP 400 with the message; the set-up
there is bounded in time. A row that still fails in the engine (or whose policy raises) writes
``[formtax error: <reason>]`` and stops; it alone is affected.

In the engine the processor loads the model's tokenizer once (:func:`formtax.backends.model_files.tokenizer_info`),
builds the row's policy with the strategy's own code (as in formtax's loop), and steps it every engine step
(:class:`~formtax.backends.vllm.logits_processor.EngineRow`: catch up on the emitted tokens, plan, edit the logits). Rows
are found by vLLM's batch index, which the processor tracks through every add, remove and move (rows are
reordered every step). Compiled grammars are cached per engine (llguidance's compile cache, keyed by grammar);
matchers are per request.

formtax's own vLLM backend sends its rows through this same processor, with other arguments: ``formtax_recipe``
(the row's policy recipe, pickled and signed with a secret only that backend and its engine know), ``formtax_row``
(the row's key) and ``formtax_report`` (where the finished row's output goes); such a row chooses its own tokens
(backends/vllm/logits_processor.py) and reports its RowOutput (backends/vllm/row_reports.py). So the backend runs with
vLLM's engine in another process, with tensor parallelism and with Ray. A recipe that does not verify is refused
in :meth:`validate_params`.

What the plugin cannot return: vLLM's response has the whole text (reasoning and answer together, InWriting's
answer on its own line as in ``Result.text``), not formtax's masked mass or switch statistics; read the answer
from the text with ``formtax.parse(text, answer, strategy=...)``, split the reasoning with the reasoning parser
(formtax.integrations.vllm_reasoning), or use ``formtax serve`` / the in-process backend for those.

vLLM's settings: chunked prefill (its default) is supported: a partial prefill's sample is discarded by the engine,
and a row whose first planned token never came is planned again from a fresh policy (``EngineRow.restart``).
Asynchronous scheduling (vLLM's default on GPUs) is refused when the processor loads: a row's plan needs the token
of the step before, which the engine then appends a step late (``--no-async-scheduling``). Rows removed from the
batch before they finish (aborted, or preempted and added again later) are kept for :data:`PARKED_MAX` removals,
then forgotten.

vLLM is imported only when vLLM loads the class (a module ``__getattr__``), so this module imports without it.
The class is :class:`VllmPluginProcessor` (``plugin_class()``); ``FormtaxLogitsProcessor`` is its public name on
vLLM's command line (the transformers integration has a ``FormtaxLogitsProcessor`` class of its own).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from formtax.backends.vllm.rows import (
    PREFIX,
    EngineSide,
    RowSpec,
    caller_context,
    engine_for,
    error_row,
    explainer,
    params_sampling,
    validate,
    warm_in_background,
)

log = logging.getLogger(__name__)

RECIPE_KEYS = ("recipe", "row", "report", "stream")  # formtax's own backend (module docstring)
PARKED_MAX = 256  # rows removed unfinished that are kept (a preempted row comes back to its state)
__all__ = ["PREFIX", "EngineSide", "RowSpec", "build_row", "plugin_class"]


def _recipe_of(extra_args: dict[str, Any] | None, once: bool = False) -> tuple[Any, str, str] | None:
    """(recipe, row key, report address) of a request from formtax's own backend; None for other requests.
    ValueError (one line) for a recipe that does not verify or incomplete arguments."""
    from formtax.backends.vllm.row_reports import unseal

    args = extra_args or {}
    if PREFIX + "recipe" not in args:
        return None
    extra = sorted(k for k in args if k.startswith(PREFIX) and k.removeprefix(PREFIX) not in RECIPE_KEYS)
    if extra:
        raise ValueError(f"vllm_xargs: formtax_recipe comes alone; also got {', '.join(extra)}")
    key, address = args.get(PREFIX + "row"), args.get(PREFIX + "report")
    if not isinstance(key, str) or not key or not isinstance(address, str) or not address:
        raise ValueError("vllm_xargs: formtax_recipe needs formtax_row and formtax_report")
    return unseal(args[PREFIX + "recipe"], key, address, once=once), key, address


def build_row(engine: EngineSide, extra_args: dict[str, Any] | None, prompt_ids: Sequence[int], sampling: Any,
              max_tokens: int, seed: int) -> Any:
    """The EngineRow of a request from formtax's own backend (None for any other request): its policy built from
    its recipe with the engine's tokenizer; it chooses its tokens and reports its output when it finishes."""
    from formtax.backends.vllm.logits_processor import EngineRow
    from formtax.backends.vllm.row_reports import encode, encode_step, send
    from formtax.decoding.plan import RowRequest

    got = _recipe_of(extra_args)
    if got is None:
        return None
    recipe, key, address = got

    def report(row: EngineRow) -> None:
        send(address, encode(key, row.out, row.error))

    sent = [0]

    def step(token: int, phase: str) -> None:
        send(address, encode_step(key, token, phase, sent[0]))
        sent[0] += 1

    tok = engine.tokenizer
    row = RowRequest(list(prompt_ids), recipe(engine), max_tokens, seed, sampling)
    live = EngineRow(row, min(tok.eos_ids), tok.n_logits, sampling, chooses=True, on_done=report)
    live.key = key
    live.rebuild = lambda: recipe(engine)
    if str((extra_args or {}).get(PREFIX + "stream", "0")) == "1":
        live.on_token = step
    return live


def plugin_class() -> type:
    """The logits processor class vLLM loads (defined on first use: needs vllm)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from formtax.backends.vllm.logits_processor import processor_class

    base: Any = processor_class()

    class VllmPluginProcessor(base):
        """formtax's rows for the requests whose ``extra_args`` name formtax arguments (module docstring)."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            super().__init__(vllm_config, device, is_pin_memory)
            refuse_settings(vllm_config)
            model = vllm_config.model_config
            self.engine = engine_for(str(model.tokenizer))
            self.max_model_len = int(getattr(model, "max_model_len", 0) or 0)
            self.parked: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # id(params) -> (params, row)

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            if _recipe_of(sampling_params.extra_args, once=True) is not None:
                if sampling_params.max_tokens is None:
                    raise ValueError("formtax's strategies need max_tokens (the row's budget is the engine's)")
                return
            if not any(str(k).startswith(PREFIX) for k in (sampling_params.extra_args or {})):
                return
            path, client_max = caller_context()
            validate(sampling_params, engine_for(path) if path else None, client_max)

        def row_for(self, params: Any, prompt_ids: Sequence[int] | None) -> Any:
            parked = self.parked.pop(id(params), None)
            if parked is not None and parked[0] is params:  # preempted, now back: its row goes on
                return parked[1]
            try:
                row = build_row(self.engine, params.extra_args, prompt_ids or [], params_sampling(params),
                                int(params.max_tokens), int(params.seed or 0))
            except Exception as e:  # never the engine: the row ends at once, and formtax refuses it for that
                log.warning("formtax: a row could not be built from its recipe (%s); it ends with no text", e)
                _report_failure(params.extra_args, f"the row could not be built in the engine: {e}")
                return _ended(self.engine)
            if row is not None:
                return row
            try:
                spec = RowSpec.of(params.extra_args, from_client=False)
            except ValueError as e:  # validate_params refused it already where it ran
                return error_row(self.engine, str(e), int(params.max_tokens or 1))
            if spec is None:
                return None
            try:
                live = spec.live_row(self.engine, prompt_ids or [], params)
            except Exception as e:  # noqa: BLE001 - never the engine: this request ends, saying why
                log.warning("formtax: a row could not be built (%s); it ends with the error", e)
                return error_row(self.engine, f"the row could not be built: {' '.join(str(e).split())}",
                                 int(params.max_tokens or 1))
            live.explain = explainer(self.engine.tokenizer)
            return live

        def row_removed(self, row: Any, params: Any) -> None:
            if row.done:
                return
            self.parked[id(params)] = (params, row)
            while len(self.parked) > PARKED_MAX:
                self.parked.popitem(last=False)

    _CLASS = VllmPluginProcessor
    warm_in_background(caller_context()[0])  # vLLM's API process loads the class at start-up: warm its tokenizer
    return _CLASS


def refuse_settings(vllm_config: Any) -> None:
    """Engine settings under which formtax's rows cannot be stepped exactly: refused when the processor loads,
    naming the flag (module docstring)."""
    sched = getattr(vllm_config, "scheduler_config", None)
    if getattr(sched, "async_scheduling", False):
        raise RuntimeError("formtax's logits processor needs --no-async-scheduling: under asynchronous scheduling "
                           "a row is planned before the engine appends its previous token")
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None and int(getattr(spec, "num_speculative_tokens", 0) or 0):
        raise RuntimeError("formtax's logits processor does not run with speculative decoding (drop "
                           "--speculative-config): draft tokens are accepted without its plans")


def _report_failure(extra_args: dict[str, Any] | None, error: str) -> None:
    """Tell formtax's backend that its row could not be built (so it says why instead of waiting for a report)."""
    from formtax.backends.vllm.row_reports import encode, send
    from formtax.decoding.plan import Finish, RowOutput

    args = extra_args or {}
    key, address = args.get(PREFIX + "row"), args.get(PREFIX + "report")
    if isinstance(key, str) and isinstance(address, str):
        send(address, encode(key, RowOutput(prompt_ids=[], finish_reason=Finish.BACKEND_ERROR), error))


def _ended(engine: EngineSide) -> Any:
    """A row that is already finished (it forces EOS at its first step)."""
    from formtax.backends.vllm.logits_processor import EngineRow
    from formtax.decoding.plan import Finish, RowRequest
    from formtax.decoding.policies import FreePolicy

    tok = engine.tokenizer
    row = EngineRow(RowRequest([], FreePolicy(tok.eos_ids), 1), min(tok.eos_ids), tok.n_logits)
    row.finish(Finish.BACKEND_ERROR, "the row could not be built in the engine")
    return row


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    if name in ("FormtaxLogitsProcessor", "VllmPluginProcessor"):  # the first: the public path vLLM is given
        return plugin_class()
    raise AttributeError(name)
