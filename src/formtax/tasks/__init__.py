"""Benchmark tasks: loaders, answer spaces, few-shot examples and prompts.

Look tasks up with ``get_task(name)``; the built-in ones are imported on the first lookup
(:data:`formtax.tasks.registry.BUILTIN_MODULES`).
"""

from formtax.tasks.base import (
    ANSWER_PREFIX,
    AnswerKind,
    Item,
    OutputFormat,
    PromptStyle,
    Task,
    resolve_data_dir,
    sample_items,
)
from formtax.tasks.prompts import (
    build_messages,
    conversion_messages,
    parse_variant_id,
    render_answer,
    variant_id,
)
from formtax.tasks.registry import get_task, list_tasks, register_task

__all__ = [
    "ANSWER_PREFIX",
    "AnswerKind",
    "Item",
    "OutputFormat",
    "PromptStyle",
    "Task",
    "build_messages",
    "conversion_messages",
    "get_task",
    "list_tasks",
    "parse_variant_id",
    "register_task",
    "render_answer",
    "resolve_data_dir",
    "sample_items",
    "variant_id",
]
