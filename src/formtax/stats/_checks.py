"""Argument checks shared by the statistics modules.

Every check raises :class:`ValueError` (or :class:`TypeError` for a wrong type) whose message names the
argument and the problem, so a caller can fix the input without reading this code.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import numpy.typing as npt

FloatMatrix = npt.NDArray[np.float64]
"""A 2-D float64 array shaped ``(n_items, n_seeds)``."""

FloatVector = npt.NDArray[np.float64]
"""A 1-D float64 array."""


def check_confidence(confidence: float) -> float:
    """Return ``confidence`` as a float after checking that it lies strictly between 0 and 1."""
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real):
        raise TypeError(f"confidence must be a real number, got {type(confidence).__name__}")
    value = float(confidence)
    if not 0.0 < value < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    return value


def check_n_resamples(n_resamples: int) -> int:
    """Return ``n_resamples`` after checking that it is a positive integer."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, numbers.Integral):
        raise TypeError(f"n_resamples must be an integer, got {type(n_resamples).__name__}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    return int(n_resamples)


def check_seed(seed: int) -> int:
    """Return ``seed`` after checking that it is a non-negative integer (what ``default_rng`` accepts)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return int(seed)


def as_matrix(values: npt.ArrayLike, name: str, *, allow_nan: bool) -> FloatMatrix:
    """Convert ``values`` to a non-empty 2-D float64 array ``(n_items, n_seeds)``.

    Booleans become 0.0/1.0. Infinite entries are always rejected; NaN entries are rejected unless
    ``allow_nan`` is true.
    """
    array = np.asarray(values)
    if array.dtype == object or not (
        np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)
    ):
        raise TypeError(f"{name} must hold numbers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    matrix = array.astype(np.float64)
    if matrix.ndim != 2:
        hint = "; for a single seed pass scores[:, None]" if matrix.ndim == 1 else ""
        raise ValueError(f"{name} must be 2-D (n_items, n_seeds), got shape {matrix.shape}{hint}")
    if matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"{name} must have at least one item and one seed, got shape {matrix.shape}")
    if np.isinf(matrix).any():
        raise ValueError(f"{name} contains {int(np.isinf(matrix).sum())} infinite entries")
    if not allow_nan:
        n_nan = int(np.isnan(matrix).sum())
        if n_nan:
            raise ValueError(
                f"{name} contains {n_nan} NaN entries (unscored); drop incomplete items first with "
                "complete_cases()"
            )
    return matrix


def check_same_shape(first: FloatMatrix, second: FloatMatrix, first_name: str, second_name: str) -> None:
    """Raise ``ValueError`` unless the two matrices have the same shape."""
    if first.shape != second.shape:
        raise ValueError(
            f"{first_name} and {second_name} must have the same shape {first.shape} vs {second.shape}"
        )


def check_finite_number(value: float, name: str) -> float:
    """Return ``value`` as a float after checking that it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return result
