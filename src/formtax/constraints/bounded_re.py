"""Regex searches of the JSON oracle with a time bound: no schema can make an answer's check run for long.

``jsonschema`` runs every ``pattern``, ``patternProperties`` key (also through ``additionalProperties`` and
``unevaluatedProperties``) and so ``propertyNames: {pattern}`` with Python's ``re.search``, which backtracks
without a time limit while holding the GIL. A keyword the grammar drops (``not``, ``if``/``then``/``else``,
``propertyNames``) is still checked afterwards, so a grammar can force a string on which the check takes a day
(issue 55: ``"not": {"pattern": "^(\\w+\\s?)*$"}`` over 40 letters and a ``!``), freezing a server.

Inside :func:`bounded_checks` every such search goes through :func:`_search`:

1. the ``regex`` module (Python's ``re`` dialect, ``VERSION0``) with a per-search timeout, releasing the GIL
   while it matches (``concurrent=True``);
2. where that times out (or the whole check's budget is spent), RE2 (``google-re2``), whose matching is linear in
   the text; a pattern seen to time out once goes straight to RE2 for the rest of the check;
3. where RE2 cannot take the pattern (a backreference, a lookaround), the search is *undecided*: it counts as a
   match for the keyword at hand and the check as a whole is reported unchecked (:class:`Checks`), so a caller
   flags the answer (``Result.stats["oracle_unchecked"]``, the server's metrics) instead of hanging.

RE2's ``\\w``, ``\\d`` and ``$`` are ASCII and end-only where Python's are Unicode and end-or-before-a-final-newline;
the difference can only matter for a pattern that already timed out, and is documented here as ours.

How: the three jsonschema modules that call ``re.search`` see a proxy of the ``re`` module whose ``search`` is
bounded while a check is in scope and plain ``re.search`` otherwise (so nothing changes for other users of
jsonschema in the process). Hand-written because jsonschema offers no hook for its regex engine, and re-writing its
``additionalProperties`` / ``unevaluatedProperties`` keywords would copy its logic instead.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
import types
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

SEARCH_TIMEOUT_S = 0.05
"""The ``regex`` module's time for one search before RE2 decides (a normal pattern takes microseconds)."""

CHECK_BUDGET_S = 1.0
"""The backtracking engine's time for one whole check; past it every search of the check goes to RE2."""


@dataclass
class Checks:
    """What happened to the regex searches of one check: the patterns RE2 decided after a timeout, and those that
    no linear engine could decide (the check is then *unchecked*)."""

    budget_s: float = CHECK_BUDGET_S
    started: float = field(default_factory=time.monotonic)
    slow: set[str] = field(default_factory=set)
    undecided: set[str] = field(default_factory=set)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    @property
    def unchecked(self) -> str | None:
        """One line naming the patterns that could not be checked, or None when every search was decided."""
        if not self.undecided:
            return None
        names = ", ".join(repr(p) for p in sorted(self.undecided)[:3])
        return (f"pattern {names} could not be checked within {SEARCH_TIMEOUT_S:g} s by backtracking nor by a "
                "linear-time engine (backreference or lookaround); treated as matching")


_SCOPE: ContextVar[Checks | None] = ContextVar("formtax_bounded_re", default=None)


@functools.lru_cache(maxsize=512)
def _fast(pattern: str) -> Any:
    import regex

    return regex.compile(pattern, flags=regex.VERSION0)


@functools.lru_cache(maxsize=512)
def _linear(pattern: str) -> Any:
    """The pattern under RE2, or None where RE2 cannot take it."""
    import re2

    try:
        return re2.compile(pattern)
    except Exception:  # noqa: BLE001 - re2.error and friends: a syntax RE2 lacks
        return None


class _Undecided:
    """A stand-in match object for an undecided search (truthy; no groups are read by jsonschema)."""

    def group(self, *_: Any) -> str:
        return ""


def _search(checks: Checks, pattern: str, string: str) -> Any:
    if pattern not in checks.slow and checks.left() > 0:
        try:
            return _fast(pattern).search(string, timeout=min(SEARCH_TIMEOUT_S, max(checks.left(), 0.001)),
                                         concurrent=True)
        except TimeoutError:
            checks.slow.add(pattern)
            log.info("pattern %.80r timed out on a %d-character string; RE2 decides", pattern, len(string))
    linear = _linear(pattern)
    if linear is None:
        checks.undecided.add(pattern)
        return _Undecided()
    return linear.search(string)


class _BoundedReModule(types.ModuleType):
    """The ``re`` module as the patched jsonschema modules see it: ``search`` bounded in scope."""

    def __init__(self) -> None:
        super().__init__("re")

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    @staticmethod
    def search(pattern: Any, string: Any, flags: int = 0) -> Any:
        checks = _SCOPE.get()
        if checks is None or flags or not isinstance(pattern, str) or not isinstance(string, str):
            return re.search(pattern, string, flags)
        return _search(checks, pattern, string)


_PATCHED = ("jsonschema._keywords", "jsonschema._utils", "jsonschema._legacy_keywords")


@functools.cache
def install() -> None:
    """Give the jsonschema modules that call ``re.search`` the bounded proxy (idempotent). Fails loudly when a
    jsonschema release moved its regex calls, so the bound can never silently vanish."""
    import importlib

    proxy = _BoundedReModule()
    for name in _PATCHED:
        mod = importlib.import_module(name)
        if getattr(mod, "re", None) is not re and not isinstance(getattr(mod, "re", None), _BoundedReModule):
            raise RuntimeError(f"{name} no longer imports re as expected; formtax's regex bound needs updating")
        mod.re = proxy  # type: ignore[attr-defined]


@contextlib.contextmanager
def bounded_checks(budget_s: float = CHECK_BUDGET_S) -> Iterator[Checks]:
    """Every jsonschema regex search in this scope is bounded (module docstring); yields the scope's record."""
    install()
    checks = Checks(budget_s)
    token = _SCOPE.set(checks)
    try:
        yield checks
    finally:
        _SCOPE.reset(token)
