"""LLM-as-a-judge correlations for SummEval runs (paper 001 section 4.3), plugged into the report and ``verify``.

Per strategy and aspect: the summary-level Spearman and Kendall correlations between the judge's ratings and the
expert means, the convention of G-Eval (Liu et al. 2023) that Deco-G follows: for each article, the correlation
over its rated summaries, averaged over articles. Also the pooled (dataset-level) correlations over all rated
records, which a small ``--limit`` can still estimate, and the mean absolute error.

Our choices (the paper leaves them open):

* ratings are read from the records alone: the *strict* rating is the last non-empty line ``The rating is N``
  (optionally ending with a period), or the strict parse for JSON outputs and for Deco-G's key-phrase format
  (the last ``The rating is N`` anywhere, paper 001 section 4.3); the *lenient* rating falls back to
  the last ``rating (is|of|:) N`` anywhere in the text, then to the shared lenient parser's value;
* an unrated record (no rating, or an errored request) is left out and counted (``n_rated`` vs ``n_records``);
* an article whose expert means are all equal, or with fewer than two rated summaries, has no correlation and is
  skipped; an article where the *judge* gives one rating to every summary is skipped too, as G-Eval does (its
  correlation is undefined), in ``spearman`` / ``kendall``. Both are reported: ``spearman_const0`` /
  ``kendall_const0`` count such an article as 0 instead (ours, conservative: a judge that cannot tell summaries
  apart carries no information, and skipping it rewards constant ratings). On one constant article plus one
  perfectly ranked one, G-Eval's rule gives 1.0 and ours 0.5;
* with several runs (seeds x prompt variants) each run is computed on its own and the values are averaged;
* the ``mean`` row averages the four aspects' values.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from formtax.report.analyses import Analysis, register_analysis
from formtax.report.matrices import frame

TASK = "summeval"
ASPECTS = ("coherence", "consistency", "fluency", "relevance")
COLUMNS = [
    "task", "strategy", "aspect", "n_records", "n_runs", "n_rated", "rated_rate", "n_rated_lenient", "n_articles",
    "spearman", "kendall", "spearman_const0", "kendall_const0", "spearman_lenient", "kendall_lenient",
    "pooled_spearman", "pooled_kendall", "mean_abs_error",
]  # fmt: skip

_LINE = re.compile(r"The rating is ([1-5])\.?")
_ANY = re.compile(r"rating\s*(?:is|of|:|=)\s*:?\s*\**\s*([1-5])(?![0-9])", re.IGNORECASE)


def strict_rating(rec: Any) -> int | None:
    if rec.error:
        return None
    if rec.output_format in ("json", "reason-keyphrase"):
        p = rec.parses.get("strict")
        return int(p.value) if p is not None and p.status == "ok" and p.value is not None else None
    text = rec.answer_text if rec.answer_text is not None else rec.text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    m = _LINE.fullmatch(lines[-1]) if lines else None
    return int(m.group(1)) if m else None


def lenient_rating(rec: Any) -> int | None:
    if rec.error:
        return None
    r = strict_rating(rec)
    if r is not None:
        return r
    found = _ANY.findall(rec.text)
    if found:
        return int(found[-1])
    p = rec.parses.get("lenient")
    if p is not None and p.status == "ok" and p.value is not None and str(p.value).isdigit():
        v = int(p.value)
        return v if 1 <= v <= 5 else None
    return None


def _corr(x: list[float], y: list[float], kind: str, constant_zero: bool = False) -> float:
    """Correlation of judge ratings x with expert means y; NaN if undefined (a constant judge: 0 with
    ``constant_zero``, ours; NaN otherwise, G-Eval's)."""
    if len(x) < 2 or len(set(y)) < 2:
        return math.nan
    if len(set(x)) < 2:
        return 0.0 if constant_zero else math.nan
    res = stats.spearmanr(x, y) if kind == "spearman" else stats.kendalltau(x, y)
    return float(res.statistic)


def _summary_level(pairs: list[tuple[str, float, float]], kind: str, constant_zero: bool = False
                   ) -> tuple[float, int]:
    by_article: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for article, rating, gold in pairs:
        by_article[article][0].append(rating)
        by_article[article][1].append(gold)
    values = [_corr(x, y, kind, constant_zero) for x, y in by_article.values()]
    values = [v for v in values if not math.isnan(v)]
    return (float(np.mean(values)) if values else math.nan), len(values)


def _run_metrics(recs: list[Any]) -> dict[str, float]:
    strict: list[tuple[str, float, float]] = []
    lenient: list[tuple[str, float, float]] = []
    for rec in recs:
        article = rec.item_id.split("-", 1)[0]
        gold = float(rec.gold)
        r = strict_rating(rec)
        if r is not None:
            strict.append((article, float(r), gold))
        rl = lenient_rating(rec)
        if rl is not None:
            lenient.append((article, float(rl), gold))
    sp, n_art = _summary_level(strict, "spearman")
    kt, _ = _summary_level(strict, "kendall")
    sp0, _ = _summary_level(strict, "spearman", constant_zero=True)
    kt0, _ = _summary_level(strict, "kendall", constant_zero=True)
    sp_l, _ = _summary_level(lenient, "spearman")
    kt_l, _ = _summary_level(lenient, "kendall")
    xs, ys = [p[1] for p in strict], [p[2] for p in strict]
    return {
        "n_rated": float(len(strict)), "n_rated_lenient": float(len(lenient)), "n_articles": float(n_art),
        "spearman": sp, "kendall": kt, "spearman_const0": sp0, "kendall_const0": kt0, "spearman_lenient": sp_l, "kendall_lenient": kt_l,
        "pooled_spearman": _corr(xs, ys, "spearman"), "pooled_kendall": _corr(xs, ys, "kendall"),
        "mean_abs_error": float(np.mean([abs(a - b) for a, b in zip(xs, ys, strict=True)])) if xs else math.nan,
    }


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def judge_table(df: pd.DataFrame, n_resamples: int = 0, seed: int = 0) -> pd.DataFrame | None:
    """The correlation table of every SummEval strategy in ``df``; None when the run has no SummEval records."""
    sub = df[df["task"] == TASK]
    if sub.empty:
        return None
    rows: list[dict[str, object]] = []
    for strategy, cell in sub.groupby("strategy", sort=True):
        per_aspect: dict[str, dict[str, Any]] = {}
        for aspect in ASPECTS:
            recs = [r for r in cell["record"] if r.item_id.rsplit("-", 1)[-1] == aspect]
            if not recs:
                continue
            runs: dict[tuple[int, str], list[Any]] = defaultdict(list)
            for r in recs:
                runs[(r.seed, r.prompt_variant)].append(r)
            metrics = [_run_metrics(v) for _, v in sorted(runs.items())]
            row: dict[str, Any] = {"task": TASK, "strategy": str(strategy), "aspect": aspect,
                                   "n_records": len(recs), "n_runs": len(runs)}
            for key in ("n_rated", "n_rated_lenient", "n_articles"):
                row[key] = int(sum(m[key] for m in metrics))
            row["rated_rate"] = row["n_rated"] / row["n_records"]
            for key in ("spearman", "kendall", "spearman_const0", "kendall_const0", "spearman_lenient",
                        "kendall_lenient", "pooled_spearman", "pooled_kendall", "mean_abs_error"):
                row[key] = _nanmean([m[key] for m in metrics])
            per_aspect[aspect] = row
            rows.append(row)
        if len(per_aspect) > 1:
            mean: dict[str, Any] = {"task": TASK, "strategy": str(strategy), "aspect": "mean"}
            for key in ("n_records", "n_runs", "n_rated", "n_rated_lenient", "n_articles"):
                mean[key] = int(sum(r[key] for r in per_aspect.values())) if key != "n_runs" else \
                    max(r["n_runs"] for r in per_aspect.values())
            mean["rated_rate"] = mean["n_rated"] / mean["n_records"]
            for key in ("spearman", "kendall", "spearman_const0", "kendall_const0", "spearman_lenient",
                        "kendall_lenient", "pooled_spearman", "pooled_kendall", "mean_abs_error"):
                mean[key] = _nanmean([r[key] for r in per_aspect.values()])
            rows.append(mean)
    return frame(rows, COLUMNS)


def judge_figure(table: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    aspects = [a for a in (*ASPECTS, "mean") if a in set(table["aspect"])]
    strategies = sorted(set(table["strategy"]))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(aspects) * max(1, len(strategies)) / 2), 3.4))
    width = 0.8 / max(1, len(strategies))
    for k, s in enumerate(strategies):
        rows = table[table["strategy"] == s].set_index("aspect")
        vals = [float(rows.loc[a, "spearman"]) if a in rows.index else math.nan for a in aspects]
        ax.bar(np.arange(len(aspects)) + k * width, np.nan_to_num(vals), width, label=s)
    ax.set_xticks(np.arange(len(aspects)) + 0.4 - width / 2, aspects)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_ylabel("summary-level Spearman")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


register_analysis(Analysis(
    name="judge",
    keys=("task", "strategy", "aspect"),
    description=(
        "SummEval LLM-as-judge: correlation of the judge's 1-5 ratings with the expert means, over articles A0-A89 "
        "(1440 of paper 001's 1600 summaries: A90-A99 are held out for the few-shot examples and the FEM's "
        "distillation, so no evaluated article is seen before; ours). Summary-level "
        "(G-Eval's convention, used by Deco-G): per article, Spearman / Kendall tau-b over its rated summaries, "
        "averaged over articles (n_articles with a defined value; an article the judge rated constant is skipped, "
        "as G-Eval does; the _const0 columns count it as 0 instead, ours). Pooled: over all "
        "rated records. Strict ratings: the last line 'The rating is N' (JSON: the answer field); lenient: any "
        "'rating is N', then the lenient parser. rated_rate = strict ratings / records. A small --limit leaves "
        "few summaries per article, so summary-level values may be n/a: read the pooled ones then."
    ),
    method="none (correlations of the recorded ratings; averaged over runs)",
    bootstrap=False,
    compute=judge_table,
    figure=judge_figure,
    figure_caption="Summary-level Spearman correlation with the SummEval expert means, per aspect and strategy.",
))
