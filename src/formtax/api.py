"""The Python API: ``load_model``, ``generate`` and ``generate_batch``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from formtax.backends import Backend, load_backend
from formtax.constraints.spec import Constraint, as_constraint
from formtax.decoding.sampling import Sampling
from formtax.errors import ConfigError
from formtax.strategies import Request, Result, get_strategy
from formtax.strategies.base import Prompt


def load_model(model: str | None = None, backend: str = "hf", device: str = "cpu", dtype: str = "float32") -> Backend:
    """Load a model: the embedded default (None), a .gguf file, a local folder or a hub id."""
    return load_backend(backend, model, device=device, dtype=dtype)


def generate_batch(
    model: Backend,
    prompts: Sequence[Prompt],
    strategy: str = "free",
    answer: str | Constraint | type[Any] | dict[str, Any] | None = None,
    max_tokens: int = 256,
    reasoning: str | None = None,
    triggers: Sequence[str] = (),
    seed: int = 0,
    constrain: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    model_defaults: bool = False,
) -> list[Result]:
    """Generate for several prompts in one batch with one strategy and answer constraint.

    Sampling: ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``min_p`` (applied to the constrained
    distribution); ``model_defaults=True`` takes all four from the model's own generation_config instead.
    """
    strat = get_strategy(strategy)
    constraint = as_constraint(answer) if answer is not None else None
    sampling = resolve_sampling(model, Sampling(temperature, top_p, top_k, min_p), model_defaults)
    reqs = [
        Request(p, constraint, max_tokens=max_tokens, seed=seed, reasoning_prefix=reasoning, triggers=triggers,
                constrain=constrain, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                min_p=sampling.min_p)
        for p in prompts
    ]
    return strat.run(model, reqs)


def resolve_sampling(model: Backend, sampling: Sampling, model_defaults: bool) -> Sampling:
    """``sampling``, or the model's own defaults when asked (refused if the backend does not know them)."""
    if not model_defaults:
        return sampling
    defaults = model.generation_defaults()
    if defaults is None:
        raise ConfigError(f"backend {model.name!r} does not know its model's generation defaults; give the "
                          "sampling settings instead")
    return defaults


def generate(
    model: Backend,
    prompt: Prompt,
    strategy: str = "free",
    answer: str | Constraint | type[Any] | dict[str, Any] | None = None,
    max_tokens: int = 256,
    reasoning: str | None = None,
    triggers: Sequence[str] = (),
    seed: int = 0,
    constrain: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    model_defaults: bool = False,
) -> Result:
    """Generate one output. ``answer`` is a SPEC string, a Constraint, a Pydantic model or a JSON schema.
    Sampling as in :func:`generate_batch`."""
    return generate_batch(model, [prompt], strategy, answer, max_tokens, reasoning, triggers, seed, constrain,
                          temperature, top_p, top_k, min_p, model_defaults)[0]
