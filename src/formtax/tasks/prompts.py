"""Prompt construction: task description, format description, optional few-shot block, question.

This is the "Let me speak freely?" / paper 003 A.2 structure. The format description states the expected output
format exactly as the strict parser accepts it, so constrained and unconstrained decoding are compared under the
same prompt and expected format (paper 003's central point). Everything is plain string assembly from fixed
templates: the same arguments always give byte-identical messages, and strategies sharing an output format get
identical prompts (the runner checks this).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Protocol

from formtax.errors import ConfigError
from formtax.tasks.vocab import (
    ANSWER_PREFIX,
    JSON_ANSWER_FORMATS,
    AnswerKind,
    Item,
    OutputFormat,
)


class Task(Protocol):
    """What the generic prompts read of a task (:class:`formtax.tasks.base.Task` provides it; the prompts are its
    default ``messages``, so this module cannot import that class)."""

    @property
    def answer_kind(self) -> AnswerKind: ...

    @property
    def instructions(self) -> tuple[str, str, str]: ...

    @property
    def key_phrase(self) -> str: ...

    def answer_description(self, item: Item) -> str: ...

    def display_answer(self, item: Item) -> str: ...

N_VARIANTS = 3
_VARIANT_ID_RE = re.compile(r"t([1-9]\d*)f([1-9]\d*)")

# Format descriptions per output format, variants 1..3. ``{desc}`` is the task's answer description; ``{json}``
# is the JSON template (integers unquoted, other answers quoted).
_FORMAT_TEMPLATES: dict[OutputFormat, tuple[str, str, str]] = {
    OutputFormat.REASON_ANSWER: (
        "Think step by step. Then, on the last line of your response, write the final answer in the form "
        f'"{ANSWER_PREFIX}<answer>", where <answer> is {{desc}}. Write nothing after that line.',
        "First reason about the problem in as much detail as you need. End your response with a final line of "
        f"exactly this form:\n{ANSWER_PREFIX}<answer>\nHere <answer> is {{desc}}.",
        "Explain your reasoning, then finish with a single line that starts with "
        f'"{ANSWER_PREFIX}" followed by your answer. The answer must be {{desc}}; nothing may follow that line.',
    ),
    OutputFormat.ANSWER_ONLY: (
        f'Respond with a single line of the form "{ANSWER_PREFIX}<answer>" and nothing else, '
        "where <answer> is {desc}.",
        f"Give only the final answer, as exactly one line:\n{ANSWER_PREFIX}<answer>\n"
        "Here <answer> is {desc}. Do not write any explanation.",
        f'Output nothing but the line "{ANSWER_PREFIX}<answer>", with <answer> being {{desc}}.',
    ),
    OutputFormat.JSON: (
        "Respond with one JSON object and nothing else, on a single line, in the form "
        "{json}, where the reason field holds your step-by-step reasoning and <answer> is {desc}. "
        "Do not wrap the JSON in a code block.",
        "Your whole response must be a single JSON object of the form {json}. Put your reasoning in "
        '"reason" and the final answer in "answer"; <answer> is {desc}. Write no text or code fences '
        "outside the object.",
        "Reply in JSON only: exactly one object {json}. First reason inside the reason field, then give "
        "<answer>, which is {desc}. No markdown, no text before or after the object.",
    ),
    OutputFormat.REASON_KEYPHRASE: (  # before REASONING: the planted backend tells formats apart by these texts
        'Think step by step, and state your result in a sentence "{phrase}<answer>", where <answer> is '
        "{desc}.",
        "First reason about the problem in as much detail as you need. Give your result in a sentence of the "
        "form:\n{phrase}<answer>\nHere <answer> is {desc}.",
        'Explain your reasoning, and write "{phrase}" followed by your answer somewhere in your response. '
        "The answer must be {desc}.",
    ),
    OutputFormat.REASONING: (  # REASON_ANSWER's variants without the phrase that asks for the answer line
        "Think step by step.",
        "First reason about the problem in as much detail as you need.",
        "Explain your reasoning.",
    ),
    OutputFormat.REASON_JSON: (
        "Think step by step. Then, at the end of your response, write the final answer as one JSON object of "
        'the form {answer_json}, where <answer> is {desc}. Write nothing after the object.',
        "First reason about the problem in as much detail as you need. End your response with exactly one JSON "
        "object:\n{answer_json}\nHere <answer> is {desc}.",
        "Explain your reasoning, then finish with the JSON object {answer_json}. The answer must be {desc}; "
        "nothing may follow the object.",
    ),
    OutputFormat.ANSWER_JSON: (
        "Respond with one JSON object of the form {answer_json} and nothing else, where <answer> is {desc}.",
        "Give only the final answer, as exactly one JSON object:\n{answer_json}\nHere <answer> is {desc}. "
        "Do not write any explanation.",
        "Output nothing but the JSON object {answer_json}, with <answer> being {desc}.",
    ),
}

_CONVERSION_INTRO = "Below are a question and a response that reasons about it. Read the response and extract its final answer."


def variant_id(task_variant: int, format_variant: int) -> str:
    """The prompt-variant id, e.g. ``t1f2`` for task description 1 and format description 2."""
    _check_variant("task", task_variant)
    _check_variant("format", format_variant)
    return f"t{task_variant}f{format_variant}"


def parse_variant_id(value: str) -> tuple[int, int]:
    """Inverse of ``variant_id``: ``"t1f2"`` -> ``(1, 2)``; ConfigError for anything else."""
    match = _VARIANT_ID_RE.fullmatch(value.strip())
    if match is None:
        raise ConfigError(
            f"bad prompt variant id {value!r}; expected t<1-{N_VARIANTS}>f<1-{N_VARIANTS}>, e.g. t1f1"
        )
    task_variant, format_variant = int(match.group(1)), int(match.group(2))
    _check_variant("task", task_variant)
    _check_variant("format", format_variant)
    return task_variant, format_variant


def all_variant_ids() -> list[str]:
    """Every prompt-variant id, t1f1 .. t3f3."""
    return [variant_id(t, f) for t in range(1, N_VARIANTS + 1) for f in range(1, N_VARIANTS + 1)]


def _check_variant(kind: str, number: int) -> None:
    if not 1 <= number <= N_VARIANTS:
        raise ConfigError(f"{kind} variant must be 1..{N_VARIANTS}, got {number}")


def json_template(task: Task) -> str:
    """The JSON shape shown in prompts: integer answers as bare numbers, others as strings."""
    return '{"reason": "<reasoning>", "answer": ' + _answer_placeholder(task) + "}"


def _answer_placeholder(task: Task) -> str:
    return "<answer>" if task.answer_kind is AnswerKind.INTEGER else '"<answer>"'


def format_description(task: Task, item: Item, output_format: OutputFormat, format_variant: int) -> str:
    """The format instruction for one output format and variant, with the item's answer description."""
    _check_variant("format", format_variant)
    template = _FORMAT_TEMPLATES[OutputFormat(output_format)][format_variant - 1]
    return template.format(desc=task.answer_description(item), json=json_template(task), phrase=task.key_phrase,
                           answer_json='{"answer": ' + _answer_placeholder(task) + "}")


def render_answer(task: Task, item: Item, output_format: OutputFormat, reason: str | None = None) -> str:
    """An item's gold answer written in ``output_format`` (few-shot examples; also a parser round-trip check).

    REASON_ANSWER (and REASONING, NL-to-Format's first call): the reasoning (if any) then the answer line.
    ANSWER_ONLY: the answer line. JSON: one compact object; an integer answer is a JSON number, any other answer
    a JSON string. REASON_JSON / ANSWER_JSON: the reasoning (if any) then ``{"answer": ...}``, or the object.
    """
    answer = task.display_answer(item)
    if reason is None:
        reason = item.solution
    fmt = OutputFormat(output_format)
    value: object = int(answer) if task.answer_kind is AnswerKind.INTEGER else answer
    if fmt is OutputFormat.JSON:
        return json.dumps({"reason": reason or "", "answer": value}, ensure_ascii=False)
    if fmt in JSON_ANSWER_FORMATS:
        obj = json.dumps({"answer": value}, ensure_ascii=False)
        return f"{reason.strip()}\n{obj}" if fmt is OutputFormat.REASON_JSON and reason else obj
    if fmt is OutputFormat.REASON_KEYPHRASE:
        phrase = f"{task.key_phrase}{answer}."
        return f"{reason.strip()}\n{phrase}" if reason else phrase
    line = f"{ANSWER_PREFIX}{answer}"
    if fmt in (OutputFormat.REASON_ANSWER, OutputFormat.REASONING) and reason:  # a reasoning shot ends as usual
        return f"{reason.strip()}\n{line}"
    return line


def build_messages(
    task: Task,
    item: Item,
    output_format: OutputFormat,
    task_variant: int,
    format_variant: int,
    shots: Sequence[Item] = (),
) -> list[dict[str, str]]:
    """The chat messages for one item: a single user message.

    Layout: task description, blank line, format description, then (with shots) an "Examples:" block where each
    shot is its question followed by its answer in ``output_format``, then ``Question: <question>``.
    """
    _check_variant("task", task_variant)
    parts = [
        task.instructions[task_variant - 1],
        format_description(task, item, output_format, format_variant),
    ]
    if shots:
        examples = "\n\n".join(
            f"Question: {shot.question}\n{render_answer(task, shot, output_format)}" for shot in shots
        )
        parts.append(f"Examples:\n\n{examples}")
    parts.append(f"Question: {item.question}")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def base_prompt(task: Task, item: Item, shots: Sequence[Item] = ()) -> str:
    """The plain-text few-shot prompt for a pre-trained model (paper 000's setting): one block per shot,
    ``Question: <question>`` then ``Answer: <reasoning>`` and the answer line, then the item's question and a
    bare ``Answer:`` for the model to continue.

    The same text for every strategy and output format (the paper's constrained baseline answers from the same
    prompt as greedy), so there is no instruction and no format description: the shots are the format. Ours:
    the reasoning and the answer line are separated by a newline, the layout the strict parser reads (the answer
    on the last line), and the prompt ends without a space after ``Answer:`` (a SentencePiece tokenizer would
    otherwise end the prompt on a lone ``▁`` piece the model rarely saw there)."""
    blocks = [f"Question: {shot.question}\nAnswer: {render_answer(task, shot, OutputFormat.REASON_ANSWER)}"
              for shot in shots]
    blocks.append(f"Question: {item.question}\nAnswer:")
    return "\n\n".join(blocks)


def conversion_messages(
    task: Task, item: Item, reasoning_text: str, format_variant: int,
    output_format: OutputFormat = OutputFormat.ANSWER_ONLY,
) -> list[dict[str, str]]:
    """The NL-to-Format second call: the question, the first call's reasoning, and an instruction to output only
    ``The answer is: <answer>`` (the ANSWER_ONLY format description of the given variant), or only
    ``{"answer": <answer>}`` (ANSWER_JSON, the JSON answer form)."""
    instruction = format_description(task, item, output_format, format_variant)
    content = "\n\n".join(
        [
            _CONVERSION_INTRO,
            f"Question: {item.question}",
            f"Response:\n{reasoning_text.strip()}",
            instruction,
        ]
    )
    return [{"role": "user", "content": content}]
