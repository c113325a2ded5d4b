"""How a policy is lowered onto an engine that owns its decode loop (vLLM, OpenAI-compatible servers).

Such an engine cannot be handed a steppable :class:`~formtax.decoding.engine.Batch`; it decodes whole rows. Each
policy says what it becomes there (:meth:`~formtax.decoding.loop.Policy.lowered`):

* ``free``: free text behind an optional forced prefix; the prefix joins the prompt (forcing tokens is the same
  as prompting with them) and the stop set becomes the engine's stop tokens;
* ``grammar``: a plain constrained policy (behind an optional prefix) whose constraint alone governs the output,
  so the engine may enforce it through its grammar parameter;
* ``live``: anything else; the policy must see the logits at every step (vLLM's logits processor can, a server
  cannot).

The policy is then replayed over the engine's tokens (:func:`formtax.decoding.rowengine.replay`) as a check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from formtax.constraints.spec import Constraint


class Lowering(StrEnum):
    FREE = "free"
    GRAMMAR = "grammar"
    LIVE = "live"


@dataclass
class LoweredRow:
    """How one row is decoded by an engine that owns its loop (see the module docstring)."""

    kind: Lowering
    prefix: list[int] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    constraint: Constraint | None = None
    inner: Any = None  # the policy behind the prefix (the whole policy for a live row)
