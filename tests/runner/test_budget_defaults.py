"""Budgets that fit the answer (issue 39, point 6): reserves from what the answer can take, a task's defaults that
run every strategy it lists, and a refusal that names the parameter and cuts the schema. Fake backend."""

from __future__ import annotations

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.cli.main import main
from formtax.constraints import parse_spec
from formtax.errors import ConfigError
from formtax.records import read_records
from formtax.strategies import Request, get_strategy


def test_reserves_follow_the_answer():
    bounded = parse_spec("The answer is: {int:0..999}")
    # "The answer is: " is 15 bytes and 0..999 at most 3 digits: 18, plus EOS, plus the switch token
    assert get_strategy("inwriting").min_budget(Request("q", bounded)) == 20
    # json: the template needs no escapes, so its JSON string is its text plus quotes (not twice the text)
    assert get_strategy("json").min_budget(Request("q", parse_spec("The answer is: {int}"))) <= 96
    res = formtax.generate(FakeBackend(random_logits(seed=3)), "2 + 5?", "json", "The answer is: {int}", max_tokens=96)
    assert res.error is None


def test_a_refusal_names_max_tokens_and_cuts_the_schema():
    schema = {"type": "object", "properties": {f"field_{k}": {"type": "string", "minLength": 40} for k in range(30)},
              "required": [f"field_{k}" for k in range(30)]}
    with pytest.raises(ConfigError) as e:
        formtax.generate(FakeBackend(), "q", "constrained", schema, max_tokens=5)
    msg = str(e.value)
    assert "raise max_tokens" in msg and len(msg) < 300 and "field_29" not in msg


def test_eae_defaults_run_every_strategy(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--task", "eae-wikievents", "--strategies", "free,json", "--limit", "1", "--backend", "fake",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    recs = read_records(out / "records.jsonl")
    assert {r.strategy for r in recs} == {"free", "json"}
    json_rec = next(r for r in recs if r.strategy == "json")
    assert json_rec.budget["reasoning_tokens"] == 128  # the floor: 256 leaves none after the record's reserve
    capsys.readouterr()
    code = main(["run", "--task", "eae-wikievents", "--strategies", "json", "--limit", "1", "--backend", "fake",
                 "--max-tokens", "256", "--out", str(tmp_path / "other")])
    assert code != 0 and "leaves no reasoning budget" in capsys.readouterr().err  # explicit: refused, by name
