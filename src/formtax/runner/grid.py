"""The evaluation grid: task x strategy spec x prompt variant x seed, expanded into planned requests.

A strategy spec is ``NAME[@LEVEL][+rc]``: LEVEL is paper 003's constraint level (``none``: the strategy's prompt
and budget with no mask; ``fc``: format constraint, the answer any string; ``vc``: validity constraint, the typed
answer space; the default for constrained strategies), ``+rc`` adds the reasoning constraint (a forced
"Let's think step by step." prefix). ``free`` and ``short`` are always unconstrained.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from formtax.constraints.spec import Constraint, parse_spec
from formtax.errors import ConfigError
from formtax.strategies import get_strategy
from formtax.strategies.base import Prompt, Strategy
from formtax.tasks import (
    Item,
    OutputFormat,
    PromptStyle,
    Task,
    variant_id,
)

RC_PREFIX = "Let's think step by step."
LEVELS = ("none", "fc", "vc")


@dataclass(frozen=True)
class StrategySpec:
    spec: str
    name: str
    level: str
    rc: bool

    @property
    def strategy(self) -> Strategy:
        return get_strategy(self.name)


def parse_strategy_spec(spec: str) -> StrategySpec:
    s = spec.strip()
    rc = s.endswith("+rc")
    if rc:
        s = s[: -len("+rc")]
    name, _, level = s.partition("@")
    strat = get_strategy(name)  # unknown names list the known ones
    if not strat.requires_constraint:
        if level and level != "none":
            raise ConfigError(f"strategy {name!r} is unconstrained; it takes no level (got {spec!r})")
        level = "none"
    level = level or "vc"
    if level not in LEVELS:
        raise ConfigError(f"unknown constraint level {level!r} in {spec!r}; use one of {', '.join(LEVELS)}")
    return StrategySpec(spec=spec.strip(), name=name, level=level, rc=rc)


def answer_spec(task: Task, item: Item, s: StrategySpec) -> str:
    """The answer constraint for this item at the spec's level (``none`` still has one: it is not enforced,
    only used to read the answer)."""
    return task.answer_spec("fc" if s.level == "fc" else "vc", item, OutputFormat(s.strategy.output_format))


@dataclass
class Planned:
    request_id: str
    task: str
    item: Item
    spec: StrategySpec
    prompt_variant: str
    seed: int
    shots: int
    messages: Prompt  # chat messages, or the plain text of a base-model prompt (PromptStyle.BASE)
    answer: str | None
    output_format: str
    format_variant: int
    meta: dict[str, Any] = field(default_factory=dict)
    prompt_style: PromptStyle = PromptStyle.CHAT
    budget: dict[str, int] | None = None  # set once by runner.run.planned_budget (deterministic in the config)

    def constraint(self) -> Constraint | None:
        return parse_spec(self.answer) if self.answer is not None else None

    def conversion(self, task: Task) -> Any:
        return lambda text: task.conversion_messages(self.item, text, self.format_variant)


def request_id(task: str, item_id: str, spec: str, variant: str, seed: int, shots: int) -> str:
    key = json.dumps([task, item_id, spec, variant, seed, shots])
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def plan_grid(
    task: Task,
    items: list[Item],
    specs: list[StrategySpec],
    variants: list[tuple[int, int]] | Callable[[StrategySpec], list[tuple[int, int]]],
    seeds: list[int],
    shots: int,
    shot_seed: int = 0,
    style: PromptStyle = PromptStyle.CHAT,
) -> list[Planned]:
    """Every request of the grid, in a stable order (strategy, variant, seed, item). ``style`` BASE: every
    strategy gets the item's plain few-shot prompt (:meth:`Task.base_prompt`)."""
    shot_items = task.shots(shots, shot_seed, {it.id for it in items}) if shots else []
    out: list[Planned] = []
    for s in specs:
        fmt = OutputFormat(s.strategy.output_format)
        for tv, fv in variants(s) if callable(variants) else variants:
            vid = variant_id(tv, fv)
            for seed in seeds:
                for it in items:
                    msgs: Prompt = (task.base_prompt(it, shot_items) if style is PromptStyle.BASE
                                    else task.messages(it, fmt, tv, fv, shot_items))
                    ans = answer_spec(task, it, s)
                    out.append(Planned(request_id(task.name, it.id, s.spec, vid, seed, shots), task.name, it, s, vid,
                                       seed, shots, msgs, ans, fmt.value, fv, prompt_style=style))
    return out


def check_prompt_identity(planned: list[Planned], render: Any, across_formats: bool = False) -> None:
    """Strategies that share an expected output format must see byte-identical prompts; refuse otherwise.

    ``across_formats``: every strategy must see the same prompt whatever its output format (a task with the
    benchmark's own prompt, e.g. metatool, where free, short and constrained differ only in decoding).
    """
    seen: dict[tuple[str, str, str, int, str], tuple[str, str]] = {}
    groups: dict[str, set[str]] = defaultdict(set)
    for p in planned:
        key = (p.task, p.item.id, p.prompt_variant, p.seed, "*" if across_formats else p.output_format)
        text = render(p.messages)
        groups[p.output_format].add(p.spec.spec)
        if key in seen and seen[key][0] != text:
            share = f"share the output format {p.output_format!r}"
            if across_formats:
                share = "must share one prompt"
            raise ConfigError(
                f"prompts differ between strategies {seen[key][1]!r} and {p.spec.spec!r} that {share} "
                f"(task {p.task}, item {p.item.id}, variant {p.prompt_variant}); "
                "refusing to run an unfair comparison"
            )
        seen.setdefault(key, (text, p.spec.spec))
