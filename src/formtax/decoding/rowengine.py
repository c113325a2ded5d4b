"""Engines that own their decode loop: the :class:`RowEngine` protocol, row planning and the replay check.

Shared by the vLLM backend and the OpenAI-compatible server backend. Such an engine decodes whole rows (prompt ids
+ a Policy + a budget); each row is planned by its policy's own lowering (:mod:`formtax.decoding.lowering`:
``free``, ``grammar`` or ``live``), and the engine says which lowerings it runs.

:func:`replay` then steps the row's policy over the tokens the engine produced. That rebuilds exactly the RowOutput
the decode loop would have built for those tokens (phases, forced/masked flags, finish reasons such as
``constraint-complete``), and it checks them: a token outside the policy's allowed set, i.e. an engine that ignored
the constraint, ends the row with ``constraint-error`` and is never accepted.

Strategies meet such an engine through :class:`RowEngine` alone (``decode_rows``, ``check_rows``); no backend
knows a strategy, and a strategy with a multi-call form on servers (InWriting's EOS switch) owns that form.
"""

from __future__ import annotations

import json
import threading
from abc import abstractmethod
from collections.abc import Callable, Collection, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Driver
from formtax.decoding.lowering import LoweredRow, Lowering
from formtax.decoding.plan import Finish, RowOutput, RowRequest
from formtax.decoding.sampling import GREEDY, Sampling
from formtax.decoding.step import RowCursor, admits, decide, flags, plan_end
from formtax.errors import ConfigError

_EMPTY = torch.empty(0)

__all__ = ["ROW_CONTROLS", "Lowering", "LoweredRow", "RowControls", "RowEngine", "caller_stops", "lark_grammar",
           "lower_row", "replay"]


@dataclass
class RowControls:
    """What the caller of ``decode_rows`` can do while an engine that owns its loop decodes (formtax serve sets
    them for the request a thread serves, :data:`ROW_CONTROLS`): cancel the call (its requests are aborted in the
    engine), receive a single-row call's tokens as they are emitted, with their phases, and end the call's free-text
    rows at stop strings (an engine with ``Capability.STOP_STRINGS``; :mod:`formtax.decoding.stops`)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    sink: Callable[[int, str], None] | None = None
    stops: tuple[str, ...] = ()


ROW_CONTROLS: ContextVar[RowControls | None] = ContextVar("formtax_row_controls", default=None)
"""The controls of the calls made in this context (None: a caller that only waits for the result)."""


def caller_stops(kinds: Sequence[Lowering]) -> tuple[str, ...]:
    """The stop strings of the call's caller (:attr:`RowControls.stops`) for rows of these lowerings, refused
    (ConfigError) unless every row is free text: an engine's stop would end a grammar row or a stepped row before
    its policy does."""
    controls = ROW_CONTROLS.get()
    stops = controls.stops if controls is not None else ()
    if stops and any(kind is not Lowering.FREE for kind in kinds):
        raise ConfigError("stop: applies to free text only (a stop string would cut a constrained or stepped row "
                          "before its answer is written)")
    return stops


class Cancelled(Exception):
    """The caller cancelled the decode (:attr:`RowControls.cancel`); the engine aborted its requests."""


class RowEngine(Backend):
    """A backend that decodes whole rows itself instead of handing the loop a steppable batch."""

    lowerings: ClassVar[frozenset[Lowering]] = frozenset({Lowering.FREE, Lowering.GRAMMAR})
    # the error a result gets when the replay caught the engine ignoring the constraint (None: the finish
    # reason's own error)
    ignored_constraint: ClassVar[str | None] = None

    @property
    def driver(self) -> Driver:
        return Driver.ENGINE

    @property
    def concurrent(self) -> bool:
        """Whether decode_rows may be called from many threads at once, each call's rows joining the engine's
        running batch (formtax serve then serves each request in its own thread: serve/batcher.py)."""
        return False

    @abstractmethod
    def decode_rows(self, backend: Backend, rows: Sequence[RowRequest], sampling: Sampling,
                    whole: Sequence[Constraint | None]) -> list[RowOutput]:
        """Decode rows to completion (a ``RowDecoder``): ``whole`` names, per row, the constraint that alone
        governs its output after its forced prefix (None: the policy must be stepped). Rows for another
        ``backend`` (NL-to-Format's extractor) go through that backend's own path."""

    def check_rows(self, who: str, kinds: Collection[Lowering], samplings: Sequence[Sampling]) -> None:
        """Refuse, before any model call, rows this engine cannot decode as asked (raise CapabilityError);
        ``who`` names the strategy in the message. ``kinds`` are the lowerings the rows need."""

    def engine_stats(self) -> dict[str, Any]:
        """What every result decoded here records about the engine."""
        return {"backend": self.name}


def lower_row(row: RowRequest, whole: Constraint | None) -> LoweredRow:
    """How the row is decoded by an engine that owns its loop: its policy's lowering, stepped live when a forced
    prefix alone fills the budget."""
    plan = row.policy.lowered(whole)
    if plan.kind is not Lowering.LIVE and len(plan.prefix) >= row.max_tokens:
        return LoweredRow(Lowering.LIVE, inner=row.policy)
    return plan


def lark_grammar(constraint: Constraint) -> str:
    """The constraint's llguidance grammar as Lark text: what vLLM's ``structured_outputs.grammar`` accepts
    (its guidance backend reads Lark, not llguidance's JSON grammar envelope)."""
    g = constraint.grammar
    if not g.lstrip().startswith("{"):
        return g
    top = json.loads(g)
    grammars = top.get("grammars") or []
    if len(grammars) != 1 or top.get("max_tokens") is not None:
        raise ConfigError(f"constraint {constraint.describe()!r}: its grammar has no single Lark form for an engine")
    one = grammars[0]
    if one.get("lark_grammar"):
        return str(one["lark_grammar"])
    if one.get("json_schema") is not None:
        return "start: %json" + json.dumps(one["json_schema"], separators=(",", ":"), ensure_ascii=False) + "\n"
    raise ConfigError(f"constraint {constraint.describe()!r}: unsupported grammar envelope {sorted(one)}")


def replay(req: RowRequest, tokens: Sequence[int], first_mass: float | None = None) -> RowOutput:
    """The RowOutput the decode loop would have produced had it chosen ``tokens``, checking each against the plan.

    Where the tokens run out before the policy ends, the row's finish is ``Finish.ENGINE_ENDED``: only the caller
    knows what its engine's own reason means (a text-only server's stop is the model's EOS; on vLLM it is a bug).

    Only for policies whose plans do not read the logits (free text, a forced prefix, a constrained policy): they
    are given an empty tensor. ``first_mass`` is the masked mass measured separately at the first constrained step
    (a grammar-masked engine row no longer holds the raw distribution).
    """
    cur = RowCursor(req)
    out = cur.out
    for token in tokens:
        plan = cur.plan(_EMPTY)
        cur.note(plan)
        end = plan_end(plan, rewinds=False)  # e.g. the grammar is complete: the engine's EOS is not in the output
        if end is None:
            cur.measure(plan, lambda: first_mass)
            if not admits(plan, token):  # the engine ignored the constraint: never accept the token, and say so
                cur.finish(Finish.CONSTRAINT_ERROR)
                out.events.append({"step": cur.step, "stats": {"constraint_ignored": True,
                                                               "rejected_token": int(token)}})
                break
            if plan.forced is None and plan.divert is None:
                choice = flags(plan, int(token))
            else:  # a forced token, or a draw the divert kept (as the loop flags them)
                choice = decide(plan, int(token), _EMPTY, GREEDY, None)
            end = cur.accept(choice)
        if end is not None:
            cur.finish(end.reason or Finish.BACKEND_ERROR)
            break
    if not out.finish_reason:
        out.finish_reason = cur.engine_end(None).reason or Finish.ENGINE_ENDED
    out.forward_passes = len(tokens)
    return out
