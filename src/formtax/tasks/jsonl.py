"""Your own task from a JSON Lines file, without Python: ``formtax run --task jsonl:PATH``.

Each line is one item: a question, its gold answer and, optionally, an id, choices and the item's own answer spec.
The answer space is one *kind* for the whole file (``integer``, ``choice``, ``letters`` or ``text``), given by
``--answer-kind`` or read from ``--answer-spec`` (a VC slot: ``{int:0..}``, ``{choice:yes|no}``, ``{letters:4}``,
``{str}``); a row's ``answer_spec`` may narrow the slot for that item (another range, other labels) but not change
the kind. Why one kind per file: the strict and lenient parsers normalise answers per task (``Task.normalize``
sees the value, not the item), exactly as for the built-in tasks, so a mixed file would be parsed by rules its
rows do not share. Everything downstream (prompts, the FC/VC levels, strict / lenient parsing, records, report)
is the built-in tasks' own code.

Task options (``formtax run`` flags): ``path``, ``answer_kind``, ``answer_spec``, ``gold_field`` (default
``answer``), ``question_field`` (``question``), ``id_field`` (``id``; the line number when absent),
``choices_field`` (``choices``: a list of texts, labelled A, B, ..., or an object label -> text), ``shots_file``
(few-shot examples in the same layout, with an optional ``solution``), ``instruction`` (the task description,
default "Answer the question.").
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from formtax.constraints.template import Slot, choice_slot, parse_template
from formtax.errors import ConfigError, ConstraintError
from formtax.tasks.base import AnswerKind, Item, Task
from formtax.tasks.io import RowError, check_unique_ids, read_jsonl
from formtax.tasks.kinds import (
    canonical_integer,
    canonical_letters,
    choice_question,
    integer_description,
    normalize_integer,
    normalize_letters,
)
from formtax.tasks.registry import register_task

KINDS = ("integer", "choice", "letters", "text")
OPTIONS = ("path", "answer_kind", "answer_spec", "gold_field", "question_field", "id_field", "choices_field",
           "shots_file", "instruction")
_SLOT_KIND = {"int": "integer", "choice": "choice", "letters": "letters", "str": "text"}
_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _slot(spec: str, where: str) -> Slot:
    kind = spec.split(":", 1)[0] if ":" in spec and not spec.startswith("{") else ""
    if kind in ("regex", "json", "lark", "choice", "number-or", "answer-json"):
        raise ConfigError(f"{where}: {spec!r} is a {kind}: constraint; a JSONL task's answer spec is one typed slot "
                          "in braces, e.g. {int:0..}, {choice:yes|no}, {letters:4} or {str} (issue 60)")
    try:
        template = parse_template(spec)
    except ConstraintError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not template.is_single_slot:
        raise ConfigError(f"{where}: an answer spec is one slot, e.g. {{int:0..}} or {{choice:yes|no}}; got {spec!r}")
    part = template.parts[0]
    assert isinstance(part, Slot)
    return part


def _normalize_text(value: str) -> str | None:
    cleaned = " ".join(value.split())
    return cleaned.casefold() if cleaned else None


@register_task
class JsonlTask(Task):
    """A JSON Lines file of your own (``--task jsonl:PATH``); see the module docstring for its layout."""

    name: ClassVar[str] = "jsonl"
    description: ClassVar[str] = ("your own items from a JSON Lines file: --task jsonl:PATH --answer-spec SLOT "
                                  "(or --answer-kind) [--gold-field F] [--shots-file P]")
    instructions: ClassVar[tuple[str, str, str]] = (
        "Answer the question.",
        "Read the question below and give its answer.",
        "Solve the following problem.",
    )
    samples_own_items: ClassVar[bool] = False
    answer_kind: ClassVar[AnswerKind] = AnswerKind.INTEGER  # the instance's kind replaces it (configure)

    def __init__(self) -> None:
        super().__init__()
        self.options: dict[str, str] = {}
        self.kind = "integer"
        self.default_slot: Slot | None = None
        self.labels: tuple[str, ...] = ()

    # -- options --------------------------------------------------------------------------------------------

    def configure(self, options: Mapping[str, Any]) -> Task:
        """Check the options, fix the file's answer kind and default slot; returns a configured task."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"task 'jsonl' does not take {', '.join(unknown)} (options: {', '.join(OPTIONS)})")
        if "path" not in options:
            raise ConfigError("task 'jsonl' needs a file: --task jsonl:PATH")
        task = JsonlTask()
        task.options = {k: str(v) for k, v in options.items()}
        path = Path(task.options["path"])
        if not path.is_file():
            raise ConfigError(f"--task jsonl:{path}: no such file")
        spec = task.options.get("answer_spec")
        kind = task.options.get("answer_kind")
        if spec is not None:
            task.default_slot = _slot(spec, "--answer-spec")
            spec_kind = _SLOT_KIND[task.default_slot.kind]
            if kind is not None and kind != spec_kind:
                raise ConfigError(f"--answer-kind {kind} contradicts --answer-spec {spec} (a {spec_kind} slot)")
            kind = spec_kind
        if kind is None:
            raise ConfigError("task 'jsonl' needs --answer-spec SLOT (e.g. '{int:0..}') or --answer-kind KIND "
                              f"({', '.join(KINDS)})")
        if kind not in KINDS:
            raise ConfigError(f"--answer-kind must be one of {', '.join(KINDS)}, got {kind!r}")
        instruction = task.options.get("instruction")
        # The answer kind and instructions are class-level on every task (the parsers read them there): a
        # configured file gets its own subclass. text: SPANS gives the lenient parser no kind-specific
        # fallback, so it reads the answer line only.
        configured = type("ConfiguredJsonlTask", (JsonlTask,), {
            "answer_kind": {"integer": AnswerKind.INTEGER, "choice": AnswerKind.CHOICE,
                            "letters": AnswerKind.LETTERS, "text": AnswerKind.SPANS}[kind],
            "instructions": (instruction,) * 3 if instruction else JsonlTask.instructions,
        })()
        configured.options, configured.default_slot, configured.kind = task.options, task.default_slot, kind
        return configured

    def _needs_data(self) -> bool:
        return False  # the file is named by its own path, not found in the data folder

    def data_files(self, data_dir: Path) -> list[Path]:
        files = [Path(self.options["path"])] if "path" in self.options else []
        if self.options.get("shots_file"):
            files.append(Path(self.options["shots_file"]))
        return files

    # -- items ----------------------------------------------------------------------------------------------

    def _expected(self) -> str:
        o = self.options
        return (f"a JSON object with {o.get('question_field', 'question')!r} (text) and "
                f"{o.get('gold_field', 'answer')!r}, optionally {o.get('id_field', 'id')!r}, "
                f"{o.get('choices_field', 'choices')!r} and 'answer_spec'")

    def _row(self, index: int, obj: Any) -> Item:
        o = self.options
        if not isinstance(obj, dict):
            raise RowError(f"got {type(obj).__name__}")
        qf, gf, idf, cf = (o.get("question_field", "question"), o.get("gold_field", "answer"),
                           o.get("id_field", "id"), o.get("choices_field", "choices"))
        question = obj.get(qf)
        if not isinstance(question, str) or not question.strip():
            raise RowError(f"field {qf!r} must be non-empty text")
        if gf not in obj or obj[gf] is None or isinstance(obj[gf], (dict, list)):
            raise RowError(f"field {gf!r} (the gold answer) is missing or not a single value")
        raw_id = obj.get(idf, index + 1)
        choices = self._choices(obj.get(cf))
        slot = self.default_slot
        if obj.get("answer_spec") is not None:
            slot = _slot(str(obj["answer_spec"]), f"row {index + 1} answer_spec")
            if _SLOT_KIND[slot.kind] != self.kind:
                raise RowError(f"answer_spec {obj['answer_spec']!r} is not a slot of kind {self.kind} (the file's kind)")
        if choices and slot is None:
            slot = _slot(choice_slot([label for label, _ in choices]), "choices")
        if slot is None:
            slot = _slot({"integer": "{int}", "letters": "{letters}", "text": "{str}", "choice": "{str}"}[self.kind],
                         "kind")
            if self.kind == "choice":
                raise RowError(f"a choice item needs {cf!r} or an answer spec")
        gold = self._normalize_kind(str(obj[gf]), slot)
        if gold is None:
            raise RowError(f"gold {obj[gf]!r} is not an answer of kind {self.kind} in {slot.source}")
        text = choice_question(question, choices) if choices else question.strip()
        if not choices and slot.kind == "choice":  # labels the lenient parser looks for (prompts do not list them)
            choices = tuple((option, option) for option in slot.options)
        solution = obj.get("solution") if isinstance(obj.get("solution"), str) else None
        return Item(id=str(raw_id), question=text, gold=gold, choices=choices, solution=solution,
                    meta={"slot": slot.source})

    @staticmethod
    def _choices(value: Any) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) <= len(_LABELS):
            return tuple((_LABELS[i], v) for i, v in enumerate(value))
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return tuple(value.items())
        raise RowError("choices must be a list of texts (labelled A, B, ...) or an object label -> text")

    def _read(self, path: Path) -> list[Item]:
        items = read_jsonl(self.name, path, self._expected(), self._row)
        check_unique_ids(self.name, path, [item.id for item in items])
        return items

    def _load(self, data_dir: Path | None) -> list[Item]:
        if "path" not in self.options:
            raise ConfigError("task 'jsonl' needs a file: --task jsonl:PATH")
        items = self._read(Path(self.options["path"]))
        if self.kind == "choice":  # every label any item offers (the parsers' label set)
            self.labels = tuple(dict.fromkeys(lab for it in items for lab in self._item_labels(it)))
        return items

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        shots = self.options.get("shots_file")
        return self._read(Path(shots)) if shots else self._load(data_dir)

    # -- answer space ---------------------------------------------------------------------------------------

    def _item_slot(self, item: Item) -> Slot:
        return _slot(str(item.meta["slot"]), f"item {item.id}")

    def _item_labels(self, item: Item) -> tuple[str, ...]:
        slot = self._item_slot(item)
        return slot.options if slot.kind == "choice" else item.labels

    def _vc_slot(self, item: Item) -> str:
        return self._item_slot(item).source

    def answer_description(self, item: Item) -> str:
        slot = self._item_slot(item)
        if slot.kind == "int":
            return integer_description(slot.lo, slot.hi)
        if slot.kind == "choice":
            return "one of " + ", ".join(slot.options)
        if slot.kind == "letters":
            return "a string of lowercase letters" if slot.n is None else f"a string of {slot.n} lowercase letters"
        return "a short answer on one line"

    def _normalize_kind(self, value: str, slot: Slot | None = None) -> str | None:
        if self.kind == "integer":
            return normalize_integer(value)
        if self.kind == "letters":
            return normalize_letters(value)
        if self.kind == "choice":
            labels = slot.options if slot is not None and slot.kind == "choice" else self.labels
            key = value.strip().casefold()
            return next((lab for lab in labels if lab.casefold() == key), None)
        return _normalize_text(value)

    def normalize(self, value: str) -> str | None:
        return self._normalize_kind(value)

    def canonical(self, value: str) -> str | None:
        if self.kind == "integer":
            return canonical_integer(value)
        if self.kind == "letters":
            return canonical_letters(value)
        return self.normalize(value)
