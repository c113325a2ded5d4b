"""Lazy package attributes (PEP 562), shared by ``formtax``, ``formtax.constraints`` and ``formtax.strategies``.

Why: importing a submodule that loads torch and llguidance costs seconds; ``formtax --help``, ``formtax ls`` and
the light submodules (``constraints.template``, ``strategies.catalog``) must not pay it through a package
``__init__``. The standard library has no helper for this; ours is these few lines.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[name]`` (a module path) on first use and caches the value in
    the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
