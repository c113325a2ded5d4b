"""Task registry: task classes register themselves by name when their module is imported.

The registry imports no task: a task module depends on it, never the reverse. The lookup that knows every built-in
task, :func:`formtax.tasks.get_task`, is :mod:`formtax.tasks.catalog`, which sits above the task modules (the
studies' and the planted world's among them) and imports them (issue 56: no string hop between layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
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


def registered() -> Mapping[str, type[Task]]:
    """The task classes registered so far, by name (a read-only view: :func:`register_task` adds to it)."""
    return MappingProxyType(_TASKS)
