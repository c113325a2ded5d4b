"""arith: synthetic multi-step arithmetic word problems from our own templates (no data files).

Each problem starts from a quantity and applies 1-3 operations (+, -, ×, ÷ with exact division), phrased in one
of several scenarios (a person's collection, a shop's stock, a bus, a library, a bakery) with several phrasings
per operation, so surface form varies and the model must track the quantity. Every intermediate value stays a
positive integer, so answers are non-negative integers and VC is ``{int:0..}`` like GSM8K. Generation uses
``StableRng`` so the items are identical on every machine and Python/numpy version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from formtax.tasks.base import Item
from formtax.tasks.kinds import IntegerTask
from formtax.tasks.registry import register_task
from formtax.tasks.rng import StableRng

_MAX_VALUE = 100_000
_SHOT_SEED_OFFSET = 0x5EED_0F_5407
_SHOT_POOL_SIZE = 200

_NAMES = (
    "Amara", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kemi", "Liam", "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
)  # fmt: skip


@dataclass(frozen=True)
class _Scenario:
    """Phrasings for one story; ``{s}`` is the subject, ``{u}`` the unit noun (plural), ``{b}`` the operand.

    Subjects other than names are lowercase; each sentence's first letter is capitalised after formatting.
    """

    subjects: tuple[str, ...]
    units: tuple[str, ...]
    start: tuple[str, ...]
    add: tuple[str, ...]
    sub: tuple[str, ...]
    mul: tuple[str, ...]
    div: tuple[str, ...]
    question: tuple[str, ...]


_SCENARIOS = (
    _Scenario(
        subjects=_NAMES,
        units=("marbles", "stickers", "stamps", "seashells", "trading cards", "coins"),
        start=("{s} has {a} {u}.", "{s} owns a collection of {a} {u}.", "{s} starts the week with {a} {u}."),
        add=("{s} buys {b} more {u}.", "A friend gives {s} {b} {u}.", "{s} finds {b} more {u}."),
        sub=("{s} gives {b} {u} to a cousin.", "{s} trades away {b} {u}.", "{s} loses {b} {u}."),
        mul=("After a lucky day, {s} has {b} times as many {u} as before.",),
        div=("{s} splits the {u} into {b} equal groups and keeps just one group.",),
        question=("How many {u} does {s} have now?", "How many {u} does {s} end up with?"),
    ),
    _Scenario(
        subjects=("a toy shop", "a hardware store", "a corner shop", "a garden centre"),
        units=("boxes", "items", "packages", "crates"),
        start=("{s} has {a} {u} in stock.", "At opening time, {s} holds {a} {u}."),
        add=("A delivery brings {b} more {u}.", "The owner orders {b} extra {u}, which arrive the same day."),
        sub=("Customers buy {b} {u}.", "{b} {u} are sold before noon.", "{b} damaged {u} are thrown away."),
        mul=("A big shipment multiplies the stock by {b}.", "The stock is restocked to {b} times its size."),
        div=("The {u} are shared equally among {b} branches, and this branch keeps one share.",),
        question=("How many {u} does the shop have in stock now?", "How many {u} are in stock at the end?"),
    ),
    _Scenario(
        subjects=("a city bus", "a school bus", "a night bus"),
        units=("passengers",),
        start=("{s} leaves the depot with {a} {u}.", "There are {a} {u} on {s}."),
        add=("At the next stop, {b} {u} get on.", "{b} more {u} board at the station."),
        sub=("At the next stop, {b} {u} get off.", "{b} {u} leave the bus at the market."),
        mul=("At the stadium the number of {u} grows to {b} times what it was.",),
        div=("The {u} are split evenly into {b} groups, and only one group stays on the bus.",),
        question=("How many {u} are on the bus now?", "How many {u} are left on the bus?"),
    ),
    _Scenario(
        subjects=("the town library", "a school library"),
        units=("books", "magazines", "comics"),
        start=("{s} has {a} {u} on its shelves.", "{s} owns {a} {u}."),
        add=("It receives a donation of {b} {u}.", "The librarian buys {b} new {u}."),
        sub=("Readers borrow {b} {u} and have not returned them.", "{b} worn-out {u} are removed."),
        mul=("After merging with another collection, it has {b} times as many {u}.",),
        div=("The {u} are divided equally among {b} reading rooms; the main room keeps one share.",),
        question=("How many {u} does the library have now?", "How many {u} are on the shelves at the end?"),
    ),
    _Scenario(
        subjects=_NAMES,
        units=("cookies", "muffins", "bread rolls", "cupcakes"),
        start=("{s} bakes {a} {u}.", "{s}'s bakery tray holds {a} {u}."),
        add=("{s} bakes another {b} {u}.", "A neighbour brings over {b} {u}."),
        sub=("{s} eats {b} of the {u}.", "{s} sells {b} {u} at the market."),
        mul=("{s} scales up the recipe and ends up with {b} times as many {u}.",),
        div=("{s} packs the {u} equally into {b} boxes and keeps one box.",),
        question=("How many {u} does {s} have now?", "How many {u} are left for {s}?"),
    ),
)

_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _valid_ops(value: int) -> list[str]:
    ops = ["add"]
    if value > 1:
        ops.append("sub")
    if value * 2 <= _MAX_VALUE:
        ops.append("mul")
    if any(value % d == 0 for d in range(2, 13)):
        ops.append("div")
    return ops


def _operand(rng: StableRng, op: str, value: int) -> int:
    if op == "add":
        return rng.randint(1, 99)
    if op == "sub":
        return rng.randint(1, value - 1)
    if op == "mul":
        return rng.randint(2, min(9, _MAX_VALUE // value))
    return rng.choice([d for d in range(2, 13) if value % d == 0])


def _apply(op: str, value: int, b: int) -> int:
    if op == "add":
        return value + b
    if op == "sub":
        return value - b
    if op == "mul":
        return value * b
    return value // b


def generate_problem(rng: StableRng, item_id: str) -> Item:
    """One problem: a scenario, a start value, 1-3 operations, a question and a worked solution."""
    scenario = rng.choice(_SCENARIOS)
    subject = rng.choice(scenario.subjects)
    unit = rng.choice(scenario.units)
    start = value = rng.randint(2, 99)
    sentences = [rng.choice(scenario.start).format(s=subject, a=value, u=unit)]
    steps: list[str] = []
    ops: list[str] = []
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(_valid_ops(value))
        b = _operand(rng, op, value)
        new_value = _apply(op, value, b)
        templates: tuple[str, ...] = getattr(scenario, op)
        sentences.append(rng.choice(templates).format(s=subject, b=b, u=unit))
        steps.append(f"{value} {_SYMBOL[op]} {b} = {new_value}.")
        ops.append(_SYMBOL[op])
        value = new_value
    sentences.append(rng.choice(scenario.question).format(s=subject, u=unit))
    question = " ".join(sentence[0].upper() + sentence[1:] for sentence in sentences)
    solution = f"Start with {start} {unit}. " + " ".join(steps)
    return Item(id=item_id, question=question, gold=str(value), solution=solution, meta={"ops": "".join(ops)})


def generate(seed: int, n: int, id_prefix: str = "") -> list[Item]:
    """``n`` problems from ``seed``; the same arguments always give the same items."""
    rng = StableRng(seed)
    return [generate_problem(rng, f"{id_prefix}{i}") for i in range(n)]


@register_task
class ArithTask(IntegerTask):
    """Synthetic arithmetic (default 1000 items, seed 0); shots come from a separate seeded stream."""

    name: ClassVar[str] = "arith"
    description: ClassVar[str] = (
        "synthetic 1-3 step arithmetic word problems (generated, 1000 items; integers)"
    )
    instructions: ClassVar[tuple[str, str, str]] = (
        "Solve the following arithmetic word problem.",
        "You are given a short word problem involving a few arithmetic steps. Work out the final number.",
        "Read the problem below, keep track of how the quantity changes, and find the answer.",
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
        return generate(self.seed, self.n_items)

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        return generate(self.seed + _SHOT_SEED_OFFSET, _SHOT_POOL_SIZE, id_prefix="shot-")
