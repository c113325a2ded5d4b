"""The decode loop and the base strategies on the fake backend (milliseconds)."""

import pytest

import formtax
from formtax.backends.fake import EOS, FakeBackend, random_logits, scripted
from formtax.decoding.engine import Capability
from formtax.errors import CapabilityError, ConfigError

Q = [{"role": "user", "content": "What is 2+3?"}]
SCRIPT = "Let me think. 2+3=5.\nThe answer is: 5"


def fake(text=SCRIPT):
    return FakeBackend(scripted(text))


def test_free_follows_the_model_and_stops_at_eos():
    r = formtax.generate(fake(), Q, "free", "The answer is: {int}", max_tokens=100)
    assert r.text == SCRIPT
    assert r.finish_reason == "eos"
    assert r.parsed == 5 and r.parse_ok
    assert r.token_ids[-1] == EOS
    assert r.tokens.total == len(SCRIPT.encode()) + 1


def test_free_budget():
    r = formtax.generate(fake(), Q, "free", None, max_tokens=5)
    assert r.text == SCRIPT[:5] and r.finish_reason == "length"
    assert not r.parse_ok


def test_short_stops_at_first_newline():
    r = formtax.generate(fake(), Q, "short", "The answer is: {int}", max_tokens=100)
    assert r.finish_reason == "newline"
    assert r.answer_text == "Let me think. 2+3=5."
    assert not r.parse_ok  # the first line holds no answer


def test_constrained_output_fullmatches_and_records_masked_mass():
    r = formtax.generate(fake(), Q, "constrained", "The answer is: {int:0..999}", max_tokens=40)
    assert r.parse_ok, r
    assert r.answer_text.startswith("The answer is: ")
    assert 0.0 <= r.masked_mass <= 1.0
    # the scripted model wanted 'L' first: nearly all its mass is outside the template's first byte 'T'
    assert r.masked_mass > 0.99
    assert r.tokens.forced > 0


def test_inwriting_switches_exactly_where_the_model_wants_eos():
    free = formtax.generate(fake(), Q, "free", None, max_tokens=100)
    r = formtax.generate(fake(), Q, "inwriting", "The answer is: {int}", max_tokens=100)
    n = len(SCRIPT.encode())
    assert r.stats["switch_reason"] == "eos"
    assert r.stats["switch_step"] == n == len(free.token_ids) - 1
    assert r.phases["reasoning"] == SCRIPT  # the preamble is the free text, EOS never emitted
    assert r.token_ids[:n] == free.token_ids[:n]
    assert EOS not in r.token_ids[:n]
    assert r.parse_ok and r.answer_text.startswith("The answer is: ")


def test_inwriting_switches_after_a_trigger_token():
    r = formtax.generate(fake(), Q, "inwriting", "The answer is: {int}", max_tokens=100, triggers=["."])
    first_dot = SCRIPT.index(".") + 1
    assert r.stats["switch_reason"] == "trigger"
    assert r.stats["switch_step"] == first_dot
    assert r.phases["reasoning"] == SCRIPT[:first_dot]  # the trigger stays in the preamble
    assert r.parse_ok


def test_inwriting_multi_token_trigger_is_refused():
    with pytest.raises(ConfigError, match="one token"):
        formtax.generate(fake(), Q, "inwriting", "The answer is: {int}", triggers=["ab"])


def test_inwriting_budget_reserves_the_answer():
    spec = "The answer is: {int:0..99}"
    reserve = len(b"The answer is: ") + 16 + 1
    r = formtax.generate(FakeBackend(random_logits(seed=3)), Q, "inwriting", spec, max_tokens=reserve + 4)
    assert r.stats["switch_reason"] in {"budget", "eos"}
    assert r.parse_ok and r.tokens.total <= reserve + 4


def test_budget_too_small_for_the_answer_is_refused_before_running():
    with pytest.raises(ConfigError, match="cannot fit the answer"):
        formtax.generate(fake(), Q, "constrained", "The answer is: {int}", max_tokens=5, closing=False)
    with pytest.raises(ConfigError, match="no completion .* fits in 5 tokens"):  # closing mode's own check
        formtax.generate(fake(), Q, "constrained", "The answer is: {int}", max_tokens=5)


def test_reasoning_prefix_is_forced_then_strategy_runs():
    r = formtax.generate(fake(), Q, "inwriting", "The answer is: {int}", max_tokens=120,
                         reasoning="Let's think step by step.")
    assert r.text.startswith("Let's think step by step.")
    assert r.tokens.by_phase["rc"] == len(b"Let's think step by step.")
    assert r.tokens.forced >= r.tokens.by_phase["rc"]
    assert r.parse_ok


def test_json_strategy_validates_and_extracts_answer():
    r = formtax.generate(fake(), Q, "json", "{int:0..}", max_tokens=60, json_layout="compact")
    assert r.parse_ok, r
    assert isinstance(r.parsed, int) and r.parsed >= 0
    assert r.answer_text.startswith('{"reason": "')


def test_json_reason_is_capped_so_the_answer_always_fits():
    # a model that never wants to close the string: the engine caps the reason, the answer still completes
    r = formtax.generate(FakeBackend(scripted("x" * 500)), Q, "json", "{choice:yes|no}", max_tokens=56)
    assert r.parse_ok and r.parsed in {"yes", "no"}
    assert r.tokens.total <= 56


def test_nl2format_makes_two_calls():
    r = formtax.generate(fake(), Q, "nl2format", "The answer is: {int}", max_tokens=100)
    assert len(r.calls) == 2
    assert r.reasoning == SCRIPT
    assert r.parse_ok
    assert r.tokens.by_phase["reasoning"] == len(SCRIPT.encode()) + 1


def test_unknown_strategy_lists_known():
    with pytest.raises(ConfigError, match="known: .*free"):
        formtax.generate(fake(), Q, "nope", None)


def test_capability_mismatch_fails_before_run():
    fb = fake()
    fb.capabilities = frozenset({Capability.GRAMMAR_PARAM})
    with pytest.raises(CapabilityError, match="step-logits"):
        formtax.generate(fb, Q, "inwriting", "The answer is: {int}")
    assert fb.batches == []


def test_constrained_strategy_without_constraint_is_refused():
    with pytest.raises(ConfigError, match="needs an answer constraint"):
        formtax.generate(fake(), Q, "constrained", None)


def test_batch_rows_finish_independently():
    fb = FakeBackend(random_logits(seed=7))
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(5)]
    batch = formtax.generate_batch(fb, prompts, "constrained", "{choice:a|bb|ccc}", max_tokens=10)
    single = [formtax.generate(fb, p, "constrained", "{choice:a|bb|ccc}", max_tokens=10) for p in prompts]
    assert [r.text for r in batch] == [r.text for r in single]
    assert all(r.parse_ok for r in batch)


def test_sampling_is_seeded():
    fb = FakeBackend(random_logits(seed=2, scale=0.5))
    from formtax.decoding import RowRequest, decode
    from formtax.decoding.policies import FreePolicy

    def run(seed):
        rows = [RowRequest([1, 2, 3], FreePolicy(frozenset({EOS})), 20, seed=seed)]
        return decode(fb, rows, temperature=1.0)[0].tokens

    assert run(1) == run(1)
    assert run(1) != run(2)


# -- InWriting's switch under sampling (a Divert) and its engine-side equivalent --------------------------------


def test_a_divert_draws_greedy_and_sampled_and_an_engine_gets_its_token_forced():
    import torch

    from formtax.decoding.plan import Divert, Plan
    from formtax.decoding.sampling import as_sampling
    from formtax.decoding.step import draw_divert, edit_row

    switched = Plan(forced=7)
    logits = torch.log(torch.tensor([0.47, 0.33, 0.20]))  # token 0 stands for EOS
    greedy, sampled = as_sampling(0.0), as_sampling(1.0)
    plan = Plan(divert=Divert(frozenset({0}), lambda: switched))
    assert draw_divert(plan, logits, greedy, None, lambda: 0) == (switched, None)  # greedy: the argmax is EOS
    other = Plan(divert=Divert(frozenset({1}), lambda: switched))
    assert draw_divert(other, logits, greedy, None, lambda: 0) == (other, 0)  # greedy: the argmax is kept
    gen = torch.Generator().manual_seed(0)
    hits = sum(draw_divert(plan, logits, sampled, gen, lambda: 0)[0] is switched for _ in range(4000))
    assert abs(hits / 4000 - 0.47) < 0.03  # sampled: switches with p(EOS)
    # an engine that samples on its own is handed the kept draw as a forced token, flagged as the loop flags it
    row = logits.clone()
    choice, entry = edit_row(row, 0, other, 0, logits, greedy, None, draws=True)
    assert (choice.token, choice.masked, choice.forced) == (0, True, False) and entry is not None and entry.forced == 0


def test_a_constraint_that_matches_nothing_is_refused_before_running():
    from formtax.errors import ConstraintError

    fb = fake()
    with pytest.raises(ConstraintError, match="matches nothing"):
        formtax.generate(fb, Q, "constrained", r"regex:[^\s\S]", max_tokens=8)
    assert not fb.batches  # no model call


@pytest.mark.parametrize("written", ['{\n  "answer": 5\n}', '\n{"answer": 5}'])
def test_nl2format_unconstrained_second_call_is_parsed_whole(written):
    """Issue 37, point 1: paper 003's unconstrained second call is only prompted and its whole output parsed; the
    first line alone (``{`` or ``""``) was what formtax used to read."""
    r = formtax.generate(fake(written), Q, "nl2format", "answer-json:{int}", max_tokens=60, constrain=False)
    assert r.answer_text == written and r.calls[1].finish_reason == "eos"
    assert r.parse_ok and r.parsed == 5
