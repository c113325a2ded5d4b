"""The report's figures (matplotlib, "Agg" backend): accuracy with intervals, paired differences, tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

FIGURES: dict[str, str] = {
    "parse": "Parse rate per strategy, 95% intervals ({intervals}): strict (the task's strict parser) and "
             "format-level (paper 003's: the requested shape, whatever the answer's spelling), per task.",
    "accuracy": "Strict accuracy per strategy, 95% intervals over items x runs ({intervals}), per task.",
    "paired": "Differences in strict accuracy against the baseline (strategy - baseline), 95% paired intervals "
              "({intervals}).",
    "tokens": "Mean generated tokens per phase (scored records), stacked, per task and strategy.",
}
"""Figure file stems and captions, in report order; ``{intervals}`` becomes the interval methods the figure's rows
actually used (report/render.py's ``methods_used``)."""


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _task_axes(n_tasks: int, width: float) -> tuple[Figure, list[Axes]]:
    fig, axes = plt.subplots(max(n_tasks, 1), 1, figsize=(width, 3.2 * max(n_tasks, 1)), squeeze=False)
    return fig, list(axes[:, 0])


def _error(values: pd.Series, low: pd.Series, high: pd.Series) -> np.ndarray:
    below = np.clip((values - low).to_numpy(dtype=float), 0.0, None)
    above = np.clip((high - values).to_numpy(dtype=float), 0.0, None)
    return np.nan_to_num(np.vstack([below, above]))


def accuracy_figure(accuracy: pd.DataFrame) -> Figure:
    tasks = sorted(accuracy["task"].unique())
    fig, axes = _task_axes(len(tasks), 8.0)
    if not tasks:
        _no_data(axes[0], "accuracy")
    for ax, task in zip(axes, tasks, strict=False):
        rows = accuracy[accuracy["task"] == task]
        x = np.arange(len(rows))
        err = _error(rows["acc_strict"], rows["acc_strict_low"], rows["acc_strict_high"])
        ax.bar(x, rows["acc_strict"].fillna(0.0), yerr=err, capsize=4, color="tab:blue", alpha=0.8)
        ax.set_xticks(x, list(rows["strategy"]), rotation=20, ha="right")
        ax.set_ylim(0.0, 1.05)
        ax.set_ylabel("strict accuracy")
        ax.set_title(f"{task}")
    fig.tight_layout()
    return fig


def parse_figure(accuracy: pd.DataFrame) -> Figure:
    tasks = sorted(accuracy["task"].unique())
    fig, axes = _task_axes(len(tasks), 8.0)
    if not tasks:
        _no_data(axes[0], "parse rates")
    for ax, task in zip(axes, tasks, strict=False):
        rows = accuracy[accuracy["task"] == task]
        x = np.arange(len(rows))
        err = _error(rows["parse_rate_strict"], rows["parse_rate_strict_low"], rows["parse_rate_strict_high"])
        ax.bar(x - 0.2, rows["parse_rate_strict"].fillna(0.0), width=0.4, yerr=err, capsize=3,
               color="tab:green", label="strict")
        fmt_err = _error(rows["parse_rate_format"], rows["parse_rate_format_low"], rows["parse_rate_format_high"])
        ax.bar(x + 0.2, rows["parse_rate_format"].fillna(0.0), width=0.4, yerr=fmt_err, capsize=3,
               color="tab:olive", label="format-level")
        ax.set_xticks(x, list(rows["strategy"]), rotation=20, ha="right")
        ax.set_ylim(0.0, 1.05)
        ax.set_ylabel("parse rate")
        ax.set_title(f"{task}")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def paired_figure(paired: pd.DataFrame, baseline: str | None = None) -> Figure:
    from formtax.report.findings import baseline_rows

    if baseline is not None:
        parts = [baseline_rows(paired, t, baseline) for t in sorted(paired["task"].astype(str).unique())]
        paired = pd.concat(parts, ignore_index=True) if parts else paired.iloc[0:0]
    height = max(2.5, 0.35 * len(paired) + 1.2)
    fig, ax = plt.subplots(figsize=(8.0, height))
    shown = paired[paired["diff"].notna()]
    if shown.empty:
        _no_data(ax, "paired comparisons")
        return fig
    y = np.arange(len(shown))[::-1]
    err = _error(shown["diff"], shown["diff_low"], shown["diff_high"])
    ax.errorbar(shown["diff"], y, xerr=err, fmt="o", color="tab:red", capsize=3)
    ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
    labels = [
        f"{t}: {a} - {b}"
        for t, a, b in zip(shown["task"], shown["strategy"], shown["baseline"], strict=True)
    ]
    ax.set_yticks(y, labels)
    ax.set_xlabel("difference in strict accuracy")
    fig.tight_layout()
    return fig


def tokens_figure(tokens: pd.DataFrame) -> Figure:
    fixed = {"tokens_prompt_mean", "tokens_total_mean", "tokens_forced_mean"}
    phase_cols = [
        c for c in tokens.columns if c.startswith("tokens_") and c.endswith("_mean") and c not in fixed
    ]
    tasks = sorted(tokens["task"].unique())
    fig, axes = _task_axes(len(tasks), 8.0)
    if not tasks:
        _no_data(axes[0], "token counts")
    for ax, task in zip(axes, tasks, strict=False):
        rows = tokens[tokens["task"] == task]
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for col in phase_cols:
            values = rows[col].fillna(0.0).to_numpy(dtype=float)
            ax.bar(x, values, bottom=bottom, label=col[len("tokens_") : -len("_mean")])
            bottom += values
        if not phase_cols:
            ax.bar(x, rows["tokens_total_mean"].fillna(0.0), label="total")
        ax.set_xticks(x, list(rows["strategy"]), rotation=20, ha="right")
        ax.set_ylabel("mean generated tokens")
        ax.set_title(f"{task}")
        ax.legend(fontsize="small", title="phase", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def write_figures(tables: dict[str, pd.DataFrame], out_dir: Path, baseline: str | None = None) -> dict[str, Path]:
    """Write ``<stem>.png`` for each of :data:`FIGURES` into ``out_dir``; returns the paths by stem. The paired
    figure draws the comparisons with ``baseline`` (all pairs when None)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    from formtax.report.catalog import analyses

    makers: dict[str, Any] = {"parse": lambda _t: parse_figure(tables["accuracy"]), "accuracy": accuracy_figure,
                              "paired": lambda t: paired_figure(t, baseline), "tokens": tokens_figure}
    stems = list(FIGURES)
    for name, a in analyses().items():
        if a.figure is not None and name in tables:
            makers[name] = a.figure
            stems.append(name)
    paths: dict[str, Path] = {}
    for stem in stems:
        fig = makers[stem](tables["accuracy" if stem == "parse" else stem])
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        paths[stem] = path
    return paths
