"""Event argument extraction (paper 001 section 4.2): AI, AC, AI+ and AC+ per strategy and parser, registered
with the report so ``formtax verify`` recomputes every number from the records.

Everything comes from the records alone (:mod:`formtax.studies.eae.scoring` explains the matching): the gold
arguments and their heads from ``Record.gold``, the prediction and its heads from the parser's ``value``.
Heads were computed when the run wrote its records, so the table does not depend on whether this machine has
spaCy, and a task whose records mix head methods (gold or predictions) is refused: the head metrics of two
methods are not comparable.

Choices, and why:

* Applies to tasks whose name starts with ``eae-``; one row per (task, strategy, parser) for the strict and
  lenient parsers, since the format cost of a strategy shows in the gap between the two.
* A record whose parse is not ``ok`` extracts nothing: its gold still counts (recall pays for a format
  failure), as a reader of the output would get no arguments from it. An errored record (``error`` set) is
  a failed request, not an output: it is left out and counted in ``n_unscored``.
* Micro P/R/F1: the counts of every sentence of the cell are summed (all runs pooled), the usual EAE
  convention (TextEE, OneIE), so sentences with many arguments weigh more. AI / AC / AI+ / AC+ count key sets
  per sentence and run (:func:`~formtax.studies.eae.scoring.score_sentence`), each with its own predicted and gold
  totals; the head-word metrics count per mention (``n_pred`` / ``n_gold`` are their totals).
* Intervals: 95% percentile bootstrap over *sentences* (the unit the attached metrics count in; a sentence of
  one mention is that mention): each replicate draws the task's sentences with replacement and sums the drawn
  sentences' counts over all their runs (the runs of a sentence move together, as they share its gold). F1 is
  recomputed from the resampled sums (F1 = 2c / (n_pred + n_gold), exactly the micro F1, 0 when both are 0).
  The draw depends only on ``seed`` and the task's sentence list (the sentences scored in any cell of the
  task), and is the same for every strategy and parser of the task, so intervals are paired across strategies
  and one task's intervals do not change when another task is added to the run. A sentence a cell never scored
  contributes zero counts. ``n_resamples`` 0 gives NaN bounds.
* ``span_in_passage_rate``: the share of filled roles (of parsed outputs) whose value the task found in the
  passage; NaN when nothing was filled.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from formtax.errors import DataError  # noqa: E402
from formtax.records.schema import Record  # noqa: E402
from formtax.report.analyses import Analysis, register_analysis  # noqa: E402
from formtax.report.matrices import CONFIDENCE, frame  # noqa: E402
from formtax.stats import bootstrap_replicates  # noqa: E402
from formtax.studies.eae.scoring import (  # noqa: E402
    ATTACHED,
    Arg,
    Attachment,
    decode_attachment,
    decode_gold,
    decode_prediction,
    prediction_in_passage,
    prf,
    score_mention,
    score_sentence,
)

TASK_PREFIX = "eae-"
PARSERS = ("strict", "lenient")
HEAD_WORD = ("ai_head", "ac_head")  # formtax's extra head-word metrics, per mention (scoring.eae.score_mention)
METRICS = (*ATTACHED, *HEAD_WORD)
LABELS = {"ai": "AI", "ac": "AC", "ai_plus": "AI+", "ac_plus": "AC+", "ai_head": "AI (head word)",
          "ac_head": "AC (head word)"}
FIELDS = tuple(f for m in ATTACHED for f in (m, f"{m}_pred", f"{m}_gold")) + ("n_pred", "n_gold", *HEAD_WORD)
COLUMNS = [
    "task", "strategy", "parser", "head_method", "n_records", "n_unscored", "n_runs", "n_mentions", "n_sentences",
    "parse_rate", "n_pred", "n_gold", "span_in_passage_rate",
    *[f"{m}_{s}" for m in METRICS for s in ("p", "r", "f1", "f1_lo", "f1_hi")],
]  # fmt: skip
NAN = math.nan
Vector = npt.NDArray[np.float64]


def _where(line: Any) -> str:
    return f"records.jsonl line {line}"


def _prediction(rec: Record, parser: str, where: str) -> tuple[list[Arg], list[bool], str | None, bool]:
    """(predicted args, their in_passage flags, head method or None, parsed ok) of one scored record."""
    parse = rec.parses.get(parser)
    if parse is None or parse.status != "ok":
        return [], [], None, False
    if parse.value is None:
        raise DataError(f"{where}: the {parser} parse is ok but has no value (the encoded prediction)")
    try:
        args, method = decode_prediction(parse.value)
        flags = prediction_in_passage(parse.value)
    except DataError as exc:
        raise DataError(f"{where}: {parser} parse value: {exc}") from exc
    return args, flags, method, True


def _gold(rec: Record, where: str) -> tuple[list[Arg], str]:
    try:
        return decode_gold(rec.gold)
    except DataError as exc:
        raise DataError(f"{where}: gold: {exc}") from exc


class _Methods:
    """The one head method of a task; a second one is an error naming both records."""

    def __init__(self, task: str) -> None:
        self.task, self.method, self.first = task, "", ""

    def add(self, method: str | None, where: str) -> None:
        if method is None:
            return
        if not self.method:
            self.method, self.first = method, where
        elif method != self.method:
            raise DataError(
                f"{where}: task {self.task!r} mixes head methods {method!r} and {self.method!r} "
                f"({self.first}); AI+/AC+ of two methods are not comparable: re-encode the records with one"
            )


def _attachment(rec: Record, where: str) -> Attachment:
    """The record's attachment; a record written before attachments existed is its own sentence."""
    try:
        at = decode_attachment(rec.gold)
    except DataError as exc:
        raise DataError(f"{where}: gold: {exc}") from exc
    return at if at is not None else Attachment(f"mention:{rec.item_id}", "", (0, 0))


Tally = Counter[str]  # the FIELDS of one sentence, summed over the runs of a cell


def _cell(cell: pd.DataFrame, parser: str, methods: _Methods) -> tuple[dict[str, Any], dict[str, Tally]]:
    """The row's count columns of one (strategy, parser) cell and the summed counts per sentence."""
    per_sentence: dict[str, Tally] = defaultdict(Counter)
    runs: dict[tuple[str, Any, Any], list[tuple[Attachment, list[Arg], list[Arg]]]] = defaultdict(list)
    mentions: set[str] = set()
    n_unscored = n_ok = n_filled = n_in = 0
    for line, rec in zip(cell["line"], cell["record"], strict=True):
        where = _where(line)
        gold, gold_method = _gold(rec, where)
        methods.add(gold_method, where)
        at = _attachment(rec, where)
        if rec.error is not None:
            n_unscored += 1
            continue
        pred, flags, pred_method, ok = _prediction(rec, parser, where)
        methods.add(pred_method, where)
        n_ok += ok
        n_filled += len(flags)
        n_in += sum(flags)
        mentions.add(str(rec.item_id))
        runs[(at.sentence, rec.seed, rec.prompt_variant)].append((at, pred, gold))
        c = score_mention(pred, gold)
        per_sentence[at.sentence].update({"n_pred": c.n_pred, "n_gold": c.n_gold, "ai_head": c.ai_head,
                                          "ac_head": c.ac_head})
    for (sentence, _, _), group in runs.items():
        per_sentence[sentence].update(score_sentence(group))
    n_scored = len(cell) - n_unscored
    row: dict[str, Any] = {
        "n_records": len(cell),
        "n_unscored": n_unscored,
        "n_runs": len({(rec.seed, rec.prompt_variant) for rec in cell["record"]}),
        "n_mentions": len(mentions),
        "n_sentences": len(per_sentence),
        "parse_rate": n_ok / n_scored if n_scored else NAN,
        "span_in_passage_rate": n_in / n_filled if n_filled else NAN,
    }
    return row, dict(per_sentence)


def _count_matrix(per_sentence: dict[str, Tally], sentences: list[str], field: str) -> Vector:
    """``sentences x 1`` matrix of one count field (zero for a sentence the cell did not score)."""
    return np.array([[float(per_sentence[i][field]) if i in per_sentence else 0.0] for i in sentences],
                    dtype=np.float64)


def _denominators(m: str) -> tuple[str, str]:
    """The predicted and gold total fields of a metric."""
    return (f"{m}_pred", f"{m}_gold") if m in ATTACHED else ("n_pred", "n_gold")


def _f1(correct: Vector, n_pred: Vector, n_gold: Vector) -> Vector:
    """Micro F1 = 2c / (n_pred + n_gold), elementwise, 0 where both counts are 0 (as :func:`prf`)."""
    denom = n_pred + n_gold
    return np.divide(2.0 * correct, denom, out=np.zeros_like(denom), where=denom > 0)


def _bounds(replicates: Vector) -> tuple[float, float]:
    alpha = 1.0 - CONFIDENCE
    low, high = np.quantile(replicates, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


def _intervals(
    cells: dict[tuple[str, str], dict[str, Tally]], sentences: list[str], n_resamples: int, seed: int
) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """Per cell and metric, the F1 interval from one paired bootstrap over the task's sentences."""
    if n_resamples <= 0 or not sentences:
        return {key: {m: (NAN, NAN) for m in METRICS} for key in cells}
    matrices = {
        f"{s}\x00{p}\x00{field}": _count_matrix(per_sentence, sentences, field)
        for (s, p), per_sentence in cells.items()
        for field in FIELDS
    }
    reps = bootstrap_replicates(matrices, n_resamples, seed)  # the same sentence draw for every matrix
    out: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for s, p in cells:
        base = f"{s}\x00{p}\x00"
        out[(s, p)] = {}
        for m in METRICS:
            n_pred, n_gold = _denominators(m)
            out[(s, p)][m] = _bounds(_f1(reps[base + m], reps[base + n_pred], reps[base + n_gold]))
    return out


def _metric_columns(total: Tally, bounds: dict[str, tuple[float, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"n_pred": total["n_pred"], "n_gold": total["n_gold"]}
    for m in METRICS:
        n_pred, n_gold = _denominators(m)
        p, r, f1 = prf(total[m], total[n_pred], total[n_gold])
        row.update({f"{m}_p": p, f"{m}_r": r, f"{m}_f1": f1})
        row[f"{m}_f1_lo"], row[f"{m}_f1_hi"] = bounds[m]
    return row


def _task_rows(task: str, sub: pd.DataFrame, n_resamples: int, seed: int) -> list[dict[str, Any]]:
    methods = _Methods(task)
    described: dict[tuple[str, str], dict[str, Any]] = {}
    cells: dict[tuple[str, str], dict[str, Tally]] = {}
    for strategy, cell in sub.groupby("strategy", sort=True):
        for parser in PARSERS:
            described[(str(strategy), parser)], cells[(str(strategy), parser)] = _cell(cell, parser, methods)
    sentences = sorted({sentence for per_sentence in cells.values() for sentence in per_sentence})
    bounds = _intervals(cells, sentences, n_resamples, seed)
    rows: list[dict[str, Any]] = []
    for (strategy, parser), per_sentence in cells.items():
        total: Tally = sum(per_sentence.values(), Counter())
        row: dict[str, Any] = {
            "task": task,
            "strategy": strategy,
            "parser": parser,
            "head_method": methods.method,
        }
        row.update(described[(strategy, parser)])
        row.update(_metric_columns(total, bounds[(strategy, parser)]))
        rows.append(row)
    return rows


def eae_table(df: pd.DataFrame, n_resamples: int = 0, seed: int = 0) -> pd.DataFrame | None:
    """The AI/AC/AI+/AC+ table of every ``eae-*`` task in ``df``; None when the run has none."""
    sub = df[df["task"].astype(str).str.startswith(TASK_PREFIX)]
    if sub.empty:
        return None
    if "line" not in sub.columns:  # a frame of (task, strategy, record) built by hand; load_records has lines
        sub = sub.assign(line=[f"? (row {i})" for i in range(len(sub))])
    rows: list[dict[str, object]] = []
    for task, part in sub.groupby("task", sort=True):
        rows += _task_rows(str(task), part, n_resamples, seed)
    return frame(rows, COLUMNS)


def eae_figure(table: pd.DataFrame) -> Figure:
    """Strict-parser F1 of AI, AC, AI+, AC+ per strategy (grouped bars, interval error bars), a panel per task."""
    strict = table[table["parser"] == "strict"]
    tasks = sorted(set(strict["task"]))
    fig, axes = plt.subplots(max(1, len(tasks)), 1, figsize=(8.0, 3.4 * max(1, len(tasks))), squeeze=False)
    for ax, task in zip(axes[:, 0], tasks, strict=False):
        rows = strict[strict["task"] == task]
        x = np.arange(len(rows))
        width = 0.8 / len(METRICS)
        for k, m in enumerate(METRICS):
            f1 = rows[f"{m}_f1"].to_numpy(dtype=float)
            low = np.clip(f1 - rows[f"{m}_f1_lo"].to_numpy(dtype=float), 0.0, None)
            high = np.clip(rows[f"{m}_f1_hi"].to_numpy(dtype=float) - f1, 0.0, None)
            err = np.nan_to_num(np.vstack([low, high]))
            ax.bar(x + k * width, np.nan_to_num(f1), width, yerr=err, capsize=3, label=LABELS[m])
        ax.set_xticks(x + 0.4 - width / 2, list(rows["strategy"]), rotation=20, ha="right")
        ax.set_ylim(0.0, 1.05)
        ax.set_ylabel("F1 (strict parser)")
        ax.set_title(f"{task} (heads: {rows['head_method'].iloc[0] or 'n/a'})")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


register_analysis(
    Analysis(
        name="eae",
        keys=("task", "strategy", "parser"),
        description=(
            "Event argument extraction (Deco-G section 4.2): micro precision, recall and F1, summed over every "
            "scored sentence and run of the cell, with TextEE's definitions: per sentence, the predicted and "
            "gold argument keys are sets (a span counts once); AI = (event type, span), AC = (event type, "
            "span, role), AI+ / AC+ (ai_plus / ac_plus) = the same attached to the trigger (its offsets), so "
            "an argument given to the wrong one of two mentions of a type is an AI hit and an AI+ miss. "
            "Extra, formtax's: AI / AC on head words (ai_head / ac_head), per mention, matched one-to-one "
            "after de-duplicating (role, string); n_pred / n_gold are their totals. Strings match after "
            "casefolding, removing all whitespace and stripping end punctuation and quotes; roles match "
            "case-insensitively. Heads were computed when the records "
            "were written (head_method: a spaCy pipeline's dependency root, the object of a root "
            "preposition, or the fallback rule: the last word of the first noun chunk after leading "
            "prepositions and determiners). An output whose parse failed extracts nothing (its gold still "
            "counts); errored requests are left out (n_unscored). parse_rate = ok parses / scored records; "
            "span_in_passage_rate = share of filled roles whose value occurs in the passage."
        ),
        method=(
            "95% percentile bootstrap of F1 over sentences (all runs and mentions of a sentence together), the "
            "same draws for every strategy and parser of a task"
        ),
        bootstrap=True,
        compute=eae_table,
        figure=eae_figure,
        figure_caption=(
            "Event argument extraction: strict-parser F1 of AI, AC, AI+, AC+ and the head-word AI / AC per "
            "strategy, with 95% bootstrap intervals over sentences."
        ),
    )
)
