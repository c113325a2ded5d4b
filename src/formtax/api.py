"""The Python API: ``load_model``, ``generate`` and ``generate_batch``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from formtax.backends import Backend, load_backend
from formtax.constraints.spec import Constraint, as_constraint
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
) -> list[Result]:
    """Generate for several prompts in one batch with one strategy and answer constraint."""
    strat = get_strategy(strategy)
    constraint = as_constraint(answer) if answer is not None else None
    reqs = [
        Request(p, constraint, max_tokens=max_tokens, seed=seed, reasoning_prefix=reasoning, triggers=triggers,
                constrain=constrain, temperature=temperature)
        for p in prompts
    ]
    return strat.run(model, reqs)


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
) -> Result:
    """Generate one output. ``answer`` is a SPEC string, a Constraint, a Pydantic model or a JSON schema."""
    return generate_batch(model, [prompt], strategy, answer, max_tokens, reasoning, triggers, seed, constrain,
                          temperature)[0]
