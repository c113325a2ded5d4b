"""formtax: let a language model reason freely and still answer in a strict, machine-readable format.

The public API is imported lazily (PEP 562): ``import formtax`` and ``formtax --help`` do not load torch,
transformers or llguidance; the first use of ``formtax.generate`` (or any name below) does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from formtax._lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "Delta": "formtax.streaming",
    "astream": "formtax.streaming",
    "stream": "formtax.streaming",
    "from_pydantic": "formtax.constraints.native",
    "from_transformers": "formtax.api",
    "agenerate": "formtax.api",
    "generate": "formtax.api",
    "generate_batch": "formtax.api",
    "load_model": "formtax.api",
    "parse": "formtax.api",
}

if TYPE_CHECKING:
    from formtax.api import agenerate, from_transformers, generate, generate_batch, load_model, parse
    from formtax.constraints.native import from_pydantic
    from formtax.streaming import Delta, astream, stream


__getattr__ = lazy_getattr("formtax", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["Delta", "__version__", "agenerate", "astream", "from_pydantic", "from_transformers", "generate", "generate_batch",
           "load_model", "parse", "stream"]
