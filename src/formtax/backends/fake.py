"""A fake backend over the byte tokenizer: tests of the loop and the strategies run in milliseconds.

The "model" is any function from a token sequence to a logits row. Two are provided: seeded random logits that
depend on the sequence (a deterministic stand-in for a real model), and a scripted model that wants to write a
given text and then stop (to test when InWriting switches, what short stops on, and so on).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

from formtax.bytetok import byte_tokenizer
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo

LogitsFn = Callable[[Sequence[int]], torch.Tensor]

N_LOGITS = 260  # 256 bytes + 4 specials
EOS = 256
PAD = 257


def random_logits(seed: int = 0, scale: float = 3.0, context: int = 4) -> LogitsFn:
    """Logits drawn from a generator seeded by (seed, the last ``context`` tokens): deterministic, varied."""

    def fn(seq: Sequence[int]) -> torch.Tensor:
        key = hashlib.blake2b(repr((seed, list(seq[-context:]))).encode(), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
        return torch.randn(N_LOGITS, generator=g) * scale

    return fn


def scripted(text: str, prompt_len: Callable[[Sequence[int]], int] | None = None, margin: float = 10.0,
             base: LogitsFn | None = None) -> LogitsFn:
    """A model that wants to write ``text`` after the prompt and then EOS; afterwards it keeps wanting EOS.

    The prompt is everything up to and including the last ``<|assistant|>`` token (id 259).
    """
    target = list(text.encode())
    noise = base or random_logits(seed=1, scale=1.0)

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = prompt_len(seq) if prompt_len else (max(i for i, t in enumerate(seq) if t == 259) + 1
                                                     if 259 in seq else 0)
        gen = list(seq[start:])
        logits = noise(seq).clone()
        k = len(gen)
        want = target[k] if k < len(target) and gen == target[:k] else EOS
        logits[want] = logits.max() + margin
        return logits

    return fn


class FakeBatch(Batch):
    def __init__(self, fn: LogitsFn, prompts: Sequence[Sequence[int]], device: torch.device | None = None) -> None:
        self.fn = fn
        self.device = device or torch.device("cpu")
        self.seqs = [list(p) for p in prompts]
        self.plen = [len(p) for p in prompts]
        self.calls = 0

    def _logits(self) -> torch.Tensor:
        self.calls += 1
        return torch.stack([self.fn(s) for s in self.seqs]).float().to(self.device)

    def prefill(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        if len(tokens) != len(self.seqs):
            raise ValueError(f"step got {len(tokens)} tokens for {len(self.seqs)} live rows")
        for s, t in zip(self.seqs, tokens, strict=True):
            s.append(int(t))
        return self._logits()

    def keep(self, live_positions: Sequence[int]) -> None:
        self.seqs = [self.seqs[i] for i in live_positions]
        self.plen = [self.plen[i] for i in live_positions]

    @property
    def joinable(self) -> bool:
        return True

    def join(self, other: Batch) -> None:
        assert isinstance(other, FakeBatch)
        self.seqs += other.seqs
        self.plen += other.plen

    def crop(self, live_position: int, n_generated: int) -> None:
        """Keep the prompt and the first ``n_generated`` tokens; ``-1`` also drops the prompt's last token (the
        caller feeds it again), as the transformers backend does."""
        p = self.plen[live_position]
        generated = len(self.seqs[live_position]) - p
        if not -1 <= n_generated <= generated:
            raise ValueError(f"cannot crop row to {n_generated} generated tokens (it has {generated})")
        self.seqs[live_position] = self.seqs[live_position][: p + n_generated]


class FakeBackend(Backend):
    name = "fake"
    capabilities = frozenset({Capability.STEP_LOGITS, Capability.KV_CROP})

    def __init__(self, fn: LogitsFn | None = None, model_id: str = "fake-random", context: int | None = None,
                 device: str = "cpu") -> None:
        self.fn = fn or random_logits()
        self.device = torch.device(device)  # where the logits are put (a test of the device paths on a GPU)
        self._id = model_id
        self._context = context
        hf = byte_tokenizer()
        self._tok = TokenizerInfo(hf=hf, eos_ids=frozenset({EOS}), pad_id=PAD, n_logits=N_LOGITS,
                                  has_chat_template=True)
        self.batches: list[FakeBatch] = []

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return self._id

    @property
    def context_length(self) -> int | None:
        return self._context

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> FakeBatch:
        b = FakeBatch(self.fn, prompts, self.device)
        self.batches.append(b)
        return b
