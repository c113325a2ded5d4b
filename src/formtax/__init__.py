"""formtax: let a language model reason freely and still answer in a strict, machine-readable format."""

__version__ = "0.1.0"

from formtax.api import generate, generate_batch, load_model  # noqa: E402

__all__ = ["__version__", "generate", "generate_batch", "load_model"]
