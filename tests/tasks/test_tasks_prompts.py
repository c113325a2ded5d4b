"""Prompts: determinism, variant differences, format descriptions that match the strict parser, few-shot blocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from formtax.errors import ConfigError
from formtax.parsing import parse_strict
from formtax.tasks import (
    ANSWER_PREFIX,
    Item,
    OutputFormat,
    Task,
    build_messages,
    conversion_messages,
    get_task,
    parse_variant_id,
    render_answer,
    variant_id,
)
from formtax.tasks.prompts import all_variant_ids


def _data_dir() -> Path:
    env = os.environ.get("FORMTAX_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


DATA = _data_dir()
FILE_TASKS = ["aime", "arc-challenge", "arc-easy", "arith", "csqa", "gsm8k", "imdb", "imdb-alt", "svamp"]


def _first(name: str) -> tuple[Task, Item]:
    task = get_task(name)
    return task, task.load(DATA)[0]


def _content(messages: list[dict[str, str]]) -> str:
    assert len(messages) == 1 and messages[0]["role"] == "user"
    return messages[0]["content"]


def test_variant_ids_round_trip() -> None:
    assert variant_id(1, 1) == "t1f1"
    assert variant_id(3, 2) == "t3f2"
    assert parse_variant_id("t2f3") == (2, 3)
    assert [parse_variant_id(v) for v in all_variant_ids()] == [(t, f) for t in (1, 2, 3) for f in (1, 2, 3)]
    for bad in ("t0f1", "t1f4", "x1f1", "t1", "t1f1 extra"):
        with pytest.raises(ConfigError):
            parse_variant_id(bad)
    with pytest.raises(ConfigError):
        variant_id(4, 1)


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_prompts_are_deterministic_and_variants_differ(fmt: OutputFormat) -> None:
    task, item = _first("gsm8k")
    shots = task.shots(2, seed=5, exclude_ids={item.id})
    contents = {}
    for t in (1, 2, 3):
        for f in (1, 2, 3):
            first = _content(build_messages(task, item, fmt, t, f, shots))
            again = _content(build_messages(get_task("gsm8k"), item, fmt, t, f, list(shots)))
            assert first == again
            contents[(t, f)] = first
    assert len(set(contents.values())) == 9
    for content in contents.values():
        assert content.endswith(f"Question: {item.question}")
    assert contents[(1, 1)].startswith(task.instructions[0])
    assert contents[(2, 1)].startswith(task.instructions[1])


def test_format_descriptions_state_the_format_and_answer_space() -> None:
    task, item = _first("gsm8k")
    reason = _content(build_messages(task, item, OutputFormat.REASON_ANSWER, 1, 1))
    assert f"{ANSWER_PREFIX}<answer>" in reason and "a non-negative integer" in reason
    answer_only = _content(build_messages(task, item, OutputFormat.ANSWER_ONLY, 1, 1))
    assert f"{ANSWER_PREFIX}<answer>" in answer_only and "nothing else" in answer_only
    as_json = _content(build_messages(task, item, OutputFormat.JSON, 1, 1))
    assert '{"reason": "<reasoning>", "answer": <answer>}' in as_json
    csqa, csqa_item = _first("csqa")
    choice = _content(build_messages(csqa, csqa_item, OutputFormat.JSON, 1, 1))
    assert '"answer": "<answer>"}' in choice and "one of the labels A, B, C, D, E" in choice
    arc, arc_item = _first("arc-challenge")
    assert "one of the labels A, B, C, D" in _content(
        build_messages(arc, arc_item, OutputFormat.ANSWER_ONLY, 1, 1)
    )
    aime, aime_item = _first("aime")
    assert "an integer from 0 to 999" in _content(
        build_messages(aime, aime_item, OutputFormat.ANSWER_ONLY, 1, 1)
    )
    alt, alt_item = _first("imdb-alt")  # paper 003 Table 4: the label prompt, only the decoding takes the words
    imdb, imdb_item = _first("imdb")
    for fmt in (OutputFormat.ANSWER_ONLY, OutputFormat.REASON_ANSWER, OutputFormat.JSON):
        text = _content(build_messages(alt, alt_item, fmt, 1, 1, alt.shots(2, 0, {alt_item.id})))
        assert text == _content(build_messages(imdb, imdb_item, fmt, 1, 1, imdb.shots(2, 0, {imdb_item.id})))
        assert "disappointing" not in text and "one of the labels positive, negative" in text


def test_bad_variants_are_rejected() -> None:
    task, item = _first("svamp")
    with pytest.raises(ConfigError):
        build_messages(task, item, OutputFormat.JSON, 0, 1)
    with pytest.raises(ConfigError):
        build_messages(task, item, OutputFormat.JSON, 1, 4)


def test_few_shot_block_uses_the_requested_format() -> None:
    task, item = _first("gsm8k")
    (shot,) = task.shots(1, seed=0, exclude_ids=set())
    reason = _content(build_messages(task, item, OutputFormat.REASON_ANSWER, 1, 1, [shot]))
    assert f"Question: {shot.question}\n{shot.solution}\n{ANSWER_PREFIX}{shot.gold}" in reason
    answer_only = _content(build_messages(task, item, OutputFormat.ANSWER_ONLY, 1, 1, [shot]))
    assert f"Question: {shot.question}\n{ANSWER_PREFIX}{shot.gold}\n" in answer_only
    assert shot.solution is not None and shot.solution not in answer_only
    as_json = _content(build_messages(task, item, OutputFormat.JSON, 1, 1, [shot]))
    assert f'"answer": {shot.gold}}}' in as_json
    assert "Examples:" in as_json and "Examples:" not in _content(
        build_messages(task, item, OutputFormat.JSON, 1, 1)
    )


@pytest.mark.parametrize("name", FILE_TASKS)
@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_rendered_gold_parses_strictly_and_scores(name: str, fmt: OutputFormat) -> None:
    task = get_task(name)
    for item in task.load(DATA)[:25]:
        text = render_answer(task, item, fmt)
        result = parse_strict(text, task, item, fmt)
        if name == "imdb-alt":  # its shots are imdb's labels (the same prompt); a label is prohibited content
            assert result.status == "invalid", text
            continue
        assert result.status == "ok", text
        assert task.score(item, result.value), text


def test_conversion_messages() -> None:
    task, item = _first("gsm8k")
    reasoning = "She sells 9 eggs.\nSo she makes 18 dollars."
    content = _content(conversion_messages(task, item, reasoning, 2))
    assert f"Question: {item.question}" in content
    assert reasoning in content
    assert f"{ANSWER_PREFIX}<answer>" in content
    assert content == _content(conversion_messages(task, item, reasoning, 2))
    assert content != _content(conversion_messages(task, item, reasoning, 3))
