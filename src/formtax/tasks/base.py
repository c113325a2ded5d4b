"""Core task types: what an evaluated item is, what a task must provide, and how items are sampled.

Every decoding strategy is compared on the same items with the same prompts, so everything here is
deterministic: items come out of a loader in file order, sampling is a fixed-seed permutation, and few-shot
examples are drawn with a seed. The answer space of a task lives in three places that must agree — the prompt's
answer description, the constraint slot (``answer_slot``) and ``normalize`` — so all three are methods of the task.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from formtax.errors import ConfigError, DataError
from formtax.tasks.prompts import base_prompt, build_messages, conversion_messages
from formtax.tasks.vocab import (  # noqa: F401  (re-exported: the task layer's vocabulary)
    ANSWER_PREFIX,
    DATA_ENV_VAR,
    JSON_ANSWER_FORMATS,
    KEY_PHRASE,
    AnswerKind,
    ConstraintLevel,
    Item,
    OutputFormat,
    PromptStyle,
)


class Task(ABC):
    """A benchmark: a loader, the answer space (prompt text, constraint slot, normaliser) and few-shot examples.

    Subclasses are registered with ``formtax.tasks.registry.register_task`` and built without arguments by
    ``get_task``. ``shots`` needs the data folder when the shot pool comes from files; it uses the folder last
    passed to ``load`` on this instance (or ``resolve_data_dir(None)`` when ``load`` was never called).
    """

    name: ClassVar[str]
    answer_kind: ClassVar[AnswerKind]
    description: ClassVar[str]
    instructions: ClassVar[tuple[str, str, str]]
    """Three task-description variants (prompt variants t1..t3); they must not mention the output format."""
    fem_output_format: ClassVar[OutputFormat] = OutputFormat.REASON_ANSWER
    """The output format of the FEM strategies (decog, ctrlg) on this task: the answer line at the end by default;
    GSM8K and SummEval take Deco-G's key phrase placed anywhere (REASON_KEYPHRASE), and so do the natural-language
    baselines beside them (runner.grid.deco_g_baselines)."""
    key_phrase: ClassVar[str] = KEY_PHRASE
    evaluated_set: ClassVar[str] = ""
    """What the evaluation covers where it is not the whole benchmark, in a sentence the report's findings print
    (issue 60: SummEval evaluates 90 of paper 001's 100 articles); empty for the whole benchmark."""
    answer_prefix: ClassVar[str] = ANSWER_PREFIX
    """The task's own answer line, less the answer (issue 60: each task declares it): the REASON_ANSWER and
    ANSWER_ONLY formats end with ``answer_prefix + <answer>``, which the strict parser, paper 003's format-level
    rate (``report.load.format_ok``) and the report read. ``The answer is: `` by default; SummEval's is
    ``The rating is ``."""
    """The REASON_KEYPHRASE format's phrase: "The final answer is " (GSM8K, paper 001 section 4.1); SummEval's is
    "The rating is " (section 4.3)."""

    def __init__(self) -> None:
        self._data_dir: Path | None = None
        self._shot_pool_cache: list[Item] | None = None

    # -- data ---------------------------------------------------------------------------------------------

    @abstractmethod
    def data_files(self, data_dir: Path) -> list[Path]:
        """The files ``load`` reads, so a run can record their sha256; empty for generated tasks."""

    # a task whose data has no train split holds out a dev split of its own items (``_shot_pool``): shots and the
    # FEM's distillation prompts come from it, and the evaluation never sees it (GSM8K and EAE have a train /
    # dev split of their own already)
    holds_out_dev: ClassVar[bool] = False

    def load(self, data_dir: Path | None) -> list[Item]:
        """Load the evaluation items in file order; ``data_dir=None`` resolves the default data folder. A task that
        holds out a dev split (``holds_out_dev``) leaves its items out."""
        resolved = self._remember_data_dir(data_dir)
        items = self._load(resolved)
        if self.holds_out_dev:
            dev = {it.id for it in self._cached_shot_pool()}
            items = [it for it in items if it.id not in dev]
        return items

    @abstractmethod
    def _load(self, data_dir: Path | None) -> list[Item]:
        """Read (or generate) the evaluation items. ``data_dir`` is None only for generated tasks."""

    def _needs_data(self) -> bool:
        """Whether ``load`` reads files; generated tasks override this to skip resolving a data folder."""
        return True

    def _require_dir(self, data_dir: Path | None) -> Path:
        """The resolved data folder for file-backed tasks (``load`` always passes one to them)."""
        if data_dir is None:
            raise DataError(f"{self.name}: no data folder given")
        return data_dir

    def _remember_data_dir(self, data_dir: Path | None) -> Path | None:
        if not self._needs_data():
            return None
        resolved = resolve_data_dir(data_dir)
        if resolved != self._data_dir:
            self._shot_pool_cache = None
        self._data_dir = resolved
        return resolved

    # -- answer space -------------------------------------------------------------------------------------

    def answer_slot(self, level: ConstraintLevel, item: Item) -> str:
        """The typed slot of the answer template for a constraint level.

        FC (format constraint) allows any single-line text, ``{str}``, for every task: it enforces the format
        only. VC (validity constraint) narrows the slot to the task's answer space, per paper 003 A.2.2.
        """
        if level == "fc":
            return "{str}"
        if level == "vc":
            return self._vc_slot(item)
        raise ConfigError(f"unknown constraint level {level!r}; known levels: fc, vc")

    def answer_spec(self, level: ConstraintLevel, item: Item, output_format: OutputFormat) -> str:
        """The answer constraint SPEC a strategy with ``output_format`` decodes with (a hook: tasks with their own
        answer line, e.g. a bare choice, override it). JSON strategies get the slot alone: it types the
        ``answer`` field."""
        slot = self.answer_slot(level, item)
        if (level == "fc" and self.answer_kind is AnswerKind.INTEGER
                and (output_format in JSON_ANSWER_FORMATS or output_format is OutputFormat.JSON)):
            # the JSON prompts show an integer's <answer> unquoted (prompts.json_template): FC admits that form
            # too, a JSON number, beside any text (paper 003's Assumption 1); VC keeps the valid integer
            slot = "number-or:" + slot
        if output_format in JSON_ANSWER_FORMATS:
            return "answer-json:" + slot
        if output_format is OutputFormat.REASON_KEYPHRASE:
            return self.key_phrase + slot
        return slot if output_format is OutputFormat.JSON else self.answer_prefix + slot

    def messages(
        self, item: Item, output_format: OutputFormat, task_variant: int, format_variant: int, shots: Sequence[Item]
    ) -> list[dict[str, str]]:
        """The prompt for one item (a hook: tasks with a benchmark's own prompt template override it)."""
        return build_messages(self, item, output_format, task_variant, format_variant, shots)

    def notes(self) -> dict[str, Any]:
        """What a run's manifest records about the loaded items beyond their ids (a hook: metatool names the
        positions its translations leave out, with reasons); empty by default."""
        return {}

    @property
    def generic_prompts(self) -> bool:
        """Whether the task's prompts are the generic ones (tasks/prompts.py): a task with a benchmark's own prompt
        template overrides :meth:`messages` and keeps it, whatever the model and the strategy."""
        return type(self).messages is Task.messages

    @property
    def has_base_prompt(self) -> bool:
        """Whether the task can be put as a plain few-shot prompt (only with the generic prompts)."""
        return self.generic_prompts

    def base_prompt(self, item: Item, shots: Sequence[Item]) -> str:
        """The plain-text few-shot prompt for a pre-trained model (:func:`formtax.tasks.prompts.base_prompt`)."""
        return base_prompt(self, item, shots)

    def conversion_messages(self, item: Item, reasoning_text: str, format_variant: int,
                            output_format: OutputFormat = OutputFormat.ANSWER_ONLY) -> list[dict[str, str]]:
        """NL-to-Format's second call, asking for ``output_format`` (the answer line, or ANSWER_JSON in the JSON
        answer form); a hook: a task with its own answer lines overrides it."""
        return conversion_messages(self, item, reasoning_text, format_variant, output_format)

    @property
    def has_json_answer_form(self) -> bool:
        """Whether the task can be put in paper 003's JSON answer form: its prompts, answer specs and second
        call are the generic ones (a task with a benchmark's own answer line keeps it)."""
        return (self.generic_prompts and type(self).answer_spec is Task.answer_spec
                and type(self).conversion_messages is Task.conversion_messages)

    @abstractmethod
    def _vc_slot(self, item: Item) -> str:
        """The validity-constraint slot for this item."""

    @abstractmethod
    def answer_description(self, item: Item) -> str:
        """How the prompt describes ``<answer>``, e.g. "a non-negative integer"; must match ``_vc_slot``."""

    @abstractmethod
    def normalize(self, value: str) -> str | None:
        """Map a raw answer string to the canonical form used for ``Item.gold``; None if it is outside the space."""

    def canonical(self, value: str) -> str | None:
        """The strict parser's reading of an answer: its value if ``value`` is already in the task's canonical
        representation (the VC language's surface form, up to the task's case rule and surrounding
        whitespace), else None.

        Paper 003 (A.4.1) counts ``28.00`` and ``H E N E`` as unconstrained failures that a validity
        constraint repairs, so the strict parser must not repair them itself; :meth:`normalize` (the lenient
        parser's reading) does. The default is :meth:`normalize`, right for tasks whose normalisation is only
        a case or whitespace rule (labels, tool names); integer and letter tasks override it.
        """
        return self.normalize(value)

    def display_answer(self, item: Item) -> str:
        """The gold answer as the model should write it (in few-shot examples); usually the gold itself."""
        return item.gold

    def score(self, item: Item, value: str | None) -> bool:
        """Whether a parsed answer is correct.

        ``value`` is normally already normalised (``ParseResult.value``); a raw string is normalised first, so
        ``score(item, "1,450,000")`` also works. None is always wrong.
        """
        if value is None:
            return False
        return value == item.gold or self.normalize(value) == item.gold

    # -- few-shot examples --------------------------------------------------------------------------------

    def shots(self, n: int, seed: int, exclude_ids: set[str]) -> list[Item]:
        """``n`` few-shot examples drawn deterministically (given ``seed``) from the shot pool.

        The pool is the train split where the data has one, otherwise the task's own items, so the caller must
        pass the evaluated item ids in ``exclude_ids`` to keep shots out of the evaluated set.
        """
        if n < 0:
            raise ConfigError(f"{self.name}: number of shots must be >= 0, got {n}")
        if n == 0:
            return []
        pool = [item for item in self._cached_shot_pool() if item.id not in exclude_ids]
        if len(pool) < n:
            hint = ("; the shot pool is the task's own items and the run evaluates all of them: give a shot file "
                    "(--shots-file) or hold items out with --limit" if not pool else "")
            raise DataError(
                f"{self.name}: asked for {n} shots but only {len(pool)} items remain outside the evaluated ones{hint}"
            )
        order = np.random.default_rng(seed).permutation(len(pool))[:n]
        return [pool[int(i)] for i in order]

    def _cached_shot_pool(self) -> list[Item]:
        if self._shot_pool_cache is None:
            if self._needs_data() and self._data_dir is None:
                self._data_dir = resolve_data_dir(None)
            self._shot_pool_cache = self._shot_pool(self._data_dir)
        return self._shot_pool_cache

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        """Candidate shots; the default is the evaluation items themselves (tasks without a train split)."""
        return self._load(data_dir)


def sample_items(items: Sequence[Item], limit: int | None, seed: int) -> list[Item]:
    """The items to evaluate: the same for every strategy given ``limit`` and ``seed``.

    With a limit, a fixed-seed permutation (numpy ``default_rng(seed)``) of all items is cut to its first
    ``limit`` entries, so a small run is a random but reproducible subset and a larger limit extends a smaller
    one. With ``limit=None`` every item is kept in its original (file) order: the full set needs no sampling,
    and file order keeps run records easy to compare with the source data.
    """
    if limit is None:
        return list(items)
    if limit < 0:
        raise ConfigError(f"limit must be >= 0 or None, got {limit}")
    order = np.random.default_rng(seed).permutation(len(items))[:limit]
    return [items[int(i)] for i in order]


def project_root() -> Path | None:
    """The formtax checkout this module runs from (the folder whose ``pyproject.toml`` names formtax), or None for
    an installed wheel."""
    for folder in Path(__file__).resolve().parents:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            try:
                text = pyproject.read_text(encoding="utf-8")
            except OSError:
                return None
            return folder if 'name = "formtax"' in text else None
    return None


def resolve_data_dir(explicit: Path | None) -> Path:
    """The benchmark data folder.

    An explicit path (``--data-dir``) is used alone; otherwise ``$FORMTAX_DATA`` alone when it is set; otherwise
    ``shared/data`` beside the formtax checkout (``<checkout>/../shared/data``, then ``<checkout>/shared/data``),
    then the same two relative to the current directory: running from another folder finds the project's data.
    An explicit or environment path that does not exist is an error rather than a silent fallback, so a typo never
    evaluates other data.
    """
    if explicit is not None:
        candidates = [Path(explicit)]
    elif os.environ.get(DATA_ENV_VAR):
        candidates = [Path(os.environ[DATA_ENV_VAR])]
    else:
        root = project_root()
        bases = ([root / "..", root] if root is not None else []) + [Path(".."), Path(".")]
        candidates = [base / "shared" / "data" for base in bases]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ", ".join(dict.fromkeys(str(c.resolve()) for c in candidates))  # each path once
    source = ("--data-dir" if explicit is not None else f"${DATA_ENV_VAR}" if os.environ.get(DATA_ENV_VAR)
              else "the default places")
    raise DataError(
        f"benchmark data folder not found ({source}); tried: {tried}; pass --data-dir DIR or set {DATA_ENV_VAR}=DIR "
        "to the folder holding gsm8k/, svamp/, ... (docs/getting-started.md, 'A first GSM8K run')"
    )
