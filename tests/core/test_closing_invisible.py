"""Closing mode is invisible wherever the model's own answer fits (issue 46).

The promise: for any constraint and budget, if the closing-off decode completes inside the budget, the closing-on
decode is token-identical, and ``Result.stats["closing_changed_tokens"]`` is 0. Where the budget does bind, closing
still finishes every answer (tests/core/test_closing.py) and counts the tokens it changed.

The oracle is the closing-off decode itself (the engine's mask alone), at the same budget. For json and InWriting
the budget also sets the reason cap and the preamble: those are compared where the budget shaped nothing in the
closing-off decode (its output equals the one with room to spare). Where the off decode's preamble or reason was cut
by the answer's worst-case reserve, closing mode's own reserve (what the answer plausibly takes, issue 45) leaves the
reasoning more room on purpose, so those outputs differ by design, not by closing's veto.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import EOS, FakeBackend, random_logits
from formtax.constraints import as_constraint
from formtax.errors import ConfigError
from formtax.strategies import Request, get_strategy

COMPLETE = ("eos", "constraint-complete")
ROOM = 400  # "room to spare": the reason cap and the preamble this budget sets shape no answer that ends below 160
EXAMPLES = int(os.environ.get("FORMTAX_PROPERTY_EXAMPLES", "250"))  # a longer run: FORMTAX_PROPERTY_EXAMPLES=2000

# A model that closes what it opens often enough that its own answers end: random logits with the structural
# bytes, digits and EOS favoured (a random walk over a JSON object otherwise stays in a string for hundreds of
# tokens, and over a regex such as ``[a-z]+ ok`` it rarely leaves the letters).
FAVOURED = [*b'"}],:. 0123456789', EOS]


def closing_model(seed: int, bias: float) -> FakeBackend:
    base = random_logits(seed=seed)

    def fn(seq: Sequence[int]) -> torch.Tensor:
        logits = base(seq).clone()
        logits[FAVOURED] += bias
        return logits

    return FakeBackend(fn)


# (strategy, answer): regex, JSON Schema, choice, templates, the json strategy's object, InWriting's answer phase
CASES = {
    "date": ("constrained", "regex:[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "regex-open": ("constrained", "regex:[a-z0-9]+ ok"),
    "regex-words": ("constrained", r"regex:(\w+ )*[0-9]+\."),
    "choice": ("constrained", "choice:yes|no|maybe|yesterday"),
    "json": ("constrained", 'json:{"type":"object","properties":{"a":{"type":"string","maxLength":6},'
                            '"n":{"type":"integer"},"e":{"enum":["x","yz"]}},"required":["a","n","e"]}'),
    "json-array": ("constrained", 'json:{"type":"array","items":{"type":"integer"},"maxItems":4}'),
    "template-int": ("constrained", "The answer is: {int}"),
    "template-choice": ("constrained", "Verdict: {choice:yes|no}."),
    "lark": ("constrained", 'lark:start: "(" item ("," item)* ")"\nitem: /[0-9]+/'),
    "json-strategy": ("json", "{int}"),
    "json-strategy-choice": ("json", "{choice:yes|no}"),
    "inwriting": ("inwriting", "The answer is: {int}"),
    "inwriting-json": ("inwriting", 'json:{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}'),
}


def run(case: str, seed: int, bias: float, budget: int, closing: bool, temperature: float) -> formtax.Result:
    strategy, spec = CASES[case]
    return formtax.generate(closing_model(seed, bias), "q", strategy, spec, max_tokens=budget, raw=True,
                            closing=closing, temperature=temperature, seed=seed)


def accepted_budget(case: str, budget: int) -> int:
    """The smallest budget from ``budget`` up that the strategy accepts with closing off (a two-phase strategy
    reserves room for its answer and refuses less, closing on or off alike)."""
    strategy, spec = CASES[case]
    strat, backend = get_strategy(strategy), FakeBackend(random_logits())
    for b in range(budget, budget + 200):
        try:
            strat.check(backend, [Request("q", as_constraint(spec), max_tokens=b)])
        except ConfigError:
            continue
        return b
    raise AssertionError(f"{case}: no budget from {budget} is accepted")


@given(case=st.sampled_from(sorted(CASES)), seed=st.integers(0, 100_000), bias=st.sampled_from([2.0, 4.0, 6.0]),
       slack=st.integers(0, 10), temperature=st.sampled_from([0.0, 1.0]))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_closing_is_invisible_where_the_answer_fits(case, seed, bias, slack, temperature):
    strategy, _ = CASES[case]
    # the length of the model's own answer where nothing binds; a two-phase strategy's is read at its own budget
    free = run(case, seed, bias, ROOM, False, temperature)
    assume(free.finish_reason in COMPLETE)
    budget = accepted_budget(case, free.tokens.total + slack)
    off = run(case, seed, bias, budget, False, temperature) if strategy != "constrained" else free
    assume(off.finish_reason in COMPLETE and off.tokens.total <= budget)
    assume(off.token_ids == free.token_ids)  # the budget shaped nothing (module docstring)
    on = run(case, seed, bias, budget, True, temperature)
    note(f"budget {budget}: off {off.text!r} on {on.text!r}")
    assert on.token_ids == off.token_ids
    assert on.stats["closing_changed_tokens"] == 0
    assert on.parse_ok == off.parse_ok


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_has_answers_that_fit(case):
    """The property above is not vacuous: every case has seeds whose closing-off answer completes and whose
    closing-on answer at the tightest budget that shapes nothing (its length, for constrained) is the same."""
    strategy, _ = CASES[case]
    checked = 0
    for seed in range(12):
        free = run(case, seed, 4.0, ROOM, False, 0.0)
        if free.finish_reason not in COMPLETE:
            continue
        budget, off = accepted_budget(case, free.tokens.total), free
        while strategy != "constrained" and budget < ROOM:  # the tightest budget that shapes nothing
            off = run(case, seed, 4.0, budget, False, 0.0)
            if off.token_ids == free.token_ids:
                break
            budget += 1
        if off.finish_reason not in COMPLETE or off.tokens.total > budget or off.token_ids != free.token_ids:
            continue
        on = run(case, seed, 4.0, budget, True, 0.0)
        assert on.token_ids == off.token_ids, (seed, budget, off.text, on.text)
        checked += 1
    assert checked >= 3, f"{case}: only {checked} of 12 seeds completed without closing"


def test_where_the_budget_binds_the_changed_tokens_are_counted():
    """An open regex whose model keeps writing letters: at a tight budget closing must act, and says so."""
    b = FakeBackend(random_logits(seed=3))
    off = formtax.generate(b, "q", "constrained", "regex:[a-z]+ ok", max_tokens=12, raw=True, closing=False)
    assert off.finish_reason == "length-incomplete"
    on = formtax.generate(b, "q", "constrained", "regex:[a-z]+ ok", max_tokens=12, raw=True)
    assert on.parse_ok and on.tokens.total <= 12
    assert on.stats["closing_changed_tokens"] >= 1
    assert "closing_changed_tokens" not in off.stats  # closing off: nothing to count


def test_the_lab_reports_closings_footprint_per_strategy(tmp_path):
    """``formtax run --closing``: every record carries the count, and the tokens table reports it per strategy,
    with the reasoning budget still the same at every level (the runner's planned reserve)."""
    from formtax.records import read_records
    from formtax.report.load import load_records
    from formtax.report.tables import tokens_table
    from formtax.runner import RunConfig, run

    out = tmp_path / "run"
    cfg = RunConfig(task="arith", strategies=["constrained", "json", "inwriting", "free"], backend="fake", limit=4,
                    max_tokens=72, closing=True)
    run(cfg, out)
    records = read_records(out / "records.jsonl")
    closed = [r for r in records if r.strategy != "free"]
    assert closed and all(isinstance(r.stats["closing_changed_tokens"], int) for r in closed)
    assert all("closing_changed_tokens" not in r.stats for r in records if r.strategy == "free")
    df = load_records(out)
    table = tokens_table(df).set_index("strategy")
    assert table.loc["free", "n_closing"] == 0
    for s in ("constrained", "json", "inwriting"):
        assert table.loc[s, "n_closing"] == 4
        changed = [r.stats["closing_changed_tokens"] for r in closed if r.strategy == s]
        assert table.loc[s, "n_closing_changed"] == sum(c > 0 for c in changed)
        assert table.loc[s, "closing_changed_tokens_mean"] == pytest.approx(sum(changed) / len(changed), abs=1e-3)
    # a record where closing acted (the API test above makes one): counted, and in the mean
    df.loc[df.index[df["strategy"] == "json"][0], "closing_changed_tokens"] = 3.0
    row = tokens_table(df).set_index("strategy").loc["json"]
    assert row["n_closing_changed"] == 1 + table.loc["json", "n_closing_changed"]
    assert row["closing_changed_tokens_mean"] > table.loc["json", "closing_changed_tokens_mean"]
    budgets = {r.strategy: r.budget for r in records if r.strategy in ("json", "inwriting")}
    assert all(b["max_tokens"] == b["reasoning_tokens"] + b["answer_tokens"] for b in budgets.values())
