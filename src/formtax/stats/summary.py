"""Summaries of run-level results: mean ± std over runs, the constraint-level decomposition, and an
exploratory logistic regression."""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import statsmodels.api as sm
from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

from formtax.stats._checks import check_finite_number

RunKey = TypeVar("RunKey", bound=tuple[Hashable, ...])

LEVELS = ("unconstrained", "fc", "fc+vc", "fc+vc+rc")
"""Constraint levels understood by :func:`decomposition`, from least to most constrained: no constraint,
format constraint, format + validity constraint, format + validity + reasoning constraint."""

_GAINS = (
    ("format_gain", "fc", "unconstrained"),
    ("validity_gain", "fc+vc", "fc"),
    ("reasoning_gain", "fc+vc+rc", "fc+vc"),
)


def mean_std_over_runs(scores_by_run: Mapping[RunKey, float]) -> tuple[float, float]:
    """Mean and sample standard deviation of per-run scores.

    A run is one (seed, prompt variant, ...) combination, the key of ``scores_by_run``; its value is that
    run's score, e.g. its accuracy. The standard deviation uses ``ddof=1`` (the sample standard deviation,
    dividing by ``n_runs - 1``), so it estimates the run-to-run spread rather than describing these runs
    only. With a single run the spread cannot be estimated and the standard deviation is NaN (not 0.0).

    Args:
        scores_by_run: Score per run, keyed by a tuple identifying the run, e.g. ``(seed, variant)``.

    Returns:
        ``(mean, std)``.

    Raises:
        ValueError: no runs, or a score that is not finite (the message names the run).
    """
    if not scores_by_run:
        raise ValueError("scores_by_run must contain at least one run")
    values = np.array(
        [check_finite_number(score, f"score of run {key!r}") for key, score in scores_by_run.items()],
        dtype=np.float64,
    )
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else math.nan
    return mean, std


def decomposition(acc: Mapping[str, float]) -> dict[str, float]:
    """Split the accuracy change from adding constraints into one gain per added constraint.

    Levels (see :data:`LEVELS`): ``"unconstrained"``, ``"fc"``, ``"fc+vc"`` and optionally ``"fc+vc+rc"``.
    The result may contain:

    - ``format_gain`` = fc - unconstrained
    - ``validity_gain`` = fc+vc - fc
    - ``reasoning_gain`` = fc+vc+rc - fc+vc
    - ``total`` = (the most constrained level given) - unconstrained

    A gain is left out (not set to zero) when a level it needs is missing; ``total`` is left out without
    ``"unconstrained"`` or without any other level. When no level between ``"unconstrained"`` and the most
    constrained one is missing, the gains add up to ``total``.

    Args:
        acc: Accuracy per level, each a finite number in [0, 1].

    Returns:
        The gains that the given levels determine, in the order listed above.

    Raises:
        ValueError: an unknown level name, or an accuracy that is not finite or outside [0, 1].
    """
    unknown = sorted(set(acc) - set(LEVELS))
    if unknown:
        raise ValueError(f"unknown level(s) {unknown}; expected some of {list(LEVELS)}")
    values: dict[str, float] = {}
    for level in LEVELS:
        if level in acc:
            value = check_finite_number(acc[level], f"accuracy of level {level!r}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"accuracy of level {level!r} must lie in [0, 1], got {value!r}")
            values[level] = value
    gains: dict[str, float] = {}
    for name, upper, lower in _GAINS:
        if upper in values and lower in values:
            gains[name] = values[upper] - values[lower]
    top = [level for level in LEVELS[1:] if level in values]
    if "unconstrained" in values and top:
        gains["total"] = values[top[-1]] - values["unconstrained"]
    return gains


@dataclass(frozen=True)
class LogisticFit:
    """Result of :func:`logistic_fit`: ``P(y = 1) = 1 / (1 + exp(-(intercept + slope * x)))``.

    Attributes:
        status: ``"ok"`` when the fit is usable. Otherwise the reason it is not, and every number except
            ``n`` is NaN: ``"constant_y"`` (all outcomes equal), ``"constant_x"`` (all x equal, slope not
            identifiable), ``"separation"`` (complete or quasi-complete separation: a threshold on x splits
            the outcomes, so the maximum-likelihood slope is infinite), ``"not_converged"`` (the optimiser
            did not converge) or ``"singular"`` (the information matrix could not be inverted).
        intercept: Fitted intercept (log-odds at x = 0).
        slope: Fitted change in log-odds per unit of x.
        intercept_se: Standard error of the intercept.
        slope_se: Standard error of the slope.
        intercept_p: Two-sided Wald p-value for intercept = 0.
        slope_p: Two-sided Wald p-value for slope = 0.
        n: Number of observations.
    """

    status: str
    intercept: float
    slope: float
    intercept_se: float
    slope_se: float
    intercept_p: float
    slope_p: float
    n: int

    @property
    def ok(self) -> bool:
        """Whether the fit succeeded (``status == "ok"``)."""
        return self.status == "ok"


def _failed(status: str, n: int) -> LogisticFit:
    nan = math.nan
    return LogisticFit(status, nan, nan, nan, nan, nan, nan, n)


def _vector(values: npt.ArrayLike, name: str) -> npt.NDArray[np.float64]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_) or np.issubdtype(
        array.dtype, np.complexfloating
    ):
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    result = array.astype(np.float64)
    if not np.isfinite(result).all():
        raise ValueError(f"{name} contains {int((~np.isfinite(result)).sum())} NaN or infinite entries")
    return result


def logistic_fit(x: npt.ArrayLike, y: npt.ArrayLike) -> LogisticFit:
    """Exploratory logistic regression of a binary outcome on one continuous predictor.

    Fits ``logit P(y = 1) = intercept + slope * x`` by maximum likelihood with ``statsmodels`` ``Logit``
    (Newton's method). Standard errors come from the inverse observed information; p-values are Wald
    z-tests. The p-values are descriptive: nothing here corrects for testing several predictors.

    Data for which the maximum-likelihood estimate does not exist (constant ``y``, constant ``x``,
    separation) do not raise; they return a :class:`LogisticFit` whose ``status`` says why and whose
    numbers are NaN. Check ``fit.ok`` before using the numbers.

    Args:
        x: Predictor values, 1-D, finite.
        y: Outcomes, 1-D, booleans or 0/1, same length as ``x``.

    Returns:
        A :class:`LogisticFit`.

    Raises:
        ValueError: ``x`` and ``y`` differ in length, fewer than 2 observations, non-finite values, or ``y``
            values other than 0/1.
    """
    xs = _vector(x, "x")
    ys = _vector(y, "y")
    if xs.shape != ys.shape:
        raise ValueError(f"x and y must have the same length {xs.shape[0]} vs {ys.shape[0]}")
    n = int(xs.shape[0])
    if n < 2:
        raise ValueError(f"logistic_fit needs at least 2 observations, got {n}")
    if not np.isin(ys, (0.0, 1.0)).all():
        bad = ys[~np.isin(ys, (0.0, 1.0))][0].item()
        raise ValueError(f"y must hold only booleans or 0/1, found {bad!r}")

    if ys.min() == ys.max():
        return _failed("constant_y", n)
    if xs.min() == xs.max():
        return _failed("constant_x", n)
    x0, x1 = xs[ys == 0.0], xs[ys == 1.0]
    if x0.max() <= x1.min() or x1.max() <= x0.min():
        return _failed("separation", n)

    design = np.column_stack([np.ones(n), xs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", PerfectSeparationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            result = sm.Logit(ys, design).fit(method="newton", maxiter=100, disp=False)
        except np.linalg.LinAlgError:
            return _failed("singular", n)
    if not result.mle_retvals.get("converged", False):
        return _failed("not_converged", n)
    params = np.asarray(result.params, dtype=np.float64)
    bse = np.asarray(result.bse, dtype=np.float64)
    pvalues = np.asarray(result.pvalues, dtype=np.float64)
    if not (np.isfinite(params).all() and np.isfinite(bse).all() and np.isfinite(pvalues).all()):
        return _failed("singular", n)
    return LogisticFit(
        status="ok",
        intercept=float(params[0]),
        slope=float(params[1]),
        intercept_se=float(bse[0]),
        slope_se=float(bse[1]),
        intercept_p=float(pvalues[0]),
        slope_p=float(pvalues[1]),
        n=n,
    )
