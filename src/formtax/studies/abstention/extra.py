"""Paper 002's remaining analyses (its sections F, H, H.1 and appendix M), registered with the report beside the
tables of :mod:`formtax.studies.abstention.tables`, whose study frame, matrices and resampling rule they share.

- ``abstention_retention``: the retention ratio, acc(minuend) / acc(subtrahend) for each of the three contrasts
  (delta_mask's is constrained / short: the share of the unconstrained accuracy the grammar keeps), and for a
  second language the difference of retention ratios from the base language on the same positions. Paper 002
  reports it beside D_paired and the absolute difference of differences (section F) and reports their
  disagreement rather than choosing one; the report does the same by putting the three side by side.
- ``abstention_breakpoint``: the masked-mass breakpoint (section H): the per-item penalty (constrained - short
  accuracy) against the short condition's first-token masked mass, fitted as a hinge that is flat below a
  breakpoint tau and linear above it, penalty = a + b * max(0, masked_mass - tau); tau with its percentile
  bootstrap interval over items (the paper's 0.480 [0.320, 0.520]).
- ``abstention_naming``: the free-to-constrained tool-naming shift (appendix M): the share of outputs that name
  a tool at all, and that name the first candidate offered, per condition, and their paired shifts.
- ``abstention_cells``: the cell-level regression of section H.1: delta_mask on abstention items regressed on
  the short condition's abstention accuracy, one point per (model, language) cell, over every model of a
  pooled report. The paper's guard withholds the coefficients unless there are at least five cells and five
  models per predictor ("a line through a handful of points that share a family is a picture rather than a
  finding"); the cells are listed either way.

Choices the paper leaves open, ours: the hinge's breakpoint is found by profile least squares over a grid of
0.01 steps on [0, 1] (for fixed tau the fit is ordinary least squares; the smallest residual sum of squares wins,
the lowest tau on ties), with at least :data:`MIN_SIDE` items on each side, written by hand because no
maintained library fits a hinge whose lower segment is flat (statsmodels has no segmented regression, and
Muggeo's iterative estimator in ``piecewise-regression`` fits a free slope on both sides); the cell
regression's interval resamples cells and then one seed inside each drawn cell (the paper's rule), its point
estimate, standard error and p-value are statsmodels OLS.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm

from formtax.report.analyses import MODEL_SEP, Analysis, per_model_frames, register_analysis
from formtax.report.matrices import frame
from formtax.stats import (
    bootstrap_replicates,
    complete_cases,
    corrected_replicates,
    linear_replicates,
    ratio_parts,
)
from formtax.studies.abstention.frame import (
    CONDITIONS,
    CONTRASTS,
    ITEM_TYPES,
    TASK,
    Matrix,
    aligned_cells,
    cell_matrix,
    per_item_frame,
    percentile_bounds,
    study_frame,
    study_languages,
)

NAN = math.nan
MIN_SIDE = 3  # items the hinge needs on each side of its breakpoint (ours)
GRID = np.round(np.linspace(0.0, 1.0, 101), 2)  # candidate breakpoints (ours: 0.01 steps)
GUARD = 5  # paper 002 H.1: five cells and five models per predictor before a coefficient is reported


def _present(sf: pd.DataFrame, language: str) -> tuple[str, ...]:
    return tuple(c for c in CONDITIONS if ((sf["language"] == language) & (sf["condition"] == c)).any())


def _ratio(num: Matrix | float, den: Matrix | float) -> Any:
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.asarray(num, dtype=float) / np.asarray(den, dtype=float)
    return np.where(np.asarray(den) == 0, np.nan, r)


# -- retention ----------------------------------------------------------------------------------------------

RETENTION_COLUMNS = [
    "task", "language", "item_type", "contrast", "minuend", "subtrahend", "acc_minuend", "acc_subtrahend",
    "retention", "low", "high", "n_replicates_undefined", "base_language", "retention_diff", "diff_low",
    "diff_high", "n_items", "n_seeds", "n_items_dropped",
]  # fmt: skip


def _pair_languages(sf: pd.DataFrame, first: str, second: str, kind: str, a: str, b: str) -> dict[str, Matrix] | None:
    """The minuend and subtrahend matrices of both languages on the positions both cover, complete in all four
    (None when the seeds differ or nothing is left)."""
    mats: dict[str, Matrix] = {}
    positions: dict[str, list[int]] = {}
    seeds: dict[str, list[int]] = {}
    for tag, lang in (("1", first), ("2", second)):
        for cond in (a, b):
            mats[f"{cond}_{tag}"], positions[tag], seeds[tag] = cell_matrix(sf, lang, kind, cond)
    if seeds["1"] != seeds["2"]:
        return None
    common = sorted(set(positions["1"]) & set(positions["2"]))
    for key in mats:
        tag = key[-1]
        mats[key] = mats[key][[positions[tag].index(q) for q in common]]
    if not common or not seeds["1"]:
        return None
    clean, _ = complete_cases(*mats.values())
    out = dict(zip(mats, clean, strict=True))
    return out if out[f"{a}_1"].shape[0] else None


def retention_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    langs = study_languages(sf)
    rows: list[dict[str, Any]] = []
    for language in langs:
        present = _present(sf, language)
        if len(present) < 2:
            continue
        for kind in ITEM_TYPES:
            cells, dropped = aligned_cells(sf, language, kind, present)
            shape = next(iter(cells.values())).shape
            reps = bootstrap_replicates(cells, n_resamples, seed) if shape[0] and shape[1] else {}
            for name, (a, b) in CONTRASTS.items():
                if a not in cells or b not in cells:
                    continue
                row: dict[str, Any] = {
                    "task": TASK, "language": language, "item_type": kind, "contrast": name, "minuend": a,
                    "subtrahend": b, "n_items": shape[0], "n_seeds": shape[1], "n_items_dropped": dropped,
                    "base_language": langs[0],
                }  # fmt: skip
                if reps:
                    row["acc_minuend"], row["acc_subtrahend"] = float(cells[a].mean()), float(cells[b].mean())
                    row["retention"] = float(_ratio(row["acc_minuend"], row["acc_subtrahend"]))
                    raw, est, infl, lin = ratio_parts(reps[a], reps[b], cells[a], cells[b])
                    r = corrected_replicates(raw, est, infl, lin) if math.isfinite(est) else raw
                    row["low"], row["high"] = percentile_bounds(r)
                    row["n_replicates_undefined"] = int(np.isnan(r).sum())
                if language != langs[0]:
                    both = _pair_languages(sf, langs[0], language, kind, a, b)
                    if both is not None:
                        point = _ratio(both[f"{a}_2"].mean(), both[f"{b}_2"].mean()) - _ratio(
                            both[f"{a}_1"].mean(), both[f"{b}_1"].mean())
                        rr = bootstrap_replicates(both, n_resamples, seed)
                        p2 = ratio_parts(rr[f"{a}_2"], rr[f"{b}_2"], both[f"{a}_2"], both[f"{b}_2"])
                        p1 = ratio_parts(rr[f"{a}_1"], rr[f"{b}_1"], both[f"{a}_1"], both[f"{b}_1"])
                        diff = p2[0] - p1[0]
                        if math.isfinite(p2[1] - p1[1]):
                            diff = corrected_replicates(diff, p2[1] - p1[1], p2[2] - p1[2], p2[3] - p1[3])
                        row["retention_diff"] = float(point)
                        row["diff_low"], row["diff_high"] = percentile_bounds(diff)
                rows.append(row)
    return frame(rows, RETENTION_COLUMNS) if rows else None


# -- masked-mass breakpoint ---------------------------------------------------------------------------------

BREAKPOINT_COLUMNS = [
    "task", "language", "item_type", "allowed_set", "n_items", "breakpoint", "low", "high", "n_replicates_undefined",
    "level_below", "slope_above", "sse_hinge", "sse_line", "status",
]  # fmt: skip


def hinge_fit(x: Matrix, y: Matrix) -> tuple[float, float, float, float] | None:
    """(tau, a, b, sse) of penalty = a + b * max(0, x - tau) by profile least squares over :data:`GRID` (see the
    module docstring); None when no grid point leaves :data:`MIN_SIDE` items on each side."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    below = (x[None, :] <= GRID[:, None]).sum(axis=1)
    ok = (below >= MIN_SIDE) & (len(x) - below >= MIN_SIDE)
    if not ok.any():
        return None
    taus = GRID[ok]
    h = np.maximum(0.0, x[None, :] - taus[:, None])  # [grid, n]
    hm = h.mean(axis=1, keepdims=True)
    ym = y.mean()
    var = ((h - hm) ** 2).sum(axis=1)
    b = ((h - hm) * (y - ym)[None, :]).sum(axis=1) / var
    a = ym - b * hm[:, 0]
    sse = ((y[None, :] - a[:, None] - b[:, None] * h) ** 2).sum(axis=1)
    k = int(np.argmin(sse))
    return float(taus[k]), float(a[k]), float(b[k]), float(sse[k])


ALLOWED_SETS = {"encoded": "masked_mass", "prefixes": "masked_mass_prefixes"}
"""The breakpoint under the paper's allowed set (each option's first encoded token, bare and space-prefixed) and
under the wider set of every prefix token (strategies/firstmass.py): the sensitivity to that choice."""


def _breakpoint_row(items: pd.DataFrame, language: str, kind: str, n_resamples: int, seed: int,
                    allowed_set: str = "encoded") -> dict[str, Any]:
    items = items[items[ALLOWED_SETS[allowed_set]].notna()]
    x = items[ALLOWED_SETS[allowed_set]].to_numpy(dtype=float)
    y = items["penalty"].to_numpy(dtype=float)
    row: dict[str, Any] = {"task": TASK, "language": language, "item_type": kind, "allowed_set": allowed_set,
                           "n_items": len(x)}
    fit = hinge_fit(x, y)
    if fit is None:
        return {**row, "status": f"too_few (needs {2 * MIN_SIDE} items with {MIN_SIDE} on each side of a breakpoint)"}
    tau, a, b, sse = fit
    line = np.polyfit(x, y, 1) if np.ptp(x) > 0 else None
    row.update(breakpoint=tau, level_below=a, slope_above=b, sse_hinge=sse, status="ok",
               sse_line=float(((y - np.polyval(line, x)) ** 2).sum()) if line is not None else NAN)
    rng = np.random.default_rng(seed)
    taus = np.full(n_resamples, np.nan)
    for r in range(n_resamples):
        idx = rng.integers(0, len(x), len(x))
        f = hinge_fit(x[idx], y[idx])
        if f is not None:
            taus[r] = f[0]
    row["low"], row["high"] = percentile_bounds(taus)
    row["n_replicates_undefined"] = int(np.isnan(taus).sum())
    return row


def breakpoint_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    per_item = per_item_frame(sf) if sf is not None else None
    if sf is None or per_item is None:
        return None
    per_item = per_item[per_item["masked_mass"].notna() & per_item["penalty"].notna()]
    rows: list[dict[str, Any]] = []
    langs = study_languages(sf)
    for kind in ITEM_TYPES:
        of_kind = per_item[per_item["item_type"] == kind]
        if of_kind.empty:
            continue
        for language in (["all"] if len(langs) > 1 else []) + langs:
            items = of_kind if language == "all" else of_kind[of_kind["language"] == language]
            for allowed_set, column in ALLOWED_SETS.items():
                if not items.empty and column in items.columns and items[column].notna().any():
                    rows.append(_breakpoint_row(items, language, kind, n_resamples, seed, allowed_set))
    return frame(rows, BREAKPOINT_COLUMNS) if rows else None


# -- tool-naming shift --------------------------------------------------------------------------------------

MEASURES = {"names_a_tool": "names_tool", "names_first_candidate": "names_first"}
NAMING_COLUMNS = [
    "task", "language", "item_type", "measure", "free", "short", "constrained", "shift_total", "shift_total_low",
    "shift_total_high", "shift_mask", "shift_mask_low", "shift_mask_high", "n_items", "n_seeds",
    "n_items_dropped",
]  # fmt: skip


def naming_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    rows: list[dict[str, Any]] = []
    for language in study_languages(sf):
        present = _present(sf, language)
        if len(present) < 2:
            continue
        for kind in ITEM_TYPES:
            for measure, column in MEASURES.items():
                mats = [cell_matrix(sf, language, kind, c, column)[0] for c in present]
                if any(0 in np.shape(m) for m in mats):
                    continue
                clean, dropped = complete_cases(*mats)
                cells = dict(zip(present, clean, strict=True))
                n_items, n_seeds = clean[0].shape
                row: dict[str, Any] = {"task": TASK, "language": language, "item_type": kind, "measure": measure,
                                       "n_items": n_items, "n_seeds": n_seeds, "n_items_dropped": dropped}
                if n_items and n_seeds:
                    row.update({c: float(m.mean()) for c, m in cells.items()})
                    reps = bootstrap_replicates(cells, n_resamples, seed)
                    for name, (a, b) in (("shift_total", ("constrained", "free")),
                                         ("shift_mask", ("constrained", "short"))):
                        if a in cells and b in cells:
                            row[name] = row[a] - row[b]
                            row[f"{name}_low"], row[f"{name}_high"] = percentile_bounds(
                                linear_replicates(reps, cells, {a: 1.0, b: -1.0}))
                rows.append(row)
    return frame(rows, NAMING_COLUMNS) if rows else None


# -- section H.1: cells ---------------------------------------------------------------------------------------

CELLS_COLUMNS = [
    "task", "model", "language", "row", "n_items", "n_seeds", "short_abstain_acc", "delta_mask", "n_cells",
    "n_models", "intercept", "slope", "slope_se", "slope_p", "slope_low", "slope_high", "status",
]  # fmt: skip


def _cell(sf: pd.DataFrame, language: str) -> tuple[Matrix, Matrix, int] | None:
    """Per seed, (short abstention accuracy, delta_mask) of one (model, language) cell, on the positions
    scored in both conditions, and the number of those positions."""
    if not {"short", "constrained"} <= set(_present(sf, language)):
        return None
    cells, _ = aligned_cells(sf, language, "abstain", ("short", "constrained"))
    short, con = cells["short"], cells["constrained"]
    if not short.shape[0] or not short.shape[1]:
        return None
    s = short.mean(axis=0)
    return s, con.mean(axis=0) - s, int(short.shape[0])


def cells_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    rows: list[dict[str, Any]] = []
    per_seed: list[tuple[Matrix, Matrix]] = []
    models: set[str] = set()
    for sub, relabel in per_model_frames(df):
        sf = study_frame(sub)
        if sf is None:
            continue
        label = relabel.get(TASK, TASK)
        model = label.partition(MODEL_SEP)[2] if relabel else ",".join(sorted({r.model for r in sub["record"]}))
        for language in study_languages(sf):
            cell = _cell(sf, language)
            if cell is None:
                continue
            s, dm, n_items = cell
            per_seed.append((s, dm))
            models.add(model)
            rows.append({"task": label, "model": model, "language": language, "row": "cell", "n_items": n_items,
                         "n_seeds": len(s), "short_abstain_acc": float(s.mean()), "delta_mask": float(dm.mean())})
    if not rows:
        return None
    fit: dict[str, Any] = {"task": TASK, "model": "all", "language": "all", "row": "fit", "n_cells": len(rows),
                           "n_models": len(models)}
    if len(rows) < GUARD or len(models) < GUARD:
        fit["status"] = (f"withheld: {len(rows)} cells, {len(models)} models; the guard asks for {GUARD} cells "
                         f"and {GUARD} models per predictor")
    else:
        x = np.array([r["short_abstain_acc"] for r in rows])
        y = np.array([r["delta_mask"] for r in rows])
        if np.ptp(x) == 0:
            fit["status"] = "degenerate: every cell has the same short accuracy"
        else:
            ols = sm.OLS(y, sm.add_constant(x)).fit()
            fit.update(intercept=float(ols.params[0]), slope=float(ols.params[1]), slope_se=float(ols.bse[1]),
                       slope_p=float(ols.pvalues[1]), status="ok")
            rng = np.random.default_rng(seed)
            slopes = np.full(n_resamples, np.nan)
            for r in range(n_resamples):
                pick = rng.integers(0, len(per_seed), len(per_seed))
                xs, ys = [], []
                for c in pick:
                    s, dm = per_seed[c]
                    j = int(rng.integers(0, len(s)))
                    xs.append(s[j])
                    ys.append(dm[j])
                if np.ptp(xs) > 0:
                    slopes[r] = np.polyfit(xs, ys, 1)[0]
            fit["slope_low"], fit["slope_high"] = percentile_bounds(slopes)
    rows.append(fit)
    return frame(rows, CELLS_COLUMNS)


# -- registration -------------------------------------------------------------------------------------------

_BOOT = "95% percentile bootstrap, positions and seeds resampled jointly"

register_analysis(
    Analysis(
        name="abstention_retention",
        keys=("task", "language", "item_type", "contrast"),
        description=(
            "Paper 002 section F: the retention ratio acc(minuend) / acc(subtrahend) of each contrast "
            "(delta_mask: constrained / short, the share of the unconstrained accuracy the grammar keeps), on "
            "the positions of abstention_contrasts. For a second language, retention_diff = its retention "
            "minus the base language's, on the positions both cover. Read beside D_paired and the difference "
            "of deltas (abstention_language): where the three disagree, that is the finding. Replicates whose "
            "subtrahend accuracy is 0 are undefined and left out (n_replicates_undefined)."
        ),
        method=_BOOT + ", one draw for both cells of a ratio (and both languages of a difference)",
        bootstrap=True,
        compute=retention_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_breakpoint",
        keys=("task", "language", "item_type", "allowed_set"),
        description=(
            "EXPLORATORY (paper 002 section H): the per-item penalty (constrained - short accuracy, mean over "
            "seeds) against the short condition's exact first-token masked_mass, fitted as a hinge, penalty = "
            "level_below + slope_above * max(0, masked_mass - breakpoint): flat below the breakpoint, linear "
            "above. The breakpoint is found by least squares over a grid of 0.01 steps with at least "
            f"{MIN_SIDE} items on each side (ours); sse_line is a straight line's residual sum of squares on the "
            "same items, for comparison. language = all pools the languages. allowed_set: encoded = the paper's "
            "allowed first tokens (each option's first token, bare and space-prefixed); prefixes = every token "
            "whose text begins an option (wider): the two rows show how much that choice moves the breakpoint."
        ),
        method="95% percentile bootstrap over items (the breakpoint refitted in each replicate)",
        bootstrap=True,
        compute=breakpoint_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_naming",
        keys=("task", "language", "item_type", "measure"),
        description=(
            "Paper 002 appendix M, the tool-naming shift: per condition, the share of scored outputs that name "
            "any candidate tool (names_a_tool) and that name the first candidate offered "
            "(names_first_candidate; the gold tool is always first in MetaTool's lists, so on abstention items "
            "this is the pull toward the head of the list); shift_total = constrained - free (the decision "
            "threshold moving toward naming a tool), shift_mask = constrained - short. On the positions "
            "scored in every condition of the language."
        ),
        method=_BOOT + ", paired across conditions",
        bootstrap=True,
        compute=naming_table,
    )
)
register_analysis(
    Analysis(
        name="abstention_cells",
        keys=("task", "language", "row"),
        description=(
            "EXPLORATORY (paper 002 section H.1): delta_mask on abstention items against the short "
            "condition's abstention accuracy it is taken from, one point per (model, language) cell over "
            f"every model of the report. The fit row (statsmodels OLS) is withheld unless there are {GUARD} "
            f"cells and {GUARD} models per predictor, the paper's guard: the cells of one model are one model "
            "measured twice."
        ),
        method="95% percentile bootstrap of the slope, cells resampled and then one seed inside each",
        bootstrap=True,
        compute=cells_table,
        across_models=True,
    )
)
