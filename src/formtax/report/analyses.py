"""Study-specific analyses plug into the report through this registry.

The generic tables (accuracy, runs, decomposition, paired, tokens, timing) apply to every run. A study with its
own statistics (tool-call abstention, LLM-as-judge correlations, ...) registers an :class:`Analysis` in its own
module: ``compute`` returns a table when the run is one it applies to (None otherwise), and the report writes,
renders, plots and *verifies* it exactly like the built-in tables.

The built-in analyses are named by module path (:data:`BUILTIN_MODULES`, in the order their tables appear) and
imported on the first call to :func:`analyses`: the studies (``formtax.studies``) sit above the generic report
and import this registry, never the reverse.
"""

from __future__ import annotations

import importlib
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
    across_models: bool = False  # compute reads a pooled report's whole frame (every model), not one model's


_ANALYSES: dict[str, Analysis] = {}

BUILTIN_MODULES = (
    "formtax.studies.abstention.analyses",  # tool-call abstention (paper 002)
    "formtax.studies.abstention.extra",  # paper 002's remaining analyses
    "formtax.studies.eae.report",  # event argument extraction (paper 001)
    "formtax.report.fem",  # the FEM strategies' masked mass
    "formtax.studies.summeval.judge",  # SummEval's judge correlations (paper 001)
    "formtax.report.paper003",  # paper 003's answer forms and IMDb words
)


def register_analysis(a: Analysis) -> Analysis:
    if a.name in _ANALYSES:
        raise ValueError(f"analysis {a.name!r} registered twice")
    _ANALYSES[a.name] = a
    return a


def analyses() -> dict[str, Analysis]:
    """Every registered analysis by table name, the built-in ones first (in :data:`BUILTIN_MODULES` order)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    return _ANALYSES


def table_keys(name: str) -> tuple[str, ...]:
    from formtax.report.matrices import TABLE_KEYS

    if name in TABLE_KEYS:
        return TABLE_KEYS[name]
    return analyses()[name].keys


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


def extra_tables(df: pd.DataFrame, n_resamples: int, seed: int) -> dict[str, pd.DataFrame]:
    """Every registered analysis that applies. In a pooled report of several models each analysis runs on each
    model's records alone (its resampling and its guards are per model, as paper 002's per-model tables are) and
    the rows carry the relabelled task, ``TASK | MODEL``, so the models stand side by side in one table."""
    out: dict[str, pd.DataFrame] = {}
    frames = per_model_frames(df)
    for name, a in analyses().items():
        if a.across_models:
            whole = a.compute(df, n_resamples, seed)
            if whole is not None:
                out[name] = whole
            continue
        parts = []
        for sub, relabel in frames:
            t = a.compute(sub, n_resamples, seed)
            if t is None:
                continue
            if relabel:
                t = t.assign(task=t["task"].astype(str).map(lambda task, r=relabel: r.get(task, task)))
            parts.append(t)
        if parts:
            out[name] = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    return out
