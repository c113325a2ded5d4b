"""Tables comparing strategies on the same items and runs: ``decomposition`` and ``paired``.

Both compare cells on *common cases*: the runs (seed x prompt variant) that every compared strategy has, and
the items scored in all of those runs under every compared strategy (:func:`formtax.stats.complete_cases`);
items dropped for an unscored or absent entry are counted in ``n_items_dropped``.

``decomposition`` (paper 003): per task and base strategy, the strategies at levels none (unconstrained),
fc, vc (= fc+vc) and vc with rc (= fc+vc+rc) are mapped to the levels of :func:`formtax.stats.decomposition`;
the columns ``strategy_<level>`` state the mapping. Gains come from :func:`formtax.stats.decomposition` on the
strict accuracies over common cases, and their intervals from :func:`formtax.stats.rules.contrast_intervals`
(one set of paired replicates for all gains). Rows need at least two levels.

Both tables take the report's interval rule (:mod:`formtax.stats.rules`): below 20 items the exact
Clopper-Pearson box on the discordant items (:mod:`formtax.stats.exact`; a percentile bootstrap of 3-16 items
under-covers); at the boundary (every item's difference alike) the Wilson bound on the share of items that could
differ (20 items give [-0.161, 0.161]), since every replicate is the point there; else the paired percentile
bootstrap.

``paired``: every pair of strategies within a task, oriented one way everywhere (issue 49): ``diff =
acc_strategy - acc_baseline`` (strict), where ``baseline`` is the report's baseline when the pair holds it, else
the strategy the run lists first (the records' order); the findings, the figures and the HTML read the same sign.
With the paired interval (:func:`formtax.stats.rules.paired_interval`), and the per-item
paired test (:func:`formtax.stats.paired_test.paired_item_test`: a sign-flip permutation test on per-item mean
differences over runs, McNemar's exact test when there is one run). The item is the unit: counting every
(item, run) as a pair made 2 discordant items of 10 at 5 identical greedy runs look like p = 1.6e-7.
``n_only_strategy`` / ``n_only_baseline`` count item x run pairs only that side got right;
``items_strategy_better`` / ``items_baseline_better`` count the discordant items the test uses.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd

from formtax.report.matrices import CONFIDENCE, Run, cell_items, cell_runs, drop_reasons, frame, score_matrix
from formtax.stats import (
    DEFAULT_RESAMPLING,
    Resampling,
    complete_cases,
    decomposition,
)
from formtax.stats.paired_test import TEST_NAME, paired_item_test
from formtax.stats.rules import contrast_intervals, paired_interval, paired_rule

NAN = math.nan

LEVEL_MAP: dict[tuple[str, bool], tuple[str, str]] = {
    ("none", False): ("none", "unconstrained"),
    ("fc", False): ("fc", "fc"),
    ("vc", False): ("vc", "fc+vc"),
    ("vc", True): ("vc_rc", "fc+vc+rc"),
}
"""(record level, rc) -> (column suffix, level name of :func:`formtax.stats.decomposition`)."""

SUFFIXES = ("none", "fc", "vc", "vc_rc")
GAINS = (
    ("format_gain", "fc", "none"),
    ("validity_gain", "vc", "fc"),
    ("reasoning_gain", "vc_rc", "vc"),
)

DECOMPOSITION_COLUMNS = (
    ["task", "base_strategy", "levels"]
    + [f"strategy_{s}" for s in SUFFIXES]
    + ["n_items", "n_runs", "n_items_dropped", "n_unscored", "drop_reasons"]
    + [f"acc_{s}" for s in SUFFIXES]
    + [
        f"{g}{end}"
        for g in ("format_gain", "validity_gain", "reasoning_gain", "total_gain")
        for end in ("", "_low", "_high", "_std")
    ]
    + ["confidence", "interval_method", "n_resamples", "notes"]
)

PAIRED_COLUMNS = [
    "task", "strategy", "baseline", "n_items", "n_runs", "n_pairs", "n_items_dropped", "n_unscored",
    "drop_reasons", "acc_strategy", "acc_baseline", "diff", "diff_low", "diff_high", "n_only_strategy",
    "n_only_baseline", "items_strategy_better", "items_baseline_better", "paired_p", "paired_test",
    "confidence", "interval_method", "interval_used", "n_resamples", "diff_lenient", "paired_p_lenient",
]  # fmt: skip

_ORIENTED = {"strategy_a": "strategy", "strategy_b": "baseline", "acc_a": "acc_strategy", "acc_b": "acc_baseline",
             "b10": "n_only_strategy", "b01": "n_only_baseline", "items_a_better": "items_strategy_better",
             "items_b_better": "items_baseline_better"}
"""The paired table's names for :func:`_paired_row`'s ``a`` / ``b`` fields, ``a`` being the strategy."""

PAIRED_TEST = TEST_NAME


def _common(cells: list[pd.DataFrame]) -> tuple[list[str], list[Run]]:
    """Union of the cells' items and intersection of their runs."""
    items = sorted(set().union(*(cell_items(c) for c in cells)))
    runs = sorted(set.intersection(*(set(cell_runs(c)) for c in cells)))
    return items, runs


def strict_matrices(cells: list[pd.DataFrame]) -> tuple[tuple[Any, ...], int, int]:
    """Complete-case strict score matrices of the cells, items dropped, and runs kept."""
    items, runs = _common(cells)
    if not items or not runs:
        return tuple(), len(items), len(runs)
    filtered, dropped = complete_cases(*(score_matrix(c, "score_strict", items, runs) for c in cells))
    return filtered, dropped, len(runs)


def why_dropped(cells: list[pd.DataFrame]) -> str:
    """:func:`~formtax.report.matrices.drop_reasons` for the cells compared on common cases."""
    items, runs = _common(cells)
    if not items or not runs:
        return "no run common to the compared strategies" if items else ""
    mats = [score_matrix(c, "score_strict", items, runs) for c in cells]
    keep = {i for k, i in enumerate(items) if not any(np.isnan(m[k]).any() for m in mats)}
    named = {str(c["strategy"].iloc[0]): c for c in cells if len(c)}
    return drop_reasons(named, items, runs, keep)


def _decomposition_row(
    task: str, base: str, group: pd.DataFrame, n_resamples: int, seed: int, resampling: Resampling
) -> dict[str, Any] | None:
    by_suffix: dict[str, list[str]] = {}
    for strategy, cell in group.groupby("strategy", sort=True):
        first = cell.iloc[0]
        key = (str(first["level"]), bool(first["rc"]))
        if key in LEVEL_MAP:
            by_suffix.setdefault(LEVEL_MAP[key][0], []).append(str(strategy))
    if len(by_suffix) < 2:
        return None
    notes = [
        f"level {s} has strategies {', '.join(names)}; used {names[0]}"
        for s, names in sorted(by_suffix.items())
        if len(names) > 1
    ]
    chosen = {s: by_suffix[s][0] for s in SUFFIXES if s in by_suffix}
    cells = [group[group["strategy"] == name] for name in chosen.values()]
    matrices, dropped, n_runs = strict_matrices(cells)
    row: dict[str, Any] = {"task": task, "base_strategy": base, "levels": ",".join(chosen)}
    for s in SUFFIXES:
        row[f"strategy_{s}"] = chosen.get(s, "")
    n_items = int(matrices[0].shape[0]) if matrices else 0
    row.update(
        n_items=n_items,
        n_runs=n_runs,
        n_items_dropped=dropped,
        n_unscored=int((~pd.concat(cells)["scored"]).sum()),
        drop_reasons=why_dropped(cells),
    )
    for s in SUFFIXES:
        row[f"acc_{s}"] = NAN
    for g in ("format_gain", "validity_gain", "reasoning_gain", "total_gain"):
        row[g] = row[f"{g}_low"] = row[f"{g}_high"] = row[f"{g}_std"] = NAN
    if n_items:
        mats = dict(zip(chosen, matrices, strict=True))
        acc = {s: float(m.mean()) for s, m in mats.items()}
        for s, value in acc.items():
            row[f"acc_{s}"] = value
        level_names = {LEVEL_MAP[k][0]: LEVEL_MAP[k][1] for k in LEVEL_MAP}
        gains = decomposition({level_names[s]: value for s, value in acc.items()})
        contrasts = {name: (upper, lower) for name, upper, lower in GAINS if upper in mats and lower in mats}
        top = [s for s in SUFFIXES[1:] if s in mats]
        if "none" in mats and top:
            contrasts["total_gain"] = (top[-1], "none")
        intervals = contrast_intervals(mats, contrasts, n_resamples, seed, resampling, CONFIDENCE)
        for name, interval in intervals.items():
            row[name] = gains["total" if name == "total_gain" else name]
            upper, lower = contrasts[name]
            row[f"{name}_low"], row[f"{name}_high"] = interval.low, interval.high
            # paper 003's form: the gain per run (seed x prompt variant) on the common items, its sample std
            per_run = mats[upper].mean(axis=0) - mats[lower].mean(axis=0)
            row[f"{name}_std"] = float(np.std(per_run, ddof=1)) if len(per_run) > 1 else NAN
    row.update(confidence=CONFIDENCE, interval_method=paired_rule(resampling), n_resamples=n_resamples)
    row["notes"] = "; ".join(notes)
    return row


def decomposition_table(
    df: pd.DataFrame, n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING
) -> pd.DataFrame:
    rows = []
    for (task, base), group in df.groupby(["task", "base_strategy"], sort=True):
        row = _decomposition_row(str(task), str(base), group, n_resamples, seed, resampling)
        if row is not None:
            rows.append(row)
    return frame(rows, DECOMPOSITION_COLUMNS)


def _lenient_pair(cell_a: pd.DataFrame, cell_b: pd.DataFrame, seed: int) -> dict[str, float]:
    """The same comparison under the lenient parser, on the items complete under both parsers (issue 60: where a
    strategy's strict parse rate is low, its strict difference is a format effect, and the findings put the
    lenient one beside it): ``diff_lenient`` and the same per-item paired test's ``paired_p_lenient``."""
    items, runs = _common([cell_a, cell_b])
    if not items or not runs:
        return {"diff_lenient": NAN, "paired_p_lenient": NAN}
    mats = [score_matrix(c, col, items, runs) for col in ("score_strict", "score_lenient") for c in (cell_a, cell_b)]
    kept, _ = complete_cases(*mats)
    if not kept or kept[0].shape[0] == 0:
        return {"diff_lenient": NAN, "paired_p_lenient": NAN}
    la, lb = kept[2], kept[3]
    return {"diff_lenient": float(la.mean() - lb.mean()),
            "paired_p_lenient": paired_item_test(la, lb, seed=seed).p_value}


def _paired_row(
    task: str, a: str, b: str, group: pd.DataFrame, n_resamples: int, seed: int, resampling: Resampling
) -> dict[str, Any]:
    cell_a, cell_b = group[group["strategy"] == a], group[group["strategy"] == b]
    matrices, dropped, n_runs = strict_matrices([cell_a, cell_b])
    n_items = int(matrices[0].shape[0]) if matrices else 0
    row: dict[str, Any] = {
        "task": task, "strategy_a": a, "strategy_b": b, "n_items": n_items, "n_runs": n_runs,
        "n_pairs": n_items * n_runs, "n_items_dropped": dropped,
        "n_unscored": int((~cell_a["scored"]).sum() + (~cell_b["scored"]).sum()),
        "drop_reasons": why_dropped([cell_a, cell_b]),
    }  # fmt: skip
    if n_items:
        mat_a, mat_b = matrices
        interval = paired_interval(mat_a, mat_b, n_resamples, seed, resampling, CONFIDENCE)
        test = paired_item_test(mat_a, mat_b, seed=seed)
        b01 = int(((mat_a == 0) & (mat_b == 1)).sum())
        b10 = int(((mat_a == 1) & (mat_b == 0)).sum())
        row.update(
            acc_a=float(mat_a.mean()), acc_b=float(mat_b.mean()), diff=interval.estimate,
            diff_low=interval.low, diff_high=interval.high,
            b01=b01, b10=b10, items_a_better=test.a_better, items_b_better=test.b_better,
            paired_p=test.p_value, interval_used=interval.method,
        )  # fmt: skip
        row.update(_lenient_pair(cell_a, cell_b, seed))
    else:
        row.update(
            acc_a=NAN, acc_b=NAN, diff=NAN, diff_low=NAN, diff_high=NAN, b01=NAN, b10=NAN, items_a_better=NAN,
            items_b_better=NAN, paired_p=NAN, interval_used="", diff_lenient=NAN, paired_p_lenient=NAN
        )
    row.update(
        paired_test=PAIRED_TEST, confidence=CONFIDENCE,
        interval_method=paired_rule(resampling),
        n_resamples=n_resamples,
    )  # fmt: skip
    return row


def paired_table(
    df: pd.DataFrame, n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING,
    baseline: str | None = None,
) -> pd.DataFrame:
    """Every pair of strategies per task, oriented ``strategy - baseline`` (module docstring)."""
    rows = []
    for task, group in df.groupby("task", sort=True):
        order = [str(s) for s in dict.fromkeys(group["strategy"].astype(str))]  # the run's order
        for first, second in itertools.combinations(order, 2):
            base, strategy = (second, first) if second == baseline else (first, second)
            row = _paired_row(str(task), strategy, base, group, n_resamples, seed, resampling)
            rows.append({_ORIENTED.get(k, k): v for k, v in row.items()})
    return frame(rows, PAIRED_COLUMNS)


def pair_difference(table: pd.DataFrame, a: str, b: str) -> tuple[float, float, float] | None:
    """``acc_a - acc_b`` with its interval from the paired table, whichever way the table oriented the pair;
    None when the table has no such pair."""
    rows = table[(table["strategy"] == a) & (table["baseline"] == b)]
    if not rows.empty:
        r = rows.iloc[0]
        return float(r["diff"]), float(r["diff_low"]), float(r["diff_high"])
    rows = table[(table["strategy"] == b) & (table["baseline"] == a)]
    if rows.empty:
        return None
    r = rows.iloc[0]
    return -float(r["diff"]), -float(r["diff_high"]), -float(r["diff_low"])
