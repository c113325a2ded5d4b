"""The decode loop's rewind (``Plan.rewind``) and the backends' crop, down to the prompt's last token."""

from __future__ import annotations

import pytest
import torch

from formtax.backends.fake import FakeBackend, random_logits
from formtax.decoding import Plan, Policy, RowRequest, decode

K = 6  # tokens generated before the rewind
TAIL = 3  # tokens generated after it


class Rewinder(Policy):
    """Generate K tokens greedily, rewind to ``n`` (once or twice), then generate TAIL more; remember what it saw."""

    def __init__(self, n: int, times: int = 1) -> None:
        self.n = n
        self.times = times
        self.first: list[int] = []
        self.after: list[tuple[int, torch.Tensor]] = []  # (step, logits) right after each rewind
        self.rewinding = False

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.rewinding:
            self.after.append((step, logits.clone()))
            self.rewinding = False
            if len(self.after) < self.times:
                self.rewinding = True
                return Plan(rewind=self.n)
        elif not self.after and step == K:
            self.rewinding = True
            return Plan(rewind=self.n)
        if self.after and step >= self.n + TAIL:
            return Plan(stop="done")
        return Plan()

    def advance(self, token: int) -> str | None:
        if not self.after:
            self.first.append(token)
        return None


def greedy(fn, seq: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(torch.argmax(fn(seq + out)).item()))
    return out


@pytest.mark.parametrize("n", [0, 1, K - 1, K])
@pytest.mark.parametrize("times", [1, 2])
def test_rewind_sees_exactly_the_kept_prefix_on_the_fake(n, times):
    fn = random_logits(seed=4)
    fb = FakeBackend(fn)
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11]]  # another row of another length rides along
    policies = [Rewinder(n, times), Rewinder(min(n + 1, K))]
    outs = decode(fb, [RowRequest(p, pol, 50) for p, pol in zip(prompts, policies, strict=True)])
    for p, pol, out in zip(prompts, policies, outs, strict=True):
        assert len(pol.first) == K
        for step, logits in pol.after:
            assert step == pol.n
            assert torch.equal(logits, fn(p + pol.first[: pol.n]).float())
        assert out.tokens == pol.first[: pol.n] + greedy(fn, p + pol.first[: pol.n], TAIL)
        assert len(out.steps) == len(out.tokens) and out.finish_reason == "done"


def test_rewind_past_the_row_is_an_error():
    class Bad(Policy):
        def plan(self, logits: torch.Tensor, step: int) -> Plan:
            return Plan(rewind=step + 1)

        def advance(self, token: int) -> str | None:
            return None

    with pytest.raises(ValueError, match="cannot rewind"):
        decode(FakeBackend(), [RowRequest([1, 2], Bad(), 10)])


def test_fake_crop_bounds():
    b = FakeBackend().new_batch([[1, 2, 3]])
    b.prefill()
    b.step([5])
    b.crop(0, -1)
    assert b.seqs[0] == [1, 2]
    for bad in (-2, 1):
        with pytest.raises(ValueError, match="cannot crop"):
            b.crop(0, bad)


@pytest.mark.model
def test_hf_crop_into_the_prompt_and_back_matches_a_fresh_forward(default_model):
    m = default_model
    tok = m.tokenizer
    prompts = [tok.prompt_ids([{"role": "user", "content": "Count to five."}]),
               tok.prompt_ids([{"role": "user", "content": "Name a color of the sky on a clear day, please."}])]

    @torch.inference_mode()
    def full(seq: list[int]) -> torch.Tensor:
        ids = torch.tensor([seq])
        return m.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()

    for n, times in ((0, 2), (3, 1), (K, 1)):
        policies = [Rewinder(n, times), Rewinder(1)]
        outs = decode(m, [RowRequest(p, pol, 50) for p, pol in zip(prompts, policies, strict=True)])
        for p, pol, out in zip(prompts, policies, outs, strict=True):
            for step, logits in pol.after:
                ref = full(p + pol.first[: pol.n])
                assert step == pol.n
                assert torch.allclose(logits, ref, atol=2e-3, rtol=0), float((logits - ref).abs().max())
            assert out.tokens[: pol.n] == pol.first[: pol.n]
            assert out.tokens[pol.n :] == greedy(full, p + pol.first[: pol.n], TAIL)
    with pytest.raises(ValueError, match="cannot crop"):
        b = m.new_batch([prompts[0]])
        b.prefill()
        b.crop(0, -2)
