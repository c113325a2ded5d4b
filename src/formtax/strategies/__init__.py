"""Decoding strategies: small per-step policies over the one decode loop, registered by name."""

from formtax.strategies import basic, decog, inwriting, nl2format, suffix  # noqa: F401  (registration)
from formtax.strategies.base import Request, Result, Strategy, get_strategy, list_strategies, register

__all__ = ["Request", "Result", "Strategy", "get_strategy", "list_strategies", "register"]
