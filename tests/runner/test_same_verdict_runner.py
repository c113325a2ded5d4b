"""Issue 60, point 2, through the real runner: a decog record and a free record with the same text always get the
same strict verdict (Hypothesis over generated answer sentences). The scripted model writes one sentence per prompt;
decog (Deco-G's key phrase placed anywhere) and free:keyphrase (its baseline, byte-identical prompts) see the same
prompt, so where the FEM keeps the script the two records hold the same text."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from formtax.backends.fake import EOS, N_LOGITS, FakeBackend
from formtax.fem.artifact import save_fem
from formtax.parsing.strict import parse_strict
from formtax.records import read_records
from formtax.runner import RunConfig, run
from formtax.runner.distill import DistillConfig, build_fem
from formtax.tasks import OutputFormat, get_task

ASSISTANT = 259
N_ITEMS = 6


@pytest.fixture(scope="module")
def fem(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("fem60")
    hmm, meta = build_fem(FakeBackend(), DistillConfig(task="arith", form="instruction-aware", states=8, samples=6,
                                                       max_tokens=32, em_iters=2))
    return str(save_fem(out / "decog.npz", hmm, meta))


def by_prompt(texts: Sequence[str]) -> FakeBackend:
    """A model that writes ``texts[k]`` after the k-th distinct prompt it sees, then EOS (under a mask: the allowed
    token it likes best)."""
    seen: dict[tuple[int, ...], list[int]] = {}

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = max(i for i, t in enumerate(seq) if t == ASSISTANT) + 1
        key = tuple(seq[:start])
        if key not in seen:
            seen[key] = list(texts[len(seen) % len(texts)].encode())
        target, gen = seen[key], list(seq[start:])
        logits = torch.zeros(N_LOGITS)
        k = len(gen)
        logits[target[k] if k < len(target) and gen == target[:k] else EOS] = 30.0
        return logits

    return FakeBackend(fn, model_id="fake-sentences")


ANSWERS = st.sampled_from(["19", "7", "0", "-0", "019", "19%", "19-20", "19.99", "1,234", "19.0", "twenty", "4/5"])
CLOSE = st.sampled_from(["", ".", ",", ";", "!", "**", "**.", "%", " dollars.", "\n"])
SENTENCE = st.builds(
    lambda lead, bold, ans, close, tail: f"{lead}{'**' if bold else ''}The final answer is {ans}{close}{tail}",
    st.sampled_from(["", "10 + 9 = 19. ", "Half of 38. "]), st.booleans(), ANSWERS, CLOSE,
    st.sampled_from(["", " Done.", " Or The final answer is 20.", " The final answer is x"]))


@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(SENTENCE, min_size=N_ITEMS - 1, max_size=N_ITEMS - 1))
@example(texts=["The final answer is 19%.", "**The final answer is 19**", "So 19-20. The final answer is 19-20 apples.",
                "The final answer is 19;", "The final answer is 19. Or The final answer is x"])
def test_decog_and_free_records_with_the_same_text_have_the_same_verdict(texts, fem, data_dir, tmp_path_factory):
    texts = [*texts, "10 + 9 = 19. The final answer is 19!"]  # in the format: the FEM keeps it, so texts match
    out = tmp_path_factory.mktemp("run")
    cfg = RunConfig(task="gsm8k", strategies=["free", "decog"], backend="fake", limit=N_ITEMS, max_tokens=96,
                    fem=fem, data_dir=str(data_dir))
    assert run(cfg, out, backend=by_prompt(texts)).errors == 0
    recs = read_records(out / "records.jsonl")
    task = get_task("gsm8k")
    items = {it.id: it for it in task.load(data_dir)}
    free = {r.item_id: r for r in recs if r.strategy == "free:keyphrase"}
    decog = {r.item_id: r for r in recs if r.base_strategy == "decog"}
    assert len(free) == len(decog) == N_ITEMS and all(r.output_format == "reason-keyphrase" for r in recs)
    same = 0
    for item_id, d in decog.items():
        mine = (d.parses["strict"].status, d.parses["strict"].value)
        # the free reader on decog's own text gives decog's verdict, whatever the FEM made of the script
        other = parse_strict(d.text, task, items[item_id], OutputFormat.REASON_KEYPHRASE)
        assert mine == (other.status, other.value), d.text
        f = free[item_id]
        if f.text == d.text:
            same += 1
            assert mine == (f.parses["strict"].status, f.parses["strict"].value), d.text
    assert same >= 1  # the FEM keeps the script where it is already in the format
