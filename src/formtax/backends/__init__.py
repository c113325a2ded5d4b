"""Model engines behind one small protocol (:mod:`formtax.decoding.engine`), registered by name.

This package's ``__init__`` is the registry (:func:`load_backend`): it sits a layer above every engine it names,
the vLLM engine included (whose plugin builds strategies' rows inside vLLM), and imports each on use; the planted
worlds' engine (:mod:`formtax.planted.backend`) sits in the engines' layer (tests/architecture/test_import_layers.py).
"""

from collections.abc import Callable
from typing import Any

from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo, require
from formtax.errors import ConfigError


def _hf(model: str | None, device: str, dtype: str, **options: Any) -> Backend:
    """transformers in this process; ``options`` are ``from_pretrained`` keywords of :data:`HF_OPTIONS` (lm-eval's
    ``--model_args``, inspect's ``-M``): revision, attn_implementation, trust_remote_code, ..."""
    from formtax.backends.hf import HF_OPTIONS, HFBackend

    unknown = sorted(set(options) - set(HF_OPTIONS))
    if unknown:
        raise ConfigError(f"backend 'hf' does not take {', '.join(unknown)} (it takes: {', '.join(HF_OPTIONS)}; "
                          "the dtype is --dtype)")
    return HFBackend.load(model, device=device, dtype=dtype, **options)


def _fake(model: str | None, device: str, dtype: str) -> Backend:
    """Seeded random logits over a byte vocabulary: for tests and dry runs of the lab, never for results."""
    from formtax.backends.fake import FakeBackend, random_logits

    seed = int(model) if model and model.isdigit() else 0
    return FakeBackend(random_logits(seed=seed), model_id=f"fake-random-{seed}")


def _vllm(model: str | None, device: str, dtype: str, **options: Any) -> Backend:
    """vLLM in this process (optional extra ``formtax[vllm]``); ``options`` are ``vllm.LLM`` keywords."""
    from formtax.backends.vllm.backend import VLLMBackend

    return VLLMBackend.load(model, device=device, dtype=dtype, **options)


def _openai(model: str | None, device: str, dtype: str, **options: Any) -> Backend:
    """Any OpenAI-compatible server (``server=URL``); ``model`` names the local tokenizer (default: embedded)."""
    import inspect

    from formtax.backends.openai_backend import OpenAIBackend

    # No api_key here: options land in the run manifest; the key is read from $OPENAI_API_KEY instead.
    known = set(inspect.signature(OpenAIBackend.connect).parameters) - {"model", "api_key"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"backend 'openai' does not take {', '.join(unknown)} (it takes: {', '.join(sorted(known))})")
    return OpenAIBackend.connect(model, **options)


def _planted(model: str | None, device: str, dtype: str) -> Backend:
    """A planted world (``model`` = the world file): exact, known output probabilities for calibration."""
    if not model:
        raise ConfigError("backend 'planted' needs a world file: --world W (or --model W)")
    from formtax.planted.backend import PlantedBackend

    return PlantedBackend.load(model)


def backend_capabilities(name: str) -> frozenset[Capability]:
    """What the named engine can do, read from its class without loading a model: a run settles closing's default
    before its model loads (runner/run.py). Unknown names are :func:`load_backend`'s to refuse."""
    if name == "hf":
        from formtax.backends.hf import HFBackend

        return HFBackend.capabilities
    if name == "fake":
        from formtax.backends.fake import FakeBackend

        return FakeBackend.capabilities
    if name == "vllm":
        from formtax.backends.vllm.backend import VLLMBackend

        return VLLMBackend.capabilities
    if name == "openai":
        from formtax.backends.openai_backend import OpenAIBackend

        return OpenAIBackend.capabilities
    if name == "planted":
        from formtax.planted.backend import PlantedBackend

        return PlantedBackend.capabilities
    return frozenset()


BACKENDS: dict[str, Callable[..., Backend]] = {"hf": _hf, "fake": _fake, "vllm": _vllm, "openai": _openai, "planted": _planted}
TAKES_OPTIONS = {"hf", "vllm", "openai"}  # backends whose factory accepts keyword options (model / engine / server)


def load_backend(name: str, model: str | None = None, device: str = "cpu", dtype: str = "float32",
                 **options: Any) -> Backend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    options = {k: v for k, v in options.items() if v is not None}
    if options and name not in TAKES_OPTIONS:
        raise ConfigError(f"backend {name!r} takes no options (got: {', '.join(sorted(options))})")
    return factory(model, device, dtype, **options)


__all__ = ["BACKENDS", "Backend", "Batch", "Capability", "TokenizerInfo", "backend_capabilities", "load_backend",
           "require"]
