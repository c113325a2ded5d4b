"""The report's interval rule, in one place: which interval a mean, a paired difference or a set of contrasts
gets. The accuracy, paired, decomposition and ablation tables call these, and the calibration study calls the
same functions, so what it measures is what the report prints.

- Fewer than :data:`~formtax.stats.exact.SMALL_ITEMS` items, scores in [0, 1]: the exact intervals of
  :mod:`formtax.stats.exact`.
- Otherwise a mean where every score is 0 or every score is 1: the Wilson score interval on the items. A
  paired difference where every item differs alike: the Wilson boundary
  (:func:`~formtax.stats.interval.paired_boundary_interval`). In both cases the bootstrap would print a point.
- Otherwise the percentile bootstrap under the chosen :class:`~formtax.stats.bootstrap.Resampling`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from formtax.stats import exact
from formtax.stats.bootstrap import (
    DEFAULT_RESAMPLING,
    Resampling,
    paired_bootstrap_contrasts,
    paired_bootstrap_diff,
    percentile_bootstrap_mean,
)
from formtax.stats.interval import Interval, paired_boundary_interval, wilson_interval

MEAN_RULE = (f"{exact.EXACT_METHOD} below {exact.SMALL_ITEMS} items; Wilson score interval on items where every "
             "score is 0 or every score is 1; percentile-bootstrap elsewhere")
PAIRED_RULE = (f"{exact.EXACT_PAIRED_METHOD} below {exact.SMALL_ITEMS} items; Wilson boundary where every item "
               "differs alike; paired percentile-bootstrap ({resampling}) elsewhere")


def paired_rule(resampling: Resampling) -> str:
    """The ``interval_method`` a paired table states for ``resampling``."""
    return PAIRED_RULE.format(resampling=Resampling(resampling).value)


def mean_interval(matrix: npt.ArrayLike, n_resamples: int, seed: int,
                  resampling: Resampling = DEFAULT_RESAMPLING, confidence: float = 0.95,
                  exact_below: int = exact.SMALL_ITEMS) -> Interval:
    """The interval of a mean score over items and runs (module docstring; ``exact_below=0``: no exact rule)."""
    m = np.asarray(matrix, dtype=float)
    return mean_edge_interval(m, confidence, exact_below) or percentile_bootstrap_mean(
        m, n_resamples=n_resamples, confidence=confidence, seed=seed, resampling=resampling)


def mean_edge_interval(m: np.ndarray, confidence: float = 0.95,
                       exact_below: int = exact.SMALL_ITEMS) -> Interval | None:
    """The mean's interval where the bootstrap does not serve (a small study; every score 0 or every score 1),
    else None: the part of the rule that a table with its own bootstrap (paper 002's) shares."""
    if exact.applies(m, below=exact_below):
        return exact.exact_mean_interval(m, confidence)
    if np.all(m == 0.0) or np.all(m == 1.0):
        n = int(m.shape[0])
        return wilson_interval(int(round(float(m.mean()) * n)), n, confidence=confidence)
    return None


def edge_interval(a: np.ndarray, b: np.ndarray, confidence: float = 0.95,
                  exact_below: int = exact.SMALL_ITEMS) -> Interval | None:
    """The paired interval where the bootstrap does not serve (small study or every item alike), else None."""
    if exact.applies(a, b, below=exact_below):
        return exact.exact_paired_interval(a, b, confidence)
    return paired_boundary_interval((a.mean(axis=1) - b.mean(axis=1)).tolist(), confidence)


def paired_interval(a: npt.ArrayLike, b: npt.ArrayLike, n_resamples: int, seed: int,
                    resampling: Resampling = DEFAULT_RESAMPLING, confidence: float = 0.95,
                    exact_below: int = exact.SMALL_ITEMS) -> Interval:
    """The interval of ``mean(a) - mean(b)`` on paired matrices (module docstring; ``exact_below=0``: no exact
    rule)."""
    ma, mb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return edge_interval(ma, mb, confidence, exact_below) or paired_bootstrap_diff(ma, mb, n_resamples=n_resamples, confidence=confidence,
                                                             seed=seed, resampling=resampling)


def contrast_intervals(cells: Mapping[str, npt.ArrayLike], contrasts: Mapping[str, tuple[str, str]],
                       n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING,
                       confidence: float = 0.95) -> dict[str, Interval]:
    """Intervals of several paired differences between cells (module docstring); where the bootstrap serves,
    one set of replicates serves every contrast, as in :func:`paired_bootstrap_contrasts`."""
    mats = {k: np.asarray(v, dtype=float) for k, v in cells.items()}
    if exact.applies(*mats.values()):
        return {name: exact.exact_paired_interval(mats[upper], mats[lower], confidence)
                for name, (upper, lower) in contrasts.items()}
    boot = paired_bootstrap_contrasts(mats, contrasts, n_resamples=n_resamples, confidence=confidence, seed=seed,
                                      resampling=resampling)
    return {name: edge_interval(mats[upper], mats[lower], confidence) or boot[name]
            for name, (upper, lower) in contrasts.items()}
