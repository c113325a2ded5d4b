"""The small-study calibration (issue 49): coverage of the report's intervals, and the rate of false
"distinguishable" findings, at 3, 5, 8, 16 and 40 items with 1 and 3 runs.

It uses *item worlds*: populations of 200 items, each with its own chance of being right under the strategy and
under the baseline. Draws are independent per item and run, as the planted backend's sampled requests are. The
truths are the population means, ``mean(p_strategy)`` and ``mean(p_strategy - p_baseline)``. They come from the
world's definition and never from the code under test. The worlds cover zero effects (equal chances, even or
spread across items), boundary accuracies (0, 0.02, 0.98, 1) and real effects. The intervals are the report's own
(:mod:`formtax.stats.rules`). A finding calls a difference distinguishable when the interval excludes 0 *and* the
per-item paired test rejects at 0.05 (:mod:`formtax.report.findings`).

The built-in planted worlds run through :func:`formtax.planted.calibrate.coverage_study` at the same sizes
(``bench/calibration.py --small-n``). This module adds the boundary and zero-effect worlds, which a planted grid
reaches only at great cost, and it is fast enough for a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from formtax.stats import exact
from formtax.stats.paired_test import paired_item_test
from formtax.stats.rules import mean_interval, paired_interval

ALPHA = 0.05
N_POPULATION = 200
SIZES = (3, 5, 8, 16, 40)
RUNS = (1, 3)


@dataclass(frozen=True)
class ItemWorld:
    """Per-item chances of a right answer under the strategy (``p``) and the baseline (``p_base``)."""

    name: str
    p: np.ndarray
    p_base: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(self.p.mean())

    @property
    def difference(self) -> float:
        return float((self.p - self.p_base).mean())

    @property
    def zero_effect(self) -> bool:
        return bool(np.array_equal(self.p, self.p_base))


def _const(v: float) -> np.ndarray:
    return np.full(N_POPULATION, v)


def _spread(lo: float, hi: float) -> np.ndarray:
    return np.linspace(lo, hi, N_POPULATION)


WORLDS: dict[str, Callable[[], ItemWorld]] = {
    "zero, every item 0.5": lambda: ItemWorld("zero, every item 0.5", _const(0.5), _const(0.5)),
    "zero, items 0.05-0.95": lambda: ItemWorld("zero, items 0.05-0.95", _spread(0.05, 0.95), _spread(0.05, 0.95)),
    "zero at 0": lambda: ItemWorld("zero at 0", _const(0.0), _const(0.0)),
    "zero at 1": lambda: ItemWorld("zero at 1", _const(1.0), _const(1.0)),
    "0.02 vs 0": lambda: ItemWorld("0.02 vs 0", _const(0.02), _const(0.0)),
    "0.98 vs 1": lambda: ItemWorld("0.98 vs 1", _const(0.98), _const(1.0)),
    "+0.2, items 0.1-0.7": lambda: ItemWorld("+0.2, items 0.1-0.7", _spread(0.3, 0.9), _spread(0.1, 0.7)),
    "0.75 vs 0.25": lambda: ItemWorld("0.75 vs 0.25", _const(0.75), _const(0.25)),
}
"""The item worlds: zero effects, boundary accuracies (0, 0.02, 0.98, 1), real effects."""


@dataclass
class SmallNResult:
    """One world at one size: coverage of the cell (strategy) and paired intervals, the share of intervals that
    exclude 0, the share of findings that call the difference distinguishable, and mean widths."""

    world: str
    n_items: int
    n_runs: int
    studies: int
    rule: str
    cell_coverage: float
    paired_coverage: float
    excludes_zero: float
    distinguishable: float
    cell_width: float
    paired_width: float
    zero_effect: bool


def study(world: ItemWorld, n_items: int, n_runs: int, studies: int, n_resamples: int = 1000, seed: int = 0,
          exact_below: int = exact.SMALL_ITEMS) -> SmallNResult:
    """``studies`` synthetic studies of ``n_items`` items drawn from the world, ``n_runs`` runs each, through the
    report's interval rule (``exact_below=0``: the bootstrap and boundary rules alone, as before issue 49)."""
    rng = np.random.default_rng(seed)
    cell_hits = paired_hits = excl = found = 0
    cell_w = paired_w = 0.0
    for k in range(studies):
        idx = rng.integers(0, N_POPULATION, size=n_items)
        a = (rng.random((n_items, n_runs)) < world.p[idx, None]).astype(float)
        b = (rng.random((n_items, n_runs)) < world.p_base[idx, None]).astype(float)
        cell = mean_interval(a, n_resamples, k, exact_below=exact_below)
        pair = paired_interval(a, b, n_resamples, k, exact_below=exact_below)
        cell_hits += cell.low - 1e-9 <= world.accuracy <= cell.high + 1e-9
        paired_hits += pair.low - 1e-9 <= world.difference <= pair.high + 1e-9
        cell_w += cell.width
        paired_w += pair.width
        outside = pair.low > 0 or pair.high < 0
        excl += outside
        found += outside and paired_item_test(a, b, seed=k).p_value < ALPHA
    return SmallNResult(world.name, n_items, n_runs, studies, "report" if exact_below else "bootstrap only",
                        cell_hits / studies, paired_hits / studies, excl / studies, found / studies,
                        cell_w / studies, paired_w / studies, world.zero_effect)


def grid(studies: int, sizes: tuple[int, ...] = SIZES, runs: tuple[int, ...] = RUNS, n_resamples: int = 1000,
         compare_bootstrap: bool = True, progress: Callable[[], None] | None = None) -> list[SmallNResult]:
    """Every item world at every size, under the report's rule (and the bootstrap alone, for comparison)."""
    out = []
    for make in WORLDS.values():
        w = make()
        for n in sizes:
            for r in runs:
                out.append(study(w, n, r, studies, n_resamples))
                if compare_bootstrap and n < exact.SMALL_ITEMS:
                    out.append(study(w, n, r, studies, n_resamples, exact_below=0))
                if progress:
                    progress()
    return out


def render(results: list[SmallNResult]) -> str:
    """Markdown tables: coverage per world and size (report rule, bootstrap alone in brackets), then false
    findings on the zero-effect worlds."""
    by = {(r.world, r.n_items, r.n_runs, r.rule): r for r in results}
    sizes = sorted({(r.n_items, r.n_runs) for r in results})
    head = "| world | quantity | " + " | ".join(f"{n}x{s}" for n, s in sizes) + " |"
    sep = "|---|---|" + "---|" * len(sizes)
    lines = [head, sep]

    def cell(world: str, n: int, s: int, attr: str) -> str:
        r = by.get((world, n, s, "report"))
        if r is None:
            return ""
        text = f"{getattr(r, attr):.3f}"
        b = by.get((world, n, s, "bootstrap only"))
        return text + (f" ({getattr(b, attr):.3f})" if b else "")

    for world in dict.fromkeys(r.world for r in results):
        for attr, label in (("cell_coverage", "cell coverage"), ("paired_coverage", "paired coverage")):
            lines.append(f"| {world} | {label} | " + " | ".join(cell(world, n, s, attr) for n, s in sizes) + " |")
    lines += ["", "False findings (interval excludes 0 and the paired test rejects at 0.05) on the zero-effect "
              "worlds; the share of intervals that exclude 0 in brackets:", "", head, sep]
    for world in dict.fromkeys(r.world for r in results if r.zero_effect):
        vals = []
        for n, s in sizes:
            r = by.get((world, n, s, "report"))
            vals.append(f"{r.distinguishable:.3f} ({r.excludes_zero:.3f})" if r else "")
        lines.append(f"| {world} | false findings | " + " | ".join(vals) + " |")
    return "\n".join(lines)
