"""Percentile bootstrap intervals for mean scores over items and seeds.

Score matrices are shaped ``(n_items, n_seeds)``: row ``i`` holds one item's scores under each decoding
seed, usually 0.0 or 1.0 (any finite real score works). By default (:attr:`Resampling.ITEMS_AND_SEEDS`,
paper 002's rule and the design's) replicates resample items *and* seeds: each replicate draws ``n_items``
item indices and ``n_seeds`` seed indices with replacement and takes the mean of
``scores[np.ix_(items, seeds)]``. This accounts for both sources of variation: which items the benchmark
happened to contain and which seeds the run happened to use, treating the seed as a factor shared by every
item (paper 002's server seed changes tie-breaking for all items at once).

Resampling items and seeds independently (the crossed, "pigeonhole" bootstrap) over-estimates the variance of
a crossed design: Owen (2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2)) shows that for a mean its
variance counts the item-by-seed interaction (the noise) three times instead of once, because the item means
and the seed means each carry it again. The calibration study measured 0.98-0.998 coverage for a nominal 0.95
(docs/calibration.md). The default, :attr:`Resampling.CORRECTED`, keeps the crossed draw and corrects its
spread: for a statistic with influence matrix ``Z`` (the matrix itself for a mean, ``a - b`` for a paired
difference, the linearised ratio for D_paired) the two-way random-effects ANOVA of ``Z`` (method of moments,
components truncated at 0) gives the design's variance ``s_item^2/I + s_seed^2/S + s_noise^2/(I S)``, and the
replicates are scaled about the estimate so that their variance equals it (:func:`corrected_replicates`); the
interval is their percentiles. A real seed effect shared by every item (paper 002's server seed) is kept in
``s_seed^2``; with independent seeds it estimates 0 and the interval is the cluster bootstrap's. The crossed
rule stays available as :attr:`Resampling.ITEMS_AND_SEEDS` (conservative) and the cluster bootstrap as
:attr:`Resampling.ITEMS` (items with all their seeds; slightly narrow for a ratio such as D_paired).

Unscored entries (NaN) are not allowed in the bootstrap functions, which raise ``ValueError`` if they see
one. Call :func:`complete_cases` first: it drops every item that has a NaN in *any* of the matrices, so
that paired comparisons stay on the same items, and it reports how many items it dropped.

Paired functions (:func:`paired_bootstrap_diff`, :func:`paired_bootstrap_contrasts`,
:func:`bootstrap_replicates`) apply the *same* item and seed indices to every matrix in a replicate, so
the variation shared by the matrices cancels out of their differences.

Replicates are computed without materialising each resampled matrix: the mean of
``scores[np.ix_(items, seeds)]`` equals ``c_items @ scores @ c_seeds / (n_items * n_seeds)``, where
``c_items`` and ``c_seeds`` count how often each item and seed was drawn. Replicates are processed in
chunks so that memory stays bounded for large matrices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from formtax.stats._checks import (
    FloatMatrix,
    FloatVector,
    as_matrix,
    check_confidence,
    check_n_resamples,
    check_same_shape,
    check_seed,
)
from formtax.stats.interval import Interval

METHOD = "percentile-bootstrap"
"""The ``method`` recorded on intervals from this module."""

_CHUNK_ENTRIES = 2_000_000
"""Upper bound on drawn indices held in memory at once (per chunk of replicates)."""

IntMatrix = npt.NDArray[np.int64]


class Resampling(StrEnum):
    """What one bootstrap replicate resamples (module docstring)."""

    CORRECTED = "items+seeds-corrected"
    """The crossed draw, its spread corrected to the variance-components estimate (the default: nominal)."""
    ITEMS_AND_SEEDS = "items+seeds"
    """Items and seeds drawn independently with replacement (crossed); paper 002's rule, conservative."""
    ITEMS = "items"
    """Items drawn with replacement, each keeping all its seeds (cluster bootstrap)."""


DEFAULT_RESAMPLING = Resampling.CORRECTED


def crossed_variance(influence: npt.ArrayLike) -> float:
    """The variance of the mean of an ``(n_items, n_seeds)`` matrix under the crossed random-effects design,
    from its two-way ANOVA (method of moments; each component truncated at 0): ``s_item^2/I + s_seed^2/S +
    s_noise^2/(I S)``. One seed: the items' sample variance over ``I``; one item: the seeds' over ``S``.

    Each component is truncated at 0 (ours): conservative by the truncation (with 3 seeds and a weak item
    effect up to about half the variance), where the untruncated, unbiased total leans on a seed mean square of
    ``S - 1`` degrees of freedom and collapsed D_paired's interval (0.77 coverage in bench/calibration.py).

    Written here because no maintained library estimates this for a bootstrap's rescaling (statsmodels'
    mixed models fit the components by REML, iteratively, for every replicate study: far too slow)."""
    z = np.asarray(influence, dtype=np.float64)
    n_i, n_s = z.shape
    if n_i * n_s < 2:
        return 0.0
    if n_s == 1 or n_i == 1:
        return float(z.var(ddof=1)) / z.size
    grand = float(z.mean())
    rows, cols = z.mean(axis=1), z.mean(axis=0)
    resid = z - rows[:, None] - cols[None, :] + grand
    ms_noise = float((resid**2).sum()) / ((n_i - 1) * (n_s - 1))
    ms_item = n_s * float(((rows - grand) ** 2).sum()) / (n_i - 1)
    ms_seed = n_i * float(((cols - grand) ** 2).sum()) / (n_s - 1)
    s_item = max(0.0, (ms_item - ms_noise) / n_s)
    s_seed = max(0.0, (ms_seed - ms_noise) / n_i)
    return s_item / n_i + s_seed / n_s + ms_noise / (n_i * n_s)


def corrected_replicates(replicates: npt.ArrayLike, estimate: float, influence: npt.ArrayLike,
                         linear: npt.ArrayLike | None = None) -> FloatVector:
    """Crossed-bootstrap ``replicates`` of a statistic scaled about ``estimate`` so that their variance is
    :func:`crossed_variance` of the statistic's ``influence`` matrix (:attr:`Resampling.CORRECTED`; NaN
    replicates, e.g. an empty ratio denominator, stay NaN). Unchanged where the replicates do not vary.

    For a non-linear statistic (a ratio) pass ``linear``, the same draws' replicates of its linearisation (the
    replicate means of ``influence``): the scale is taken from them, so the correction removes the design's
    over-count and leaves the statistic's own skew (the ratio's heavy tail would otherwise shrink the centre)."""
    reps = np.asarray(replicates, dtype=np.float64)
    base = reps if linear is None else np.asarray(linear, dtype=np.float64)
    finite = base[np.isfinite(base)]
    spread = float(finite.var()) if finite.size > 1 else 0.0
    if not spread > 0.0:
        return reps
    z = np.asarray(influence, dtype=np.float64)
    out = estimate + (reps - estimate) * np.sqrt(crossed_variance(z) / spread)
    # a mean of Z cannot leave [min Z, max Z] (an accuracy stays in [0, 1]); a ratio keeps its own range
    return np.clip(out, z.min(), z.max()) if linear is None else out


def complete_cases(*matrices: npt.ArrayLike) -> tuple[tuple[FloatMatrix, ...], int]:
    """Drop the items (rows) that are unscored (NaN) anywhere in any of the matrices.

    Use it before the bootstrap functions, which refuse NaN. Dropping a row from every matrix at once keeps
    paired comparisons on the same items. Matrices must be 2-D and have the same number of items; their
    seed counts may differ.

    Args:
        *matrices: One or more score matrices shaped ``(n_items, n_seeds)``.

    Returns:
        ``(filtered, n_dropped)``: the matrices without the incomplete items (float64, in the order given)
        and how many items were dropped.

    Raises:
        ValueError: no matrices, a matrix is not 2-D or is empty, holds infinite values, or the matrices
            disagree on the number of items.
    """
    if not matrices:
        raise ValueError("complete_cases needs at least one matrix")
    converted = [as_matrix(m, f"matrix {index}", allow_nan=True) for index, m in enumerate(matrices)]
    n_items = converted[0].shape[0]
    for index, matrix in enumerate(converted[1:], start=1):
        if matrix.shape[0] != n_items:
            raise ValueError(
                f"all matrices must have the same number of items: matrix 0 has shape {converted[0].shape}, "
                f"matrix {index} has shape {matrix.shape}"
            )
    keep = np.ones(n_items, dtype=bool)
    for matrix in converted:
        keep &= ~np.isnan(matrix).any(axis=1)
    filtered = tuple(matrix[keep] for matrix in converted)
    return filtered, int(n_items - keep.sum())


def linear_replicates(reps: Mapping[str, FloatVector], cells: Mapping[str, FloatMatrix],
                      weights: Mapping[str, float]) -> FloatVector:
    """Corrected replicates (:func:`corrected_replicates`) of the linear statistic ``sum w_k mean(cells[k])``
    from :func:`bootstrap_replicates`' crossed ``reps`` (a contrast: ``{"a": 1, "b": -1}``)."""
    raw = sum(w * np.asarray(reps[k], dtype=np.float64) for k, w in weights.items())
    estimate = float(sum(w * float(np.mean(cells[k])) for k, w in weights.items()))
    influence = sum(w * np.asarray(cells[k], dtype=np.float64) for k, w in weights.items())
    return corrected_replicates(np.asarray(raw), estimate, np.asarray(influence))


def ratio_parts(reps_num: FloatVector, reps_den: FloatVector, num: FloatMatrix, den: FloatMatrix
                ) -> tuple[FloatVector, float, FloatMatrix, FloatVector]:
    """``(replicates, estimate, influence, linear replicates)`` of ``mean(num) / mean(den)`` (NaN where a
    replicate's denominator is 0), the arguments of :func:`corrected_replicates`; sums and differences of ratios
    add their parts."""
    mean_den = float(np.mean(den))
    estimate = float(np.mean(num)) / mean_den if mean_den else float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        raw = np.where(reps_den == 0, np.nan, reps_num / reps_den)
    if not mean_den:
        return raw, estimate, np.zeros_like(num, dtype=np.float64), np.zeros_like(raw)
    influence = (np.asarray(num, dtype=np.float64) - estimate * np.asarray(den, dtype=np.float64)) / mean_den
    return raw, estimate, influence, (reps_num - estimate * reps_den) / mean_den


def _resample_indices(
    n_items: int, n_seeds: int, n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING
) -> Iterator[tuple[IntMatrix, IntMatrix]]:
    """Yield ``(item_indices, seed_indices)`` chunks, shaped ``(chunk, n_items)`` and ``(chunk, n_seeds)``.

    Row ``r`` of a chunk is one replicate's draw. The stream depends only on the arguments, so the same
    arguments always give the same replicates, and every paired function sees the same draws for matrices
    of the same shape.
    """
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_resamples, _CHUNK_ENTRIES // (n_items + n_seeds)))
    done = 0
    while done < n_resamples:
        size = min(chunk, n_resamples - done)
        items = rng.integers(0, n_items, size=(size, n_items), dtype=np.int64)
        if resampling is Resampling.ITEMS:
            seeds = np.broadcast_to(np.arange(n_seeds, dtype=np.int64), (size, n_seeds))
        else:
            seeds = rng.integers(0, n_seeds, size=(size, n_seeds), dtype=np.int64)
        yield items, seeds
        done += size


def _counts(indices: IntMatrix, n_values: int) -> FloatMatrix:
    """Per row of ``indices``, how often each of ``0 .. n_values - 1`` occurs, as float64."""
    n_rows = indices.shape[0]
    offsets = np.arange(n_rows, dtype=np.int64)[:, None] * n_values
    counts = np.bincount((indices + offsets).ravel(), minlength=n_rows * n_values)
    return counts.reshape(n_rows, n_values).astype(np.float64)


def _replicate_means(
    stack: npt.NDArray[np.float64], n_resamples: int, seed: int, resampling: Resampling = DEFAULT_RESAMPLING
) -> FloatMatrix:
    """Bootstrap replicate means of each matrix in ``stack`` (shape ``(k, n_items, n_seeds)``).

    Returns an array shaped ``(k, n_resamples)``; entry ``[j, r]`` is the mean of matrix ``j`` over
    replicate ``r``'s items and seeds, with the same indices for every ``j``.
    """
    k, n_items, n_seeds = stack.shape
    out = np.empty((k, n_resamples), dtype=np.float64)
    start = 0
    for items, seeds in _resample_indices(n_items, n_seeds, n_resamples, seed, Resampling(resampling)):
        item_counts = _counts(items, n_items)  # (chunk, n_items)
        seed_counts = _counts(seeds, n_seeds)  # (chunk, n_seeds)
        weighted = np.matmul(item_counts[None, :, :], stack)  # (k, chunk, n_seeds)
        sums = np.einsum("kcs,cs->kc", weighted, seed_counts)
        stop = start + items.shape[0]
        out[:, start:stop] = sums / (n_items * n_seeds)
        start = stop
    return out


def _percentile_interval(
    replicates: FloatVector,
    estimate: float,
    shape: tuple[int, int],
    n_resamples: int,
    confidence: float,
) -> Interval:
    alpha = 1.0 - confidence
    low, high = np.quantile(replicates, [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(
        estimate=estimate,
        low=float(low),
        high=float(high),
        n_items=shape[0],
        n_seeds=shape[1],
        n_resamples=n_resamples,
        method=METHOD,
        confidence=confidence,
    )


def _checked_cells(cells: Mapping[str, npt.ArrayLike]) -> dict[str, FloatMatrix]:
    if not cells:
        raise ValueError("cells must contain at least one score matrix")
    checked: dict[str, FloatMatrix] = {}
    first_name = ""
    for name, values in cells.items():
        matrix = as_matrix(values, f"cell {name!r}", allow_nan=False)
        if checked:
            check_same_shape(checked[first_name], matrix, f"cell {first_name!r}", f"cell {name!r}")
        else:
            first_name = name
        checked[name] = matrix
    return checked


def bootstrap_replicates(
    cells: Mapping[str, npt.ArrayLike],
    n_resamples: int = 10_000,
    seed: int = 0,
    resampling: Resampling = DEFAULT_RESAMPLING,
) -> dict[str, FloatVector]:
    """Paired bootstrap replicate means for each cell.

    Every replicate draws one set of item and seed indices and applies it to all cells, so the difference
    of two cells' replicate arrays is the paired bootstrap distribution of their mean difference. Under
    :attr:`Resampling.CORRECTED` these are the crossed draw's replicates: correct the statistic computed from
    them with :func:`corrected_replicates` and its influence matrix.

    Args:
        cells: Score matrices by name, all of the same shape ``(n_items, n_seeds)``, without NaN.
        n_resamples: Number of replicates, at least 1.
        seed: Seed for ``np.random.default_rng``.
        resampling: What a replicate resamples (:class:`Resampling`).

    Returns:
        For each cell, an array of ``n_resamples`` replicate means.

    Raises:
        ValueError: no cells, cells of different shapes, NaN or infinite scores, bad ``n_resamples``.
    """
    checked = _checked_cells(cells)
    n_resamples = check_n_resamples(n_resamples)
    seed = check_seed(seed)
    stack = np.stack(list(checked.values()))
    means = _replicate_means(stack, n_resamples, seed, resampling)
    return {name: means[index] for index, name in enumerate(checked)}


def percentile_bootstrap_mean(
    scores: npt.ArrayLike,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    resampling: Resampling = DEFAULT_RESAMPLING,
) -> Interval:
    """Percentile bootstrap interval for the mean score, resampling items and seeds jointly.

    Args:
        scores: Score matrix shaped ``(n_items, n_seeds)``, without NaN (see :func:`complete_cases`).
        n_resamples: Number of bootstrap replicates, at least 1.
        confidence: Nominal two-sided coverage, strictly between 0 and 1.
        seed: Seed for ``np.random.default_rng``; the same seed and data give the same interval.
        resampling: What a replicate resamples (:class:`Resampling`).

    Returns:
        An :class:`Interval` whose estimate is the plain mean of ``scores``.

    Raises:
        ValueError: ``scores`` is not a non-empty 2-D matrix, holds NaN or infinite values, or an argument
            is out of range.
    """
    matrix = as_matrix(scores, "scores", allow_nan=False)
    n_resamples = check_n_resamples(n_resamples)
    confidence = check_confidence(confidence)
    seed = check_seed(seed)
    replicates = _replicate_means(matrix[None], n_resamples, seed, resampling)[0]
    if resampling is Resampling.CORRECTED:
        replicates = corrected_replicates(replicates, float(matrix.mean()), matrix)
    shape = (matrix.shape[0], matrix.shape[1])
    return _percentile_interval(replicates, float(matrix.mean()), shape, n_resamples, confidence)


def paired_bootstrap_diff(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    resampling: Resampling = DEFAULT_RESAMPLING,
) -> Interval:
    """Paired percentile bootstrap interval for ``mean(a) - mean(b)``.

    ``a`` and ``b`` must score the same items under the same seeds (row ``i``, column ``j`` of both refer
    to the same item and seed). Each replicate applies the same item and seed indices to both.

    Args:
        a: Score matrix shaped ``(n_items, n_seeds)``, without NaN.
        b: Score matrix of the same shape as ``a``, without NaN.
        n_resamples: Number of bootstrap replicates, at least 1.
        confidence: Nominal two-sided coverage, strictly between 0 and 1.
        seed: Seed for ``np.random.default_rng``.
        resampling: What a replicate resamples (:class:`Resampling`).

    Returns:
        An :class:`Interval` whose estimate is ``mean(a) - mean(b)``.

    Raises:
        ValueError: shapes differ, NaN or infinite scores, or an argument is out of range.
    """
    matrix_a = as_matrix(a, "a", allow_nan=False)
    matrix_b = as_matrix(b, "b", allow_nan=False)
    check_same_shape(matrix_a, matrix_b, "a", "b")
    n_resamples = check_n_resamples(n_resamples)
    confidence = check_confidence(confidence)
    seed = check_seed(seed)
    means = _replicate_means(np.stack([matrix_a, matrix_b]), n_resamples, seed, resampling)
    estimate = float(matrix_a.mean() - matrix_b.mean())
    diff = means[0] - means[1]
    if resampling is Resampling.CORRECTED:
        diff = corrected_replicates(diff, estimate, matrix_a - matrix_b)
    shape = (matrix_a.shape[0], matrix_a.shape[1])
    return _percentile_interval(diff, estimate, shape, n_resamples, confidence)


def paired_bootstrap_contrasts(
    cells: Mapping[str, npt.ArrayLike],
    contrasts: Mapping[str, tuple[str, str]],
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    resampling: Resampling = DEFAULT_RESAMPLING,
) -> dict[str, Interval]:
    """Paired percentile bootstrap intervals for several differences between cells at once.

    All contrasts come from the same replicates (see :func:`bootstrap_replicates`), so they are mutually
    consistent: for ``{"delta_mask": ("constrained", "short"), "delta_length": ("short", "free"),
    "delta_total": ("constrained", "free")}`` every replicate of ``delta_total`` equals the sum of the
    corresponding ``delta_mask`` and ``delta_length`` replicates (up to floating-point rounding). The
    interval endpoints need not add up, because percentiles of a sum are not sums of percentiles.

    Args:
        cells: Score matrices by name, all shaped ``(n_items, n_seeds)`` over the same items and seeds,
            without NaN.
        contrasts: For each contrast name, ``(minuend, subtrahend)`` cell names; the contrast is
            ``mean(cells[minuend]) - mean(cells[subtrahend])``.
        n_resamples: Number of bootstrap replicates, at least 1.
        confidence: Nominal two-sided coverage, strictly between 0 and 1.
        seed: Seed for ``np.random.default_rng``.
        resampling: What a replicate resamples (:class:`Resampling`).

    Returns:
        An :class:`Interval` per contrast, in the order of ``contrasts``.

    Raises:
        ValueError: no contrasts, a contrast names an unknown cell or is not a pair, cells of different
            shapes, NaN or infinite scores, or an argument is out of range.
    """
    if not contrasts:
        raise ValueError("contrasts must name at least one (minuend, subtrahend) pair")
    for name, pair in contrasts.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(
                f"contrast {name!r} must be a (minuend, subtrahend) pair of cell names, got {pair!r}"
            )
        for cell in pair:
            if cell not in cells:
                raise ValueError(f"contrast {name!r} names unknown cell {cell!r}; cells are {sorted(cells)}")
    checked = _checked_cells(cells)
    n_resamples = check_n_resamples(n_resamples)
    confidence = check_confidence(confidence)
    replicates = bootstrap_replicates(checked, n_resamples, seed, resampling)
    first = next(iter(checked.values()))
    shape = (first.shape[0], first.shape[1])
    results: dict[str, Interval] = {}
    for name, (minuend, subtrahend) in contrasts.items():
        estimate = float(checked[minuend].mean() - checked[subtrahend].mean())
        diff = replicates[minuend] - replicates[subtrahend]
        if resampling is Resampling.CORRECTED:
            diff = corrected_replicates(diff, estimate, checked[minuend] - checked[subtrahend])
        results[name] = _percentile_interval(diff, estimate, shape, n_resamples, confidence)
    return results
