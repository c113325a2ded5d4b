"""Benchmark tasks: loaders, answer spaces, few-shot examples and prompts.

Look tasks up with ``get_task(name)``: it is :func:`formtax.tasks.catalog.get_task`, loaded on first use, since the
catalog imports every built-in task (the studies' and the planted worlds' too), which importing a task module such as
``formtax.tasks.base`` must not pull in (issue 56: the catalog sits above its plugins, no string names them).
"""

from typing import TYPE_CHECKING, Any

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
from formtax.tasks.registry import register_task

if TYPE_CHECKING:
    from formtax.tasks.catalog import get_task, list_tasks

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


def __getattr__(name: str) -> Any:
    """``get_task`` and ``list_tasks``, from the catalog on first use (module docstring)."""
    if name in ("get_task", "list_tasks"):
        from formtax.tasks import catalog

        return getattr(catalog, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
