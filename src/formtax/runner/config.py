"""A run's configuration (:class:`RunConfig`) and the optional task protocols the runner honours.

Kept apart from the runner itself so that the executors (runner/execute.py, runner/parallel.py) and the run
(runner/run.py) all read one definition, with no import between them but downwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from formtax.errors import ConfigError
from formtax.parsing import ParseResult
from formtax.runner.grid import StrategySpec, deco_g_baselines, paper_answer_form, parse_strategy_spec
from formtax.tasks import Item, OutputFormat, PromptStyle, Task, parse_variant_id

# Options that change how fast a run goes, not what it computes: they may differ between resumptions.
NON_IDENTITY = ("batch_size", "device", "workers", "ray_address", "backend_options", "reasoning_floor")
WEIGHT_OPTIONS = ("revision", "subfolder", "trust_remote_code")  # backend options that change the model itself
DEFAULT_REASONING_FLOOR = 128  # formtax run without --max-tokens: the reasoning budget where 256 leaves none


@runtime_checkable
class ConfigurableTask(Protocol):
    """A task that takes options of its own (e.g. metatool's ``pairs``, ``translations``). ``configure`` may
    return the task to use instead (the planted task returns the one of its world's answer kind). A task samples
    its own items (and refuses ``--limit``) unless it sets ``samples_own_items = False``."""

    def configure(self, options: Mapping[str, Any]) -> Task | None: ...


@runtime_checkable
class OwnParsing(Protocol):
    """A task whose benchmark defines how an output is read (e.g. metatool's mention rules): it returns the
    per-parser verdicts (at least ``strict`` and ``lenient``) that formtax's parsers would otherwise give."""

    def parse_output(self, text: str, item: Item, output_format: OutputFormat) -> dict[str, ParseResult]: ...


@dataclass
class RunConfig:
    task: str
    strategies: list[str]
    model: str | None = None
    backend: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    limit: int | None = None
    seeds: int = 1
    prompt_variants: str = "t1f1"  # "all" or a comma list like "t1f1,t2f3"
    shots: int = 0
    # "chat" | "base" (a plain few-shot prompt, paper 000's pre-trained setting); None: base for a model known to
    # have no chat template (resolve_prompt_style), else chat. The resolved style is what the run records.
    prompt_style: str | None = None
    max_tokens: int = 256
    # paper 003's equal reasoning budget: the reasoning phase of every level of a strategy gets this many tokens,
    # the answer's reserve on top; None: max_tokens minus the largest reserve of the strategy's levels (FC, VC)
    reasoning_tokens: int | None = None
    # issue 60: every strategy gets the same reasoning budget (--reasoning-tokens, else max_tokens): free reasons
    # and answers in it, the strategies with an answer phase (json, InWriting, NL-to-Format) reason in it and get
    # their answer's reserve on top; off: each strategy's budget is max_tokens less its own levels' reserve
    same_reasoning: bool = False
    # where max_tokens leaves no reasoning budget after an answer's reserve (a large record: EAE's JSON), the
    # reasoning budget is this instead of a refusal; 0: refuse. Only formtax run's default --max-tokens sets it,
    # and it applies only where a run would otherwise be refused, so no resumable run changes (not identity)
    reasoning_floor: int = 0
    batch_size: int = 8
    temperature: float = 0.0
    top_p: float = 1.0  # sampling filters (decoding/sampling.py)
    top_k: int = 0
    min_p: float = 0.0
    model_defaults: bool = False  # sample with the model's generation_config defaults (resolved at load)
    thinking: str | None = None  # "on" | "off": the chat template's enable_thinking (paper 003: off); None: as is
    extractor_model: str | None = None  # NL-to-Format's second call on this model (paper 003: a larger one)
    extractor_backend: str | None = None  # its engine (default: --backend)
    item_seed: int = 0
    data_dir: str | None = None
    task_options: dict[str, Any] = field(default_factory=dict)  # passed to a ConfigurableTask
    hypotheses: str | None = None  # pre-registration file, locked into the manifest
    workers: int = 1  # > 1: shard the chunks over this many Ray actors, one backend each (runner/parallel.py)
    ray_address: str | None = None  # join this Ray cluster instead of starting a local one
    backend_options: dict[str, Any] = field(default_factory=dict)  # e.g. server=URL, tensor_parallel_size=2
    fem: str | None = None  # decog / ctrlg: FEM artifact(s), FILE or NAME=FILE,... (strategies/decog.py)
    seeding: str = "request"  # how a request's sampler seed is made from its seed index: see sampler_seed
    json_layout: str = "flexible"  # the json strategy's layout (constraints/jsonreason.py): flexible | compact
    # closing mode (constraints/closing.py); None: its default, settled when the run starts (runner/run.py): on
    # wherever formtax steps the model, as on every other route (issue 56); a resumed run keeps its own
    closing: bool | None = None
    # a system message before every chat prompt ("": an empty one, so the template's own default, e.g. SmolLM's,
    # is not injected); None: the task's messages as they are
    system_prompt: str | None = None

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        for k in NON_IDENTITY:
            d.pop(k)
        # Unset new options are left out, so run directories made before they existed still resume.
        if not d["task_options"]:
            d.pop("task_options")
        if d["hypotheses"] is None:
            d.pop("hypotheses")
        if d["fem"] is None:
            d.pop("fem")
        if d["reasoning_tokens"] is None:
            d.pop("reasoning_tokens")
        if not d["same_reasoning"]:
            d.pop("same_reasoning")
        if not any(parse_strategy_spec(s).name == "json" for s in self.strategies):
            d.pop("json_layout")  # a grid without the json strategy reads no layout
        if d["prompt_style"] in (None, PromptStyle.CHAT):
            d.pop("prompt_style")  # chat: the only style before base-model prompting existed
        if d["seeding"] == "index" or (self.temperature <= 0.0 and not self.model_defaults):
            d.pop("seeding")  # the rule before it existed; and greedy decoding reads no seed
        for key, default in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("model_defaults", False), ("closing", False),
                             ("thinking", None), ("extractor_model", None), ("extractor_backend", None),
                             ("system_prompt", None)):
            if d[key] == default:
                d.pop(key)
        # the options that choose other weights are part of what a run is (the rest of backend_options is not)
        weights = {k: self.backend_options[k] for k in WEIGHT_OPTIONS if k in self.backend_options}
        if weights:
            d["model_options"] = weights
        return d

    def strategy_specs(self, task: Task) -> list[StrategySpec]:
        """The parsed strategies as they run on ``task``, each spec without a named form in its plan's: under
        ``--prompt-variants paper`` InWriting and NL-to-Format take paper 003's JSON answer form
        (grid.paper_answer_form); beside a FEM strategy, free and constrained take the task's key phrase
        (grid.deco_g_baselines). ``:plain`` keeps the answer line."""
        specs = [parse_strategy_spec(s) for s in self.strategies]
        if self.prompt_variants == "paper":
            specs = [paper_answer_form(s, task) for s in specs]
        return deco_g_baselines(specs, task)

    def variants(self, strategy: str | None = None) -> list[tuple[int, int]]:
        """The (task variant, format variant) pairs of ``strategy`` (a base strategy name; None: any)."""
        if self.prompt_variants == "paper":
            return paper_variants(self.task, strategy)
        if self.prompt_variants == "all":
            return [(t, f) for t in (1, 2, 3) for f in (1, 2, 3)]
        return [parse_variant_id(v.strip()) for v in self.prompt_variants.split(",") if v.strip()]


PAPER_PLANS = {"inwriting": (3, 3), "nl2format": (3, 3), "json": (3, 1)}
"""Paper 003's prompt plan (A.2): task x format variants per strategy; AIME uses 1 task x 3 format variants."""


def paper_variants(task: str, strategy: str | None) -> list[tuple[int, int]]:
    """``--prompt-variants paper``: exactly paper 003's plan for ``strategy`` on ``task`` (refused for strategies
    the paper does not run)."""
    if strategy is None:  # the union, for callers that ask for every variant in the grid
        return sorted({v for name in PAPER_PLANS for v in paper_variants(task, name)})
    if strategy not in PAPER_PLANS:
        raise ConfigError(f"--prompt-variants paper: paper 003 runs {', '.join(sorted(PAPER_PLANS))}, not "
                          f"{strategy!r}; give the variants explicitly (e.g. t1f1)")
    n_task, n_format = (1, 3) if task == "aime" else PAPER_PLANS[strategy]
    return [(t, f) for t in range(1, n_task + 1) for f in range(1, n_format + 1)]


def thinking_flag(value: str | None) -> bool | None:
    """``--thinking on|off`` as the template's ``enable_thinking`` (None: the template's default)."""
    if value is None:
        return None
    if value not in ("on", "off"):
        raise ConfigError(f"--thinking must be on or off, got {value!r}")
    return value == "on"


SEEDINGS = ("request", "index")
