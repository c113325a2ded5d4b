"""The evaluation grid: task x strategy spec x prompt variant x seed, expanded into planned requests.

A strategy spec is ``NAME[@LEVEL][:json][+rc]``: LEVEL is paper 003's constraint level (``none``: the strategy's
prompt and budget with no mask; ``fc``: format constraint, the answer any string; ``vc``: validity constraint, the
typed answer space; the default for constrained strategies), ``:json`` is paper 003's JSON answer form of
InWriting and NL-to-Format (the answer as the object ``{"answer": ...}`` instead of the answer line, A.2),
``:keyphrase`` is Deco-G's format for ``free`` and ``constrained`` (the task's key phrase, e.g. "The final answer
is <answer>" on GSM8K, placed anywhere), ``:plain`` asks for the answer line explicitly, ``+rc`` adds the reasoning
constraint (a forced "Let's think step by step." prefix). ``free`` and ``short`` are always unconstrained.

Two prompt plans pick a form where a spec names none (:meth:`RunConfig.strategy_specs`):

* under ``--prompt-variants paper`` InWriting and NL-to-Format take the JSON answer form
  (:func:`paper_answer_form`): paper 003 uses JSON as the target format for every experiment after its section
  5.2 (A.2.2's expected format), and compares the plain answer line only in its Table 2;
* in a grid with a FEM strategy (decog, ctrlg) on a task whose FEM format is a key phrase, ``free`` and
  ``constrained`` take that key phrase (:func:`deco_g_baselines`): paper 001 prompts every natural-language
  method for "The final answer is ..." (section 4.1), so a study of Deco-G compares on one prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from formtax.constraints.parse import parse_spec
from formtax.constraints.spec import Constraint
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
JSON_FORM_STRATEGIES = ("inwriting", "nl2format")  # paper 003 A.2: the strategies with a JSON answer form
NL_BASELINES = ("free", "constrained")  # paper 001's Prompt-Only (NL) and Structured generation (NL)


class AnswerForm(StrEnum):
    """A spec's answer form (``NAME:FORM``); a spec without one takes its strategy's format or the plan's."""

    JSON = "json"  # paper 003's one-field object after free reasoning
    PLAIN = "plain"  # the answer line, said explicitly (a plan's default would otherwise apply)
    KEYPHRASE = "keyphrase"  # the task's FEM key phrase (Deco-G's), placed anywhere

    @property
    def suffix(self) -> str:
        return ":" + self.value


FORM_STRATEGIES = {AnswerForm.JSON: JSON_FORM_STRATEGIES, AnswerForm.PLAIN: JSON_FORM_STRATEGIES + NL_BASELINES,
                   AnswerForm.KEYPHRASE: NL_BASELINES}
JSON_FORM = AnswerForm.JSON.suffix


@dataclass(frozen=True)
class StrategySpec:
    spec: str
    name: str
    level: str
    rc: bool
    form: AnswerForm | None = None

    @property
    def json_answer(self) -> bool:
        """Paper 003's JSON answer form (``:json``)."""
        return self.form is AnswerForm.JSON

    @property
    def strategy(self) -> Strategy:
        return get_strategy(self.name)

    def output_format(self, task: Task) -> OutputFormat:
        """The output format the prompt asks for: the strategy's, the JSON answer form's, or for the FEM strategies
        and the key-phrase form the task's (:attr:`Task.fem_output_format`: Deco-G's key phrase on GSM8K)."""
        if self.json_answer:
            return OutputFormat.REASON_JSON
        if self.strategy.task_output_format or self.form is AnswerForm.KEYPHRASE:
            return task.fem_output_format
        return OutputFormat(self.strategy.output_format)

    def prompt_format(self, task: Task) -> OutputFormat:
        """The format the (first) prompt describes: the strategy's own prompt format where the task's prompts
        are the generic ones (NL-to-Format's first call asks for reasoning only), else the output format."""
        own = self.strategy.prompt_format
        return OutputFormat(own) if own is not None and task.generic_prompts else self.output_format(task)

    @property
    def family(self) -> str:
        """The strategy with its answer form (``inwriting``, ``inwriting:json``): the records' ``base_strategy``,
        so a decomposition compares the levels of one form."""
        return self.name + (self.form.suffix if self.form in (AnswerForm.JSON, AnswerForm.KEYPHRASE) else "")

    def with_form(self, form: AnswerForm) -> StrategySpec:
        """This spec in ``form``, its text rewritten (``inwriting@fc+rc`` -> ``inwriting@fc:json+rc``) so records
        name the form they ran and the text parses back to the same spec."""
        head = self.spec[: -len("+rc")] if self.rc else self.spec
        return replace(self, spec=head + form.suffix + ("+rc" if self.rc else ""), form=form)


def parse_strategy_spec(spec: str) -> StrategySpec:
    s = spec.strip()
    rc = s.endswith("+rc")
    if rc:
        s = s[: -len("+rc")]
    form = next((f for f in AnswerForm if s.endswith(f.suffix)), None)
    if form is not None:
        s = s[: -len(form.suffix)]
    name, _, level = s.partition("@")
    strat = get_strategy(name)  # unknown names list the known ones
    if form is not None and name not in FORM_STRATEGIES[form]:
        raise ConfigError(f"the answer form {form.suffix!r} applies to {', '.join(FORM_STRATEGIES[form])}, "
                          f"not {name!r} (in {spec!r})")
    if not strat.requires_constraint:
        if level and level != "none":
            raise ConfigError(f"strategy {name!r} is unconstrained; it takes no level (got {spec!r})")
        level = "none"
    level = level or "vc"
    if level not in LEVELS:
        raise ConfigError(f"unknown constraint level {level!r} in {spec!r}; use one of {', '.join(LEVELS)}")
    return StrategySpec(spec=spec.strip(), name=name, level=level, rc=rc, form=form)


def paper_answer_form(s: StrategySpec, task: Task) -> StrategySpec:
    """``s`` under paper 003's prompt plan: InWriting and NL-to-Format answer in the JSON form (the paper's target
    format after section 5.2), unless the spec names a form or the task has its own answer format."""
    if s.name not in JSON_FORM_STRATEGIES or s.form is not None or not task.has_json_answer_form:
        return s
    return s.with_form(AnswerForm.JSON)


def as_listed(strategy: str) -> str:
    """The grid's spelling (``--strategies``) of a recorded spec: a spec a prompt plan gave a form
    (``inwriting@vc:json`` under --prompt-variants paper, ``free:keyphrase`` beside a FEM strategy) less that
    form. It may also have been listed with the form; callers accept either."""
    for form in (AnswerForm.JSON, AnswerForm.KEYPHRASE):
        if form.suffix in strategy:
            return strategy.replace(form.suffix, "", 1)
    return strategy


def deco_g_baselines(specs: list[StrategySpec], task: Task) -> list[StrategySpec]:
    """Paper 001's comparison on one prompt: where the grid runs a FEM strategy and the task's FEM format is a key
    phrase (GSM8K's "The final answer is", SummEval's "The rating is"), ``free`` and ``constrained`` without a
    named form take it too, as the paper's Prompt-Only and Structured (NL) baselines do."""
    if (task.fem_output_format is not OutputFormat.REASON_KEYPHRASE
            or not any(s.strategy.task_output_format for s in specs)):
        return specs
    return [s.with_form(AnswerForm.KEYPHRASE) if s.name in NL_BASELINES and s.form is None else s for s in specs]


def answer_spec(task: Task, item: Item, s: StrategySpec) -> str:
    """The answer constraint for this item at the spec's level (``none`` still has one: it is not enforced,
    only used to read the answer)."""
    return task.answer_spec("fc" if s.level == "fc" else "vc", item, s.output_format(task))


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
    prompt_format: str = ""  # what the prompt describes (check_prompt_identity groups on it); "": output_format
    prompt_style: PromptStyle = PromptStyle.CHAT
    budget: dict[str, int] | None = None  # set once by runner.execute.planned_budget (deterministic in the config)
    checked: bool = False  # its request passed Strategy.check (the run's up-front check): not checked again

    def constraint(self) -> Constraint | None:
        return parse_spec(self.answer) if self.answer is not None else None

    def conversion(self, task: Task) -> Any:
        fmt = OutputFormat.ANSWER_JSON if self.spec.json_answer else OutputFormat.ANSWER_ONLY
        return lambda text: task.conversion_messages(self.item, text, self.format_variant, fmt)


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
    system_prompt: str | None = None,
) -> list[Planned]:
    """Every request of the grid, in a stable order (strategy, variant, seed, item). ``style`` BASE: every
    strategy gets the item's plain few-shot prompt (:meth:`Task.base_prompt`). ``system_prompt``: a system
    message before every chat prompt (:func:`with_system`)."""
    shot_items = task.shots(shots, shot_seed, {it.id for it in items}) if shots else []
    out: list[Planned] = []
    for s in specs:
        if s.json_answer and not task.has_json_answer_form:
            raise ConfigError(f"{s.spec}: task {task.name!r} has its own answer format; the JSON answer form needs "
                              "the generic prompts")
        if s.form is AnswerForm.KEYPHRASE and task.fem_output_format is not OutputFormat.REASON_KEYPHRASE:
            raise ConfigError(f"{s.spec}: task {task.name!r} has no key-phrase format (Deco-G's GSM8K and SummEval "
                              "phrases); drop :keyphrase")
        if s.json_answer and style is PromptStyle.BASE:
            raise ConfigError(f"{s.spec}: a base-model prompt shows the answer line in its shots, not the JSON "
                              "answer form; use --prompt-style chat")
        fmt, pfmt = s.output_format(task), s.prompt_format(task)
        for tv, fv in variants(s) if callable(variants) else variants:
            vid = variant_id(tv, fv)
            for seed in seeds:
                for it in items:
                    msgs: Prompt = (task.base_prompt(it, shot_items) if style is PromptStyle.BASE
                                    else with_system(task.messages(it, pfmt, tv, fv, shot_items), system_prompt))
                    ans = answer_spec(task, it, s)
                    out.append(Planned(request_id(task.name, it.id, s.spec, vid, seed, shots), task.name, it, s, vid,
                                       seed, shots, msgs, ans, fmt.value, fv, prompt_style=style,
                                       prompt_format=pfmt.value))
    return out


def with_system(messages: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
    """``messages`` under ``formtax run --system-prompt``: the text as the first system message (before a task's own
    system message, in the same message, so there is still one); None leaves them as they are. An empty text is an
    empty system message, which keeps a chat template from injecting its default (SmolLM2's "You are a helpful AI
    assistant named SmolLM...")."""
    if system is None:
        return messages
    if messages and messages[0]["role"] == "system":
        joined = f"{system}\n\n{messages[0]['content']}" if system else messages[0]["content"]
        return [{"role": "system", "content": joined}, *messages[1:]]
    return [{"role": "system", "content": system}, *messages]


def check_prompt_identity(planned: list[Planned], render: Any, across_formats: bool = False) -> None:
    """Strategies that share an expected output format must see byte-identical prompts; refuse otherwise.

    ``across_formats``: every strategy must see the same prompt whatever its output format (a task with the
    benchmark's own prompt, e.g. metatool, where free, short and constrained differ only in decoding).
    """
    seen: dict[tuple[str, str, str, int, str], tuple[str, str]] = {}
    groups: dict[str, set[str]] = defaultdict(set)
    for p in planned:
        described = p.prompt_format or p.output_format
        key = (p.task, p.item.id, p.prompt_variant, p.seed, "*" if across_formats else described)
        text = render(p.messages)
        groups[described].add(p.spec.spec)
        if key in seen and seen[key][0] != text:
            share = f"share the prompt format {described!r}"
            if across_formats:
                share = "must share one prompt"
            raise ConfigError(
                f"prompts differ between strategies {seen[key][1]!r} and {p.spec.spec!r} that {share} "
                f"(task {p.task}, item {p.item.id}, variant {p.prompt_variant}); "
                "refusing to run an unfair comparison"
            )
        seen.setdefault(key, (text, p.spec.spec))
