"""Study-specific analyses plug into the report through this registry.

The generic tables (accuracy, runs, decomposition, paired, tokens, timing) apply to every run. A study with its
own statistics (tool-call abstention, LLM-as-judge correlations, ...) registers an :class:`Analysis` in its own
module: ``compute`` returns a table when the run is one it applies to (None otherwise), and the report writes,
renders, plots and *verifies* it exactly like the built-in tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Analysis:
    name: str  # the table's CSV stem
    keys: tuple[str, ...]  # the columns that identify a row (verify matches rows on them)
    description: str  # the paragraph above the table
    method: str  # the interval method, for the line under the table
    bootstrap: bool  # whether it resamples (the footer then states replicates and seed)
    compute: Callable[[pd.DataFrame, int, int], pd.DataFrame | None]  # (records frame, n_resamples, seed)
    figure: Callable[[pd.DataFrame], Any] | None = None  # a matplotlib Figure from the table
    figure_caption: str = ""


ANALYSES: dict[str, Analysis] = {}


def register_analysis(a: Analysis) -> Analysis:
    if a.name in ANALYSES:
        raise ValueError(f"analysis {a.name!r} registered twice")
    ANALYSES[a.name] = a
    return a


def table_keys(name: str) -> tuple[str, ...]:
    from formtax.report.matrices import TABLE_KEYS

    if name in TABLE_KEYS:
        return TABLE_KEYS[name]
    return ANALYSES[name].keys


def extra_tables(df: pd.DataFrame, n_resamples: int, seed: int) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for name, a in ANALYSES.items():
        t = a.compute(df, n_resamples, seed)
        if t is not None:
            out[name] = t
    return out
