"""Deco-G / Ctrl-G's hidden-state concentration (paper 001): how much of the HMM's forward mass the top-k states
keep at each step, as a table and a figure.

Each decog / ctrlg record keeps the retained mass of every step (``stats.fem_mass``, 1.0 when nothing is pruned).
The table gives, per task, strategy and step, the mean, minimum and number of records that reached that step; the
figure draws the mean per step, one line per strategy. A curve near 1 means the pruned states carried almost no
mass, so pruning changed little; a falling curve means k is too small for this HMM.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from formtax.report.analyses import Analysis, register_analysis
from formtax.report.matrices import frame

COLUMNS = ["task", "strategy", "step", "n_records", "mass_mean", "mass_min", "top_k", "h"]


def fem_mass_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    rows: list[dict[str, Any]] = []
    if "record" not in df.columns:
        return None
    for (task, strategy), cell in df.groupby(["task", "strategy"], sort=True):
        per_step: dict[int, list[float]] = {}
        top_k = h = None
        for rec in cell["record"]:
            stats = rec.stats or {}
            masses = stats.get("fem_mass")
            if not masses:
                continue
            top_k, h = stats.get("fem_top_k"), stats.get("fem_h")
            for step, m in enumerate(masses):
                per_step.setdefault(step, []).append(float(m))
        for step, values in sorted(per_step.items()):
            rows.append({"task": task, "strategy": strategy, "step": step, "n_records": len(values),
                         "mass_mean": sum(values) / len(values), "mass_min": min(values),
                         "top_k": top_k if top_k is not None else 0, "h": h if h is not None else 0})
    if not rows:
        return None
    return frame(rows, COLUMNS)


def fem_mass_figure(table: pd.DataFrame) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    for (task, strategy), part in table.groupby(["task", "strategy"], sort=True):
        k, h = int(part["top_k"].iloc[0]), int(part["h"].iloc[0])
        label = f"{task} {strategy} (k={k or h} of h={h})"
        ax.plot(part["step"], part["mass_mean"], label=label)
    ax.set_xlabel("decoding step")
    ax.set_ylabel("retained forward mass (mean)")
    ax.set_ylim(0.0, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


COST_COLUMNS = ["task", "strategy", "answer_format", "placement", "n_records", "h", "top_k", "ms_per_step_mean",
                "ms_per_step_median"]


def fem_cost_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    """Measured FEM time per decoding step, per task and strategy, with the state counts it ran at."""
    rows: list[dict[str, Any]] = []
    if "record" not in df.columns:
        return None
    for (task, strategy), cell in df.groupby(["task", "strategy"], sort=True):
        ms = [float(r.stats["fem_ms_per_step"]) for r in cell["record"]
              if (r.stats or {}).get("fem_ms_per_step") is not None]
        if not ms:
            continue
        rec = next(r for r in cell["record"] if (r.stats or {}).get("fem_ms_per_step") is not None)
        first = rec.stats
        k = first.get("fem_top_k")
        rows.append({"task": task, "strategy": strategy, "answer_format": rec.answer_spec or "",
                     "placement": first.get("fem_placement", ""), "n_records": len(ms), "h": first.get("fem_h", 0),
                     "top_k": k if k is not None else 0, "ms_per_step_mean": sum(ms) / len(ms),
                     "ms_per_step_median": float(pd.Series(ms).median())})
    return frame(rows, COST_COLUMNS) if rows else None


register_analysis(
    Analysis(
        name="fem_cost",
        keys=("task", "strategy"),
        description=(
            "Deco-G / Ctrl-G efficiency (paper 001): the measured time of the HMM reweighting per decoding step, "
            "with the states kept (top_k, 0 = all h). Compare a pruned strategy with an unpruned one (decog vs "
            "ctrlg, or decog with --state-top-k 0) in one run; times are this machine's. answer_format is the "
            "template the FEM enforced (the first record's) and placement where it must stand: end = the last "
            "line, anywhere = the phrase only has to appear (GSM8K's default, Deco-G's key phrase \"The final "
            "answer is ...\")."
        ),
        method="none (mean and median over records)",
        bootstrap=False,
        compute=fem_cost_table,
    )
)


register_analysis(
    Analysis(
        name="fem_mass",
        keys=("task", "strategy", "step"),
        description=(
            "Deco-G / Ctrl-G hidden-state concentration (paper 001): the share of the HMM's forward mass that the "
            "top-k states keep at each decoding step, mean and minimum over the records that reached the step "
            "(1.0: nothing pruned)."
        ),
        method="none (means over records)",
        bootstrap=False,
        compute=fem_mass_table,
        figure=fem_mass_figure,
        figure_caption="Retained forward mass per step under top-k state pruning (paper 001's concentration figure).",
    )
)
