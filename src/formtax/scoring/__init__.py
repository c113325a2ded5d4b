"""Scoring: turn per-parser parse results into per-parser correctness."""

from formtax.scoring.score import score_all

__all__ = ["score_all"]
