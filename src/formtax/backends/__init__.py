"""Model engines behind one small protocol (``base``), registered by name."""

from collections.abc import Callable

from formtax.backends.base import Backend, Batch, Capability, TokenizerInfo, require
from formtax.errors import ConfigError


def _hf(model: str | None, device: str, dtype: str) -> Backend:
    from formtax.backends.hf import HFBackend

    return HFBackend.load(model, device=device, dtype=dtype)


def _fake(model: str | None, device: str, dtype: str) -> Backend:
    """Seeded random logits over a byte vocabulary: for tests and dry runs of the lab, never for results."""
    from formtax.backends.fake import FakeBackend, random_logits

    seed = int(model) if model and model.isdigit() else 0
    return FakeBackend(random_logits(seed=seed), model_id=f"fake-random-{seed}")


BACKENDS: dict[str, Callable[[str | None, str, str], Backend]] = {"hf": _hf, "fake": _fake}


def load_backend(name: str, model: str | None = None, device: str = "cpu", dtype: str = "float32") -> Backend:
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return factory(model, device, dtype)


__all__ = ["BACKENDS", "Backend", "Batch", "Capability", "TokenizerInfo", "load_backend", "require"]
