"""Calibration: a planted-effect model whose exact truths are known, and the machinery that checks the lab
recovers them (the backend, the exact expectations, the calibration runs and coverage studies)."""

from formtax.planted.world import World, WorldError, load_world, parse_world, write_world

__all__ = ["World", "WorldError", "load_world", "parse_world", "write_world"]
