"""``formtax compare A B [C ...]``: runs side by side, as an ablation reads them (issue 49). Comparing is not
pooling (:mod:`formtax.report.combine` pools, and refuses runs whose prompts differ or that repeat a request):
here each run stays itself, whatever else differs (a budget, a prompt variant, a model setting), and every strategy
the runs share gets its difference from the first run, paired per item where the items match.

Per task and strategy, each run's item score is the item's mean strict score over its scored records (its seeds
and prompt variants); the items scored in both runs are paired. ``diff = acc_run - acc_first`` on those items, with
the report's paired interval rule (:func:`formtax.stats.rules.paired_interval`: exact below 20 items, the Wilson
boundary where no item differs, the paired percentile bootstrap elsewhere) and the report's per-item paired test
(McNemar's exact test where the scores are 0/1, a sign-flip test on the per-item differences otherwise), as
:mod:`formtax.report.comparisons` does. Each run's configuration is named by what sets it apart from
the first (:func:`config_differences`).

Items are paired by content, not by id alone (issue 60): two JSONL tasks without ``id`` fields both number their
items by line, so an id names different questions in the two runs. An item whose id both runs hold but whose
content (its ``item_hash``: id, question, gold and choices) differs is refused, as ``report A B`` refuses to pool
it, naming the item.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from formtax.errors import ConfigError
from formtax.report.matrices import CONFIDENCE
from formtax.stats.paired_test import TEST_NAME, paired_item_test
from formtax.stats.rules import paired_interval

ABLATION_COLUMNS = ["task", "strategy", "run", "first_run", "differs_in", "n_items", "acc_first", "acc_run", "diff",
                    "diff_low", "diff_high", "paired_p", "paired_test"]
IGNORED = ("batch_size", "device", "workers", "ray_address")  # how a run was executed, not what it measured


@dataclass
class Side:
    """One run of the comparison: its folder, records and configuration."""

    path: Path
    records: pd.DataFrame
    config: dict[str, Any]

    @property
    def label(self) -> str:
        return str(self.path)


def load_side(path: Path) -> Side:
    from formtax.report.load import load_records
    from formtax.report.write import read_manifest

    records = load_records(path)
    if records.empty:
        raise ConfigError(f"{path}: no records to compare")
    config = ((read_manifest(path) or {}).get("config") or {})
    return Side(Path(path), records, {k: v for k, v in config.items() if k not in IGNORED})


def config_differences(first: dict[str, Any], other: dict[str, Any]) -> str:
    """What sets ``other`` apart from ``first``: ``key=first->other`` for every differing setting."""
    keys = sorted(set(first) | set(other))
    parts = [f"{k}={first.get(k)!r}->{other.get(k)!r}" for k in keys if first.get(k) != other.get(k)]
    return "; ".join(parts) if parts else "nothing recorded"


def _item_means(cell: pd.DataFrame) -> pd.Series:
    scored = cell[cell["scored"].astype(bool) & cell["score_strict"].notna()]
    return scored.groupby("item_id")["score_strict"].mean()


def item_contents(side: Side) -> dict[tuple[str, str], str]:
    """Per (task, item id), the item's content hash as the run recorded it."""
    if "record" not in side.records.columns:
        return {}
    return {(str(r.task), str(r.item_id)): str(r.item_hash) for r in side.records["record"]}


def check_same_items(first: Side, other: Side) -> None:
    """Refuse two runs that hold the same item id with different content (module docstring)."""
    a, b = item_contents(first), item_contents(other)
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    if differ:
        task, item = differ[0]
        raise ConfigError(f"cannot compare: item {task}/{item} differs ({first.label}: item_hash {a[differ[0]][:12]}; "
                          f"{other.label}: item_hash {b[differ[0]][:12]}); {len(differ)} item(s) share an id but not "
                          "their question or gold (a JSONL task without ids numbers its lines), so they cannot be "
                          "paired")


def ablation_table(sides: list[Side], n_resamples: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """Every run after the first against the first (module docstring)."""
    if len(sides) < 2:
        raise ConfigError("compare needs at least two run directories")
    first = sides[0]
    rows: list[dict[str, Any]] = []
    for other in sides[1:]:
        check_same_items(first, other)
        differs = config_differences(first.config, other.config)
        cells = sorted(set(map(tuple, first.records[["task", "strategy"]].astype(str).to_numpy()))
                       & set(map(tuple, other.records[["task", "strategy"]].astype(str).to_numpy())))
        for task, strategy in cells:
            a = _item_means(first.records[(first.records["task"] == task) & (first.records["strategy"] == strategy)])
            b = _item_means(other.records[(other.records["task"] == task) & (other.records["strategy"] == strategy)])
            common = sorted(set(a.index) & set(b.index))
            row: dict[str, Any] = {"task": task, "strategy": strategy, "run": other.label, "first_run": first.label,
                                   "differs_in": differs, "n_items": len(common), "paired_test": TEST_NAME}
            if common:
                ma = a.loc[common].to_numpy(dtype=float).reshape(-1, 1)
                mb = b.loc[common].to_numpy(dtype=float).reshape(-1, 1)
                interval = paired_interval(mb, ma, n_resamples, seed, confidence=CONFIDENCE)
                row.update(acc_first=float(ma.mean()), acc_run=float(mb.mean()), diff=interval.estimate,
                           diff_low=interval.low, diff_high=interval.high,
                           paired_p=paired_item_test(mb, ma, seed=seed).p_value)
            else:
                row.update(acc_first=np.nan, acc_run=np.nan, diff=np.nan, diff_low=np.nan, diff_high=np.nan,
                           paired_p=np.nan)
            rows.append(row)
    if not rows:
        raise ConfigError("the runs share no task and strategy to compare")
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)


def render_table(table: pd.DataFrame) -> str:
    """The table as text: each run named by what differs, then one line per task and strategy."""
    lines = []
    for run, g in table.groupby("run", sort=False):
        lines.append(f"{run} vs {g['first_run'].iloc[0]} (differs in: {g['differs_in'].iloc[0]})")
        for r in g.itertuples(index=False):
            if r.n_items == 0:
                lines.append(f"  {r.task} / {r.strategy}: no item scored in both runs")
                continue
            lines.append(f"  {r.task} / {r.strategy}: {100 * r.acc_first:.0f}% -> {100 * r.acc_run:.0f}%, "
                         f"diff {_signed(r.diff)} [{_signed(r.diff_low)}, {_signed(r.diff_high)}] "
                         f"(paired p = {_p(r.paired_p)}, {r.n_items} items)")
    return "\n".join(lines)


def _signed(x: float) -> str:
    return "+0.00" if round(float(x), 2) == 0 else f"{float(x):+.2f}"


def _p(p: float) -> str:
    from formtax.stats.paired_test import format_p

    return "n/a" if p is None or np.isnan(p) else format_p(float(p))


def write_ablation(table: pd.DataFrame, out_dir: Path) -> Path:
    """``ablation.csv`` and ``ablation.png`` (each difference with its interval) in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "ablation.csv", index=False)
    shown = table[table["diff"].notna()].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(8.0, max(2.5, 0.4 * len(shown) + 1.2)))
    y = np.arange(len(shown))[::-1]
    err = np.vstack([shown["diff"] - shown["diff_low"], shown["diff_high"] - shown["diff"]]) if len(shown) else None
    ax.errorbar(shown["diff"], y, xerr=err, fmt="o", capsize=3)
    ax.axvline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(y, [f"{r.task} / {r.strategy}: {Path(r.run).name} - {Path(r.first_run).name}"
                      for r in shown.itertuples(index=False)])
    ax.set_xlabel("difference in strict accuracy (run - first run)")
    fig.tight_layout()
    path = out_dir / "ablation.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
