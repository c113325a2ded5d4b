"""The evaluation runner: grid planning, the resumable run loop."""

from formtax.runner.config import RunConfig
from formtax.runner.grid import StrategySpec, parse_strategy_spec, plan_grid
from formtax.runner.run import RunSummary, run

__all__ = ["RunConfig", "RunSummary", "StrategySpec", "parse_strategy_spec", "plan_grid", "run"]
