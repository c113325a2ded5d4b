"""InWriting under sampling: a sampled EOS switches to the answer (the draw replaced by the masked answer's).

The world's model, after "Two and three.", stops with p = 0.47 (then answers 5, right) or goes on (p = 0.53) to a
second thought that ends in a wrong answer. Under greedy decoding the argmax goes on: accuracy 0. Under sampling
at T = 1 the switch fires on the sampled EOS: accuracy exactly 0.47 (the old argmax-only rule never switched at
that step, so a sampled run always went on: 0).
"""

from __future__ import annotations

import pytest
from scipy import stats

from formtax.planted.calibrate import calibrate
from formtax.planted.world import parse_world, write_world


def _world() -> dict:
    return {"name": "sampled-eos", "tokenizer": "bytes", "items": [{
        "id": "a", "question": "What is two plus three?", "gold": "5",
        "continuations": [
            {"text": ["Two and three."], "p": 0.47, "after_end": [{"text": "The answer is: 5", "p": 1.0}]},
            {"text": ["Two and three.", " Or is it six?"], "p": 0.53,
             "after_end": [{"text": "The answer is: 6", "p": 1.0}]},
        ]}],
        "study": {"strategies": ["inwriting@vc"], "reasoning_tokens": 64}}


def test_greedy_goes_on_past_a_minority_eos(tmp_path):
    path = write_world(parse_world(_world()), tmp_path / "w.json")
    cal = calibrate(str(path), tmp_path / "o", n_resamples=100)
    row = next(r for r in cal.rows if r.quantity == "accuracy/inwriting@vc/acc_strict")
    assert cal.records_differing == 0
    assert row.exact == pytest.approx(0.0) and row.estimate == pytest.approx(0.0)


def test_sampled_eos_switches_with_its_probability(tmp_path):
    path = write_world(parse_world(_world()), tmp_path / "w.json")
    cal = calibrate(str(path), tmp_path / "o", seeds=300, temperature=1.0, n_resamples=200)
    row = next(r for r in cal.rows if r.quantity == "accuracy/inwriting@vc/acc_strict")
    assert row.exact == pytest.approx(0.47, abs=1e-6)  # the enumerated truth of the written rule
    hits = round(row.estimate * 300)
    assert stats.binomtest(hits, 300, 0.47).pvalue > 1e-3, hits  # the decode loop draws the same rule
