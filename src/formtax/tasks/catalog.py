"""The task catalog: every built-in task, imported here, and the lookup by name (``formtax.tasks.get_task``).

The built-in tasks register themselves on import (:func:`formtax.tasks.registry.register_task`); this module
imports them all, the benchmark tasks of this package and the tasks of the studies and the planted worlds, so it
sits above every one of them in the layer order (tests/architecture/test_import_layers.py) and nothing names a
task module by string (issue 56). The runner, its Ray workers, the report and the CLI reach tasks through
:func:`get_task`, which ``formtax.tasks`` re-exports, so a process that looks a task up has every built-in task.
A task registered by user code (``@register_task``) is found the same way.
"""

from __future__ import annotations

from types import ModuleType

from formtax.errors import ConfigError
from formtax.planted import task as planted_task
from formtax.studies.abstention import task as abstention_task
from formtax.studies.eae import task as eae_task
from formtax.studies.summeval import task as summeval_task
from formtax.tasks import aime, arc, arith, csqa, gsm8k, imdb, jsonl, lastletter, svamp
from formtax.tasks.base import Task
from formtax.tasks.registry import registered

BUILTIN: tuple[ModuleType, ...] = (aime, arc, arith, csqa, gsm8k, imdb, jsonl, lastletter, svamp, eae_task,
                                   abstention_task, summeval_task, planted_task)
"""The modules of the built-in tasks (each registers its tasks when imported, which this module does)."""


def get_task(name: str) -> Task:
    """A new instance of the task registered as ``name``; ConfigError listing the known names otherwise."""
    cls = registered().get(name)
    if cls is None:
        raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}")
    return cls()


def list_tasks() -> list[str]:
    """The registered task names, sorted."""
    return sorted(registered())
