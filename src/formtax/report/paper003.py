"""Paper 003's Table 2: the answer line against the one-field JSON object, at the same level and reasoning.

For every strategy of a run in the JSON answer form (``inwriting@vc:json``, ``nl2format@none:json``) whose line
form is in the run too (``inwriting@vc``), one row: both strict accuracies on their common items and runs and the
paired difference JSON - line, with the paired table's interval and per-item test (report/comparisons.py). The
prompts differ only in the format description (InWriting) or only in the second call's (NL-to-Format, whose
first call is byte-identical, so the two forms read the same free reasoning as in the paper).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from formtax.report.analyses import Analysis, register_analysis
from formtax.report.comparisons import _paired_row
from formtax.report.matrices import frame
from formtax.runner.grid import JSON_FORM, AnswerForm
from formtax.stats import DEFAULT_RESAMPLING

PLAIN_FORM = AnswerForm.PLAIN.suffix
COLUMNS = [
    "task", "base_strategy", "level", "rc", "strategy_line", "strategy_json", "n_items", "n_runs",
    "n_items_dropped", "drop_reasons", "acc_line", "acc_json", "diff", "diff_low", "diff_high", "items_json_better",
    "items_line_better", "paired_p", "paired_test", "confidence", "interval_method", "n_resamples",
]  # fmt: skip


def line_form(strategy: str, present: set[str] | None = None) -> str:
    """The spec of a JSON-form strategy's answer-line twin (``inwriting@vc:json+rc`` -> ``inwriting@vc+rc``, or
    ``inwriting@vc:plain+rc`` where that is the one ``present``: the explicit form of ``--prompt-variants paper``)."""
    bare, plain = strategy.replace(JSON_FORM, "", 1), strategy.replace(JSON_FORM, PLAIN_FORM, 1)
    return plain if present is not None and bare not in present and plain in present else bare


def answer_form_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    if df.empty or not df["base_strategy"].astype(str).str.endswith(JSON_FORM).any():
        return None
    rows: list[dict[str, Any]] = []
    for task, group in df.groupby("task", sort=True):
        present = set(group["strategy"].astype(str))
        for strategy in sorted(present):
            line = line_form(strategy, present)
            if JSON_FORM not in strategy or line not in present:
                continue
            first = group[group["strategy"] == strategy].iloc[0]
            paired = _paired_row(str(task), strategy, line, group, n_resamples, seed, DEFAULT_RESAMPLING)
            rows.append({
                "task": task, "base_strategy": str(first["base_strategy"]).removesuffix(JSON_FORM),
                "level": first["level"], "rc": bool(first["rc"]), "strategy_line": line,
                "strategy_json": strategy, "n_items": paired["n_items"], "n_runs": paired["n_runs"],
                "n_items_dropped": paired["n_items_dropped"], "drop_reasons": paired["drop_reasons"],
                "acc_line": paired["acc_b"], "acc_json": paired["acc_a"], "diff": paired["diff"],
                "diff_low": paired["diff_low"], "diff_high": paired["diff_high"],
                "items_json_better": paired["items_a_better"], "items_line_better": paired["items_b_better"],
                "paired_p": paired["paired_p"], "paired_test": paired["paired_test"],
                "confidence": paired["confidence"], "interval_method": paired["interval_method"],
                "n_resamples": paired["n_resamples"],
            })  # fmt: skip
    if not rows:
        return None
    return frame(rows, COLUMNS)


register_analysis(Analysis(
    name="answer_forms",
    keys=("task", "strategy_json"),
    description=(
        "Paper 003's Table 2: each strategy's answer line (The answer is: ...) against its JSON answer form "
        '({"answer": ...}, spec NAME@LEVEL:json) at the same constraint level and reasoning budget, strict '
        "accuracy on common items and runs, and the paired difference JSON - line."
    ),
    method="the paired table's interval of JSON - line (exact below 20 items, Wilson boundary where every item "
           "differs alike, paired percentile bootstrap elsewhere), "
           "per-item sign-flip test",
    bootstrap=True,
    compute=answer_form_table,
))


# -- Table 4: IMDb with the labels masked out ------------------------------------------------------------------

LABEL_TASK, WORDS_TASK = "imdb", "imdb-alt"
IMDB_COLUMNS = [
    "task", "strategy", "base_strategy", "level", "strategy_unconstrained", "n_items", "n_runs",
    "acc_unconstrained", "acc_label", "acc_alternative", "diff", "diff_low", "diff_high", "paired_p",
    "paired_test", "confidence", "interval_method", "n_resamples",
]  # fmt: skip


def imdb_alternatives_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    """Paper 003's Table 4 from a report pooling an ``imdb`` run and an ``imdb-alt`` run (same items, prompts,
    strategies): per constrained strategy, its unconstrained twin on ``imdb`` (the same strategy at level
    ``none``), ``imdb`` constrained to the labels and ``imdb-alt`` constrained to the words, and the paired
    difference alternative - label on common items and runs."""
    if df.empty or not {LABEL_TASK, WORDS_TASK} <= set(df["task"].astype(str)):
        return None
    label, words = df[df["task"] == LABEL_TASK], df[df["task"] == WORDS_TASK]
    rows: list[dict[str, Any]] = []
    for strategy in sorted(set(words["strategy"].astype(str)) & set(label["strategy"].astype(str))):
        first = words[words["strategy"] == strategy].iloc[0]
        if first["level"] == "none":
            continue
        twin = label[(label["base_strategy"] == first["base_strategy"]) & (label["level"] == "none")
                     & (label["rc"] == first["rc"])]
        moved = words[words["strategy"] == strategy].assign(task=LABEL_TASK, strategy="words:" + strategy)
        group = pd.concat([label, moved], ignore_index=True)
        paired = _paired_row(LABEL_TASK, "words:" + strategy, strategy, group, n_resamples, seed, DEFAULT_RESAMPLING)
        unconstrained = str(twin["strategy"].iloc[0]) if len(twin) else ""
        acc_free = (_paired_row(LABEL_TASK, unconstrained, strategy, label, n_resamples, seed, DEFAULT_RESAMPLING)
                    ["acc_a"] if unconstrained else float("nan"))
        rows.append({
            "task": f"{LABEL_TASK} / {WORDS_TASK}", "strategy": strategy, "base_strategy": first["base_strategy"],
            "level": first["level"], "strategy_unconstrained": unconstrained, "n_items": paired["n_items"],
            "n_runs": paired["n_runs"], "acc_unconstrained": acc_free, "acc_label": paired["acc_b"],
            "acc_alternative": paired["acc_a"], "diff": paired["diff"], "diff_low": paired["diff_low"],
            "diff_high": paired["diff_high"], "paired_p": paired["paired_p"], "paired_test": paired["paired_test"],
            "confidence": paired["confidence"], "interval_method": paired["interval_method"],
            "n_resamples": paired["n_resamples"],
        })  # fmt: skip
    return frame(rows, IMDB_COLUMNS) if rows else None


register_analysis(Analysis(
    name="imdb_alternatives",
    keys=("task", "strategy"),
    description=(
        "Paper 003's Table 4 (a report pooling an imdb and an imdb-alt run): the same label prompt decoded "
        "without a mask (acc_unconstrained: the strategy at level none on imdb), constrained to the labels "
        "(acc_label: imdb) and constrained to the alternative words with the labels masked out (acc_alternative: "
        "imdb-alt, scored by the class a word stands for); diff = alternative - label, paired on common items and "
        "runs (acc_unconstrained on its own common cases with the label column)."
    ),
    method="the paired table's interval of alternative - label (exact below 20 items, Wilson boundary where "
           "every item differs alike, paired percentile bootstrap elsewhere), per-item sign-flip test",
    bootstrap=True,
    compute=imdb_alternatives_table,
))
