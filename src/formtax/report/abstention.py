"""The tool-abstention study's tables and figure (paper 002), registered with the report so ``formtax verify``
regenerates and checks every number.

Everything is recomputed from the records: each output is re-scored from its text with
:mod:`formtax.scoring.abstention` (the candidates come from the record's ``answer_spec``), and a record whose
stored score disagrees with that rule is an error, so a scorer change can never silently mix two rules in one
report. The three conditions are the records of ``free``, ``short`` and ``constrained`` (level vc, no RC).

The unit of every interval is an item position resampled together with the decoding seeds: each bootstrap
replicate draws positions and seeds with replacement, and the same draw is used in every cell a number
compares (paired), so within a replicate delta_total = delta_mask + delta_length exactly.

Tables (each applies only to runs with metatool records):

- ``abstention_accuracy``: paper 002 Table 1; abstention and tool-selection accuracy per language and
  condition, with the outcome counts beside them (D0, D2, wrong readable answer, refused by the ordering
  rule).
- ``abstention_contrasts``: Table 3; delta_mask, delta_length, delta_total per language and item type.
- ``abstention_transitions``: what the ``short`` output was where the constraint turned wrong into right, and
  how often it turned right into wrong.
- ``abstention_mass``: per item, the first-token masked mass under ``short`` (exact, top-20 lower bound,
  coverage) and the per-item penalty (constrained - short accuracy); the figure plots one against the other.
- ``abstention_mass_fit``: exploratory logistic fit of P(flip) on masked_mass, with the coverage summary.
- ``abstention_language``: D_paired = (b - c)/|S| and the difference in delta_mask between languages, when a
  run has a second language.
- ``abstention_seeds``: whether outputs differ across seeds (at temperature 0 they should not).
"""

from __future__ import annotations

import math
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
from formtax.scoring.abstention import ABSTAIN, Category, score_output  # noqa: E402
from formtax.stats import (  # noqa: E402
    DEFAULT_RESAMPLING,
    Resampling,
    bootstrap_replicates,
    complete_cases,
    logistic_fit,
    paired_boundary_interval,
    wilson_interval,
)
from formtax.strategies.firstmass import EVENT as FIRST_MASS  # noqa: E402
from formtax.tasks.metatool import BASE_LANGUAGE, parse_item_id  # noqa: E402

TASK = "metatool"
CONDITIONS = ("free", "short", "constrained")
ITEM_TYPES = ("abstain", "tool")
CONTRASTS: dict[str, tuple[str, str]] = {
    "delta_mask": ("constrained", "short"),
    "delta_length": ("short", "free"),
    "delta_total": ("constrained", "free"),
}
WRONG_CATEGORIES = (Category.D0, Category.WRONG, Category.D2, Category.ORDER)
NAN = math.nan
Matrix = npt.NDArray[np.float64]


def _condition(rec: Record) -> str | None:
    """Which of the three conditions a record belongs to (None: another strategy, left out of the study)."""
    if rec.rc:
        return None
    if rec.base_strategy in ("free", "short"):
        return rec.base_strategy
    if rec.base_strategy == "constrained" and rec.level == "vc":
        return "constrained"
    return None


def _candidates(rec: Record, where: str) -> list[str]:
    spec = rec.answer_spec or ""
    if not spec.startswith("choice:"):
        raise DataError(f"{where}: answer_spec {spec!r} is not the item's choice over its candidates")
    return [o for o in spec[len("choice:") :].split("|") if o != ABSTAIN]


_LAST: list[tuple[pd.DataFrame, pd.DataFrame | None]] = []


def study_frame(df: pd.DataFrame) -> pd.DataFrame | None:
    """:func:`score_frame`, computed once per records frame (every table of one report reads the same frame)."""
    if _LAST and _LAST[0][0] is df:
        return _LAST[0][1]
    result = score_frame(df)
    _LAST[:] = [(df, result)]
    return result


def score_frame(df: pd.DataFrame) -> pd.DataFrame | None:
    """One row per metatool record of the three conditions, re-scored from its text; None when there are none.

    Columns: language, position, item_type, item_id, condition, strategy, seed, scored, correct (1/0, NaN when
    unscored), category, abstained (the output contains ``None``), names_tool / names_first (1/0, NaN when
    unscored: the output names any candidate / the first candidate offered), text, masked_mass /
    masked_mass_topk / topk_coverage / n_allowed (short only), grammar_masked_mass (constrained only).
    """
    sub = df[df["task"] == TASK]
    rows: list[dict[str, Any]] = []
    for line, rec in zip(sub["line"], sub["record"], strict=True):
        condition = _condition(rec)
        if condition is None:
            continue
        where = f"records.jsonl line {line}"
        key = parse_item_id(rec.item_id)
        if (rec.gold == ABSTAIN) != (key.kind == "abstain"):
            raise DataError(f"{where}: item {rec.item_id} has gold {rec.gold!r}, inconsistent with its kind")
        row: dict[str, Any] = {
            "language": key.language,
            "position": key.position,
            "item_type": key.kind,
            "item_id": rec.item_id,
            "condition": condition,
            "strategy": rec.strategy,
            "seed": rec.seed,
            "scored": rec.scored,
            "correct": NAN,
            "category": "",
            "abstained": False,
            "text": rec.text,
            "masked_mass": NAN,
            "masked_mass_topk": NAN,
            "topk_coverage": NAN,
            "n_allowed": NAN,
            "grammar_masked_mass": NAN,
            "names_tool": NAN,
            "names_first": NAN,
        }
        if rec.scored:
            text = rec.answer_text if rec.answer_text is not None else rec.text
            candidates = _candidates(rec, where)
            s = score_output(text, candidates, rec.gold)
            if rec.scores.get("strict") is not s.correct:
                raise DataError(
                    f"{where}: the recorded score {rec.scores.get('strict')} differs from the "
                    f"abstention scoring rule ({s.correct}); re-score the run with this formtax"
                )
            row.update(correct=float(s.correct), category=str(s.category), abstained=s.abstained,
                       names_tool=float(bool(s.named)),
                       names_first=float(bool(candidates) and candidates[0] in s.named))
            mass = rec.stats.get(FIRST_MASS)
            if condition == "short" and isinstance(mass, dict):
                for name in ("masked_mass", "masked_mass_topk", "topk_coverage", "n_allowed"):
                    row[name] = float(mass[name])
            if condition == "constrained" and rec.masked_mass is not None:
                row["grammar_masked_mass"] = float(rec.masked_mass)
        rows.append(row)
    if not rows:
        return None
    return pd.DataFrame(rows)


def _languages(sf: pd.DataFrame) -> list[str]:
    langs = sorted(set(sf["language"]))
    return [BASE_LANGUAGE] + [x for x in langs if x != BASE_LANGUAGE] if BASE_LANGUAGE in langs else langs


def _matrix(
    sf: pd.DataFrame, language: str, item_type: str, condition: str, column: str = "correct"
) -> tuple[Matrix, list[int], list[int]]:
    """positions x seeds of ``column`` (NaN where unscored or absent), over every position and seed of the
    language and item type (so the matrices of one language and type are aligned across conditions)."""
    base = sf[(sf["language"] == language) & (sf["item_type"] == item_type)]
    positions, seeds = sorted(set(base["position"])), sorted(set(base["seed"]))
    out = np.full((len(positions), len(seeds)), np.nan)
    pi, si = {p: i for i, p in enumerate(positions)}, {s: j for j, s in enumerate(seeds)}
    cell = base[base["condition"] == condition]
    for p, s, v in zip(cell["position"], cell["seed"], cell[column], strict=True):
        out[pi[p], si[s]] = float(v)
    return out, positions, seeds


def _quantiles(replicates: Matrix) -> tuple[float, float]:
    alpha = 1.0 - CONFIDENCE
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return NAN, NAN
    low, high = np.quantile(finite, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


def _mean_interval(matrix: Matrix, n_resamples: int, seed: int) -> tuple[float, float, float]:
    if 0 in np.shape(matrix):  # no items of this type in the run (e.g. only tool items): no number, no error
        return NAN, NAN, NAN
    (clean,), _ = complete_cases(matrix)
    if clean.shape[0] == 0 or clean.shape[1] == 0:
        return NAN, NAN, NAN
    if np.all(clean == 0.0) or np.all(clean == 1.0):  # the bootstrap would print a point: Wilson on positions
        n = int(clean.shape[0])
        w = wilson_interval(int(round(float(clean.mean()) * n)), n, confidence=CONFIDENCE)
        return w.estimate, w.low, w.high
    reps = bootstrap_replicates({"m": clean}, n_resamples, seed)["m"]
    low, high = _quantiles(reps)
    return float(clean.mean()), low, high


def contrast_replicates(cells: dict[str, Matrix], n_resamples: int, seed: int) -> dict[str, Matrix]:
    """Paired bootstrap replicates of every contrast whose two conditions are in ``cells``.

    ``cells`` are complete matrices of one shape. Each replicate is one draw of positions and seeds, applied
    to every cell, so within a replicate delta_total = delta_mask + delta_length exactly (up to rounding)."""
    means = bootstrap_replicates(cells, n_resamples, seed)
    return {name: means[a] - means[b] for name, (a, b) in CONTRASTS.items() if a in means and b in means}


# -- Table 1 ------------------------------------------------------------------------------------------------

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
    for language in _languages(sf):
        present = tuple(
            c for c in CONDITIONS if ((sf["language"] == language) & (sf["condition"] == c)).any()
        )
        # one basis with Table 3: the positions and seeds scored in every condition of the language and type
        aligned = {kind: _aligned(sf, language, kind, present) for kind in ITEM_TYPES}
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
                acc, low, high = _mean_interval(matrix, n_resamples, seed)
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
    return _mean_interval(np.vstack(parts), n_resamples, seed)


# -- Table 3 ------------------------------------------------------------------------------------------------

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


def _aligned(
    sf: pd.DataFrame, language: str, kind: str, conditions: tuple[str, ...]
) -> tuple[dict[str, Matrix], int]:
    mats = [_matrix(sf, language, kind, c)[0] for c in conditions]
    if any(0 in np.shape(m) for m in mats):  # no items of this type: empty cells, reported as NaN rows
        return {c: np.zeros((0, 0)) for c in conditions}, 0
    clean, dropped = complete_cases(*mats)
    return dict(zip(conditions, clean, strict=True)), dropped


def contrasts_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for language in _languages(sf):
        present = tuple(
            c for c in CONDITIONS if ((sf["language"] == language) & (sf["condition"] == c)).any()
        )
        if len(present) < 2:
            continue
        for kind in ITEM_TYPES:
            cells, dropped = _aligned(sf, language, kind, present)
            shape = next(iter(cells.values())).shape
            reps = contrast_replicates(cells, n_resamples, seed) if shape[0] and shape[1] else {}
            for name, (a, b) in CONTRASTS.items():
                if a not in cells or b not in cells:
                    continue
                est = float(cells[a].mean() - cells[b].mean()) if shape[0] else NAN
                low, high = _quantiles(reps[name]) if name in reps else (NAN, NAN)
                edge = paired_boundary_interval((cells[a].mean(axis=1) - cells[b].mean(axis=1)).tolist(),
                                                CONFIDENCE) if name in reps else None
                if edge is not None:  # every position differs alike: the bootstrap would print a point
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


# -- transitions --------------------------------------------------------------------------------------------

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
    for language in _languages(sf):
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


# -- masked mass --------------------------------------------------------------------------------------------

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


def _per_item(sf: pd.DataFrame) -> pd.DataFrame | None:
    short = sf[(sf["condition"] == "short") & sf["scored"]]
    con = sf[(sf["condition"] == "constrained") & sf["scored"]]
    if short.empty or short["masked_mass"].isna().all():
        return None
    keys = ["item_id", "language", "item_type", "position"]
    s = short.groupby(keys, sort=True).agg(
        n_seeds=("seed", "nunique"),
        masked_mass=("masked_mass", "mean"),
        masked_mass_topk=("masked_mass_topk", "mean"),
        topk_coverage=("topk_coverage", "mean"),
        n_allowed=("n_allowed", "mean"),
        short_acc=("correct", "mean"),
    )
    c = con.groupby(keys, sort=True).agg(
        grammar_masked_mass=("grammar_masked_mass", "mean"), constrained_acc=("correct", "mean")
    )
    out = s.join(c, how="left").reset_index()
    out["penalty"] = out["constrained_acc"] - out["short_acc"]
    out["task"] = TASK
    return out


def mass_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    per_item = _per_item(sf) if sf is not None else None
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
    per_item = _per_item(sf) if sf is not None else None
    if sf is None or per_item is None:
        return None
    mass = per_item.set_index("item_id")["masked_mass"]
    rows: list[dict[str, Any]] = []
    for language in _languages(sf):
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


# -- second language ----------------------------------------------------------------------------------------

LANGUAGE_COLUMNS = [
    "task",
    "language_1",
    "language_2",
    "item_type",
    "n_items",
    "n_seeds",
    "n_items_dropped",
    "n_positions_only_1",
    "n_positions_only_2",
    "S",
    "b",
    "c",
    "d_paired",
    "d_paired_low",
    "d_paired_high",
    "n_replicates_undefined",
    "short_acc_1",
    "short_acc_2",
    "delta_mask_1",
    "delta_mask_2",
    "delta_mask_diff",
    "delta_mask_diff_low",
    "delta_mask_diff_high",
    "delta_length_diff",
    "delta_length_diff_low",
    "delta_length_diff_high",
    "delta_total_diff",
    "delta_total_diff_low",
    "delta_total_diff_high",
]


def d_paired_cells(short_1: Matrix, con_1: Matrix, short_2: Matrix, con_2: Matrix) -> dict[str, Matrix]:
    """The indicator matrices of D_paired: S (both languages right under short), b (only language 2 lost under
    the constraint), c (only language 1 lost). D_paired = (sum b - sum c) / sum S."""
    s = (short_1 == 1.0) & (short_2 == 1.0)
    b = s & (con_1 == 1.0) & (con_2 == 0.0)
    c = s & (con_1 == 0.0) & (con_2 == 1.0)
    return {"S": s.astype(float), "b": b.astype(float), "c": c.astype(float)}


def d_paired_interval(cells: dict[str, Matrix], n_resamples: int, seed: int,
                      resampling: Resampling = DEFAULT_RESAMPLING) -> tuple[float, float, float, int]:
    """(D_paired, 95% low, high, replicates where S was empty) from the :func:`d_paired_cells` matrices (items x
    seeds), with the paired bootstrap of the ratio (b - c) / S: every replicate resamples the same items (and
    seeds) in all three."""
    s, b, c = (float(cells[k].sum()) for k in ("S", "b", "c"))
    d = (b - c) / s if s else NAN
    reps = bootstrap_replicates({k: cells[k] for k in ("S", "b", "c")}, n_resamples, seed, resampling)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (reps["b"] - reps["c"]) / reps["S"]
    r[reps["S"] == 0] = np.nan
    low, high = _quantiles(r)
    return d, low, high, int(np.isnan(r).sum())


def _length_total_diffs(sf: pd.DataFrame, first: str, second: str, kind: str, common: list[int],
                        n_resamples: int, seed: int) -> dict[str, float]:
    """Delta(language 2) - Delta(language 1) of delta_length and delta_total (paper 002 reports all three
    contrasts' language differences), on the common positions scored in all six cells, one paired draw."""
    mats: dict[str, Matrix] = {}
    for tag, lang in (("1", first), ("2", second)):
        for cond in CONDITIONS:
            matrix, positions, _ = _matrix(sf, lang, kind, cond)
            mats[f"{cond}_{tag}"] = matrix[[positions.index(q) for q in common]]
    clean, _ = complete_cases(*mats.values())
    m = dict(zip(mats, clean, strict=True))
    out: dict[str, float] = {}
    if m["free_1"].shape[0] == 0:
        return out
    reps = bootstrap_replicates(m, n_resamples, seed)
    for name in ("delta_length", "delta_total"):
        a, b = CONTRASTS[name]
        point = float(m[f"{a}_2"].mean() - m[f"{b}_2"].mean() - (m[f"{a}_1"].mean() - m[f"{b}_1"].mean()))
        low, high = _quantiles((reps[f"{a}_2"] - reps[f"{b}_2"]) - (reps[f"{a}_1"] - reps[f"{b}_1"]))
        out.update({f"{name}_diff": point, f"{name}_diff_low": low, f"{name}_diff_high": high})
    return out


def language_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    langs = _languages(sf)
    if len(langs) < 2 or not {"short", "constrained"} <= set(sf["condition"]):
        return None
    first = langs[0]
    has_free = "free" in set(sf["condition"])
    rows: list[dict[str, Any]] = []
    for second in langs[1:]:
        for kind in ITEM_TYPES:
            mats: dict[str, Matrix] = {}
            positions: dict[str, list[int]] = {}
            seeds: dict[str, list[int]] = {}
            for tag, lang in (("1", first), ("2", second)):
                for cond in ("short", "constrained"):
                    mats[f"{cond}_{tag}"], positions[tag], seeds[tag] = _matrix(sf, lang, kind, cond)
            if not positions["1"] and not positions["2"]:
                continue
            if seeds["1"] != seeds["2"]:
                raise DataError(
                    f"metatool: languages {first} and {second} were run with different seeds for {kind} "
                    f"items; D_paired needs both languages on the same seeds"
                )
            # A translation may leave positions out (recorded in the manifest): pair the positions both cover.
            common = sorted(set(positions["1"]) & set(positions["2"]))
            for tag in ("1", "2"):
                keep = [positions[tag].index(q) for q in common]
                for cond in ("short", "constrained"):
                    mats[f"{cond}_{tag}"] = mats[f"{cond}_{tag}"][keep]
            only = {tag: len(set(positions[tag]) - set(common)) for tag in ("1", "2")}
            names = list(mats)
            clean, dropped = complete_cases(*mats.values())
            m = dict(zip(names, clean, strict=True))
            cells = {
                **d_paired_cells(m["short_1"], m["constrained_1"], m["short_2"], m["constrained_2"]),
                **m,
            }
            n_items, n_seeds = cells["S"].shape
            row: dict[str, Any] = {
                "task": TASK,
                "language_1": first,
                "language_2": second,
                "item_type": kind,
                "n_items": n_items,
                "n_seeds": n_seeds,
                "n_items_dropped": dropped,
                "n_positions_only_1": only["1"],
                "n_positions_only_2": only["2"],
            }
            s_sum, b_sum, c_sum = (int(cells[k].sum()) for k in ("S", "b", "c"))
            row.update(S=s_sum, b=b_sum, c=c_sum, d_paired=(b_sum - c_sum) / s_sum if s_sum else NAN)
            if n_items:
                _, row["d_paired_low"], row["d_paired_high"], row["n_replicates_undefined"] = d_paired_interval(
                    cells, n_resamples, seed)
                reps = bootstrap_replicates(cells, n_resamples, seed)
                dm1 = reps["constrained_1"] - reps["short_1"]
                dm2 = reps["constrained_2"] - reps["short_2"]
                row["delta_mask_diff_low"], row["delta_mask_diff_high"] = _quantiles(dm2 - dm1)
                row["short_acc_1"], row["short_acc_2"] = (
                    float(m["short_1"].mean()),
                    float(m["short_2"].mean()),
                )
                row["delta_mask_1"] = float(m["constrained_1"].mean() - m["short_1"].mean())
                row["delta_mask_2"] = float(m["constrained_2"].mean() - m["short_2"].mean())
                row["delta_mask_diff"] = row["delta_mask_2"] - row["delta_mask_1"]
            if n_items and has_free:
                row.update(_length_total_diffs(sf, first, second, kind, common, n_resamples, seed))
            rows.append(row)
    return frame(rows, LANGUAGE_COLUMNS) if rows else None


# -- seeds --------------------------------------------------------------------------------------------------

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


# -- registration -------------------------------------------------------------------------------------------

_BOOT = "95% percentile bootstrap, positions and seeds resampled jointly"

register_analysis(
    Analysis(
        name="abstention_accuracy",
        keys=("task", "language", "strategy"),
        description=(
            "Paper 002 Table 1 (tool abstention, MetaTool Task 2): accuracy on abstention items (gold None) "
            "and on tool-needed items (gold = the listed tool) per language and condition, scored by the "
            "deterministic mention rules (no LLM judge). Beside them, the outcome counts over scored "
            "outputs: D0 = no readable answer (no candidate, no None), D2 = two or more candidates named "
            "(wrong, counted apart), wrong = a readable single wrong answer, order = the gold is present "
            "but refused by the ordering rule. Absolute levels are context only: the design licenses claims "
            "about the differences (abstention_contrasts). pooled_acc = over both item types (paper 002's "
            "pooled table, section 4.1), the items of both types resampled as units."
        ),
        method=_BOOT + "; Wilson on positions where every score is 0 or every score is 1 (a bootstrap point there)",
        bootstrap=True,
        compute=accuracy_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_contrasts",
        keys=("task", "language", "item_type", "contrast"),
        description=(
            "Paper 002 Table 3: delta_mask = constrained - short (the grammar alone), delta_length = short - "
            "free (the stop at the first newline), delta_total = constrained - free (what a two-condition "
            "design reports), per language and item type, on the positions scored in all three conditions. "
            "Every replicate draws one set of positions and seeds for all three cells, so delta_total = "
            "delta_mask + delta_length within each replicate (the interval ends need not add)."
        ),
        method=_BOOT + ", paired across cells; where every position differs alike (e.g. no position differs) "
        "the Wilson boundary interval (formtax.stats.paired_boundary_interval), as the paired table",
        bootstrap=True,
        compute=contrasts_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_transitions",
        keys=("task", "language", "item_type", "direction", "short_category"),
        description=(
            "Over (position, seed) pairs scored under short and constrained: for the outputs the constraint "
            "turned from wrong to right, what the short output had been (D0 = no readable answer, wrong = a "
            "readable wrong answer, D2 = several candidates, order = correct but refused by the ordering "
            "rule); and how many it turned from right to wrong. share = the category's share of its "
            "direction; n_short_abstained = how many of those short outputs contained None. Repair shows as "
            "D0 dominating wrong_to_right."
        ),
        method="none (counts)",
        bootstrap=False,
        compute=transitions_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_mass",
        keys=("task", "item_id"),
        description=(
            "Per item, from the short condition's first token (no mask applied): masked_mass = the exact "
            "probability outside the tokens that can begin an allowed answer (each candidate name or None, "
            "bare or space-prefixed); masked_mass_topk = the same summed over the top-20 tokens only, the "
            "lower bound a server returning top-20 log-probs would give, with topk_coverage = the mass of "
            "those 20; grammar_masked_mass = the mass outside the grammar engine's allowed first tokens, "
            "recorded by the constrained condition on the same prompt; penalty = constrained - short "
            "accuracy (mean over seeds)."
        ),
        method="none (per-item values; means over seeds)",
        bootstrap=False,
        compute=mass_table,
        figure=mass_figure,
        figure_caption=(
            "Per-item penalty (constrained - short accuracy) against the short condition's first-token "
            "masked_mass; colour = item type, marker = language; small vertical jitter."
        ),
    )
)
register_analysis(
    Analysis(
        name="abstention_mass_fit",
        keys=("task", "language", "item_type"),
        description=(
            "EXPLORATORY, not registered: logistic fit (statsmodels) of P(flip) on masked_mass, over the "
            "outputs short got right; flip = the constrained output is wrong. Units are items when every "
            "item's outcome is the same across seeds (seeds would only repeat it), otherwise item x seed. "
            "status other than ok means the maximum-likelihood fit does not exist (e.g. no flips). The "
            "coverage columns summarise the top-20 bound: bound_gap = exact - top-20 masked mass per item."
        ),
        method="Wald standard errors and p-values from the logistic fit (descriptive)",
        bootstrap=False,
        compute=fit_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_language",
        keys=("task", "language_1", "language_2", "item_type"),
        description=(
            "Second language (query translated, every other prompt byte identical): over (position, seed) "
            "pairs, S = pairs both languages answered correctly under short; b = those only language 2 lost "
            "under the constraint, c = those only language 1 lost; D_paired = (b - c)/|S|. delta_mask_diff = "
            "delta_mask of language 2 - delta_mask of language 1, on the same positions. Replicates with |S| "
            "= 0 are undefined and left out of the interval (n_replicates_undefined). delta_length_diff and "
            "delta_total_diff are the same language differences of the other two contrasts (on the positions "
            "scored in all six cells; empty without the free condition). Only positions both "
            "languages cover are paired: n_positions_only_1 / _2 count those one language has alone (a "
            "translation's exclusions, each with its reason in the manifest's task_notes)."
        ),
        method=_BOOT + ", the same draw for both languages",
        bootstrap=True,
        compute=language_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_seeds",
        keys=("task", "strategy"),
        description=(
            "Whether outputs differ across decoding seeds: at temperature 0 decoding is greedy and "
            "in-process, so a seed should change nothing; outputs_differ_across_seeds = no confirms it, and "
            "the seed axis of the intervals then only repeats each item (the intervals are those of the "
            "items)."
        ),
        method="none (counts)",
        bootstrap=False,
        compute=seeds_table,
    )
)
