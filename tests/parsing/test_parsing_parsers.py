"""Strict and lenient parsers on hand-written model outputs."""

from __future__ import annotations

import pytest

from formtax.errors import ConfigError
from formtax.parsing import ParseResult, get_parser, list_parsers, parse_all
from formtax.tasks import Item, OutputFormat, Task, get_task

RA = OutputFormat.REASON_ANSWER
AO = OutputFormat.ANSWER_ONLY
JS = OutputFormat.JSON

GSM = get_task("gsm8k")
GSM_ITEM = Item(id="0", question="q", gold="18")
CSQA = get_task("csqa")
CSQA_ITEM = Item(
    id="c",
    question="q",
    gold="B",
    choices=(("A", "bank"), ("B", "library"), ("C", "mall"), ("D", "zoo"), ("E", "x")),
)
LL = get_task("lastletter")
LL_ITEM = Item(id="l", question="q", gold="hene")
ALT = get_task("imdb-alt")
ALT_ITEM = Item(id="i", question="q", gold="negative")


def _both(text: str, task: Task, item: Item, fmt: OutputFormat) -> tuple[tuple[str, str | None], ...]:
    results = parse_all(text, task, item, fmt)
    assert list(results) == ["strict", "lenient"]
    return tuple((r.status, r.value) for r in results.values())


def test_registry() -> None:
    assert list_parsers() == ["strict", "lenient"]
    with pytest.raises(ConfigError) as info:
        get_parser("fuzzy")
    assert "strict" in str(info.value) and "lenient" in str(info.value)


@pytest.mark.parametrize(
    ("text", "strict", "lenient"),
    [
        ("9 * 2 = 18\nThe answer is: 18", ("ok", "18"), ("ok", "18")),
        ("9 * 2 = 18\nThe answer is: 18.\n\n", ("ok", "18"), ("ok", "18")),
        # the strict parser reads only the canonical representation (paper 003 A.4.1); lenient normalises
        ("The answer is: 1,450,000", ("invalid", None), ("ok", "1450000")),
        ("The answer is: $18.00", ("invalid", None), ("ok", "18")),
        ("The answer is: 28.00", ("invalid", None), ("ok", "28")),
        ("The answer is: 2,8", ("invalid", None), ("ok", "28")),
        ("The answer is: 028", ("invalid", None), ("ok", "28")),
        ("The answer is: -0", ("invalid", None), ("ok", "0")),  # issue 60: -0 is not canonical, as in JSON
        ("The answer is: twelve", ("invalid", None), ("invalid", None)),
        ("The answer is: 18 dollars", ("invalid", None), ("ok", "18")),
        ("The answer is: 18\nHope this helps!", ("no_answer", None), ("ok", "18")),
        ("the answer is: 18", ("no_answer", None), ("ok", "18")),
        ("**The final answer is: 18**", ("no_answer", None), ("ok", "18")),
        ("She makes 9 * 2 = $18 per day.", ("no_answer", None), ("ok", "18")),
        ("The total is 1,450,000 dollars", ("no_answer", None), ("ok", "1450000")),
        ("I cannot solve this.", ("no_answer", None), ("no_answer", None)),
        ("", ("no_answer", None), ("no_answer", None)),
    ],
)
def test_reason_answer_integer(
    text: str, strict: tuple[str, str | None], lenient: tuple[str, str | None]
) -> None:
    assert _both(text, GSM, GSM_ITEM, RA) == (strict, lenient)


def test_answer_only_requires_a_single_line() -> None:
    assert _both("The answer is: 18\n", GSM, GSM_ITEM, AO) == (("ok", "18"), ("ok", "18"))
    assert _both("Let me think.\nThe answer is: 18", GSM, GSM_ITEM, AO) == (("no_answer", None), ("ok", "18"))
    assert _both("18", GSM, GSM_ITEM, AO) == (("no_answer", None), ("ok", "18"))


@pytest.mark.parametrize(
    ("text", "strict", "lenient"),
    [
        ('{"reason": "9*2", "answer": 18}', ("ok", "18"), ("ok", "18")),
        # a string for an integer answer: the right shape, a value of the wrong JSON type (the reader's check, issue 56)
        ('  {\n  "reason": "9*2",\n  "answer": "18"\n}\n', ("invalid", None), ("ok", "18")),
        ('{"answer": 18.0, "reason": ""}', ("invalid", None), ("ok", "18")),
        ('{"answer": "18", "reason": ""}', ("invalid", None), ("ok", "18")),
        ('```json\n{"reason": "9*2", "answer": 18}\n```', ("no_answer", None), ("ok", "18")),
        (
            'Step 1...\n\n```json\n{"reason": "r", "answer": "1,450,000"}\n```',
            ("no_answer", None),
            ("ok", "1450000"),
        ),
        ('Result: {"reason": "r", "answer": 18} done', ("no_answer", None), ("ok", "18")),
        ('{"reason": "r", "answer": 18, "confidence": 1}', ("no_answer", None), ("ok", "18")),
        ('{"reason": 5, "answer": 18}', ("no_answer", None), ("ok", "18")),
        ('{"reason": "r", "answer": "twelve"}', ("invalid", None), ("invalid", None)),
        ('{"reason": "r", "answer": true}', ("no_answer", None), ("invalid", None)),  # not FC's shape (issue 49)
        ('{"reason": "r", "answer": [18]}', ("no_answer", None), ("ok", "18")),
        ('{"reason": "r", "answer": 18', ("no_answer", None), ("ok", "18")),
    ],
)
def test_json_integer(text: str, strict: tuple[str, str | None], lenient: tuple[str, str | None]) -> None:
    assert _both(text, GSM, GSM_ITEM, JS) == (strict, lenient)


def test_strict_json_ignores_format_of_other_strategies() -> None:
    # A reason-answer output is not JSON: strict JSON fails, lenient still finds the answer line.
    assert _both("blah\nThe answer is: 18", GSM, GSM_ITEM, JS) == (("no_answer", None), ("ok", "18"))


@pytest.mark.parametrize(
    ("text", "strict", "lenient"),
    [
        ("Libraries are quiet.\nThe answer is: B", ("ok", "B"), ("ok", "B")),
        ("The answer is: b.", ("ok", "B"), ("ok", "B")),
        ("The answer is: (B)", ("invalid", None), ("ok", "B")),
        ("The answer is: (B) library", ("invalid", None), ("ok", "B")),
        ("The answer is: library", ("invalid", None), ("invalid", None)),
        ("A bank has doors. So (B) is right.", ("no_answer", None), ("ok", "B")),
        ("I would pick B) library.", ("no_answer", None), ("ok", "B")),
        ("A revolving door...\nAnswer: B", ("no_answer", None), ("ok", "B")),
        ("Option C is tempting, but the answer is option B", ("no_answer", None), ("ok", "B")),
        ("A revolving door is at a bank.\n\nB", ("no_answer", None), ("ok", "B")),
        ("**B**", ("no_answer", None), ("ok", "B")),
        ("A bank is a place.", ("no_answer", None), ("no_answer", None)),
    ],
)
def test_choice_labels(text: str, strict: tuple[str, str | None], lenient: tuple[str, str | None]) -> None:
    assert _both(text, CSQA, CSQA_ITEM, RA) == (strict, lenient)


def test_choice_label_outside_item_is_not_found_by_lenient() -> None:
    four = Item(id="a", question="q", gold="A", choices=(("A", "w"), ("B", "x"), ("C", "y"), ("D", "z")))
    arc = get_task("arc-easy")
    assert _both("I pick (E).", arc, four, RA) == (("no_answer", None), ("no_answer", None))


@pytest.mark.parametrize(
    ("text", "strict", "lenient"),
    [
        ("The answer is: hene", ("ok", "hene"), ("ok", "hene")),
        ("The answer is: H E N E", ("invalid", None), ("ok", "hene")),
        ("The answer is: HENE", ("ok", "hene"), ("ok", "hene")),
        ('The answer is: "hene".', ("invalid", None), ("ok", "hene")),
        ("The answer is: hene1", ("invalid", None), ("ok", "hene")),
        ("The answer is: 1234", ("invalid", None), ("invalid", None)),
        ("The letters are h, e, n, e, giving hene", ("no_answer", None), ("ok", "hene")),
        ("Joining them yields abcd; wait, hene", ("no_answer", None), ("ok", "hene")),
        ("so we get xyz", ("no_answer", None), ("no_answer", None)),
    ],
)
def test_letters(text: str, strict: tuple[str, str | None], lenient: tuple[str, str | None]) -> None:
    assert _both(text, LL, LL_ITEM, RA) == (strict, lenient)


def test_paper_case_free_text_then_fenced_json() -> None:
    # Paper 003 A.4.3 case 1: free-form reasoning, then a fenced JSON object at the end.
    text = (
        "### Step-by-step\n1. Split the words\n\n### Final Answer:\n\n```json\n"
        '{\n"reason": "split and take last letters",\n"answer": "hene"\n}\n```'
    )
    assert _both(text, LL, LL_ITEM, JS) == (("no_answer", None), ("ok", "hene"))


def test_imdb_alt_words() -> None:
    assert _both("The answer is: Disappointing", ALT, ALT_ITEM, AO) == (
        ("ok", "negative"),
        ("ok", "negative"),
    )
    assert _both("The answer is: negative", ALT, ALT_ITEM, AO) == (("invalid", None), ("invalid", None))
    assert _both('{"reason": "dull", "answer": "bad"}', ALT, ALT_ITEM, JS) == (
        ("ok", "negative"),
        ("ok", "negative"),
    )
    assert _both("This review sounds unfavorable overall.", ALT, ALT_ITEM, RA) == (
        ("no_answer", None),
        ("ok", "negative"),
    )


def test_parse_result_keeps_the_raw_answer() -> None:
    result = get_parser("lenient")("The answer is: $1,450,000.", GSM, GSM_ITEM, RA)
    assert result == ParseResult("ok", "1450000", "$1,450,000")
    assert result.ok
    strict = get_parser("strict")("The answer is: $1,450,000.", GSM, GSM_ITEM, RA)
    assert strict == ParseResult("invalid", None, "$1,450,000")


def test_strict_reads_the_item_answer_space_as_the_reader_does() -> None:
    """Issue 56 (one reader): a canonical answer outside the item's answer space, an integer out of the VC range
    or a letter string of another length, is the right shape holding an invalid value, as ``formtax.parse`` reads
    it; the lenient parser still reads it."""
    from formtax.tasks.jsonl import JsonlTask

    assert _both("The answer is: hen", LL, LL_ITEM, RA) == (("invalid", None), ("ok", "hen"))
    assert _both('{"reason": "r", "answer": "HENES"}', LL, LL_ITEM, JS) == (("invalid", None), ("ok", "henes"))
    ranged = JsonlTask()
    item = Item(id="r", question="q", gold="5", meta={"slot": "{int:0..99}"})
    assert _both("The answer is: 99", ranged, item, RA)[0] == ("ok", "99")
    assert _both("The answer is: 100", ranged, item, RA)[0] == ("invalid", None)
    assert _both('{"reason": "r", "answer": 100}', ranged, item, JS)[0] == ("invalid", None)
    assert _both('{"reason": "r", "answer": 7}', ranged, item, JS)[0] == ("ok", "7")
