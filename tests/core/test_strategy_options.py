"""Strategy options: one declaration per strategy (strategies/options.py) serves the check, the CLI and the API."""

from __future__ import annotations

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.cli.generate import _args
from formtax.errors import ConfigError
from formtax.strategies import get_strategy, list_strategies
from formtax.strategies.options import MODELS, StrategyOptions, check_options, options_model


def test_every_strategy_points_at_the_model_that_names_it() -> None:
    for name in list_strategies():
        model = get_strategy(name).Options
        assert model is options_model(name), name
        assert model is StrategyOptions or name in model.strategies
    for model in MODELS:
        for name in model.strategies:
            assert issubclass(get_strategy(name).Options, model)


def test_the_generate_flags_are_the_option_fields() -> None:
    import argparse

    p = argparse.ArgumentParser()
    _args(p)
    flags = {a.dest: a.option_strings for a in p._actions if a.dest.startswith("opt_")}
    fields = {f"opt_{n}" for m in MODELS for n in m.model_fields}
    assert set(flags) == fields
    assert flags["opt_rule"] == ["--beam-rule"] and flags["opt_state_top_k"] == ["--state-top-k"]
    args = p.parse_args(["--json-layout", "compact", "--tau", "0.5", "x"])
    assert (args.opt_json_layout, args.opt_tau) == ("compact", 0.5)
    with pytest.raises(SystemExit):  # choices come from the model's Literal
        p.parse_args(["--json-layout", "tight", "x"])


@pytest.mark.parametrize(("strategy", "options", "message"), [
    ("free", {"tau": 1.0}, "takes no tau option (--tau applies to"),
    ("suffix-last", {"rule": "min"}, "takes no rule option (--beam-rule applies to suffix-beam)"),
    ("suffix-beam", {"rule": "first"}, "unknown beam rule 'first'"),
    ("json", {"json_layout": "tight"}, "json_layout must be one of flexible, compact"),
    ("json", {"jsonlayout": "compact"}, "unknown option(s) jsonlayout; known: json_layout"),
    ("decog", {"gamma": "strong"}, "gamma"),
])
def test_a_bad_option_is_one_clear_line(strategy: str, options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_options(strategy, options)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_api_takes_the_same_names_and_refuses_before_any_model_call() -> None:
    fb = FakeBackend(random_logits(seed=0))
    r = formtax.generate(fb, "Q", "json", "{int:0..9}", max_tokens=60, json_layout="compact")
    assert r.parse_ok and r.text.startswith('{"reason": "')  # json.dumps' spelling
    with pytest.raises(ConfigError, match="takes no tau option"):
        formtax.generate(fb, "Q", "constrained", "{int:0..9}", tau=0.5)
    assert fb.batches[-1:] and len(fb.batches) == 1  # only the json call reached the model
