"""The Python API keeps its word (issue 45, points 5, 6 and 8): streams add up to the Result, sampling without a
seed is random and a seeded batch's rows are distinct and reproducible, the typed forms users bring, ``agenerate``
and calls from several threads."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import threading
import uuid

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.decoding.sampling import row_seeds
from formtax.strategies import Result

STREAMABLE = [("free", None), ("short", None), ("constrained", "The answer is: {int}"), ("json", "{int}"),
              ("inwriting", "The answer is: {int}"), ("inwriting", "{choice:yes|no}"),
              ("constrained", 'json:{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}')]


@given(seed=st.integers(0, 10_000), case=st.sampled_from(STREAMABLE), temperature=st.sampled_from([0.0, 1.0]),
       rc=st.sampled_from([None, "Think."]))
@settings(max_examples=60, deadline=None)
def test_streamed_pieces_add_up_to_the_result_text(seed, case, temperature, rc):
    strategy, answer = case
    parts = list(formtax.stream(FakeBackend(random_logits(seed=seed)), "2 + 5?", strategy, answer, max_tokens=80,
                                raw=True, temperature=temperature, seed=seed, reasoning=rc))
    result = parts[-1]
    assert isinstance(result, Result) and all(isinstance(p, formtax.Delta) for p in parts[:-1])
    assert "".join(p.text for p in parts[:-1]) == result.text


def test_the_inwriting_seam_streams_as_its_own_delta():
    """The issue's case: the switch glues the preamble and the answer; the Result's text has a line break there."""
    for seed in range(40):
        b = FakeBackend(random_logits(seed=seed))
        parts = list(formtax.stream(b, "2 + 5?", "inwriting", "The answer is: {int}", max_tokens=40, raw=True))
        result = parts[-1]
        if "\n" in result.text and result.text.replace("\n", "", 1) == "".join(result.phases.values()):
            seam = [p for p in parts[:-1] if p.token_ids == ()]
            assert [p.text for p in seam] == ["\n"] and seam[0].phase == "answer"
            assert "".join(p.text for p in parts[:-1]) == result.text
            return
    raise AssertionError("no seed glued the preamble to the answer")


def test_two_unseeded_sampled_calls_differ_and_record_their_seed():
    b = FakeBackend(random_logits(seed=0))
    a = formtax.generate(b, "q", "free", max_tokens=24, temperature=1.0, raw=True)
    c = formtax.generate(b, "q", "free", max_tokens=24, temperature=1.0, raw=True)
    assert a.token_ids != c.token_ids and a.stats["seed"] != c.stats["seed"]
    again = formtax.generate(b, "q", "free", max_tokens=24, temperature=1.0, raw=True, seed=a.stats["seed"])
    assert again.token_ids == a.token_ids  # the recorded seed reproduces the row
    greedy = formtax.generate(b, "q", "free", max_tokens=24, raw=True)
    assert "seed" not in greedy.stats


def test_a_seeded_batch_has_distinct_reproducible_rows():
    b = FakeBackend(random_logits(seed=0))
    one = formtax.generate_batch(b, ["Name a fruit."] * 3, temperature=1.0, seed=5, max_tokens=24, raw=True)
    two = formtax.generate_batch(b, ["Name a fruit."] * 3, temperature=1.0, seed=5, max_tokens=24, raw=True)
    assert len({tuple(r.token_ids) for r in one}) == 3
    assert [r.token_ids for r in one] == [r.token_ids for r in two]
    assert [r.stats["seed"] for r in one] == row_seeds(5, 3) == [5, 6, 7]
    solo = formtax.generate(b, "Name a fruit.", temperature=1.0, seed=5, max_tokens=24, raw=True)
    assert solo.token_ids == one[0].token_ids  # a one-row call keeps its seed


@pytest.mark.parametrize(("tp", "fmt"), [(datetime.datetime, "date-time"), (datetime.date, "date"),
                                         (datetime.time, "time"), (uuid.UUID, "uuid"), (decimal.Decimal, None)])
def test_the_forms_users_bring(tp, fmt):
    for seed in range(3):
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", tp, max_tokens=60, raw=True)
        assert r.parse_ok and isinstance(r.parsed, tp), (r.text, r.parse_error)
        if fmt is not None:  # a JSON string of that format, checked by the oracle's format checker
            jsonschema.validate(r.answer_text.strip('"'), {"type": "string", "format": fmt},
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        else:
            assert decimal.Decimal(r.answer_text) == r.parsed


def test_agenerate_gives_what_generate_gives():
    b = FakeBackend(random_logits(seed=4))

    async def both():
        return await asyncio.gather(*(formtax.agenerate(b, p, "constrained", "The answer is: {int}", max_tokens=30,
                                                        raw=True) for p in ("a", "b")))

    got = asyncio.run(both())
    want = [formtax.generate(b, p, "constrained", "The answer is: {int}", max_tokens=30, raw=True) for p in ("a", "b")]
    assert [r.token_ids for r in got] == [r.token_ids for r in want]


def test_four_threads_on_one_model_match_sequential_calls():
    b = FakeBackend(random_logits(seed=6))
    prompts = [f"question {k}" for k in range(8)]
    kw = dict(strategy="json", answer="{int}", max_tokens=120, raw=True, temperature=1.0)
    want = {p: formtax.generate(b, p, seed=k, **kw).token_ids for k, p in enumerate(prompts)}
    got: dict[str, list[int]] = {}

    def work(k: int) -> None:
        for j in range(k, len(prompts), 4):
            got[prompts[j]] = formtax.generate(b, prompts[j], seed=j, **kw).token_ids

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want
