"""Decoding strategies: small per-step policies over the one decode loop, registered by name.

Names are imported lazily (PEP 562) so that :mod:`formtax.strategies.catalog` (what ``formtax ls`` reads) does not
load torch; :func:`get_strategy` imports the built-in strategy modules, which register themselves.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = ("Request", "Result", "Strategy", "get_strategy", "list_strategies", "register")

if TYPE_CHECKING:
    from formtax.strategies.base import Request, Result, Strategy, get_strategy, list_strategies, register


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'formtax.strategies' has no attribute {name!r}")
    value = getattr(importlib.import_module("formtax.strategies.base"), name)
    globals()[name] = value
    return value


__all__ = ["Request", "Result", "Strategy", "get_strategy", "list_strategies", "register"]
