"""The tool-abstention study's records frame (paper 002): which records form the three conditions, each output
re-scored from its text (:mod:`formtax.studies.abstention.scoring`; a stored score that disagrees with the rule is an
error), and the position x seed matrices and paired bootstrap every table of the study reads.

The unit of every interval is an item position resampled together with the decoding seeds: each bootstrap
replicate draws positions and seeds with replacement, and the same draw is used in every cell a number
compares (paired), so within a replicate delta_total = delta_mask + delta_length exactly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from formtax.errors import DataError
from formtax.records.schema import Record
from formtax.report.matrices import CONFIDENCE
from formtax.stats import (
    bootstrap_replicates,
    complete_cases,
    linear_replicates,
)
from formtax.stats.rules import mean_edge_interval
from formtax.strategies.firstmass import EVENT as FIRST_MASS
from formtax.studies.abstention.data import BASE_LANGUAGE, parse_item_id
from formtax.studies.abstention.scoring import ABSTAIN, Category, score_output

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
            "masked_mass_prefixes": NAN,
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
                row["masked_mass_prefixes"] = float(mass.get("masked_mass_prefixes", NAN))  # absent in older runs
            if condition == "constrained" and rec.masked_mass is not None:
                row["grammar_masked_mass"] = float(rec.masked_mass)
        rows.append(row)
    if not rows:
        return None
    return pd.DataFrame(rows)


def study_languages(sf: pd.DataFrame) -> list[str]:
    langs = sorted(set(sf["language"]))
    return [BASE_LANGUAGE] + [x for x in langs if x != BASE_LANGUAGE] if BASE_LANGUAGE in langs else langs


def cell_matrix(
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


def percentile_bounds(replicates: Matrix) -> tuple[float, float]:
    alpha = 1.0 - CONFIDENCE
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return NAN, NAN
    low, high = np.quantile(finite, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


def mean_interval(matrix: Matrix, n_resamples: int, seed: int) -> tuple[float, float, float]:
    if 0 in np.shape(matrix):  # no items of this type in the run (e.g. only tool items): no number, no error
        return NAN, NAN, NAN
    (clean,), _ = complete_cases(matrix)
    if clean.shape[0] == 0 or clean.shape[1] == 0:
        return NAN, NAN, NAN
    edge = mean_edge_interval(clean, CONFIDENCE)  # the report's rule: exact when small, Wilson at 0 and 1
    if edge is not None:
        return edge.estimate, edge.low, edge.high
    reps = bootstrap_replicates({"m": clean}, n_resamples, seed)
    low, high = percentile_bounds(linear_replicates(reps, {"m": clean}, {"m": 1.0}))
    return float(clean.mean()), low, high


def contrast_replicates(cells: dict[str, Matrix], n_resamples: int, seed: int) -> dict[str, Matrix]:
    """Paired bootstrap replicates of every contrast whose two conditions are in ``cells``.

    ``cells`` are complete matrices of one shape. Each replicate is one draw of positions and seeds, applied
    to every cell (so the crossed draws' delta_total = delta_mask + delta_length exactly), then each contrast's
    spread is corrected to its variance components (stats.linear_replicates, the default rule), one factor per
    contrast: the corrected replicates no longer add up exactly, as interval endpoints never did."""
    means = bootstrap_replicates(cells, n_resamples, seed)
    return {name: linear_replicates(means, cells, {a: 1.0, b: -1.0}) for name, (a, b) in CONTRASTS.items()
            if a in means and b in means}


def aligned_cells(
    sf: pd.DataFrame, language: str, kind: str, conditions: tuple[str, ...]
) -> tuple[dict[str, Matrix], int]:
    mats = [cell_matrix(sf, language, kind, c)[0] for c in conditions]
    if any(0 in np.shape(m) for m in mats):  # no items of this type: empty cells, reported as NaN rows
        return {c: np.zeros((0, 0)) for c in conditions}, 0
    clean, dropped = complete_cases(*mats)
    return dict(zip(conditions, clean, strict=True)), dropped


def per_item_frame(sf: pd.DataFrame) -> pd.DataFrame | None:
    short = sf[(sf["condition"] == "short") & sf["scored"]]
    con = sf[(sf["condition"] == "constrained") & sf["scored"]]
    if short.empty or short["masked_mass"].isna().all():
        return None
    keys = ["item_id", "language", "item_type", "position"]
    s = short.groupby(keys, sort=True).agg(
        n_seeds=("seed", "nunique"),
        masked_mass=("masked_mass", "mean"),
        masked_mass_prefixes=("masked_mass_prefixes", "mean"),
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
