"""Sampling settings: temperature, top-k, top-p (nucleus) and min-p, and a model's own generation defaults.

One :class:`Sampling` is shared by every row of a batch. :meth:`Sampling.warp` turns a row's logits (already
masked by the row's plan: a constraint's disallowed tokens are ``-inf``) into the logits the draw is made from,
in transformers' order: temperature, then top-k, then top-p, then min-p, each over what the previous one left. So
the filters act on the *constrained* distribution, as transformers' warpers do after a logits processor, and a
token outside the constraint can never be drawn. The warpers are a few lines each, written here because the
decode loop draws one row at a time from its own seeded generator; the tests check them against transformers'
``TopKLogitsWarper`` / ``TopPLogitsWarper`` / ``MinPLogitsWarper``.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

import torch

from formtax.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn. ``temperature == 0`` is greedy (the filters then change nothing)."""

    temperature: float = 0.0
    top_p: float = 1.0  # keep the smallest set of most likely tokens whose mass reaches top_p (1 = all)
    top_k: int = 0  # keep the k most likely tokens (0 = all)
    min_p: float = 0.0  # drop tokens below min_p times the most likely token's probability (0 = none)

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, int | float) or isinstance(t, bool) or math.isnan(t) or math.isinf(t) or t < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.min_p, int | float) or not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def filtered(self) -> bool:
        """Whether any filter beyond temperature is on."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits to draw from (1-D, ``-inf`` = never): temperature, top-k, top-p, min-p (module docstring).

        Each filter keeps at least the most likely token, so a row with any allowed token keeps one.
        """
        x = logits / self.temperature if self.temperature > 0.0 else logits.clone()
        if self.top_k > 0 and self.top_k < x.numel():
            kth = torch.topk(x, self.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=False)
            cum = torch.softmax(sorted_x.double(), dim=-1).cumsum(dim=-1)
            drop_sorted = cum <= (1.0 - self.top_p)
            drop_sorted[-1] = False  # the most likely token always stays
            drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
            x = x.masked_fill(drop, float("-inf"))
        if self.min_p > 0.0:
            p = torch.softmax(x.double(), dim=-1)
            x = x.masked_fill(p < self.min_p * p.max(), float("-inf"))
        return x

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}


GREEDY = Sampling()


def fresh_seed() -> int:
    """A seed from the operating system's entropy: what an unseeded sampled request draws with."""
    return secrets.randbits(62)


def row_seeds(seed: int | None, n: int) -> list[int]:
    """The sampling seeds of ``n`` rows asked for under one ``seed``: row ``k`` draws with ``seed + k``, so the rows
    of a batch are distinct streams (self-consistency and pass@k get samples, not copies), a one-row call keeps
    ``seed`` itself, and the same seed reproduces every row. ``seed=None``: fresh entropy (:func:`fresh_seed`)."""
    base = fresh_seed() if seed is None else int(seed)
    return [choice_seed(base, k) for k in range(n)]


def choice_seed(seed: int, k: int) -> int:
    """Row ``k``'s seed under ``seed``: ``seed + k``, wrapped into the signed 64-bit range (OpenAI's and vLLM's
    ``seed``), so the last seeds of the range with ``n > 1`` stay seeds every generator takes."""
    return ((int(seed) + k + (1 << 63)) % (1 << 64)) - (1 << 63)


def as_sampling(value: Sampling | float) -> Sampling:
    """A :class:`Sampling` from itself or from a bare temperature."""
    return value if isinstance(value, Sampling) else Sampling(temperature=float(value))


def from_generation_config(config: Any) -> Sampling:
    """A model's own defaults (a transformers ``GenerationConfig``): greedy unless ``do_sample``; then its
    temperature, top_p, top_k and min_p, with transformers' defaults (1.0, 1.0, 50, off) where unset."""
    if not getattr(config, "do_sample", False):
        return GREEDY
    temperature = getattr(config, "temperature", None)
    top_p = getattr(config, "top_p", None)
    top_k = getattr(config, "top_k", None)
    min_p = getattr(config, "min_p", None)
    return Sampling(temperature=1.0 if temperature is None else float(temperature),
                    top_p=1.0 if top_p is None else float(top_p),
                    top_k=50 if top_k is None else int(top_k),
                    min_p=0.0 if min_p is None else float(min_p))
