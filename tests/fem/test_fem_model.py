"""decog and ctrlg on the embedded default model (SmolLM2-135M, 49k vocabulary): small HMMs distilled here, short
budgets; every output must be in the format, whatever the (tiny, barely trained) HMM says."""

from __future__ import annotations

import pytest

from formtax.constraints import parse_spec
from formtax.fem.artifact import FemArtifact
from formtax.runner.distill import DistillConfig, build_fem
from formtax.strategies import Request, get_strategy

pytestmark = pytest.mark.model

QUESTIONS = [
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
    "Rate this sentence from 1 to 5 for fluency: 'the cat sat on mat the'.",
]
TEMPLATES = {  # two templates per strategy keep the test short; together they cover int, range, choice, letters
    "decog": ["The answer is: {int:0..}", "Answer: {choice:yes|no}"],
    "ctrlg": ["The rating is {int:1..5}", "So it is {letters}."],
}


@pytest.fixture(scope="module")
def model_fems(default_model) -> dict[str, FemArtifact]:
    out = {}
    for name, form in (("decog", "instruction-aware"), ("ctrlg", "unconditional")):
        cfg = DistillConfig(task="gsm8k", form=form, states=16, samples=3, max_tokens=20, em_iters=2, batch_size=3)
        hmm, meta = build_fem(default_model, cfg)
        out[name] = FemArtifact(hmm, meta)
        # each form's paper: Deco-G's n-gram frequencies, Ctrl-G's hidden-state clusters (issue 37, point 8)
        assert meta["init"] == ("ngram" if form == "instruction-aware" else "kmeans") and meta["n_samples"] == 3
    return out


@pytest.mark.parametrize("strategy", ["decog", "ctrlg"])
def test_always_in_the_format_on_the_default_model(default_model, model_fems, strategy: str) -> None:
    s = get_strategy(strategy)
    for k, answer in enumerate(TEMPLATES[strategy]):
        c = parse_spec(answer)
        budget = 20 + 4 * k
        reqs = [Request([{"role": "user", "content": q}], c, max_tokens=budget, options={"fem": model_fems[strategy]})
                for q in QUESTIONS]
        for r in s.run(default_model, reqs):
            assert r.error is None and r.finish_reason in ("eos", "length"), (answer, r.finish_reason, r.text)
            assert r.parse_ok and c.validate(r.answer_text).ok, (answer, r.text)
            last = r.text.rstrip("\n").rsplit("\n", 1)[-1].strip()
            assert last == r.answer_text, (answer, r.text)
            assert r.tokens.total <= budget
            assert r.stats["fem_h"] == 16 and all(0 < m <= 1 for m in r.stats["fem_mass"])
