"""formtax.stream: deltas with phases that add up to exactly the Result generate returns."""

from __future__ import annotations

import asyncio

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.errors import ConfigError

Q = "What is 2 + 2?"
CASES = [("free", None), ("constrained", "The answer is: {int:0..99}"), ("inwriting", "The answer is: {int:0..99}"),
         ("json", "{int:0..99}"), ("inwriting", int)]


@pytest.mark.parametrize(("strategy", "answer"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stream_adds_up_to_generate(strategy, answer, seed):
    fb = FakeBackend(random_logits(seed=seed))
    ref = formtax.generate(fb, Q, strategy, answer, max_tokens=80)
    parts = list(formtax.stream(fb, Q, strategy, answer, max_tokens=80))
    *deltas, res = parts
    assert isinstance(res, formtax.strategies.Result) and all(isinstance(d, formtax.Delta) for d in deltas)
    assert res.token_ids == ref.token_ids and res.parsed == ref.parsed and res.finish_reason == ref.finish_reason
    assert [t for d in deltas for t in d.token_ids] == ref.token_ids
    phases = list(dict.fromkeys(d.phase for d in deltas))
    assert "".join(d.text for d in deltas) == ref.text  # all of them: the text (InWriting's seam included)
    for ph in phases:  # each phase's deltas are that phase's text; the seam's line break carries no token
        assert "".join(d.text for d in deltas if d.phase == ph and d.token_ids) == res.phases[ph], ph
    if strategy == "inwriting":  # the switch shows live: reasoning deltas, then answer deltas
        assert phases in (["reasoning", "answer"], ["answer"], ["reasoning"])


def test_astream_and_refusals():
    fb = FakeBackend(random_logits(seed=4))

    async def collect():
        return [p async for p in formtax.astream(fb, Q, "constrained", "{int:0..9}", max_tokens=20)]

    parts = asyncio.run(collect())
    assert parts[-1].token_ids == formtax.generate(fb, Q, "constrained", "{int:0..9}", max_tokens=20).token_ids
    with pytest.raises(ConfigError, match="cannot stream"):
        next(formtax.stream(fb, Q, "suffix-last", "The answer is: {int}"))
    with pytest.raises(ConfigError, match="needs an answer"):
        next(formtax.stream(fb, Q, "constrained", None))
