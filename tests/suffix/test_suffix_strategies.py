"""The suffix strategies on the fake backend: branch points, budgets, statistics, options, the CLI."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import torch

import formtax
from formtax.backends.fake import EOS, FakeBackend, random_logits, scripted
from formtax.cli.main import main
from formtax.constraints import parse_spec
from formtax.decoding.engine import Capability
from formtax.errors import CapabilityError, ConfigError
from formtax.strategies import get_strategy
from formtax.strategies.base import Request
from formtax.strategies.suffix_policies import choose_branch, suffix_answer

Q = [{"role": "user", "content": "What is 2+3?"}]
SCRIPT = "Let me think. 2+3=5.\nThe answer is: 5"
SPEC = "The answer is: {int}"
SUFFIX = ["suffix-pipeline", "suffix-last", "suffix-min", "suffix-beam"]
RESERVE = len(b"The answer is: ") + 16 + 1 + 1  # template bound, EOS, an optional leading whitespace


def fake(text: str = SCRIPT) -> FakeBackend:
    return FakeBackend(scripted(text))


def run(strategy: str, backend: FakeBackend, max_tokens: int = 100, spec: str = SPEC, **options):
    req = Request(Q, parse_spec(spec), max_tokens=max_tokens, options=options)
    return get_strategy(strategy).run(backend, [req])[0]


def test_last_branches_where_the_model_starts_the_template_itself():
    r = formtax.generate(fake(), Q, "suffix-last", SPEC, max_tokens=100)
    t = SCRIPT.index("The answer")
    assert r.stats["t_star"] == t
    assert r.stats["free_end"] == len(SCRIPT.encode()) and r.stats["free_end_reason"] == "eos"
    assert r.text == SCRIPT and r.finish_reason == "eos" and r.token_ids[-1] == EOS
    assert r.reasoning == SCRIPT[:t] and r.answer_text == "The answer is: 5"
    assert r.parse_ok and r.parsed == 5 and r.error is None
    assert r.stats["delta_at_t_star"] == 0.0 and r.stats["n_candidates"] == 2  # "T" of "The", and the end
    deltas = r.stats["deltas"]
    assert len(deltas) == r.stats["free_end"] + 1
    assert [k for k, d in enumerate(deltas) if d == 0.0] == [t]
    assert r.masked_mass is not None and r.masked_mass < 0.01  # the model itself wanted "T" there
    assert r.tokens.by_phase == {"reasoning": t, "answer": len("The answer is: 5") + 1}


def test_pipeline_appends_the_template_where_the_model_wants_to_stop():
    r = formtax.generate(fake(), Q, "suffix-pipeline", SPEC, max_tokens=100)
    n = len(SCRIPT.encode())
    assert r.stats["t_star"] == r.stats["free_end"] == n
    assert r.reasoning == SCRIPT  # the free run, without its EOS
    assert r.text.startswith(SCRIPT + "The answer is: ") and r.parse_ok
    assert EOS not in r.token_ids[:n]


def test_min_takes_the_latest_minimal_delta():
    assert choose_branch([0.5, 0.0, 0.3, 0.0, 0.2], 4, "min", 0.0) == 3
    assert choose_branch([0.5, 0.1, 0.3, 0.2], 3, "min", 0.0) == 1
    assert choose_branch([None, None, 0.4, 0.4], 3, "min", 0.0) == 3  # the end counts with its own delta
    assert choose_branch([0.5, 0.0, 0.3, 0.2], 3, "last", 0.0) == 1
    assert choose_branch([0.5, 0.1, 0.3, 0.2], 3, "last", 0.0) == 3  # nothing <= tau: the end
    assert choose_branch([0.5, 0.1, 0.3, 0.9], 3, "last", 0.3) == 2
    assert choose_branch([0.0, 0.0], 1, "pipeline", 0.0) == 1


def test_tau_widens_the_candidates():
    r0 = run("suffix-last", FakeBackend(random_logits(seed=5)), 80)
    r1 = run("suffix-last", FakeBackend(random_logits(seed=5)), 80, tau=1.0)
    assert r0.stats["tau"] == 0.0 and r1.stats["tau"] == 1.0
    # with tau = 1 every step is a candidate, so the latest one, the end, is chosen
    assert r1.stats["t_star"] == r1.stats["free_end"] and r1.stats["n_candidates"] == r1.stats["free_end"] + 1
    mid = run("suffix-last", FakeBackend(random_logits(seed=5)), 80, tau=0.3)
    d = mid.stats["deltas"]
    below = [k for k, x in enumerate(d[:-1]) if x <= 0.3]
    assert mid.stats["n_candidates"] == len(below) + 1
    assert mid.stats["t_star"] == (below[-1] if d[-1] > 0.3 and below else mid.stats["free_end"])


@pytest.mark.parametrize("strategy", SUFFIX)
def test_the_free_budget_leaves_the_reserve_and_every_answer_parses(strategy):
    for budget in (RESERVE, RESERVE + 1, RESERVE + 17):
        r = run(strategy, fake("x" * 500), budget)  # a model that never stops
        assert r.stats["free_end_reason"] == "budget" and r.stats["free_end"] == budget - RESERVE
        assert r.tokens.total <= budget and r.parse_ok, (budget, r.text)
    with pytest.raises(ConfigError, match="cannot fit the answer"):
        run(strategy, fake(), RESERVE - 1)


@pytest.mark.parametrize("strategy", SUFFIX)
def test_reasoning_prefix_is_forced_and_never_a_branch_point(strategy):
    prefix = "Let's think step by step."
    r = formtax.generate(fake(), Q, strategy, SPEC, max_tokens=100, reasoning=prefix)
    n = len(prefix.encode())
    assert r.text.startswith(prefix) and r.reasoning.startswith(prefix)
    assert r.stats["deltas"][:n] == [None] * n and r.stats["t_star"] >= n
    assert r.tokens.by_phase["rc"] == n and r.tokens.forced >= n
    assert r.parse_ok


@pytest.mark.parametrize("strategy", SUFFIX)
def test_batch_rows_equal_single_rows(strategy):
    prompts = [[{"role": "user", "content": "q" * (i + 1)}] for i in range(5)]
    fb = FakeBackend(random_logits(seed=11, scale=2.0))
    batch = formtax.generate_batch(fb, prompts, strategy, "{int:0..999}", max_tokens=40)
    single = [formtax.generate(fb, p, strategy, "{int:0..999}", max_tokens=40) for p in prompts]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    assert all(r.parse_ok for r in batch)


def test_beam_is_a_beam_and_equals_the_lazy_form():
    fb = fake()
    lazy = formtax.generate(fb, Q, "suffix-last", SPEC, max_tokens=100)
    beam = formtax.generate(fb, Q, "suffix-beam", SPEC, max_tokens=100)
    assert beam.token_ids == lazy.token_ids and beam.stats["t_star"] == lazy.stats["t_star"]
    assert beam.stats["rule"] == "last" and beam.stats["branches"] == 1
    lazy_min = run("suffix-min", FakeBackend(random_logits(seed=3)), 70)
    beam_min = run("suffix-beam", FakeBackend(random_logits(seed=3)), 70, rule="min")
    assert beam_min.token_ids == lazy_min.token_ids and beam_min.stats["rule"] == "min"
    assert beam_min.stats["branches"] >= 1


def test_beam_runs_two_rows_per_request(monkeypatch):
    import formtax.strategies.suffix as suffix_mod

    sizes = []
    orig = suffix_mod.decode

    def spy(backend, rows, temperature=0.0, on_step=None):
        sizes.append(len(rows))
        return orig(backend, rows, temperature, on_step)

    monkeypatch.setattr(suffix_mod, "decode", spy)
    fb = fake()
    beam = formtax.generate_batch(fb, [Q, Q, Q], "suffix-beam", SPEC, max_tokens=100)
    lazy = formtax.generate_batch(fb, [Q, Q, Q], "suffix-last", SPEC, max_tokens=100)
    assert sizes == [6, 3]
    # the beam's rows run side by side: fewer sequential passes here, more token computations
    assert beam[0].stats["forward_passes"] < lazy[0].stats["forward_passes"]
    assert beam[0].stats["row_passes"] > lazy[0].stats["row_passes"]


def test_unconstrained_level_is_free_decoding_with_the_same_budget():
    fb = fake()
    free = formtax.generate(fb, Q, "free", SPEC, max_tokens=100)
    r = formtax.generate(fb, Q, "suffix-last", SPEC, max_tokens=100, constrain=False)
    assert r.strategy == "suffix-last" and r.token_ids == free.token_ids
    assert r.answer_text is None and r.parse_ok and r.parsed == 5  # read from the free text


def test_options_are_checked_before_any_model_call():
    fb = fake()
    bad = [("suffix-last", {"rule": "min"}, "takes no rule"), ("suffix-beam", {"rule": "first"}, "unknown beam rule"),
           ("suffix-last", {"tau": -0.1}, "tau must be"), ("suffix-min", {"tau": float("nan")}, "tau must be"),
           ("suffix-last", {"taux": 1}, "unknown option")]
    for name, opts, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            run(name, fb, **opts)
    assert fb.batches == []


def test_a_backend_that_cannot_crop_is_refused():
    fb = fake()
    fb.capabilities = frozenset({Capability.STEP_LOGITS})
    for name in SUFFIX:
        with pytest.raises(CapabilityError, match="kv-crop"):
            formtax.generate(fb, Q, name, SPEC)
    assert fb.batches == []


def test_start_set_on_the_byte_tokenizer():
    tok = fake().tokenizer

    def s(spec: str) -> set[str]:
        return {tok.decode([i]) for i in suffix_answer(parse_spec(spec), tok).start.nonzero().flatten().tolist()}

    assert s(SPEC) == {"T"}  # bare " " / "\n" tokens are not starts of the template
    assert s("{int:0..9}") == set("0123456789")
    assert s(" {int}") == {" "}  # T itself begins with a space
    assert s("regex:[ab]+") == {"a", "b"}  # not a template: used as it is


def _sampling_model(seq: Sequence[int]) -> torch.Tensor:
    """Argmax never EOS, but EOS nearly as likely as the argmax: every EOS end is a sampled one."""
    logits = random_logits(seed=9, scale=0.5)(seq).clone()
    logits[ord("a")] = 6.0
    logits[EOS] = 5.8
    return logits


@pytest.mark.parametrize("strategy", ["suffix-last", "suffix-beam"])
def test_sampling_is_seeded_and_a_sampled_eos_is_rewound_away(strategy):
    fb = FakeBackend(_sampling_model)
    ends = set()
    for seed in range(6):
        a = formtax.generate(fb, Q, strategy, SPEC, max_tokens=60, temperature=1.0, seed=seed)
        b = formtax.generate(fb, Q, strategy, SPEC, max_tokens=60, temperature=1.0, seed=seed)
        assert a.token_ids == b.token_ids
        assert a.parse_ok and a.tokens.total <= 60
        assert EOS not in a.token_ids[: a.stats["t_star"]]
        ends.add(a.stats["free_end_reason"])
    assert "eos" in ends


def test_generate_cli_json_carries_t_star_and_delta(capsys):
    rc = main(["generate", "--backend", "fake", "--strategy", "suffix-last", "--answer", SPEC, "--max-tokens", "60",
               "--tau", "0.5", "--json", "What is 2+3?"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["parse_ok"]
    assert out["stats"]["tau"] == 0.5 and isinstance(out["stats"]["t_star"], int)
    assert isinstance(out["stats"]["delta_at_t_star"], float)
    rc = main(["generate", "--backend", "fake", "--strategy", "suffix-beam", "--beam-rule", "min", "--answer", SPEC,
               "--max-tokens", "60", "What is 2+3?"])
    text = capsys.readouterr().out
    assert rc == 0 and "[suffix] rule=min" in text
    rc = main(["generate", "--backend", "fake", "--strategy", "free", "--tau", "0.1", "x"])
    assert rc == 2 and "--tau applies to suffix-beam, suffix-last, suffix-min, suffix-pipeline, not 'free'" in capsys.readouterr().err
