"""formtax: let a language model reason freely and still answer in a strict, machine-readable format."""

__version__ = "0.1.0"
