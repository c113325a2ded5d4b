"""The record schema: one JSON line per request, versioned.

A record holds everything needed to recompute every reported number without the model: ids, hashes of the
prompt and the item, the prompt itself, the raw output per phase, token counts, finish reason, every parser's
verdict, the scores, timings, errors, and the strategy's statistics.

Schema history: version 1 (this one). ``run_identity`` was added within it (empty in records made before).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1


GRID_KEYS = ("task", "strategies", "limit", "seeds", "item_seed", "prompt_variants", "data_dir", "hypotheses")
"""Run settings that choose *which* requests a run makes (or lock its pre-registration), not what a request
outputs: left out of :func:`identity_hash`, so a record stays valid for a grid that grows or a run that
registers its hypotheses late (which is refused for its own reason)."""


def identity_hash(identity: dict[str, Any]) -> str:
    """The hash of a run's output-determining settings (the manifest's ``config_identity`` without
    :data:`GRID_KEYS`: model, backend, dtype, sampling, budgets, task options, FEM, seeding, ...), which every
    record carries as ``run_identity``. With the request id (the grid cell: task, item, strategy, variant, seed,
    shots) it names everything that determines the output."""
    kept = {k: v for k, v in identity.items() if k not in GRID_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:20]


class ParseRecord(BaseModel):
    status: str  # ok | no_answer | invalid
    value: str | None = None
    raw: str | None = None


class Record(BaseModel):
    schema_version: int = SCHEMA_VERSION
    request_id: str  # stable hash of (task, item_id, strategy, prompt_variant, seed, shots)
    run_identity: str = ""  # identity_hash of the run's settings ("" in records made before it existed)
    task: str
    item_id: str
    item_hash: str
    strategy: str  # the strategy spec as given, e.g. "json@vc" or "inwriting@vc+rc"
    base_strategy: str  # the registered strategy with its answer form, e.g. "json", "inwriting:json"
    level: str  # none | fc | vc (paper 003's constraint levels)
    rc: bool  # reasoning constraint (forced prefix) on
    output_format: str  # the answer's format: reason-answer | answer-only | json | reason-json (tasks.OutputFormat)
    prompt_format: str | None = None  # what the (first) prompt describes when it differs (nl2format: reasoning)
    prompt_variant: str  # e.g. "t1f1"
    seed: int
    shots: int
    prompt_style: str = "chat"  # chat | base (a plain few-shot prompt for a pre-trained model, paper 000)
    model: str
    batch_size: int
    prompt_hash: str
    prompt: str  # the rendered prompt text (chat template applied)
    gold: str
    answer_spec: str | None = None  # the constraint SPEC used (None for free/short)
    text: str = ""
    reasoning: str = ""
    answer_text: str | None = None
    phases: dict[str, str] = Field(default_factory=dict)
    finish_reason: str = ""
    tokens: dict[str, Any] = Field(default_factory=dict)  # prompt, total, forced, by_phase
    # reasoning_tokens (the same at every level of a strategy), answer_tokens (on top), max_tokens (their sum);
    # only max_tokens for a strategy without a separate reasoning phase; empty in records made before it existed
    budget: dict[str, int] = Field(default_factory=dict)
    constraint_ok: bool | None = None  # the constraint oracle's verdict on the constrained answer
    parses: dict[str, ParseRecord] = Field(default_factory=dict)  # strict, lenient
    scores: dict[str, bool] = Field(default_factory=dict)  # strict, lenient
    masked_mass: float | None = None
    stats: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    finished_at: str = ""

    @property
    def scored(self) -> bool:
        """An errored request is unscored (reported as a count under every table), not counted as wrong."""
        return self.error is None
