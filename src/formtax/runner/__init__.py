"""The evaluation runner: grid planning, the resumable run loop."""

from formtax.runner.grid import StrategySpec, parse_strategy_spec, plan_grid
from formtax.runner.run import RunConfig, RunSummary, run

__all__ = ["RunConfig", "RunSummary", "StrategySpec", "parse_strategy_spec", "plan_grid", "run"]
