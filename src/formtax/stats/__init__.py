"""Statistics for comparing decoding strategies: bootstrap intervals over items and seeds, the Wilson
interval, the exact McNemar test, and run-level summaries.

Score matrices are shaped ``(n_items, n_seeds)`` with scores usually in {0, 1}; NaN marks an unscored
entry and must be removed with :func:`complete_cases` before bootstrapping.
"""

from formtax.stats.bootstrap import (
    DEFAULT_RESAMPLING,
    Resampling,
    bootstrap_replicates,
    complete_cases,
    corrected_replicates,
    crossed_variance,
    linear_replicates,
    paired_bootstrap_contrasts,
    paired_bootstrap_diff,
    percentile_bootstrap_mean,
    ratio_parts,
)
from formtax.stats.interval import Interval, paired_boundary_interval, wilson_interval
from formtax.stats.mcnemar import McNemarResult, mcnemar_exact
from formtax.stats.summary import LEVELS, LogisticFit, decomposition, logistic_fit, mean_std_over_runs

__all__ = [
    "DEFAULT_RESAMPLING",
    "Resampling",
    "LEVELS",
    "Interval",
    "LogisticFit",
    "McNemarResult",
    "bootstrap_replicates",
    "complete_cases",
    "corrected_replicates",
    "crossed_variance",
    "linear_replicates",
    "decomposition",
    "logistic_fit",
    "mcnemar_exact",
    "mean_std_over_runs",
    "paired_bootstrap_contrasts",
    "paired_bootstrap_diff",
    "paired_boundary_interval",
    "percentile_bootstrap_mean",
    "ratio_parts",
    "wilson_interval",
]
