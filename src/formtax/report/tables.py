"""Per task x strategy tables: ``accuracy``, ``runs``, ``tokens`` and ``timing``; and :func:`compute_tables`.

Conventions shared by every table:

- An errored record (``error`` set) is *unscored*: it is left out of every number and counted in the
  ``n_unscored`` column.
- ``accuracy``: the score matrix of a cell is items x runs (run = seed x prompt variant). Items with an
  unscored or absent entry in *any* strategy of the task are dropped from every strategy of the task
  (:func:`task_basis`: one basis with the decomposition and paired tables; counted in ``n_items_dropped``),
  and the accuracy is the mean of what remains, with a 95% percentile bootstrap
  interval resampling items and runs jointly (:func:`formtax.stats.percentile_bootstrap_mean`), or the Wilson
  interval on items where every score is 0 or 1 (:func:`_interval`). The strict parse rate is computed the same
  way.
- ``runs``: per-run accuracy over that run's scored items, then mean and sample std (ddof=1) over runs
  (:func:`formtax.stats.mean_std_over_runs`), paper 003's way.
- ``tokens`` and ``timing``: means over scored records.

Every float is rounded to :data:`~formtax.report.matrices.DECIMALS` decimals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from formtax.report.comparisons import decomposition_table, paired_table
from formtax.report.findings import RunExtent
from formtax.report.load import phases_of
from formtax.report.matrices import (
    CONFIDENCE,
    TABLE_KEYS,
    Run,
    cell_items,
    cell_runs,
    drop_reasons,
    frame,
    run_label,
    score_matrix,
)
from formtax.stats import (
    DEFAULT_RESAMPLING,
    Resampling,
    complete_cases,
    mean_std_over_runs,
)
from formtax.stats.rules import MEAN_RULE, mean_interval

NAN = math.nan

ACCURACY_COLUMNS = [
    "task", "strategy", "n_items", "n_runs", "n_records", "n_scored", "n_unscored", "n_missing",
    "n_items_used", "n_items_dropped", "drop_reasons",
    "acc_strict", "acc_strict_low", "acc_strict_high",
    "acc_lenient", "acc_lenient_low", "acc_lenient_high",
    "parse_rate_strict", "parse_rate_strict_low", "parse_rate_strict_high",
    "parse_rate_format", "parse_rate_format_low", "parse_rate_format_high",
    "confidence", "interval_method", "interval_used", "resampling", "n_resamples",
]  # fmt: skip

RUNS_COLUMNS = [
    "task", "strategy", "n_runs", "n_runs_used", "n_scored", "n_unscored",
    "acc_strict_mean", "acc_strict_std", "acc_lenient_mean", "acc_lenient_std",
    "acc_strict_min", "acc_strict_max", "std_ddof", "runs",
]  # fmt: skip

TIMING_COLUMNS = [
    "task", "strategy", "n_scored", "n_unscored", "n_timed",
    "wall_s_mean", "wall_s_median", "wall_s_total", "batch_wall_s_mean",
    "share_s_mean", "tokens_per_s", "cpu_s_mean", "cpu_per_wall",
]  # fmt: skip
"""``share_s``: a request's share of its batch's wall time (batch wall / batch size), the machine time it cost;
``tokens_per_s``: generated tokens over the summed shares (the cell's throughput); ``cpu_s``: its share of the
batch's process CPU time; ``cpu_per_wall``: CPU over wall seconds (about the cores in use: far below the core count
on a machine busy with other work, or while waiting on a server)."""


def _cells(df: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """``(task, strategy, records)`` for every cell, sorted by task then strategy."""
    return [
        (str(task), str(strategy), cell)
        for (task, strategy), cell in df.groupby(["task", "strategy"], sort=True)
    ]


def _interval(
    matrix: np.ndarray, n_resamples: int, seed: int, resampling: Resampling, used: list[str] | None = None
) -> tuple[float, float, float]:
    """The mean's interval by the report's rule (:func:`formtax.stats.rules.mean_interval`: exact below 20 items,
    Wilson at 0 and 1, the percentile bootstrap elsewhere); the method it took is appended to ``used``."""
    if matrix.shape[0] == 0:
        return NAN, NAN, NAN
    result = mean_interval(matrix, n_resamples, seed, resampling, CONFIDENCE)
    if used is not None and result.method not in used:
        used.append(result.method)
    return result.estimate, result.low, result.high


def _complete_items(cell: pd.DataFrame) -> set[str]:
    """Items of a cell scored in every one of its runs."""
    items, runs = cell_items(cell), cell_runs(cell)
    m = score_matrix(cell, "score_strict", items, runs)
    return {item for item, row in zip(items, m, strict=True) if not np.isnan(row).any()}


def task_basis(df: pd.DataFrame) -> dict[str, set[str]]:
    """Per task, the items scored in every run of every strategy: the one item set that the accuracy table, the
    decomposition and the paired comparisons all stand on, so that acc_fc - acc_none from the accuracy table is
    the decomposition's format gain (issue 14: one basis under missing data). A strategy with no complete item
    at all (every request crashed) reports NaN and does not veto the others' items."""
    basis: dict[str, set[str]] = {}
    for task, _, cell in _cells(df):
        done = _complete_items(cell)
        if not done:
            basis.setdefault(task, set(cell_items(cell)))
            continue
        basis[task] = basis[task] & done if task in basis else done
    return basis


def _why(df: pd.DataFrame, task: str, present: list[str], runs: list[Run], kept: set[str]) -> str:
    """Why this cell's items outside the task's basis were dropped, naming the strategies that lack them."""
    cells = {strategy: cell for t, strategy, cell in _cells(df) if t == task}
    return drop_reasons(cells, present, runs, kept & set(present))


def accuracy_table(
    df: pd.DataFrame, n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING
) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    basis = task_basis(df)
    for task, strategy, cell in _cells(df):
        runs = cell_runs(cell)
        present = cell_items(cell)
        items = [i for i in present if i in basis[task]]  # the task's one basis (task_basis)
        matrices = [
            score_matrix(cell, col, items, runs)
            for col in ("score_strict", "score_lenient", "parse_ok_strict", "format_ok")
        ]
        if items:
            (strict, lenient, parse_ok, format_ok), n_dropped = complete_cases(*matrices)
        else:
            strict = lenient = parse_ok = format_ok = np.zeros((0, len(runs)))
            n_dropped = 0
        n_dropped += len(present) - len(items)  # unscored or missing here or in another strategy of the task
        n_scored = int(cell["scored"].sum())
        row: dict[str, Any] = {
            "task": task,
            "strategy": strategy,
            "n_items": len(present),
            "n_runs": len(runs),
            "n_records": len(cell),
            "n_scored": n_scored,
            "n_unscored": len(cell) - n_scored,
            "n_missing": len(present) * len(runs) - len(cell),
            "n_items_used": int(strict.shape[0]),
            "n_items_dropped": n_dropped,
            "drop_reasons": _why(df, task, present, runs, basis[task]) if n_dropped else "",
        }
        used: list[str] = []  # the methods this row's intervals took (issue 60: footers name what was used)
        for name, matrix in (
            ("acc_strict", strict),
            ("acc_lenient", lenient),
            ("parse_rate_strict", parse_ok),
            ("parse_rate_format", format_ok),  # paper 003's parse rate: the format's shape (report/load.format_ok)
        ):
            row[name], row[f"{name}_low"], row[f"{name}_high"] = _interval(
                matrix, n_resamples, seed, resampling, used
            )
        row.update(
            confidence=CONFIDENCE,
            interval_method=MEAN_RULE,
            interval_used="; ".join(used),
            resampling=Resampling(resampling).value,
            n_resamples=n_resamples,
        )
        rows.append(row)
    return frame(rows, ACCURACY_COLUMNS)


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for task, strategy, cell in _cells(df):
        runs = cell_runs(cell)
        scored = cell[cell["scored"]]
        per_run: dict[str, dict[tuple[int, str], float]] = {"strict": {}, "lenient": {}}
        for (seed, variant), group in scored.groupby(["seed", "prompt_variant"], sort=True):
            for parser in per_run:
                per_run[parser][(int(seed), str(variant))] = float(group[f"score_{parser}"].mean())
        row: dict[str, Any] = {
            "task": task,
            "strategy": strategy,
            "n_runs": len(runs),
            "n_runs_used": len(per_run["strict"]),
            "n_scored": len(scored),
            "n_unscored": len(cell) - len(scored),
        }
        for parser, by_run in per_run.items():
            mean, std = mean_std_over_runs(by_run) if by_run else (NAN, NAN)
            row[f"acc_{parser}_mean"], row[f"acc_{parser}_std"] = mean, std
        strict_values = list(per_run["strict"].values())
        row["acc_strict_min"] = min(strict_values) if strict_values else NAN
        row["acc_strict_max"] = max(strict_values) if strict_values else NAN
        row["std_ddof"] = 1
        row["runs"] = ";".join(run_label(run) for run in runs)
        rows.append(row)
    return frame(rows, RUNS_COLUMNS)


def tokens_table(df: pd.DataFrame) -> pd.DataFrame:
    """Mean token counts per cell, and what closing mode changed: ``n_closing`` records decoded with it,
    ``n_closing_changed`` of them where it changed at least one token (the budget bound the answer), and the mean
    number of changed tokens over the ``n_closing`` records (NaN where closing was off)."""
    phases = phases_of(df)
    means = ["tokens_prompt", "tokens_total", "tokens_forced"] + [f"tokens_{phase}" for phase in phases]
    columns = (["task", "strategy", "n_scored", "n_unscored", "n_counted"] + [f"{name}_mean" for name in means]
               + ["n_closing", "n_closing_changed", "closing_changed_tokens_mean"])
    rows: list[dict[str, Any]] = []
    for task, strategy, cell in _cells(df):
        scored = cell[cell["scored"]]
        row: dict[str, Any] = {
            "task": task,
            "strategy": strategy,
            "n_scored": len(scored),
            "n_unscored": len(cell) - len(scored),
            "n_counted": int(scored["tokens_total"].notna().sum()),
        }
        for name in means:
            values = scored[name].dropna()
            row[f"{name}_mean"] = float(values.mean()) if len(values) else NAN
        changed = cell["closing_changed_tokens"].dropna()  # every record: closing acts on errored ones too
        row["n_closing"] = len(changed)
        row["n_closing_changed"] = int((changed > 0).sum())
        row["closing_changed_tokens_mean"] = float(changed.mean()) if len(changed) else NAN
        rows.append(row)
    return frame(rows, columns)


def timing_table(df: pd.DataFrame) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for task, strategy, cell in _cells(df):
        scored = cell[cell["scored"]]
        wall = scored["wall_s"].dropna()
        batch = scored["batch_wall_s"].dropna()
        share = (scored["batch_wall_s"] / scored["batch_size"]).dropna()
        cpu = (scored["batch_cpu_s"] / scored["batch_size"]).dropna()
        tokens = scored.loc[share.index, "tokens_total"].dropna()
        share_sum = float(share.loc[tokens.index].sum())
        cpu_wall = float((scored["batch_wall_s"] / scored["batch_size"]).loc[cpu.index].sum())
        rows.append(
            {
                "task": task,
                "strategy": strategy,
                "n_scored": len(scored),
                "n_unscored": len(cell) - len(scored),
                "n_timed": len(wall),
                "wall_s_mean": float(wall.mean()) if len(wall) else NAN,
                "wall_s_median": float(wall.median()) if len(wall) else NAN,
                "wall_s_total": float(wall.sum()),
                "batch_wall_s_mean": float(batch.mean()) if len(batch) else NAN,
                "share_s_mean": float(share.mean()) if len(share) else NAN,
                "tokens_per_s": float(tokens.sum()) / share_sum if share_sum > 0 else NAN,
                "cpu_s_mean": float(cpu.mean()) if len(cpu) else NAN,
                "cpu_per_wall": float(cpu.sum()) / cpu_wall if len(cpu) and cpu_wall > 0 else NAN,
            }
        )
    return frame(rows, TIMING_COLUMNS)


SUMMARY_COLUMNS = [
    "task", "strategy", "acc_strict", "acc_strict_low", "acc_strict_high", "parse_rate_strict", "parse_rate_format",
    "tokens_total_mean",
]  # fmt: skip
"""At most eight: the headline a reader compares; the rest is in the accuracy, tokens and timing tables."""


def summary_table(df: pd.DataFrame, accuracy: pd.DataFrame, tokens: pd.DataFrame,
                  timing: pd.DataFrame) -> pd.DataFrame:
    """The report's headline, one row per task x strategy: strict accuracy with its interval, parse rate, mean
    tokens and throughput, read from the accuracy, tokens and timing tables (no number of its own)."""
    keyed = {name: t.set_index(["task", "strategy"]) for name, t in
             (("accuracy", accuracy), ("tokens", tokens), ("timing", timing))}
    rows: list[dict[str, Any]] = []
    for task, strategy, _cell in _cells(df):
        row: dict[str, Any] = {"task": task, "strategy": strategy}
        for name, columns in (("accuracy", ["acc_strict", "acc_strict_low", "acc_strict_high", "parse_rate_strict",
                                            "parse_rate_format"]),
                              ("tokens", ["tokens_total_mean"])):
            source = keyed[name]
            for column in columns:
                row[column] = source.at[(task, strategy), column] if (task, strategy) in source.index else NAN
        rows.append(row)
    return frame(rows, SUMMARY_COLUMNS)


OUTCOMES_COLUMNS = ["task", "strategy", "kind", "reason", "n", "share"]


def outcomes_table(df: pd.DataFrame) -> pd.DataFrame:
    """How each strategy's requests ended (issue 49): per task and strategy, the count and share of each finish
    reason (``length`` where the budget cut the output) and, for InWriting, of each switch reason (``eos``: the
    model wanted to stop; ``trigger``; ``budget``: the budget forced the switch, whatever the model wanted). Over
    every record, errored ones included (their finish reason says why)."""
    rows: list[dict[str, Any]] = []
    for (task, strategy), g in df.groupby(["task", "strategy"], sort=True):
        for kind, column in (("finish", "finish_reason"), ("switch", "switch_reason")):
            values = g[column].dropna().astype(str) if column in g.columns else pd.Series(dtype=str)
            for reason, n in sorted(values.value_counts().items()):
                rows.append({"task": task, "strategy": strategy, "kind": kind, "reason": reason, "n": int(n),
                             "share": round(int(n) / len(values), 6)})
    return frame(rows, OUTCOMES_COLUMNS)


def compute_tables(
    df: pd.DataFrame, n_resamples: int = 10_000, seed: int = 0, resampling: Resampling = DEFAULT_RESAMPLING,
    baseline: str | None = None, extent: RunExtent | None = None, p_adjust: str = "holm",
) -> dict[str, pd.DataFrame]:
    """Every report table from a frame of :func:`~formtax.report.load_records`, keyed by CSV file stem.
    ``baseline``: the strategy the findings compare against (:mod:`formtax.report.findings`); ``extent``: what
    the run planned (its manifest), so that an incomplete run's findings open with a warning.

    Deterministic given ``seed``: each bootstrap uses ``seed`` for its own generator. ``resampling``
    applies to the accuracy, decomposition and paired intervals; the paper-specific analyses (abstention,
    EAE) keep their paper's rule (:data:`formtax.stats.DEFAULT_RESAMPLING`).
    """
    from formtax.report.findings import budget_table, findings_table, recorded_counts

    accuracy, tokens, timing = accuracy_table(df, n_resamples, seed, resampling), tokens_table(df), timing_table(df)
    paired = paired_table(df, n_resamples, seed, resampling, baseline)
    decomposition = decomposition_table(df, n_resamples, seed, resampling)
    tables = {
        "findings": findings_table(accuracy, paired, baseline, extent, decomposition, recorded_counts(df), p_adjust,
                                   budget_table(df)),
        "summary": summary_table(df, accuracy, tokens, timing),
        "accuracy": accuracy,
        "runs": runs_table(df),
        "decomposition": decomposition,
        "paired": paired,
        "tokens": tokens,
        "timing": timing,
        "outcomes": outcomes_table(df),
    }
    assert list(tables) == list(TABLE_KEYS)
    from formtax.report.catalog import extra_tables

    tables.update(extra_tables(df, n_resamples, seed))
    return tables
