"""The record schema: one JSON line per request, versioned.

A record holds everything needed to recompute every reported number without the model: ids, hashes of the
prompt and the item, the prompt itself, the raw output per phase, token counts, finish reason, every parser's
verdict, the scores, timings, errors, and the strategy's statistics.

Schema history: version 1 (this one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1


class ParseRecord(BaseModel):
    status: str  # ok | no_answer | invalid
    value: str | None = None
    raw: str | None = None


class Record(BaseModel):
    schema_version: int = SCHEMA_VERSION
    request_id: str  # stable hash of (task, item_id, strategy, prompt_variant, seed, shots)
    task: str
    item_id: str
    item_hash: str
    strategy: str  # the strategy spec as given, e.g. "json@vc" or "inwriting@vc+rc"
    base_strategy: str  # the registered strategy, e.g. "json"
    level: str  # none | fc | vc (paper 003's constraint levels)
    rc: bool  # reasoning constraint (forced prefix) on
    output_format: str  # reason-answer | answer-only | json
    prompt_variant: str  # e.g. "t1f1"
    seed: int
    shots: int
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
