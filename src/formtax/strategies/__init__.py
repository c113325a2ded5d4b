"""Decoding strategies: small per-step policies over the one decode loop, registered by name.

Names are imported lazily (PEP 562) so that :mod:`formtax.strategies.catalog` (what ``formtax ls`` reads) does not
load torch; :func:`get_strategy` imports the built-in strategy modules, which register themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from formtax._lazy import lazy_getattr

_LAZY = ("Request", "Result", "Strategy", "get_strategy", "list_strategies", "register")

if TYPE_CHECKING:
    from formtax.strategies.base import Request, Result, Strategy, get_strategy, list_strategies, register


__getattr__ = lazy_getattr("formtax.strategies", dict.fromkeys(_LAZY, "formtax.strategies.base"), globals())


__all__ = ["Request", "Result", "Strategy", "get_strategy", "list_strategies", "register"]
