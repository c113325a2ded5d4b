"""A tiny seeded generator for synthetic tasks whose output must never change.

Python's ``random`` only promises a stable ``random()`` stream across versions, and numpy's ``Generator`` does
not promise stable derived draws either. Generated benchmarks (arith, lastletter) are compared across runs made
months apart, so they use this SplitMix64 generator, whose every draw is defined here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_MASK = (1 << 64) - 1


class StableRng:
    """SplitMix64 with unbiased bounded integers (rejection sampling)."""

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK

    def next_u64(self) -> int:
        """The next 64-bit output."""
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """A uniform integer in ``[0, n)``."""
        if n <= 0:
            raise ValueError(f"bound must be positive, got {n}")
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n

    def randint(self, low: int, high: int) -> int:
        """A uniform integer in ``[low, high]`` (both inclusive)."""
        return low + self.below(high - low + 1)

    def choice(self, seq: Sequence[T]) -> T:
        """A uniform element of a non-empty sequence."""
        return seq[self.below(len(seq))]

    def sample(self, seq: Sequence[T], k: int) -> list[T]:
        """``k`` distinct positions of ``seq`` (partial Fisher-Yates), in draw order."""
        pool = list(seq)
        if k > len(pool):
            raise ValueError(f"cannot sample {k} from {len(pool)}")
        for i in range(k):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]
