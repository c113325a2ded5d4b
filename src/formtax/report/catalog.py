"""The analysis catalog: every built-in study analysis, imported here, and the lookups the report's writers use.

A study with its own statistics registers an :class:`~formtax.report.analyses.Analysis` in its own module
(:func:`~formtax.report.analyses.register_analysis`). This module imports the built-in ones, in the order their
tables appear, so it sits above them in the layer order and below the report's writers (tables, render, figures,
write, verify), which look analyses up here (issue 56: nothing names an analysis module by string).
"""

from __future__ import annotations

from types import ModuleType

import pandas as pd

from formtax.report.analyses import Analysis, per_model_frames, registered

# isort: off
# imported in the order their tables appear: each registers its analyses on import, and the registry keeps that order
from formtax.studies.abstention import analyses as abstention_analyses
from formtax.studies.abstention import extra as abstention_extra
from formtax.studies.eae import report as eae_report
from formtax.report import fem
from formtax.studies.summeval import judge as summeval_judge
from formtax.report import paper003
# isort: on

BUILTIN: tuple[ModuleType, ...] = (
    abstention_analyses,  # tool-call abstention (paper 002)
    abstention_extra,  # paper 002's remaining analyses
    eae_report,  # event argument extraction (paper 001)
    fem,  # the FEM strategies' masked mass
    summeval_judge,  # SummEval's judge correlations (paper 001)
    paper003,  # paper 003's answer forms and IMDb words
)
"""The modules of the built-in analyses, in the order their tables appear (each registers its analyses when
imported, which this module does in this order)."""


def analyses() -> dict[str, Analysis]:
    """Every registered analysis by table name, the built-in ones first (in :data:`BUILTIN` order)."""
    return dict(registered())


def table_keys(name: str) -> tuple[str, ...]:
    """The columns that identify a row of table ``name`` (a generic table's, or an analysis's)."""
    from formtax.report.matrices import TABLE_KEYS

    if name in TABLE_KEYS:
        return TABLE_KEYS[name]
    return analyses()[name].keys


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
