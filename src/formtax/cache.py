"""One small thread-safe least-recently-used map, the shape of every in-process cache in formtax (compiled grammars,
token vocabularies, token DFAs, FEM artifacts and runtimes, suffix start sets).

Each cache is bounded, because tasks with a template per item (choice lists, a passage's spans) would otherwise grow
one without limit; a cache whose entries differ widely in size can also be bounded by a ``weigh`` function.
Values are computed outside the lock (two threads may both compute a miss; the later ``put`` wins), so a slow build
never blocks readers of other keys.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``limit`` entries; with ``weigh``, also at most ``max_weight`` in total (the newest entry is always
    kept). Weights are read at each ``put``, so entries that grow after insertion are counted as they are then."""

    def __init__(self, limit: int, weigh: Callable[[V], int] | None = None, max_weight: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"an LRU cache needs limit >= 1, got {limit}")
        self.limit = limit
        self.weigh = weigh
        self.max_weight = max_weight
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: K, value: V) -> V:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit or (len(self._items) > 1 and self._too_heavy()):
                self._items.popitem(last=False)
        return value

    def _too_heavy(self) -> bool:
        if self.weigh is None or self.max_weight is None:
            return False
        return sum(self.weigh(v) for v in self._items.values()) > self.max_weight

    def __len__(self) -> int:
        return len(self._items)
