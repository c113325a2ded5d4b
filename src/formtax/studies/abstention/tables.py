"""The tool-abstention study's tables and figure (paper 002), each applying only to runs with metatool records:

- ``abstention_accuracy``: paper 002 Table 1; abstention and tool-selection accuracy per language and
  condition, with the outcome counts beside them (D0, D2, wrong readable answer, refused by the ordering
  rule).
- ``abstention_contrasts``: Table 3; delta_mask, delta_length, delta_total per language and item type.
- ``abstention_transitions``: what the ``short`` output was where the constraint turned wrong into right, and
  how often it turned right into wrong.
- ``abstention_mass``: per item, the first-token masked mass under ``short`` (exact, top-20 lower bound,
  coverage) and the per-item penalty (constrained - short accuracy); the figure plots one against the other.
- ``abstention_mass_fit``: exploratory logistic fit of P(flip) on masked_mass, with the coverage summary.
- ``abstention_seeds``: whether outputs differ across seeds (at temperature 0 they should not).
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from formtax.report.matrices import CONFIDENCE, frame  # noqa: E402
from formtax.stats import logistic_fit  # noqa: E402
from formtax.stats.rules import edge_interval  # noqa: E402
from formtax.studies.abstention.frame import (
    CONDITIONS,
    CONTRASTS,
    ITEM_TYPES,
    NAN,
    TASK,
    WRONG_CATEGORIES,
    Matrix,
    aligned_cells,
    contrast_replicates,
    mean_interval,
    per_item_frame,
    percentile_bounds,
    study_frame,
    study_languages,
)
from formtax.studies.abstention.scoring import Category  # noqa: E402

ACCURACY_COLUMNS = [
    "task", "language", "strategy", "condition", "n_pairs", "n_seeds",
    "abstain_acc", "abstain_acc_low", "abstain_acc_high", "tool_acc", "tool_acc_low", "tool_acc_high",
    "pooled_acc", "pooled_acc_low", "pooled_acc_high",
    *[f"{kind}_{c}" for kind in ITEM_TYPES
      for c in ("n_scored", "n_correct", "n_D0", "n_D2", "n_wrong", "n_order", "n_unscored",
                "n_items_dropped")],
]  # fmt: skip


def accuracy_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for language in study_languages(sf):
        present = tuple(
            c for c in CONDITIONS if ((sf["language"] == language) & (sf["condition"] == c)).any()
        )
        # one basis with Table 3: the positions and seeds scored in every condition of the language and type
        aligned = {kind: aligned_cells(sf, language, kind, present) for kind in ITEM_TYPES}
        for condition in CONDITIONS:
            cell = sf[(sf["language"] == language) & (sf["condition"] == condition)]
            if cell.empty:
                continue
            row: dict[str, Any] = {
                "task": TASK,
                "language": language,
                "strategy": ",".join(sorted(set(cell["strategy"]))),
                "condition": condition,
                "n_pairs": int(cell["position"].nunique()),
                "n_seeds": int(cell["seed"].nunique()),
            }
            for kind in ITEM_TYPES:
                cells, n_dropped = aligned[kind]
                matrix = cells[condition]
                acc, low, high = mean_interval(matrix, n_resamples, seed)
                row[f"{kind}_acc"], row[f"{kind}_acc_low"], row[f"{kind}_acc_high"] = acc, low, high
                part = cell[cell["item_type"] == kind]
                scored = part[part["scored"]]
                counts = scored["category"].value_counts()
                row[f"{kind}_n_scored"] = len(scored)
                row[f"{kind}_n_correct"] = int(counts.get(str(Category.CORRECT), 0))
                for c in WRONG_CATEGORIES:
                    row[f"{kind}_n_{c}"] = int(counts.get(str(c), 0))
                row[f"{kind}_n_unscored"] = len(part) - len(scored)
                row[f"{kind}_n_items_dropped"] = n_dropped
            row["pooled_acc"], row["pooled_acc_low"], row["pooled_acc_high"] = _pooled(aligned, condition,
                                                                                       n_resamples, seed)
            rows.append(row)
    return frame(rows, ACCURACY_COLUMNS)


def _pooled(aligned: dict[str, tuple[dict[str, Matrix], int]], condition: str, n_resamples: int,
            seed: int) -> tuple[float, float, float]:
    """Accuracy over both item types of a language and condition (paper 002's pooled table, section 4.1), on
    the positions each type keeps in Table 1. Ours: the items of both types are the resampled units (a pair's
    two items are drawn independently), which is how the pooled accuracy reads them."""
    parts = [aligned[kind][0][condition] for kind in ITEM_TYPES if condition in aligned[kind][0]]
    parts = [m for m in parts if m.shape[0] and m.shape[1]]
    if not parts or len({m.shape[1] for m in parts}) != 1:
        return NAN, NAN, NAN
    return mean_interval(np.vstack(parts), n_resamples, seed)


CONTRAST_COLUMNS = [
    "task",
    "language",
    "item_type",
    "contrast",
    "minuend",
    "subtrahend",
    "estimate",
    "low",
    "high",
    "n_items",
    "n_seeds",
    "n_items_dropped",
]


def contrasts_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for language in study_languages(sf):
        present = tuple(
            c for c in CONDITIONS if ((sf["language"] == language) & (sf["condition"] == c)).any()
        )
        if len(present) < 2:
            continue
        for kind in ITEM_TYPES:
            cells, dropped = aligned_cells(sf, language, kind, present)
            shape = next(iter(cells.values())).shape
            reps = contrast_replicates(cells, n_resamples, seed) if shape[0] and shape[1] else {}
            for name, (a, b) in CONTRASTS.items():
                if a not in cells or b not in cells:
                    continue
                est = float(cells[a].mean() - cells[b].mean()) if shape[0] else NAN
                low, high = percentile_bounds(reps[name]) if name in reps else (NAN, NAN)
                edge = edge_interval(cells[a], cells[b], CONFIDENCE) if name in reps else None
                if edge is not None:  # a small study, or every position alike: the report's rule
                    low, high = edge.low, edge.high
                rows.append(
                    {
                        "task": TASK,
                        "language": language,
                        "item_type": kind,
                        "contrast": name,
                        "minuend": a,
                        "subtrahend": b,
                        "estimate": est,
                        "low": low,
                        "high": high,
                        "n_items": shape[0],
                        "n_seeds": shape[1],
                        "n_items_dropped": dropped,
                    }
                )
    return frame(rows, CONTRAST_COLUMNS) if rows else None


TRANSITION_COLUMNS = [
    "task",
    "language",
    "item_type",
    "direction",
    "short_category",
    "n",
    "share",
    "n_short_abstained",
]


def _paired_outputs(sf: pd.DataFrame, language: str, kind: str) -> pd.DataFrame:
    """short and constrained outputs of the same (position, seed), both scored."""
    base = sf[(sf["language"] == language) & (sf["item_type"] == kind) & sf["scored"]]
    short = base[base["condition"] == "short"].set_index(["position", "seed"])
    con = base[base["condition"] == "constrained"].set_index(["position", "seed"])
    return short.merge(con, how="inner", left_index=True, right_index=True, suffixes=("_short", "_con"))


def transitions_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for language in study_languages(sf):
        for kind in ITEM_TYPES:
            both = _paired_outputs(sf, language, kind)
            if both.empty:
                continue
            repaired = both[(both["correct_short"] == 0.0) & (both["correct_con"] == 1.0)]
            broken = both[(both["correct_short"] == 1.0) & (both["correct_con"] == 0.0)]
            for c in WRONG_CATEGORIES:
                part = repaired[repaired["category_short"] == str(c)]
                rows.append(
                    {
                        "task": TASK,
                        "language": language,
                        "item_type": kind,
                        "direction": "wrong_to_right",
                        "short_category": str(c),
                        "n": len(part),
                        "share": len(part) / len(repaired) if len(repaired) else NAN,
                        "n_short_abstained": int(part["abstained_short"].sum()),
                    }
                )
            rows.append(
                {
                    "task": TASK,
                    "language": language,
                    "item_type": kind,
                    "direction": "right_to_wrong",
                    "short_category": str(Category.CORRECT),
                    "n": len(broken),
                    "share": 1.0 if len(broken) else NAN,
                    "n_short_abstained": int(broken["abstained_short"].sum()),
                }
            )
    return frame(rows, TRANSITION_COLUMNS) if rows else None


MASS_COLUMNS = [
    "task",
    "item_id",
    "language",
    "item_type",
    "position",
    "n_seeds",
    "masked_mass",
    "masked_mass_topk",
    "topk_coverage",
    "n_allowed",
    "grammar_masked_mass",
    "short_acc",
    "constrained_acc",
    "penalty",
]


def mass_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    per_item = per_item_frame(sf) if sf is not None else None
    if per_item is None:
        return None
    return frame(per_item.to_dict("records"), MASS_COLUMNS)


def mass_figure(table: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    markers = {lang: m for lang, m in zip(sorted(set(table["language"])), "os^vD", strict=False)}
    colors = {"abstain": "tab:red", "tool": "tab:blue"}
    shown = table[table["penalty"].notna() & table["masked_mass"].notna()]
    rng = np.random.default_rng(0)  # vertical jitter only, so identical penalties stay visible
    for (lang, kind), part in shown.groupby(["language", "item_type"], sort=True):
        jitter = rng.uniform(-0.03, 0.03, len(part))
        ax.scatter(
            part["masked_mass"],
            part["penalty"] + jitter,
            s=14,
            alpha=0.6,
            marker=markers.get(lang, "o"),
            color=colors.get(str(kind), "grey"),
            label=f"{kind} ({lang})",
        )
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("masked_mass (short, first token, exact)")
    ax.set_ylabel("per-item penalty: constrained - short accuracy")
    if not shown.empty:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


FIT_COLUMNS = [
    "task",
    "language",
    "item_type",
    "analysis",
    "units",
    "n",
    "n_flip",
    "intercept",
    "slope",
    "slope_se",
    "slope_p",
    "status",
    "n_items",
    "masked_mass_mean",
    "masked_mass_topk_mean",
    "topk_coverage_mean",
    "topk_coverage_min",
    "bound_gap_mean",
    "bound_gap_max",
]


def fit_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    per_item = per_item_frame(sf) if sf is not None else None
    if sf is None or per_item is None:
        return None
    mass = per_item.set_index("item_id")["masked_mass"]
    rows: list[dict[str, Any]] = []
    for language in study_languages(sf):
        for kind in ITEM_TYPES:
            items = per_item[(per_item["language"] == language) & (per_item["item_type"] == kind)]
            if items.empty:
                continue
            both = _paired_outputs(sf, language, kind)
            at_risk = both[both["correct_short"] == 1.0].reset_index()
            at_risk = at_risk[at_risk["item_id_short"].map(mass).notna()]
            # At temperature 0 every seed repeats the item; counting them again would only shrink the errors.
            per = at_risk.groupby("item_id_short")["correct_con"].agg(["min", "max"])
            by_item = bool(len(per)) and bool((per["min"] == per["max"]).all())
            if by_item:
                units = at_risk.groupby("item_id_short", sort=True)["correct_con"].first().reset_index()
                x = units["item_id_short"].map(mass).to_numpy(dtype=float)
                y = (units["correct_con"] == 0.0).to_numpy(dtype=float)
            else:
                x = at_risk["item_id_short"].map(mass).to_numpy(dtype=float)
                y = (at_risk["correct_con"] == 0.0).to_numpy(dtype=float)
            fit = logistic_fit(x, y) if len(x) >= 2 else None
            gap = items["masked_mass"] - items["masked_mass_topk"]
            rows.append(
                {
                    "task": TASK,
                    "language": language,
                    "item_type": kind,
                    "analysis": "exploratory",
                    "units": "none"
                    if at_risk.empty
                    else ("items (seeds identical)" if by_item else "item x seed"),
                    "n": len(x),
                    "n_flip": int(y.sum()),
                    "intercept": fit.intercept if fit else NAN,
                    "slope": fit.slope if fit else NAN,
                    "slope_se": fit.slope_se if fit else NAN,
                    "slope_p": fit.slope_p if fit else NAN,
                    "status": fit.status if fit else "too_few",
                    "n_items": len(items),
                    "masked_mass_mean": float(items["masked_mass"].mean()),
                    "masked_mass_topk_mean": float(items["masked_mass_topk"].mean()),
                    "topk_coverage_mean": float(items["topk_coverage"].mean()),
                    "topk_coverage_min": float(items["topk_coverage"].min()),
                    "bound_gap_mean": float(gap.mean()),
                    "bound_gap_max": float(gap.max()),
                }
            )
    return frame(rows, FIT_COLUMNS) if rows else None


SEEDS_COLUMNS = [
    "task",
    "strategy",
    "condition",
    "n_items",
    "n_seeds",
    "n_items_text_differs",
    "n_items_score_differs",
    "outputs_differ_across_seeds",
]


def seeds_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for (strategy, condition), cell in sf.groupby(["strategy", "condition"], sort=True):
        n_seeds = int(cell["seed"].nunique())
        by_item = cell.groupby("item_id")
        text_differs = int((by_item["text"].nunique() > 1).sum())
        score_differs = int((by_item["correct"].nunique(dropna=False) > 1).sum())
        verdict = "n/a (one seed)" if n_seeds < 2 else ("yes" if text_differs else "no")
        rows.append(
            {
                "task": TASK,
                "strategy": strategy,
                "condition": condition,
                "n_items": len(by_item),
                "n_seeds": n_seeds,
                "n_items_text_differs": text_differs,
                "n_items_score_differs": score_differs,
                "outputs_differ_across_seeds": verdict,
            }
        )
    return frame(rows, SEEDS_COLUMNS)
