"""Score matrices (items x runs) from the flat record frame, and the shared table conventions.

A *run* is one (seed, prompt variant) pair; runs are ordered by ``(seed, prompt_variant)``. Items are ordered
by ``item_id`` (string order). Entry ``[i, j]`` of a matrix holds the record of item ``i`` in run ``j``; it is
NaN when that record is unscored (errored) or absent.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

Run = tuple[int, str]
FloatMatrix = npt.NDArray[np.float64]

DECIMALS = 6
"""Every float in every table is rounded to this many decimals, so that CSV files round-trip exactly."""

CONFIDENCE = 0.95
"""Nominal coverage of every interval in the report."""

TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "findings": ("task", "finding"),
    "summary": ("task", "strategy"),
    "accuracy": ("task", "strategy"),
    "runs": ("task", "strategy"),
    "decomposition": ("task", "base_strategy"),
    "paired": ("task", "strategy", "baseline"),
    "tokens": ("task", "strategy"),
    "timing": ("task", "strategy"),
    "outcomes": ("task", "strategy", "kind", "reason"),
}
"""The tables, in report order, with the columns that identify a row."""


def run_label(run: Run) -> str:
    return f"s{run[0]}/{run[1]}"


def cell_runs(cell: pd.DataFrame) -> list[Run]:
    """The sorted (seed, prompt_variant) runs present in ``cell`` (any record, scored or not)."""
    return sorted(
        {
            (int(seed), str(variant))
            for seed, variant in zip(cell["seed"], cell["prompt_variant"], strict=True)
        }
    )


def cell_items(cell: pd.DataFrame) -> list[str]:
    return sorted({str(item) for item in cell["item_id"]})


def score_matrix(cell: pd.DataFrame, column: str, items: list[str], runs: list[Run]) -> FloatMatrix:
    """``items x runs`` matrix of ``cell[column]``; NaN where unscored or absent.

    Records of items or runs not listed are left out (the caller chose the items and runs to compare).
    """
    out = np.full((len(items), len(runs)), np.nan, dtype=np.float64)
    item_index = {item: i for i, item in enumerate(items)}
    run_index = {run: j for j, run in enumerate(runs)}
    for item, seed, variant, value in zip(
        cell["item_id"], cell["seed"], cell["prompt_variant"], cell[column], strict=True
    ):
        i = item_index.get(str(item))
        j = run_index.get((int(seed), str(variant)))
        if i is not None and j is not None:
            out[i, j] = float(value)
    return out


def is_p_column(column: str) -> bool:
    """p-value columns (``paired_p``, ``mcnemar_p``, ``p_value``) keep significant digits, not decimals."""
    return column.endswith("_p") or column == "p_value"


def round_table(table: pd.DataFrame) -> pd.DataFrame:
    """Round every float column to :data:`DECIMALS` decimals, p-values to as many significant digits (in
    place and returned): a p of 1.6e-7 must not read 0.0."""
    for column in table.columns:
        if pd.api.types.is_float_dtype(table[column]):
            if is_p_column(str(column)):
                table[column] = table[column].map(lambda x: float(f"{x:.{DECIMALS}g}"))
            else:
                table[column] = table[column].round(DECIMALS)
    return table


def frame(rows: list[dict[str, object]], columns: list[str]) -> pd.DataFrame:
    """A table from row dicts with a fixed column order (so empty tables still have their columns)."""
    return round_table(pd.DataFrame(rows, columns=columns))


def _error_kind(error: object) -> str:
    text = str(error or "").strip()
    return (text.split(":", 1)[0].strip() or "error")[:40]


def drop_reasons(cells: dict[str, pd.DataFrame], items: list[str], runs: list[Run], kept: set[str]) -> str:
    """Why the items outside ``kept`` were dropped, per strategy: absent from one of the compared runs, or
    unscored there (by the kind of error the record holds, e.g. ``RuntimeError``). Empty when nothing was
    dropped. For example ``inwriting@vc: 2 unscored (RuntimeError 2); constrained: 1 absent``."""
    dropped = [i for i in items if i not in kept]
    if not dropped:
        return ""
    want = set(dropped)
    parts = []
    for name, cell in sorted(cells.items()):
        present: dict[str, set[Run]] = {}
        errors: dict[str, list[str]] = {}
        for item, seed, variant, scored, error in zip(cell["item_id"], cell["seed"], cell["prompt_variant"],
                                                      cell["scored"], cell["error"], strict=True):
            item = str(item)
            if item not in want:
                continue
            present.setdefault(item, set()).add((int(seed), str(variant)))
            if not bool(scored):
                errors.setdefault(item, []).append(_error_kind(error))
        absent = sum(1 for i in dropped if not set(runs) <= present.get(i, set()))
        kinds: dict[str, int] = {}
        for i in dropped:
            for kind in sorted(set(errors.get(i, []))):
                kinds[kind] = kinds.get(kind, 0) + 1
        said = []
        if errors:
            detail = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            said.append(f"{len(errors)} unscored ({detail})")
        if absent:
            said.append(f"{absent} absent")
        if said:
            parts.append(f"{name}: {', '.join(said)}")
    return "; ".join(parts) or f"{len(dropped)} incomplete in another strategy of the task"
