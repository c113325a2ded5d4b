"""The path users give vLLM for formtax's plugin, kept where the documentation puts it:

    vllm serve MODEL --logits-processors formtax.vllm_plugin:FormtaxLogitsProcessor

The plugin lives with formtax's vLLM engine (:mod:`formtax.backends.vllm.plugin`); every name is read from
there on use, so vLLM is imported only when vLLM loads the class.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from formtax.backends.vllm import plugin

    return getattr(plugin, name)
