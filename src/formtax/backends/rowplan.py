"""How an engine without a steppable batch decodes a row: classify its policy, compile it, replay the output.

Shared by the vLLM backend and the OpenAI-compatible server backend. A row (prompt ids + a Policy + a budget) is

* ``free`` when its policy is a FreePolicy behind an optional ForcedPrefix: the prefix joins the prompt (forcing
  tokens is the same as prompting with them) and the stop set becomes the engine's stop tokens;
* ``grammar`` when it is a plain ConstrainedPolicy (behind an optional prefix) and the strategy names the
  constraint that alone governs the output: the engine enforces it through its grammar parameter;
* ``live`` otherwise: the policy must see the logits at every step (vLLM's logits processor can; a server cannot).

:func:`replay` then steps the row's policy over the tokens the engine produced. That rebuilds exactly the RowOutput
the decode loop would have built for those tokens (phases, forced/masked flags, finish reasons such as
``constraint-complete``), and it checks them: a token outside the policy's allowed set, i.e. an engine that ignored
the constraint, ends the row with ``constraint-error`` and is never accepted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from formtax.constraints.spec import Constraint
from formtax.decoding.loop import RowOutput, RowRequest, Step
from formtax.errors import ConfigError

_EMPTY = torch.empty(0)


@dataclass
class RowPlan:
    """How one row is decoded (see the module docstring)."""

    kind: str  # free | grammar | live
    prefix: list[int] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    constraint: Constraint | None = None
    inner: Any = None  # the policy behind the prefix


def plan_row(row: RowRequest, whole: Constraint | None) -> RowPlan:
    """Classify a row by its policy's exact type (a subclass or a wrapper may change what the plan means)."""
    from formtax.strategies.policies import ConstrainedPolicy, ForcedPrefix, FreePolicy

    policy = row.policy
    prefix: list[int] = []
    if type(policy) is ForcedPrefix:
        prefix, policy = list(policy.prefix), policy.inner
    if len(prefix) >= row.max_tokens:
        return RowPlan("live", inner=row.policy)
    if type(policy) is FreePolicy:
        return RowPlan("free", prefix, stop_ids=policy.eos_ids | policy.stop_ids, inner=policy)
    if whole is not None and type(policy) is ConstrainedPolicy:
        return RowPlan("grammar", prefix, stop_ids=policy.eos_ids, constraint=whole, inner=policy)
    return RowPlan("live", inner=row.policy)


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


def replay(req: RowRequest, tokens: Sequence[int], engine_finish: str | None,
           first_mass: float | None = None) -> RowOutput:
    """The RowOutput the decode loop would have produced had it chosen ``tokens``, checking each against the plan.

    Only for policies whose plans do not read the logits (free text, a forced prefix, a constrained policy): they
    are given an empty tensor. ``first_mass`` is the masked mass measured separately at the first constrained step
    (a grammar-masked engine row no longer holds the raw distribution).
    """
    policy = req.policy
    out = RowOutput(prompt_ids=list(req.prompt_ids))
    for token in tokens:
        step = len(out.tokens)
        plan = policy.plan(_EMPTY, step)
        if plan.event is not None:
            out.events.append({"step": step, **plan.event})
        if plan.stop is not None:
            out.finish_reason = plan.stop  # e.g. the grammar is complete: the engine's EOS is not part of the output
            break
        if plan.measure_mass and plan.allowed is not None and out.masked_mass is None:
            out.masked_mass = first_mass
        if plan.forced is not None:
            if token != plan.forced:
                out.finish_reason = "constraint-error"
                out.events.append({"step": step, "stats": {"constraint_ignored": True, "rejected_token": int(token)}})
                break
            forced, masked = True, plan.allowed is not None
        else:
            outside = ((plan.allowed is not None and not bool(plan.allowed[token])) or token in plan.banned
                       or (plan.divert is not None and token in plan.divert.tokens))  # replay cannot divert
            if outside:  # the engine ignored the constraint: never accept the token, and say so
                out.finish_reason = "constraint-error"
                out.events.append({"step": step, "stats": {"constraint_ignored": True, "rejected_token": int(token)}})
                break
            masked = plan.allowed is not None or bool(plan.banned) or plan.divert is not None
            forced = plan.allowed is not None and plan.allowed_count() == 1
        out.tokens.append(int(token))
        out.steps.append(Step(int(token), policy.phase, forced, masked))
        reason = policy.advance(int(token))
        if reason is None and len(out.tokens) >= req.max_tokens:
            reason = policy.budget_exhausted()
        if reason is not None:
            out.finish_reason = reason
            break
    if not out.finish_reason:
        plan = policy.plan(_EMPTY, len(out.tokens))
        out.finish_reason = plan.stop or f"engine-{engine_finish or 'stop'}"
    out.forward_passes = len(tokens)
    return out
