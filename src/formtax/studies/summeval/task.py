"""SummEval as LLM-as-a-judge (paper 001 section 4.3): rate a news summary from 1 to 5 on one aspect.

Data: ``summeval/summeval_expert_mean.jsonl`` (100 CNN/DM articles x 16 system summaries, each with the mean of three
experts' ratings for coherence, consistency, fluency and relevance; see the folder's SOURCE.md). One item per
(summary, aspect): id ``A<article>-S<summary>-<aspect>``, 6400 items in file order.

The answer line is Deco-G's natural-language format ``The rating is <score>`` (``answer_spec``), and the JSON format
has the score in ``answer``. Deco-G places the rating phrase anywhere (paper 001 section 4.3: "能够将评分短语灵活集成到
任意位置", while the baselines append it at the end), so the FEM strategies' format is the key phrase
(``fem_output_format`` REASON_KEYPHRASE, ``key_phrase`` "The rating is "): a prompt that asks for the sentence
somewhere in the response, the FEM placed ``anywhere``, the last phrase read. Beside them ``free`` and
``constrained`` get the same prompt (runner.grid.deco_g_baselines); alone, they keep the last-line format. The
prompts are ours (the paper's criteria come from ChatGPT and are not reproduced): a one-sentence task, the aspect's
definition in our words, the format instruction, then the article and the summary.

Gold and scoring (our choices): ``Item.gold`` is the expert *mean* written with 4 decimals (the correlation
analysis, :mod:`formtax.studies.summeval.judge`, needs it from the records alone), not a normalised answer as for other
tasks; ``score`` counts a rating as correct when it equals the mean rounded to the nearest integer (means are
multiples of 1/3, so there are no ties). The study's metric is the summary-level correlation, not this accuracy.
The task declares its answer line (``answer_prefix`` "The rating is "), so the shared strict parser, the format-level
parse rate and the report read ``The rating is N`` as this task's answer line (issue 60; before, only ``The answer
is: ...`` lines were read and every constrained output counted as unparsed).

There is no train split: the shot pool (few-shot examples, and the questions an instruction-aware FEM is distilled
from) is the items of articles A90-A99, which the evaluation never sees (``holds_out_dev``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from formtax.tasks.base import ConstraintLevel, Item, OutputFormat
from formtax.tasks.io import RowError, read_jsonl, require_object, require_str
from formtax.tasks.kinds import IntegerTask, normalize_integer
from formtax.tasks.registry import register_task

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
RATING_PREFIX = "The rating is "
SHOT_ARTICLES = frozenset(f"A{i}" for i in range(90, 100))

CRITERIA: dict[str, str] = {
    "coherence": "Coherence: how well the summary hangs together as a whole. A good summary is organised, its "
    "sentences follow from one another, and it reads as one body of information rather than a list of loosely "
    "related facts.",
    "consistency": "Consistency: whether the summary is faithful to the article. Every statement in it should be "
    "supported by the article; invented or distorted facts lower the score.",
    "fluency": "Fluency: the quality of the summary's sentences on their own: grammar, spelling, punctuation, "
    "word choice and sentence structure.",
    "relevance": "Relevance: whether the summary keeps the article's important content. It should contain the key "
    "points and leave out minor details and repetitions.",
}

_FORMATS: dict[OutputFormat, tuple[str, str, str]] = {
    OutputFormat.REASON_ANSWER: (
        "Explain your assessment briefly, then end with a final line of the form "
        f'"{RATING_PREFIX}<score>", where <score> is an integer from 1 to 5. Write nothing after that line.',
        "First give your reasoning. Finish your response with exactly this line:\n"
        f"{RATING_PREFIX}<score>\nHere <score> is an integer from 1 to 5.",
        "Reason about the criterion, then write a last line that starts with "
        f'"{RATING_PREFIX}" followed by your score, an integer from 1 to 5; nothing may follow that line.',
    ),
    OutputFormat.REASON_KEYPHRASE: (  # Deco-G's: the rating sentence anywhere in the response
        f'Explain your assessment, and state your score in a sentence "{RATING_PREFIX}<score>", where <score> is '
        "an integer from 1 to 5.",
        "Give your reasoning and your score. State the score in a sentence of the form:\n"
        f"{RATING_PREFIX}<score>\nHere <score> is an integer from 1 to 5.",
        f'Reason about the criterion, and write "{RATING_PREFIX}" followed by your score, an integer from 1 to '
        "5, somewhere in your response.",
    ),
    OutputFormat.ANSWER_ONLY: (
        f'Respond with a single line of the form "{RATING_PREFIX}<score>" and nothing else, where <score> is an '
        "integer from 1 to 5.",
        f"Give only your score, as exactly one line:\n{RATING_PREFIX}<score>\nHere <score> is an integer from 1 "
        "to 5. Do not write any explanation.",
        f'Output nothing but the line "{RATING_PREFIX}<score>", with <score> an integer from 1 to 5.',
    ),
    OutputFormat.JSON: (
        'Respond with one JSON object and nothing else, on a single line, in the form {"reason": "<reasoning>", '
        '"answer": <score>}, where the reason field holds your assessment and <score> is an integer from 1 to 5.',
        'Your whole response must be a single JSON object of the form {"reason": "<reasoning>", "answer": '
        '<score>}. Put your assessment in "reason" and the score, an integer from 1 to 5, in "answer".',
        'Reply in JSON only: exactly one object {"reason": "<reasoning>", "answer": <score>}. First assess the '
        "summary inside the reason field, then give <score>, an integer from 1 to 5.",
    ),
}

_EXPECTED = ("a JSON object with 'article_id', 'summary_id', 'article', 'summary' and the float ratings "
             "'coherence', 'consistency', 'fluency', 'relevance' in [1, 5]")


def _parse_row(index: int, obj: Any) -> dict[str, Any]:
    row = require_object(obj)
    out: dict[str, Any] = {k: require_str(row, k) for k in ("article_id", "summary_id", "article", "summary")}
    for aspect in ASPECTS:
        value = row.get(aspect)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 1.0 <= float(value) <= 5.0:
            raise RowError(f"field {aspect!r} must be a number in [1, 5], got {value!r}")
        out[aspect] = float(value)
    return out


def nearest_rating(mean: float) -> int:
    return int(math.floor(mean + 0.5))


@register_task
class SummEvalTask(IntegerTask):
    """SummEval judge: one item per (summary, aspect); gold = the experts' mean rating."""

    name: ClassVar[str] = "summeval"
    description: ClassVar[str] = (
        "SummEval LLM-as-judge: rate a news summary 1-5 for coherence, consistency, fluency or relevance "
        "(1440 of the 1600 summaries, articles A0-A89, x 4 aspects: A90-A99 are held out for shots and FEM "
        "distillation; 'The rating is <score>'; Spearman/Kendall against expert means)"
    )
    instructions: ClassVar[tuple[str, str, str]] = (
        "You will be given a news article and a summary of it. Rate the summary on one quality criterion, "
        "defined below.",
        "Evaluate the summary of the news article below on the criterion given.",
        "Read the news article and its summary, then judge how good the summary is on the criterion described.",
    )
    fem_output_format: ClassVar[OutputFormat] = OutputFormat.REASON_KEYPHRASE
    key_phrase: ClassVar[str] = RATING_PREFIX
    answer_prefix: ClassVar[str] = RATING_PREFIX
    evaluated_set: ClassVar[str] = (
        "SummEval evaluates articles A0-A89: 90 of paper 001's 100 articles (1440 of 1600 summaries x 4 aspects); "
        "A90-A99 are held out as the shot pool and for FEM distillation")
    vc_min: ClassVar[int | None] = 1
    vc_max: ClassVar[int | None] = 5
    folder: ClassVar[str] = "summeval"

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / self.folder / "summeval_expert_mean.jsonl"]

    def _load(self, data_dir: Path | None) -> list[Item]:
        path = self.data_files(self._require_dir(data_dir))[0]
        rows = read_jsonl(self.name, path, _EXPECTED, _parse_row)
        items: list[Item] = []
        for row in rows:
            for aspect in ASPECTS:
                items.append(Item(
                    id=f"{row['article_id']}-{row['summary_id']}-{aspect}",
                    question=f"Article:\n{row['article'].strip()}\n\nSummary:\n{row['summary'].strip()}",
                    gold=f"{row[aspect]:.4f}",
                    meta={"aspect": aspect, "article_id": row["article_id"], "summary_id": row["summary_id"]},
                ))
        return items

    holds_out_dev: ClassVar[bool] = True  # SHOT_ARTICLES: shots and FEM distillation only, never evaluated

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        return [it for it in self._load(data_dir) if it.meta["article_id"] in SHOT_ARTICLES]

    # -- answer space ---------------------------------------------------------------------------------------
    def answer_spec(self, level: ConstraintLevel, item: Item, output_format: OutputFormat) -> str:
        slot = self.answer_slot(level, item)
        return slot if output_format is OutputFormat.JSON else RATING_PREFIX + slot

    def normalize(self, value: str) -> str | None:
        v = normalize_integer(value)
        return v if v is not None and 1 <= int(v) <= 5 else None

    def score(self, item: Item, value: str | None) -> bool:
        v = self.normalize(value) if value is not None else None
        return v is not None and int(v) == nearest_rating(float(item.gold))

    def display_answer(self, item: Item) -> str:
        return str(nearest_rating(float(item.gold)))

    # -- prompts --------------------------------------------------------------------------------------------
    def _aspect(self, item: Item) -> str:
        return str(item.meta.get("aspect") or item.id.rsplit("-", 1)[-1])

    def messages(self, item: Item, output_format: OutputFormat, task_variant: int, format_variant: int,
                 shots: Sequence[Item]) -> list[dict[str, str]]:
        fmt = _FORMATS[OutputFormat(output_format)][format_variant - 1]
        parts = [self.instructions[task_variant - 1], CRITERIA[self._aspect(item)], fmt]
        if shots:
            examples = "\n\n".join(f"{s.question}\n{self._render(s, output_format)}" for s in shots)
            parts.append(f"Examples:\n\n{examples}")
        parts.append(item.question)
        return [{"role": "user", "content": "\n\n".join(parts)}]

    def _render(self, shot: Item, output_format: OutputFormat) -> str:
        score = self.display_answer(shot)
        if OutputFormat(output_format) is OutputFormat.JSON:
            return json.dumps({"reason": "", "answer": int(score)})
        return RATING_PREFIX + score

    def task_only_messages(self, item: Item) -> list[dict[str, str]]:
        """The prompt without a format instruction (instruction-aware FEM distillation)."""
        parts = [self.instructions[0], CRITERIA[self._aspect(item)], item.question]
        return [{"role": "user", "content": "\n\n".join(parts)}]
