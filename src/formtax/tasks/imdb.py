"""IMDb sentiment (1000 labelled review sentences) in the two answer spaces of paper 003 A.4.2.

``imdb`` answers with the class labels ``positive`` / ``negative`` (label-constrained decoding).
``imdb-alt`` is the alternative-word condition of Table 4: the prompt is ``imdb``'s label prompt, byte for byte
(it asks for positive / negative), and only the decoding is constrained to the alternative words, five per
class (negative: bad, critical, unfavorable, disappointing, unsatisfactory; positive: good, favorable, impressive,
satisfying, enjoyable); ``normalize`` maps a word to its class so scoring compares classes. The class labels
themselves are *not* accepted in ``imdb-alt`` (they are the prohibited content): the condition asks whether the
model keeps the right sentiment when the label it was asked for is masked out. Table 4's three columns are the
unconstrained ``imdb`` level, ``imdb`` constrained to the labels and ``imdb-alt`` constrained to the words
(report/paper003.py, a report pooling the two runs).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import Item
from formtax.tasks.io import RowError, check_unique_ids, read_jsonl, require_int, require_object, require_str
from formtax.tasks.kinds import ChoiceTask
from formtax.tasks.registry import register_task

_EXPECTED = "a JSON object with an integer 'idx', a 'sentence' (str) and 'label' 0 (negative) or 1 (positive)"
_CLASSES = ("negative", "positive")

ALTERNATIVE_WORDS: dict[str, tuple[str, ...]] = {
    "negative": ("bad", "critical", "unfavorable", "disappointing", "unsatisfactory"),
    "positive": ("good", "favorable", "impressive", "satisfying", "enjoyable"),
}
"""The alternative words of paper 003 A.4.2, per class, in the paper's order."""

_WORD_TO_CLASS = {word: cls for cls, words in ALTERNATIVE_WORDS.items() for word in words}


def _parse_row(index: int, obj: Any) -> Item:
    row = require_object(obj)
    idx = require_int(row, "idx")
    sentence = require_str(row, "sentence").strip()
    label = require_int(row, "label")
    if label not in (0, 1):
        raise RowError(f"'label' must be 0 or 1, got {label}")
    question = f'What is the sentiment of this movie review sentence? "{sentence}"'
    return Item(id=str(idx), question=question, gold=_CLASSES[label], meta={"sentence": sentence})


class _ImdbBase(ChoiceTask):
    instructions: ClassVar[tuple[str, str, str]] = (
        "Classify the sentiment of the following movie review sentence.",
        "You are given a sentence from an IMDb movie review. Decide whether its sentiment is positive or negative.",
        "Read the movie review sentence below and determine the sentiment it expresses.",
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / "imdb_sample" / "imdb_labelled_sentences.jsonl"]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        items = read_jsonl(self.name, path, _EXPECTED, _parse_row)
        check_unique_ids(self.name, path, [item.id for item in items])
        return [self._with_choices(item) for item in items]

    def _with_choices(self, item: Item) -> Item:
        return item


@register_task
class ImdbTask(_ImdbBase):
    """IMDb, label-constrained: answer ``positive`` or ``negative``."""

    name: ClassVar[str] = "imdb"
    description: ClassVar[str] = "IMDb review-sentence sentiment (1000 items; labels positive/negative)"
    all_labels: ClassVar[tuple[str, ...]] = ("positive", "negative")

    def _with_choices(self, item: Item) -> Item:
        choices = tuple((label, label) for label in self.all_labels)
        return replace(item, choices=choices)


@register_task
class ImdbAltTask(_ImdbBase):
    """IMDb, alternative-word condition: answer one of ten sentiment words; scored by class."""

    name: ClassVar[str] = "imdb-alt"
    description: ClassVar[str] = (
        "IMDb sentiment answered with alternative words (1000 items; e.g. good/bad, scored by class)"
    )
    all_labels: ClassVar[tuple[str, ...]] = ALTERNATIVE_WORDS["negative"] + ALTERNATIVE_WORDS["positive"]

    def _with_choices(self, item: Item) -> Item:
        # (label, text) = (word, the class it stands for).
        choices = tuple((word, _WORD_TO_CLASS[word]) for word in self.all_labels)
        return replace(item, choices=choices)

    def answer_description(self, item: Item) -> str:
        """``imdb``'s: the prompt asks for the label (paper 003 keeps the label prompt for this condition)."""
        return "one of the labels " + ", ".join(ImdbTask.all_labels)

    def normalize(self, value: str) -> str | None:
        """Map an alternative word (any case) to its class; anything else, including the class names, is None."""
        return _WORD_TO_CLASS.get(value.strip().casefold())

    def display_answer(self, item: Item) -> str:
        """The gold label, as ``imdb`` shows it in few-shot examples (the prompts are the same)."""
        return item.gold
