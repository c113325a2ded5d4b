"""Task registry: tasks register themselves by name; the CLI and runner look them up here.

The built-in tasks are named by module path (:data:`BUILTIN_MODULES`, a plugin table in the manner of entry
points) and imported on the first lookup, so this module, and the task package, import none of them: a task
module depends on the registry, never the reverse (the import-layer test checks it).
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from formtax.errors import ConfigError
from formtax.tasks.base import Task

_TASKS: dict[str, type[Task]] = {}

T = TypeVar("T", bound=type[Task])


def register_task(cls: T) -> T:
    """Class decorator: register a task class under its ``name`` (which must be unique)."""
    name = cls.name
    existing = _TASKS.get(name)
    if existing is not None and existing is not cls:
        raise ConfigError(
            f"task name {name!r} is registered twice ({existing.__qualname__}, {cls.__qualname__})"
        )
    _TASKS[name] = cls
    return cls


def get_task(name: str) -> Task:
    """A new instance of the task registered as ``name``; ConfigError listing the known names otherwise."""
    _ensure_builtin_tasks()
    cls = _TASKS.get(name)
    if cls is None:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}")
    return cls()


def list_tasks() -> list[str]:
    """The registered task names, sorted."""
    _ensure_builtin_tasks()
    return sorted(_TASKS)


BUILTIN_MODULES = tuple(f"formtax.tasks.{m}" for m in (
    "aime", "arc", "arith", "csqa", "gsm8k", "imdb", "jsonl", "lastletter", "svamp",
)) + ("formtax.studies.eae.task", "formtax.studies.abstention.task", "formtax.studies.summeval.task",
      "formtax.planted.task")


def _ensure_builtin_tasks() -> None:
    for module in BUILTIN_MODULES:  # each registers its tasks when first imported
        importlib.import_module(module)
