"""The task layer's vocabulary: answer kinds, output formats, prompt styles, the evaluated :class:`Item` and the
fixed answer phrases. A leaf module, so the prompts (tasks/prompts.py), the parsers and the scorers can use it
without the :class:`~formtax.tasks.base.Task` class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

ANSWER_PREFIX = "The answer is: "
"""The exact text that introduces the final answer in the ``reason-answer`` and ``answer-only`` formats."""

KEY_PHRASE = "The final answer is "
"""Deco-G's GSM8K key phrase (paper 001): in the ``reason-keyphrase`` format it appears anywhere in the output,
followed by the answer, and text may follow it."""

DATA_ENV_VAR = "FORMTAX_DATA"
"""Environment variable naming the data folder when no explicit path is given."""

ConstraintLevel = Literal["fc", "vc"]


class AnswerKind(StrEnum):
    """The shape of a task's answer; parsers use it to pick their fallbacks."""

    INTEGER = "integer"
    CHOICE = "choice"
    LETTERS = "letters"
    SPANS = "spans"
    """Text spans copied from the input, one per role (event argument extraction); such tasks read their own
    outputs (``parse_output``)."""


class PromptStyle(StrEnum):
    """How an item becomes a prompt: chat messages (instruction, format description, question) for a model with
    a chat template, or a plain-text few-shot completion prompt for a pre-trained one (paper 000)."""

    CHAT = "chat"
    BASE = "base"


class OutputFormat(StrEnum):
    """The output format the prompt asks for, and that the strict parser accepts."""

    REASON_ANSWER = "reason-answer"
    """Free reasoning, then a final line ``The answer is: <answer>``."""
    ANSWER_ONLY = "answer-only"
    """A single line ``The answer is: <answer>`` and nothing else."""
    JSON = "json"
    """One compact JSON object ``{"reason": "...", "answer": ...}``."""
    REASON_JSON = "reason-json"
    """Free reasoning, then the one-field JSON object ``{"answer": <answer>}`` (paper 003 A.2's JSON answer form
    of InWriting and NL-to-Format)."""
    ANSWER_JSON = "answer-json"
    """The object ``{"answer": <answer>}`` and nothing else (NL-to-Format's second call in the JSON form)."""
    REASON_KEYPHRASE = "reason-keyphrase"
    """Free reasoning in which ``The final answer is <answer>`` appears anywhere (text may follow): Deco-G's GSM8K
    format (paper 001), the default of the FEM strategies on tasks that set it (:attr:`Task.fem_output_format`)."""
    REASONING = "reasoning"
    """Free reasoning, no answer format (NL-to-Format's first call: paper 003's InWriting prompt is this one plus
    the phrase that asks for the answer line; the second call asks for the answer). A prompt format only."""


JSON_ANSWER_FORMATS = frozenset({OutputFormat.REASON_JSON, OutputFormat.ANSWER_JSON})
ANSWER_ALONE = {OutputFormat.REASON_ANSWER: OutputFormat.ANSWER_ONLY, OutputFormat.REASON_JSON: OutputFormat.ANSWER_JSON}
"""The answer-only form of a format: what a call asked for the answer alone must write (NL-to-Format's second)."""


@dataclass(frozen=True)
class Item:
    """One evaluated question with its normalised gold answer.

    ``gold`` is already in the form ``Task.normalize`` produces, so scoring is plain string equality.
    ``meta`` is excluded from hashing (it is a mapping) but compared, so items stay usable as dict keys.
    """

    id: str
    question: str
    gold: str
    choices: tuple[tuple[str, str], ...] = ()
    solution: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def labels(self) -> tuple[str, ...]:
        """The choice labels in order (empty for non-choice tasks)."""
        return tuple(label for label, _ in self.choices)
