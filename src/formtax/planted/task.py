"""The ``planted`` task: a world's items, with the answer space (integer, letters or choice) the world names.

``formtax run --world W`` (task ``planted``, task option ``world``) evaluates a world's items with the standard
prompts, parsers and scorers of that answer kind, so everything downstream of the model is the lab's own code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from formtax.constraints.template import choice_slot
from formtax.errors import ConfigError
from formtax.planted.world import World, WorldError, load_world
from formtax.tasks.base import Item, Task
from formtax.tasks.kinds import ChoiceTask, IntegerTask, LettersTask, integer_description
from formtax.tasks.registry import register_task

_INSTRUCTIONS = (
    "Answer the question.",
    "Solve the following problem.",
    "Read the question and give its answer.",
)


class _PlantedBase(Task):
    """What every planted task shares: items from the world file, no data folder."""

    name: ClassVar[str] = "planted"
    description: ClassVar[str] = "the items of a planted world (--world W): known exact truths for calibration"
    instructions: ClassVar[tuple[str, str, str]] = _INSTRUCTIONS
    samples_own_items: ClassVar[bool] = False

    def __init__(self, world: World | None = None, path: str | None = None) -> None:
        super().__init__()
        self.world = world
        self.world_path = path

    def _needs_data(self) -> bool:
        return False

    def data_files(self, data_dir: Path) -> list[Path]:
        return [Path(self.world_path)] if self.world_path else []

    def _require_world(self) -> World:
        if self.world is None:
            raise ConfigError("task 'planted' needs a world file: formtax run --world W (task option world=W)")
        return self.world

    def _load(self, data_dir: Path | None) -> list[Item]:
        w = self._require_world()
        return [Item(id=it.id, question=it.question, gold=it.gold, choices=tuple((c[0], c[1]) for c in it.choices),
                     meta=dict(it.meta)) for it in w.items]

    def configure(self, options: Mapping[str, Any]) -> Task:
        """Build the task of the world named by ``options['world']`` (returned; the runner uses it instead)."""
        unknown = sorted(set(options) - {"world"})
        if unknown:
            raise ConfigError(f"task 'planted' takes only the option world (got {', '.join(unknown)})")
        if "world" not in options:
            raise ConfigError("task 'planted' needs a world file: formtax run --world W")
        path = str(options["world"])
        return planted_task(load_world(path), str(Path(path).resolve()))


@register_task
class PlantedTask(_PlantedBase, IntegerTask):
    """The integer kind, with the world's VC range; registered as ``planted`` (``configure`` returns the task of
    the world's answer kind)."""

    def _range(self) -> tuple[int | None, int | None]:
        a = self._require_world().answer
        return a.vc_min, a.vc_max

    def _vc_slot(self, item: Item) -> str:
        low, high = self._range()
        if low is None and high is None:
            return "{int}"
        return f"{{int:{'' if low is None else low}..{'' if high is None else high}}}"

    def answer_description(self, item: Item) -> str:
        return integer_description(*self._range())


class PlantedLettersTask(_PlantedBase, LettersTask):
    length: ClassVar[int] = 0

    def _vc_slot(self, item: Item) -> str:
        return f"{{letters:{self._length(item)}}}"

    def answer_description(self, item: Item) -> str:
        return f"a string of {self._length(item)} lowercase letters"

    def _length(self, item: Item) -> int:
        w = self._require_world()
        return w.answer.length if w.answer.length is not None else len(item.gold)


class PlantedChoiceTask(_PlantedBase, ChoiceTask):
    def item_labels(self, item: Item) -> tuple[str, ...]:
        labels = self._require_world().answer.labels
        return item.labels or (tuple(labels) if labels else self.all_labels)

    def _vc_slot(self, item: Item) -> str:
        return choice_slot(self.item_labels(item))

    def normalize(self, value: str) -> str | None:
        key = value.strip().casefold()
        labels = self._require_world().answer.labels or list(self.all_labels)
        return next((lab for lab in labels if lab.casefold() == key), None)


def planted_task(world: World, path: str | None = None) -> Task:
    """The task of ``world``: its answer kind's class, with every gold checked to be scorable."""
    kind = world.answer.kind
    task: _PlantedBase
    if kind == "integer":
        task = PlantedTask(world, path)
    elif kind == "letters":
        task = PlantedLettersTask(world, path)
    else:
        task = PlantedChoiceTask(world, path)
    for it in world.items:
        if task.normalize(it.gold) != it.gold:
            raise WorldError(f"world {world.name}: item {it.id}, field gold: {it.gold!r} is not a canonical "
                             f"{kind} answer, so the task cannot score it")
    return task
