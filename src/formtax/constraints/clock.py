"""The clocks closing's searches are bounded by: the CPU time of the searching thread, and a caller's wall deadline.

Ours, and why: a witness search's time bound is a backstop for grammars whose states are slow to expand (its work
bounds, in states and beam depth, come first). Measured in wall time, that backstop bound on an ordinary grammar
whenever the machine was busy: a byte search that takes 160 ms on a quiet machine ran past its 500 ms share under
load, the token was refused, and the same request gave another answer (issue 56: the default-model golden output
moved between runs). The thread's CPU time hardly moves with other processes' load, so an output no longer depends
on it. A caller that must not wait in wall time (the vLLM plugin checks requests on vLLM's API loop) sets
:data:`SEARCH_DEADLINE` as well, and every search stops at whichever comes first."""

from __future__ import annotations

import contextvars
import time

SEARCH_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("formtax_search_deadline",
                                                                               default=None)
"""A ``time.monotonic()`` past which a witness search gives up (:class:`SearchTimeout`); None: only the search's own
bounds. Set by a caller that must not wait long (formtax's vLLM plugin checks a request on vLLM's API loop:
backends/vllm/rows.py)."""


class SearchTimeout(TimeoutError):
    """A witness search passed :data:`SEARCH_DEADLINE`."""


def search_clock() -> float:
    """Seconds of CPU time this thread has used (``time.thread_time``): the clock of a search's own bound."""
    return time.thread_time()


def past(deadline: float) -> bool:
    """Whether a search must stop: its own bound (``deadline``, on :func:`search_clock`) or its caller's wall
    deadline (:data:`SEARCH_DEADLINE`) has passed."""
    if search_clock() > deadline:
        return True
    wall = SEARCH_DEADLINE.get()
    return wall is not None and time.monotonic() > wall


def caller_bound(ms: float) -> float:
    """``ms`` cut to what :data:`SEARCH_DEADLINE` leaves; :class:`SearchTimeout` once it has passed."""
    deadline = SEARCH_DEADLINE.get()
    if deadline is None:
        return ms
    left = deadline - time.monotonic()
    if left <= 0:
        raise SearchTimeout("the witness search ran past its caller's time bound")
    return min(ms, 1000 * left)
