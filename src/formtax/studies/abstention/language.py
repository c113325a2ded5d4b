"""The tool-abstention study's cross-language table (paper 002): ``abstention_language``, D_paired = (b - c)/|S|
and the difference in delta_mask between languages, when a run has a second language. The planted worlds'
exact truths (:mod:`formtax.planted.languages`) run the very same interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from formtax.errors import DataError
from formtax.report.matrices import CONFIDENCE, frame
from formtax.stats import (
    DEFAULT_RESAMPLING,
    Resampling,
    bootstrap_replicates,
    complete_cases,
    corrected_replicates,
    exact,
    linear_replicates,
    ratio_parts,
)
from formtax.studies.abstention.frame import (
    CONDITIONS,
    CONTRASTS,
    ITEM_TYPES,
    NAN,
    TASK,
    Matrix,
    cell_matrix,
    percentile_bounds,
    study_frame,
    study_languages,
)

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
    seeds) in all three. Where fewer than 20 items have a position in S (issue 49: the ratio's bootstrap
    covered 0.40 at 16 items x 1 run) it is the exact box of :mod:`formtax.stats.exact` on the S positions
    instead: given S, D_paired is the paired difference of b and c there, counted in item units."""
    s, b, c = (float(cells[k].sum()) for k in ("S", "b", "c"))
    d = (b - c) / s if s else NAN
    runs = cells["S"].shape[1]
    if s and int((cells["S"].sum(axis=1) > 0).sum()) < exact.SMALL_ITEMS:  # a small study: the exact box on the S positions, in item units
        low, high = exact.box_interval(b / runs, c / runs, s / runs, CONFIDENCE)
        return d, min(low, d), max(high, d), 0
    reps = bootstrap_replicates({k: cells[k] for k in ("S", "b", "c")}, n_resamples, seed, resampling)
    r, _, influence, linear = ratio_parts(reps["b"] - reps["c"], reps["S"], cells["b"] - cells["c"], cells["S"])
    if resampling is Resampling.CORRECTED and s:  # scaled by the linearised ratio's crossed spread
        r = corrected_replicates(r, d, influence, linear)
    low, high = percentile_bounds(r)
    return d, low, high, int(np.isnan(r).sum())


def _length_total_diffs(sf: pd.DataFrame, first: str, second: str, kind: str, common: list[int],
                        n_resamples: int, seed: int) -> dict[str, float]:
    """Delta(language 2) - Delta(language 1) of delta_length and delta_total (paper 002 reports all three
    contrasts' language differences), on the common positions scored in all six cells, one paired draw."""
    mats: dict[str, Matrix] = {}
    for tag, lang in (("1", first), ("2", second)):
        for cond in CONDITIONS:
            matrix, positions, _ = cell_matrix(sf, lang, kind, cond)
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
        low, high = percentile_bounds(linear_replicates(reps, m, {f"{a}_2": 1, f"{b}_2": -1, f"{a}_1": -1,
                                                                  f"{b}_1": 1}))
        out.update({f"{name}_diff": point, f"{name}_diff_low": low, f"{name}_diff_high": high})
    return out


def language_table(df: pd.DataFrame, n_resamples: int, seed: int) -> pd.DataFrame | None:
    sf = study_frame(df)
    if sf is None:
        return None
    langs = study_languages(sf)
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
                    mats[f"{cond}_{tag}"], positions[tag], seeds[tag] = cell_matrix(sf, lang, kind, cond)
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
                dm = linear_replicates(reps, cells, {"constrained_2": 1, "short_2": -1, "constrained_1": -1,
                                                     "short_1": 1})
                row["delta_mask_diff_low"], row["delta_mask_diff_high"] = percentile_bounds(dm)
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
