"""formtax: let a language model reason freely and still answer in a strict, machine-readable format."""

__version__ = "0.1.0"

from formtax.api import from_transformers, generate, generate_batch, load_model  # noqa: E402
from formtax.constraints.native import from_pydantic  # noqa: E402
from formtax.streaming import Delta, astream, stream  # noqa: E402

__all__ = ["Delta", "__version__", "astream", "from_pydantic", "from_transformers", "generate", "generate_batch",
           "load_model", "stream"]
