"""The report's findings: plain sentences generated from the tables, each number with its interval or test, so a
reader meets the result before the machinery. They are a table like the others (``tables/findings.csv``, one
row per task and finding), recomputed and compared by ``formtax verify``, which also checks that report.md prints
exactly these sentences.

Comparisons are against one baseline strategy (``formtax report --baseline``; default: the run's first
strategy), oriented ``strategy - baseline``; every pair stays in ``tables/paired.csv``. A difference is called
distinguishable from 0 only when its 95% paired interval excludes 0 *and* the exact paired test rejects at the same
level (p < 0.05); where the two disagree the sentence names the difference and says which one does not reject
(at 3 items a bootstrap interval can exclude 0 beside an exact p of 1: issue 49).

A run that did not record all it planned (interrupted, failed, or still running) opens its findings with a warning:
how many requests of how many, the strategies with no records and those with fewer than their share
(:func:`incomplete_sentence`); ``formtax verify`` prints it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

FINDINGS_COLUMNS = ["task", "finding", "sentence"]


def _pct(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _rate(name: str, value: float, low: float, high: float) -> str:
    if isinstance(low, float) and not math.isnan(low):
        return f"{name} {_pct(value)} [{100 * low:.0f}, {100 * high:.0f}]"
    return f"{name} {_pct(value)}"


def _num(x: float) -> str:
    return "n/a" if math.isnan(x) else ("+0.00" if round(x, 2) == 0 else f"{x:+.2f}")


def _dec(x: float) -> str:
    """Two decimals, never ``-0.00``."""
    return "0.00" if round(float(x), 2) == 0 else f"{float(x):.2f}"


def _p(p: Any) -> str:
    from formtax.stats.paired_test import format_p

    return "n/a" if p is None or (isinstance(p, float) and math.isnan(p)) else format_p(float(p))


def baseline_rows(paired: pd.DataFrame, task: str, baseline: str) -> pd.DataFrame:
    """The task's paired comparisons with ``baseline``, oriented ``strategy - baseline``: columns strategy,
    baseline, diff, diff_low, diff_high, paired_p, n_pairs (sorted by strategy)."""
    rows: list[dict[str, Any]] = []
    for r in paired[paired["task"] == task].itertuples(index=False):
        a, b = str(r.strategy), str(r.baseline)
        if baseline not in (a, b) or a == b:
            continue
        flip = a == baseline
        lenient = float(getattr(r, "diff_lenient", math.nan))
        rows.append({"task": task, "strategy": b if flip else a, "baseline": baseline,
                     "diff": -r.diff if flip else r.diff,
                     "diff_low": -r.diff_high if flip else r.diff_low,
                     "diff_high": -r.diff_low if flip else r.diff_high,
                     "paired_p": r.paired_p, "n_pairs": r.n_pairs,
                     "diff_lenient": -lenient if flip else lenient,
                     "paired_p_lenient": float(getattr(r, "paired_p_lenient", math.nan))})
    columns = ["task", "strategy", "baseline", "diff", "diff_low", "diff_high", "paired_p", "n_pairs",
               "diff_lenient", "paired_p_lenient"]
    return pd.DataFrame(rows, columns=columns).sort_values("strategy", kind="stable").reset_index(drop=True)


def resolve_baseline(df: pd.DataFrame, wanted: str | None, manifest: dict[str, Any] | None) -> str | None:
    """The baseline strategy: ``wanted`` when given (it must be a strategy of the run, as recorded or as
    ``--strategies`` spelled it), else the run's first strategy (its ``--strategies`` order), else the first
    strategy in the records."""
    from formtax.errors import ConfigError
    from formtax.runner.grid import as_listed

    present = [str(s) for s in dict.fromkeys(df["strategy"].astype(str))] if "strategy" in df.columns else []

    def recorded(name: str) -> str | None:  # a prompt plan may have given the listed spec a form
        return name if name in present else next((p for p in present if as_listed(p) == name), None)

    if wanted is not None:
        found = recorded(wanted)
        if found is None:
            raise ConfigError(f"--baseline {wanted!r} is not a strategy of this run ({', '.join(present)})")
        return found
    listed = ((manifest or {}).get("config") or {}).get("strategies") or []
    for s in listed:
        found = recorded(str(s).strip())
        if found is not None:
            return found
    return present[0] if present else None


@dataclass(frozen=True)
class RunExtent:
    """What a run set out to record, from its manifest: its status, the requests it planned and its strategies as
    ``--strategies`` listed them. ``planned`` is the union of every session's grid (a run only grows, so it is the
    last session's whole grid), ``planned_by`` the same per strategy (as recorded) and seed; manifests written
    before sessions recorded their grid give the first session's pending count and no ``planned_by``."""

    status: str
    planned: int
    strategies: tuple[str, ...]
    planned_by: dict[str, dict[int, int]] | None = None


def run_extent(manifest: dict[str, Any] | None) -> RunExtent | None:
    """The :class:`RunExtent` of a run directory's manifest (None where it records no session: a pooled or a
    hand-made directory, whose extent nobody planned)."""
    sessions = (manifest or {}).get("resumptions") or []
    if not sessions:
        return None
    listed = tuple(str(s).strip() for s in ((manifest or {}).get("config") or {}).get("strategies") or [])
    status = str((manifest or {}).get("status", ""))
    with_grid = [s for s in sessions if s.get("planned") is not None]
    if not with_grid:
        return RunExtent(status, int(sessions[0]["pending"]), listed)
    last = with_grid[-1]
    by = {str(k): {int(seed): int(n) for seed, n in v.items()} for k, v in (last.get("planned_by") or {}).items()}
    return RunExtent(status, int(last["planned"]), listed, by or None)


def recorded_counts(df: pd.DataFrame) -> dict[tuple[str, int], int]:
    """Records per (strategy, seed) of a frame of :func:`~formtax.report.load_records`."""
    if df.empty:
        return {}
    return {(str(k[0]), int(k[1])): int(n) for k, n in df.groupby(["strategy", "seed"]).size().items()}


def incomplete_sentence(accuracy: pd.DataFrame, extent: RunExtent | None,
                        recorded: dict[tuple[str, int], int] | None = None) -> str | None:
    """The warning that opens the findings of a run that did not record all it planned (issue 49): how many
    requests of how many, the strategies with no records and those with fewer than their share, naming the seeds
    they lack (issue 60: counted against the union of every session's grid, so a run that grew and was then
    interrupted says "26 of 32"); None when the run is complete."""
    if extent is None:
        return None
    from formtax.runner.grid import as_listed

    counts = {str(r.strategy): int(r.n_records) for r in accuracy.itertuples(index=False)}
    recorded_n = sum(counts.values())
    if recorded_n >= extent.planned and extent.status in ("", "complete"):
        return None
    missing: list[str] = []
    partial: list[str] = []
    if extent.planned_by is not None:
        got = recorded or {}
        for name, by_seed in extent.planned_by.items():
            n, want = sum(got.get((name, seed), 0) for seed in by_seed), sum(by_seed.values())
            if n == 0:
                missing.append(name)
            elif n < want:
                short = [f"seed {seed}: {got.get((name, seed), 0)} of {k}" for seed, k in sorted(by_seed.items())
                         if got.get((name, seed), 0) < k]
                seeds = f"; {', '.join(short)}" if len(by_seed) > 1 else ""
                partial.append(f"{name} ({n} of {want}{seeds})")
    else:
        share = extent.planned // max(1, len(extent.strategies)) if extent.strategies else 0
        by_listed = {s: sum(n for name, n in counts.items() if name == s or as_listed(name) == s)
                     for s in extent.strategies}
        missing = [s for s, n in by_listed.items() if n == 0]
        partial = [f"{s} ({n} of {share})" for s, n in by_listed.items() if 0 < n < share]
    parts = [f"no records for {', '.join(missing)}"] if missing else []
    parts += [f"partial: {'; '.join(partial)}"] if partial else []
    detail = f"; {'; '.join(parts)}" if parts else ""
    return (f"Incomplete run (status {extent.status or 'unknown'}): {recorded_n} of {extent.planned} requests "
            f"recorded{detail}. The findings below describe only what was recorded.")


def gains_sentence(rows: pd.DataFrame) -> str | None:
    """Paper 003's decomposition as it reports it (issue 49): per base strategy with levels, each gain the plan
    measures as ``mean +- std`` over runs (seed x prompt variant; std n/a at one run) with its 95% paired interval;
    None when the task's plan has no levels."""
    parts = []
    any_std = False
    for r in rows.itertuples(index=False):
        gains = []
        for name, label in (("format_gain", "format"), ("validity_gain", "validity"), ("reasoning_gain", "reasoning"),
                            ("total_gain", "total")):
            value = getattr(r, name)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            std = getattr(r, f"{name}_std")
            spread = "" if std is None or (isinstance(std, float) and math.isnan(std)) else f" +- {_dec(std)}"
            any_std = any_std or bool(spread)
            gains.append(f"{label} {_num(value)}{spread} [{_dec(getattr(r, f'{name}_low'))}, "
                         f"{_dec(getattr(r, f'{name}_high'))}]")
        if gains:
            parts.append(f"{r.base_strategy}: {', '.join(gains)}")
    if not parts:
        return None
    how = "mean +- std over runs" if any_std else "one run, no spread over runs"  # issue 60: no "+- std" at one run
    return f"Paper 003's gains (strict accuracy, {how}, 95% paired intervals): " + "; ".join(parts) + "."


def findings_table(accuracy: pd.DataFrame, paired: pd.DataFrame, baseline: str | None,
                   extent: RunExtent | None = None, decomposition: pd.DataFrame | None = None,
                   recorded: dict[tuple[str, int], int] | None = None, p_adjust: str = "holm",
                   budgets: pd.DataFrame | None = None) -> pd.DataFrame:
    """The findings of every task (module docstring); an incomplete run's open with :func:`incomplete_sentence`;
    a plan with constraint levels adds paper 003's gains (:func:`gains_sentence`). ``p_adjust``: the multiple
    comparison adjustment of the baseline comparisons (:data:`P_ADJUST`); ``budgets``: each strategy's reasoning
    budget and share of forced answers (:func:`budget_table`), stated when they differ."""
    rows: list[dict[str, Any]] = []
    warning = incomplete_sentence(accuracy, extent, recorded)
    if warning is not None:
        tasks = sorted(accuracy["task"].astype(str).unique())
        rows.append({"task": tasks[0] if tasks else "", "finding": "incomplete", "sentence": warning})
    for task in sorted(accuracy["task"].astype(str).unique()):
        acc = accuracy[accuracy["task"] == task]
        by_parse = acc.sort_values(["parse_rate_strict", "strategy"], ascending=[False, True], kind="stable")
        rates = ", ".join(_rate(str(r.strategy), r.parse_rate_strict, r.parse_rate_strict_low,
                                r.parse_rate_strict_high) for r in by_parse.itertuples(index=False))
        rows.append({"task": task, "finding": "parse",
                     "sentence": f"Strict parse rate ({extent_words(acc)}, 95% intervals): {rates}."})
        fmt = acc[acc["parse_rate_format"].notna()].sort_values(["parse_rate_format", "strategy"],
                                                                ascending=[False, True], kind="stable")
        if len(fmt):
            listed = ", ".join(_rate(str(r.strategy), r.parse_rate_format, r.parse_rate_format_low,
                                     r.parse_rate_format_high) for r in fmt.itertuples(index=False))
            rows.append({"task": task, "finding": "parse_format",
                         "sentence": "Format-level parse rate (paper 003's: the requested shape, whatever the "
                                     f"answer's spelling): {listed}."})
        by_acc = acc.sort_values(["acc_strict", "strategy"], ascending=[False, True], kind="stable")
        if len(by_acc) > 1 and by_acc["acc_strict"].nunique(dropna=False) == 1:  # every strategy ties
            value = by_acc.iloc[0].acc_strict
            names = ", ".join(str(r.strategy) for r in by_acc.itertuples(index=False))
            rows.append({"task": task, "finding": "accuracy", "sentence": (
                f"Strict accuracy is the same for every strategy: {_pct(value)} ({names}).")})
        elif len(by_acc) == 1:  # one strategy: no range
            only = by_acc.iloc[0]
            rows.append({"task": task, "finding": "accuracy", "sentence": (
                f"Strict accuracy: {_rate(str(only.strategy), only.acc_strict, only.acc_strict_low, only.acc_strict_high)}.")})
        elif len(by_acc):
            best, worst = by_acc.iloc[0], by_acc.iloc[-1]
            rows.append({"task": task, "finding": "accuracy", "sentence": (
                "Strict accuracy ranges from "
                f"{_rate(str(worst.strategy), worst.acc_strict, worst.acc_strict_low, worst.acc_strict_high)} to "
                f"{_rate(str(best.strategy), best.acc_strict, best.acc_strict_low, best.acc_strict_high)}.")})
        against = (baseline_rows(paired, task, baseline)
                   if baseline is not None and baseline in set(acc["strategy"].astype(str)) else None)
        if against is not None and baseline is not None:
            rows.append({"task": task, "finding": "baseline", "sentence": _against(against, baseline, p_adjust)})
        note = scope_sentence(task, acc)
        if note is not None:
            rows.append({"task": task, "finding": "scope", "sentence": note})
        low = low_parse_sentence(acc, against, baseline)
        if low is not None:
            rows.append({"task": task, "finding": "low_parse", "sentence": low})
        if budgets is not None and len(budgets):
            said = budget_sentence(budgets[budgets["task"].astype(str) == task])
            if said is not None:
                rows.append({"task": task, "finding": "budgets", "sentence": said})
        if decomposition is not None and len(decomposition):
            gains = gains_sentence(decomposition[decomposition["task"].astype(str) == task])
            if gains is not None:
                rows.append({"task": task, "finding": "gains", "sentence": gains})
    return pd.DataFrame(rows, columns=FINDINGS_COLUMNS)


def extent_words(acc: pd.DataFrame) -> str:
    """What the task's rates stand on, as scored (issue 60): ``8 items x 4 runs``; where strategies were scored
    over different numbers of runs (a seed missing for some), each strategy's count: ``8 items x 3-4 runs (free
    4, constrained 3)``."""
    n = int(acc["n_items_used"].max()) if len(acc) else 0
    runs = {str(r.strategy): int(r.n_runs) for r in acc.itertuples(index=False)}
    lo, hi = (min(runs.values()), max(runs.values())) if runs else (0, 0)
    if lo == hi:
        return f"{n} items x {hi} {'run' if hi == 1 else 'runs'}"
    each = ", ".join(f"{s} {k}" for s, k in runs.items())
    return f"{n} items x {lo}-{hi} runs ({each})"


ALPHA = 0.05
"""The level of the paired interval (95%) and of the paired test that must both reject."""


P_ADJUST = ("holm", "bonferroni", "none")
"""Multiple-comparison adjustments of a task's baseline comparisons (``formtax report --p-adjust``): Holm's
step-down (the default; it controls the family-wise error rate at no loss against Bonferroni) via statsmodels'
``multipletests``, Bonferroni, or none."""
PARSE_FLOOR = 0.5
"""A strict parse rate below this flags a strategy: its strict accuracy difference is a format effect."""


def adjust_p(p_values: list[float], method: str) -> list[float]:
    """``p_values`` adjusted by ``method`` over the family they form (NaN stays NaN and is not counted)."""
    if method not in P_ADJUST:
        from formtax.errors import ConfigError

        raise ConfigError(f"--p-adjust must be one of {', '.join(P_ADJUST)}, got {method!r}")
    out = [math.nan] * len(p_values)
    index = [k for k, p in enumerate(p_values) if not math.isnan(float(p))]
    if method == "none" or not index:
        return [float(p) for p in p_values]
    from statsmodels.stats.multitest import multipletests

    adjusted = multipletests([float(p_values[k]) for k in index], alpha=ALPHA, method=method)[1]
    for k, value in zip(index, adjusted, strict=True):
        out[k] = float(value)
    return out


def _against(rows: pd.DataFrame, baseline: str, p_adjust: str = "holm") -> str:
    rows = rows[rows["diff"].notna()].copy()
    if rows.empty:
        return f"Accuracy against the baseline {baseline}: no strategy shares enough scored items to compare."
    rows["p_adj"] = adjust_p([float(p) for p in rows["paired_p"]], p_adjust)
    family = int(rows["paired_p"].notna().sum())
    adjusted = p_adjust != "none" and family > 1
    label = p_adjust.capitalize()

    def p_text(r: Any) -> str:
        raw = f"paired p = {_p(r.paired_p)}"
        return f"{raw}, {label}-adjusted p = {_p(r.p_adj)}" if adjusted else raw

    excludes = (rows["diff_low"] > 0) | (rows["diff_high"] < 0)
    rejects = rows["p_adj"].notna() & (rows["p_adj"].astype(float) < ALPHA)
    apart, split = rows[excludes & rejects], rows[excludes ^ rejects]
    same = rows[~excludes & ~rejects]
    test = f"the paired test ({label}-adjusted over {family} comparisons)" if adjusted else "the paired test"
    parts = [f"{r.strategy} {_num(r.diff)} [{_dec(r.diff_low)}, {_dec(r.diff_high)}] ({p_text(r)})"
             for r in apart.itertuples(index=False)]
    parts += [f"{r.strategy} {_num(r.diff)} [{_dec(r.diff_low)}, {_dec(r.diff_high)}] is not called distinguishable: "
              + (f"the interval excludes 0 but {test} does not reject" if lo_hi_excl else
                 f"{test} rejects but the interval includes 0") + f" ({p_text(r)})"
              for r, lo_hi_excl in zip(split.itertuples(index=False), excludes[split.index], strict=True)]
    head = f"Accuracy against the baseline {baseline}"
    if same.empty:
        return f"{head}: {'; '.join(parts)}."
    top = same.loc[same["diff"].abs().idxmax()]
    top_p = f"paired p = {_p(top['paired_p'])}" + (f", {label}-adjusted p = {_p(top['p_adj'])}" if adjusted else "")
    rest = f"largest difference {_num(top['diff'])} for {top['strategy']}, [{_dec(top['diff_low'])}, " \
           f"{_dec(top['diff_high'])}], {top_p}"
    if not parts:
        return f"{head}: no difference is distinguishable from 0 ({rest})."
    others = "the other one is" if len(same) == 1 else f"the other {len(same)} are"
    return f"{head}: {'; '.join(parts)}; {others} not distinguishable from 0 ({rest})."


def scope_sentence(task: str, acc: pd.DataFrame) -> str | None:
    """What a reader must know about the numbers' basis (issue 60): the task's evaluated set where it is not the
    whole benchmark (:attr:`Task.evaluated_set`), and, below 20 items with several runs, that the exact intervals
    are conservative (a per-item mean over runs varies less than one Bernoulli draw: docs/calibration.md)."""
    from formtax.errors import ConfigError
    from formtax.stats.exact import SMALL_ITEMS
    from formtax.tasks import get_task

    parts = []
    try:
        scope = get_task(task).evaluated_set
    except ConfigError:  # a pooled label (TASK | MODEL) or a task module not imported here
        scope = ""
    if scope:
        parts.append(scope)
    n = int(acc["n_items_used"].max()) if len(acc) else 0
    runs = int(acc["n_runs"].max()) if len(acc) else 0
    if 0 < n < SMALL_ITEMS and runs > 1:
        parts.append(f"with {runs} runs per item and fewer than {SMALL_ITEMS} items the exact intervals are "
                     "conservative (a per-item mean over runs varies less than one Bernoulli draw), so an interval "
                     "can include 0 where the exact paired test rejects (docs/calibration.md)")
    if not parts:
        return None
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def low_parse_sentence(acc: pd.DataFrame, against: pd.DataFrame | None, baseline: str | None) -> str | None:
    """The flag a reviewer would raise (issue 60): strategies whose strict parse rate is below
    :data:`PARSE_FLOOR`, so that a strict accuracy difference involving them measures the format, not the
    answers; beside it the lenient paired comparisons with the baseline. None when every rate is at the floor or
    above."""
    low = acc[acc["parse_rate_strict"].notna() & (acc["parse_rate_strict"] < PARSE_FLOOR)]
    if low.empty:
        return None
    names = ", ".join(f"{r.strategy} {_pct(r.parse_rate_strict)}" for r in low.itertuples(index=False))
    sentence = (f"Strict parse rate below {_pct(PARSE_FLOOR)}: {names}. A strict accuracy difference involving "
                "these is a format effect (their answers are not read), not a difference in what they answer")
    flagged = {str(s) for s in low["strategy"]}
    if against is not None and baseline is not None:
        rows = against[against["diff_lenient"].notna()
                       & (against["strategy"].astype(str).isin(flagged) | (baseline in flagged))]
        if len(rows):
            listed = "; ".join(f"{r.strategy} {_num(r.diff_lenient)} (paired p = {_p(r.paired_p_lenient)})"
                               for r in rows.itertuples(index=False))
            sentence += f"; under the lenient parser, against {baseline}: {listed}"
    return sentence + "."


BUDGET_COLUMNS = ["task", "strategy", "reasoning_tokens", "max_tokens", "n_records", "n_forced", "forced_share"]


def budget_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and strategy: its reasoning budget (the planned ``reasoning_tokens``, else the whole ``max_tokens``:
    a strategy without a separate answer phase reasons in all of it), and how many records the budget forced or
    cut (InWriting's budget switch, or a ``length`` finish)."""
    rows: list[dict[str, Any]] = []
    if df.empty or "record" not in df.columns:
        return pd.DataFrame(rows, columns=BUDGET_COLUMNS)
    for (task, strategy), g in df.groupby(["task", "strategy"], sort=True):
        budgets = [r.budget or {} for r in g["record"]]
        reasoning = sorted({int(b.get("reasoning_tokens", b.get("max_tokens", 0)) or 0) for b in budgets})
        max_tokens = sorted({int(b.get("max_tokens", 0) or 0) for b in budgets})
        forced = int(((g["switch_reason"].astype(str) == "budget") | (g["finish_reason"].astype(str) == "length"))
                     .sum())
        rows.append({"task": str(task), "strategy": str(strategy),
                     "reasoning_tokens": "/".join(map(str, reasoning)), "max_tokens": "/".join(map(str, max_tokens)),
                     "n_records": len(g), "n_forced": forced, "forced_share": forced / len(g) if len(g) else math.nan})
    return pd.DataFrame(rows, columns=BUDGET_COLUMNS)


def budget_sentence(rows: pd.DataFrame) -> str | None:
    """Each strategy's reasoning budget and share of forced answers, when budgets differ or some answer was forced
    (issue 60: at one ``--max-tokens`` json's reasoning may get 75 tokens, InWriting's 96, free's 128); None
    otherwise."""
    if rows.empty or (rows["reasoning_tokens"].nunique() <= 1 and not (rows["n_forced"] > 0).any()):
        return None
    listed = ", ".join(f"{r.strategy} {r.reasoning_tokens} (forced or cut: {r.n_forced} of {r.n_records})"
                       for r in rows.itertuples(index=False))
    same = ("differ between strategies" if rows["reasoning_tokens"].nunique() > 1
            else "are the same for every strategy")
    return (f"Reasoning budgets in tokens {same}: {listed}. An answer the budget forced or cut is scored as "
            "written; `formtax run --same-reasoning` gives every strategy the same reasoning budget.")
