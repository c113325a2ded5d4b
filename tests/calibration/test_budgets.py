"""Paper 003's equal reasoning budgets, checked on a planted world whose exact truths are known.

Every item reasons for about 60 tokens (byte tokenizer) before a correct answer line. If a level's reasoning were
cut short, its answer would be garbage. Under the old rule (reasoning = max_tokens minus the level's own answer
reserve) FC's larger reserve cut the reasoning that VC's smaller one did not, and the decomposition showed a
"validity gain" of 1.0 that was only extra reasoning room; with one reasoning budget for every level it is 0.
"""

from __future__ import annotations

import pytest

from formtax.planted.calibrate import calibrate
from formtax.planted.world import parse_world, write_world

REASONING = "Adding the tens first and then the ones, the total comes out as"


def _world(n_items: int = 8) -> dict:
    items = []
    for k in range(n_items):
        g = 20 + k
        text = f"{REASONING} {g}.\nThe answer is: {g}"
        items.append({"id": f"b{k}", "question": f"What is {g - 7} plus 7? (item {k})", "gold": str(g),
                      "continuations": [{"text": text, "p": 1.0, "after_end": [{"text": f"The answer is: {g}",
                                                                                  "p": 1.0}]}]})
    return {"name": "long-reasoning", "tokenizer": "bytes", "items": items,
            "study": {"strategies": ["inwriting@fc", "inwriting@vc"], "max_tokens": 130, "planted": {
                "decomposition/inwriting/validity_gain": 0.0}}}


@pytest.mark.parametrize(("reasoning_tokens", "accuracy"), [(None, 0.0), (120, 1.0)])
def test_levels_share_one_reasoning_budget(tmp_path, reasoning_tokens, accuracy):
    path = write_world(parse_world(_world()), tmp_path / "w.json")
    cal = calibrate(str(path), tmp_path / "o", n_resamples=200, reasoning_tokens=reasoning_tokens)
    rows = {r.quantity: r for r in cal.rows}
    assert cal.records_differing == 0
    assert rows["decomposition/inwriting/validity_gain"].exact == pytest.approx(0.0)
    assert rows["decomposition/inwriting/validity_gain"].estimate == pytest.approx(0.0)
    for level in ("fc", "vc"):
        assert rows[f"accuracy/inwriting@{level}/acc_strict"].estimate == pytest.approx(accuracy)
    import json

    budgets = {}
    for line in (tmp_path / "o" / "run" / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        budgets.setdefault(r["strategy"], set()).add(r["budget"]["reasoning_tokens"])
    assert budgets["inwriting@fc"] == budgets["inwriting@vc"]
    assert len(budgets["inwriting@fc"]) == 1
    if reasoning_tokens is not None:
        assert budgets["inwriting@fc"] == {reasoning_tokens}
