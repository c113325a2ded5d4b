"""LastLetter (4 names) and LastLetter-Extended (8 names): concatenate the last letters of the names.

The original task (4 names) is Last Letter Concatenation from Wei et al. (2022, chain-of-thought prompting; also
used by Kojima et al. 2022), which paper 003 cites in its section 4.1; the 8-name Extended variant is paper
003's own (A.3.3). For both, following A.3.3, names come from the PyPI package ``names-dataset`` (an optional
dependency: the ``lastletter`` extra) and compound names are excluded. The paper samples from the whole
dataset; we instead use a stable, sorted pool — the 1000 most common male and 1000 most common female first names of the US and of the
UK (``get_top_names``) — so items do not hinge on rare, noisy entries and the pool is identical wherever the
same ``names-dataset`` version is installed. A name is kept only if it is a single ASCII word of 2+ letters
(``[A-Z][a-z]+``), which drops compound names (space, hyphen, apostrophe), non-ASCII names and initials.

Loading the dataset takes seconds and about 1 GB, so the pool is built once per process and cached; the
``NameDataset`` object itself is dropped after that. Items are drawn with ``StableRng`` from a seed.
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from formtax.errors import ConfigError
from formtax.tasks.base import Item
from formtax.tasks.kinds import LettersTask
from formtax.tasks.registry import register_task
from formtax.tasks.rng import StableRng

POOL_COUNTRIES = ("US", "GB")
POOL_TOP_N = 1000
_SIMPLE_NAME_RE = re.compile(r"[A-Z][a-z]+")
_SHOT_SEED_OFFSET = 0x5EED_1E77E5
_SHOT_POOL_SIZE = 200


def is_simple_name(name: str) -> bool:
    """Whether a name is one plain ASCII word (``Homoh``), not compound (``Juan Pablo``, ``Mary-Ann``,
    ``D'Angelo``), non-ASCII (``José``) or a bare initial."""
    return _SIMPLE_NAME_RE.fullmatch(name) is not None


def import_names_dataset() -> ModuleType:
    """The ``names_dataset`` module, or ConfigError telling how to install it."""
    try:
        return importlib.import_module("names_dataset")
    except ImportError as exc:
        raise ConfigError(
            "the lastletter tasks need the names-dataset package: pip install 'formtax[lastletter]'"
        ) from exc


@functools.cache
def name_pool() -> tuple[str, ...]:
    """The sorted pool of simple first names (loaded once per process)."""
    module = import_names_dataset()
    dataset = module.NameDataset(load_first_names=True, load_last_names=False)
    names: set[str] = set()
    for country in POOL_COUNTRIES:
        top = dataset.get_top_names(n=POOL_TOP_N, use_first_names=True, country_alpha2=country)
        for by_gender in top.get(country, {}).values():
            names.update(name for name in by_gender if is_simple_name(name))
    if len(names) < 100:
        raise ConfigError(f"names-dataset returned only {len(names)} usable names; is the install complete?")
    return tuple(sorted(names))


def make_item(rng: StableRng, pool: tuple[str, ...], n_names: int, item_id: str) -> Item:
    """One item: ``n_names`` distinct names, the question, the gold letters and a worked solution."""
    names = rng.sample(pool, n_names)
    joined = " ".join(names)
    gold = "".join(name[-1] for name in names).lower()
    steps = " ".join(f'The last letter of "{name}" is "{name[-1].lower()}".' for name in names)
    solution = f'{steps} Concatenating them gives "{gold}".'
    question = f'Take the last letters of each word in "{joined}" and concatenate them.'
    return Item(id=item_id, question=question, gold=gold, solution=solution, meta={"names": tuple(names)})


def generate(pool: tuple[str, ...], n_names: int, n_items: int, seed: int, id_prefix: str = "") -> list[Item]:
    """``n_items`` items from ``seed``; the same pool and arguments always give the same items.

    The name count is mixed into the stream seed so LastLetter and LastLetter-Extended do not share prefixes.
    """
    rng = StableRng(seed * 0x100 + n_names)
    return [make_item(rng, pool, n_names, f"{id_prefix}{i}") for i in range(n_items)]


class _LastLetterBase(LettersTask):
    instructions: ClassVar[tuple[str, str, str]] = (
        "Solve the following letter-concatenation task.",
        "You are given a list of names. Take the last letter of each name, in order, and join them into one string.",
        "Read the instruction below and build the requested string of letters.",
    )

    def __init__(self, n_items: int = 1000, seed: int = 0) -> None:
        super().__init__()
        self.n_items = n_items
        self.seed = seed

    def _needs_data(self) -> bool:
        return False

    def data_files(self, data_dir: Path) -> list[Path]:
        return []

    def _load(self, data_dir: Path | None) -> list[Item]:
        return generate(name_pool(), self.length, self.n_items, self.seed)

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        return generate(name_pool(), self.length, _SHOT_POOL_SIZE, self.seed + _SHOT_SEED_OFFSET, "shot-")


@register_task
class LastLetterTask(_LastLetterBase):
    """LastLetter: 4 names per item (default 1000 items, seed 0)."""

    name: ClassVar[str] = "lastletter"
    description: ClassVar[str] = (
        "last letters of 4 names, concatenated (generated, 1000 items; needs names-dataset)"
    )
    length: ClassVar[int] = 4


@register_task
class LastLetterExtTask(_LastLetterBase):
    """LastLetter-Extended: 8 names per item (default 1000 items, seed 0)."""

    name: ClassVar[str] = "lastletter-ext"
    description: ClassVar[str] = (
        "last letters of 8 names, concatenated (generated, 1000 items; needs names-dataset)"
    )
    length: ClassVar[int] = 8
