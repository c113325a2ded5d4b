"""D_paired's exact truth and the coverage of its interval (paper 002's second-language statistic).

D_paired = (b - c) / |S| over item x seed cells: S = both languages right under short, b = of those, only
language 2 wrong under the constraint, c = only language 1 wrong. It is a joint statistic of four requests per
cell, so its estimand depends on how those requests are coupled; formtax draws every request independently (its
default seeding, ``runner.execute.sampler_seed``), under which ``E[b - c] / E[S]`` per item is

    s1 s2 (c1 (1 - c2) - (1 - c1) c2) / (s1 s2) = c1 - c2,   weighted by s1 s2 across items,

with s, c the exact probabilities of a right answer under short and constrained. The report's estimator, the
ratio of sums, is consistent for the ratio of the population sums, ``sum_i s1 s2 (c1 - c2) / sum_i s1 s2``; that
is the truth here. The coverage study draws synthetic studies (pairs of items with replacement, seeds
independent) from those probabilities and runs the report's own interval, ``studies.abstention.language.d_paired_interval``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from formtax.errors import ConfigError
from formtax.planted.truth import GridTruth
from formtax.stats import Resampling


@dataclass(frozen=True)
class PairTruth:
    pair: str
    s1: float
    c1: float
    s2: float
    c2: float


def pair_truths(g: GridTruth, short: str = "short", constrained: str = "constrained") -> list[PairTruth]:
    """Per pair of items (item meta ``pair`` and ``language`` ``l1`` / ``l2``), the exact P(right) of each cell."""
    p: dict[tuple[str, str, str], float] = {}
    for r in g.requests:
        meta = r.planned.item.meta
        if "pair" not in meta or "language" not in meta or r.planned.spec.spec not in (short, constrained):
            continue
        if r.p_unscored > 0.0:
            raise ConfigError(f"item {r.planned.item.id}: D_paired's truth here assumes every request is scored")
        p[(str(meta["pair"]), str(meta["language"]), r.planned.spec.spec)] = r.expect("strict")
    pairs = sorted({k[0] for k in p})
    out = []
    for pair in pairs:
        try:
            out.append(PairTruth(pair, p[(pair, "l1", short)], p[(pair, "l1", constrained)],
                                 p[(pair, "l2", short)], p[(pair, "l2", constrained)]))
        except KeyError as e:
            raise ConfigError(f"item pair {pair!r} lacks the cell {e.args[0][1:]} (two languages x short and "
                              "constrained are needed)") from None
    if not out:
        raise ConfigError("no item pairs: D_paired needs items with meta 'pair' and 'language' (l1 / l2), e.g. "
                          "the abstention-languages world")
    return out


def d_paired_truth(pairs: list[PairTruth]) -> float:
    w = np.array([t.s1 * t.s2 for t in pairs])
    d = np.array([t.c1 - t.c2 for t in pairs])
    return float((w * d).sum() / w.sum()) if w.sum() > 0 else math.nan


@dataclass
class DPairedCoverage:
    truth: float
    n_studies: int
    by_rule: dict[str, dict[str, float]]  # rule -> coverage, n (studies with an interval), mean_width


def d_paired_coverage(pairs: list[PairTruth], n_studies: int = 400, n_items: int = 40, n_seeds: int = 3,
                      n_resamples: int = 2000, seed: int = 0,
                      resamplings: tuple[Resampling, ...] = (Resampling.CORRECTED, Resampling.ITEMS_AND_SEEDS,
                                                         Resampling.ITEMS),
                      progress: Callable[[int], None] | None = None) -> DPairedCoverage:
    """Coverage of the report's D_paired interval over synthetic studies (module docstring)."""
    from formtax.studies.abstention.language import d_paired_cells, d_paired_interval

    truth = d_paired_truth(pairs)
    rng = np.random.default_rng(seed)
    probs = np.array([[t.s1, t.c1, t.s2, t.c2] for t in pairs])
    hits: dict[str, list[float]] = {rs.value: [] for rs in resamplings}
    widths: dict[str, list[float]] = {rs.value: [] for rs in resamplings}
    for k in range(n_studies):
        pick = rng.integers(0, len(pairs), size=n_items)
        draws = (rng.random((n_items, n_seeds, 4)) < probs[pick][:, None, :]).astype(float)
        cells = d_paired_cells(draws[..., 0], draws[..., 1], draws[..., 2], draws[..., 3])
        for rs in resamplings:
            _, low, high, _ = d_paired_interval(cells, n_resamples, k, rs)
            if math.isnan(low) or math.isnan(high):
                continue
            hits[rs.value].append(float(low - 1e-9 <= truth <= high + 1e-9))
            widths[rs.value].append(high - low)
        if progress:
            progress(k + 1)
    by_rule = {rule: {"coverage": float(np.mean(h)) if h else math.nan, "n": float(len(h)),
                      "mean_width": float(np.mean(widths[rule])) if h else math.nan} for rule, h in hits.items()}
    return DPairedCoverage(truth, n_studies, by_rule)


def d_paired_estimate(df: object, world_items: dict[str, dict[str, object]], n_resamples: int,
                      short: str = "short", constrained: str = "constrained") -> tuple[float, float, float]:
    """D_paired and its interval from a run's records frame (``report.load.load_records``), pairs x seeds, by the
    report's own functions; NaN when the run lacks a cell."""
    import pandas as pd

    from formtax.studies.abstention.language import d_paired_cells, d_paired_interval

    assert isinstance(df, pd.DataFrame)
    nan = (math.nan, math.nan, math.nan)
    sub = df[df["strategy"].isin([short, constrained]) & df["scored"]]
    if sub.empty:
        return nan
    pairs = sorted({str(m["pair"]) for m in world_items.values() if "pair" in m})
    seeds = sorted(set(sub["seed"]))
    pi, si = {p: i for i, p in enumerate(pairs)}, {s: j for j, s in enumerate(seeds)}
    mats = {(lang, st): np.full((len(pairs), len(seeds)), np.nan) for lang in ("l1", "l2") for st in (short, constrained)}
    for item, st, seed, v in zip(sub["item_id"], sub["strategy"], sub["seed"], sub["score_strict"], strict=True):
        meta = world_items.get(str(item), {})
        if "pair" in meta:
            mats[(str(meta["language"]), st)][pi[str(meta["pair"])], si[seed]] = float(v)
    stack = np.stack(list(mats.values()))
    keep = ~np.isnan(stack).any(axis=(0, 2))
    if not keep.any():
        return nan
    m = {k: v[keep] for k, v in mats.items()}
    cells = d_paired_cells(m[("l1", short)], m[("l1", constrained)], m[("l2", short)], m[("l2", constrained)])
    d, low, high, _ = d_paired_interval(cells, n_resamples, 0)
    return d, low, high
