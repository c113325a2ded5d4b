"""score_all: per-parser correctness."""

from __future__ import annotations

from formtax.parsing import ParseResult, parse_all
from formtax.scoring import score_all
from formtax.tasks import Item, OutputFormat, get_task


def test_score_all_per_parser() -> None:
    task = get_task("gsm8k")
    item = Item(id="0", question="q", gold="1450000")
    parses = parse_all(
        "so 1,450,000 in total\nThe answer is: 1,450,000\nDone.", task, item, OutputFormat.REASON_ANSWER
    )
    assert score_all(task, item, parses) == {"strict": False, "lenient": True}
    parses = parse_all("The answer is: 1450000", task, item, OutputFormat.REASON_ANSWER)
    assert score_all(task, item, parses) == {"strict": True, "lenient": True}
    # a separator is not the canonical representation: only the lenient parser forgives it (paper 003 A.4.1)
    parses = parse_all("The answer is: 1,450,000", task, item, OutputFormat.REASON_ANSWER)
    assert score_all(task, item, parses) == {"strict": False, "lenient": True}


def test_wrong_invalid_and_missing_answers_score_false() -> None:
    task = get_task("gsm8k")
    item = Item(id="0", question="q", gold="18")
    parses = {
        "wrong": ParseResult("ok", "17", "17"),
        "invalid": ParseResult("invalid", None, "twelve"),
        "missing": ParseResult("no_answer", None, None),
        "right": ParseResult("ok", "18", "18.0"),
    }
    assert score_all(task, item, parses) == {
        "wrong": False,
        "invalid": False,
        "missing": False,
        "right": True,
    }
    assert score_all(task, item, {}) == {}


def test_imdb_alt_scores_by_class() -> None:
    task = get_task("imdb-alt")
    item = Item(id="0", question="q", gold="positive")
    parses = parse_all("The answer is: Enjoyable", task, item, OutputFormat.ANSWER_ONLY)
    assert score_all(task, item, parses) == {"strict": True, "lenient": True}
    parses = parse_all("The answer is: Critical", task, item, OutputFormat.ANSWER_ONLY)
    assert score_all(task, item, parses) == {"strict": False, "lenient": False}
