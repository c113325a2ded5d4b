"""Study-specific analyses plug into the report through this registry.

The generic tables (accuracy, runs, decomposition, paired, tokens, timing) apply to every run. A study with its
own statistics (tool-call abstention, LLM-as-judge correlations, ...) registers an :class:`Analysis` in its own
module: ``compute`` returns a table when the run is one it applies to (None otherwise), and the report writes,
renders, plots and *verifies* it exactly like the built-in tables.

This module is the registry only and imports no analysis: the analyses' modules import it. The lookup that knows
every built-in analysis (:func:`formtax.report.catalog.analyses`, with :func:`~formtax.report.catalog.extra_tables`
and :func:`~formtax.report.catalog.table_keys`) is :mod:`formtax.report.catalog`, which imports them and sits above
them and below the report's writers (issue 56: no module names another layer's module by string).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
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
    across_models: bool = False  # compute reads a pooled report's whole frame (every model), not one model's


_ANALYSES: dict[str, Analysis] = {}

def register_analysis(a: Analysis) -> Analysis:
    if a.name in _ANALYSES:
        raise ValueError(f"analysis {a.name!r} registered twice")
    _ANALYSES[a.name] = a
    return a


def registered() -> Mapping[str, Analysis]:
    """The analyses registered so far by table name, in registration order (a read-only view)."""
    return MappingProxyType(_ANALYSES)


MODEL_SEP = " | "  # a pooled report of several models labels each record's task TASK | MODEL (report/combine.py)


def per_model_frames(df: pd.DataFrame) -> list[tuple[pd.DataFrame, dict[str, str]]]:
    """The frame as the study analyses read it: one frame when no task is relabelled, else one frame per model
    with the task names restored (a study selects its task by name) and the map back to the relabelled names."""
    if df.empty or "task" not in df.columns:
        return [(df, {})]
    tasks = df["task"].astype(str)
    if not tasks.str.contains(MODEL_SEP, regex=False).any():
        return [(df, {})]
    models = tasks.str.partition(MODEL_SEP)[2]
    out = []
    for model in sorted(set(models)):
        sub = df[models == model]
        names = tasks[models == model]
        base = names.str.partition(MODEL_SEP)[0]
        out.append((sub.assign(task=base.to_numpy()), dict(zip(base, names, strict=True))))
    return out
