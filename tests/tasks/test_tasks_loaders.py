"""Loaders against the shared benchmark data: row counts and golds from each SOURCE.md, and error messages."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from formtax.errors import DataError
from formtax.tasks import get_task


def _data_dir() -> Path:
    env = os.environ.get("FORMTAX_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


DATA = _data_dir()

COUNTS = {
    "gsm8k": 1319,
    "svamp": 937,  # 1000, less the 63 held out as a dev split (shots, FEM distillation)
    "aime": 30,
    "arc-challenge": 1172,
    "arc-easy": 2376,
    "csqa": 1144,  # 1221, less the 77 held out
    "imdb": 1000,
    "imdb-alt": 1000,
}


@pytest.mark.parametrize(("name", "count"), sorted(COUNTS.items()))
def test_row_counts_and_unique_ids(name: str, count: int) -> None:
    task = get_task(name)
    items = task.load(DATA)
    assert len(items) == count
    assert len({item.id for item in items}) == count
    assert all(task.normalize(item.gold) is not None or name == "imdb-alt" for item in items)
    assert all(path.is_file() for path in task.data_files(DATA))


def test_gsm8k_golds() -> None:
    items = get_task("gsm8k").load(DATA)
    assert items[0].gold == "18"
    assert items[0].question.startswith("Janet")
    golds = Counter(item.gold for item in items)
    assert golds["1450000"] >= 1  # "1,450,000" upstream: commas removed
    assert sorted(g for g in golds if g.startswith("-")) == ["-10", "-3"]
    assert items[0].solution is not None and "<<" not in items[0].solution


def test_gsm8k_train_is_the_shot_pool() -> None:
    task = get_task("gsm8k")
    task.load(DATA)
    shots = task.shots(3, seed=1, exclude_ids=set())
    assert all(shot.id.startswith("train-") for shot in shots)
    assert all(shot.solution and "<<" not in shot.solution and "####" not in shot.solution for shot in shots)
    assert len(task.shots(7473, seed=0, exclude_ids=set())) == 7473
    with pytest.raises(DataError):
        task.shots(7474, seed=0, exclude_ids=set())


def test_svamp_and_aime_golds() -> None:
    svamp = get_task("svamp")._load(DATA)  # every row of the file (load() holds out a dev split)
    assert (svamp[0].id, svamp[0].gold) == ("chal-1", "51")
    assert svamp[0].question.endswith("each pack How much do you have to pay to buy each pack?")
    aime = get_task("aime").load(DATA)
    assert [item.gold for item in aime[:3]] == ["70", "588", "16"]
    assert [item.gold for item in aime[-3:]] == ["248", "104", "240"]
    assert aime[0].id == "2025-I-1"


def test_arc_options_and_labels() -> None:
    challenge = get_task("arc-challenge").load(DATA)
    first = challenge[0]
    assert first.gold == "C"
    assert first.choices[2] == ("C", "Planetary days will become shorter.")
    assert "(C) Planetary days will become shorter." in first.question
    assert "Answer format" not in first.question
    assert Counter(len(item.choices) for item in challenge) == {4: 1165, 3: 4, 5: 3}
    easy = get_task("arc-easy").load(DATA)
    assert Counter(len(item.choices) for item in easy) == {4: 2365, 3: 7, 5: 4}
    assert all(item.gold in item.labels for item in challenge + easy)


def test_csqa_and_imdb_labels() -> None:
    csqa = get_task("csqa")._load(DATA)  # every row of the file (load() holds out a dev split)
    assert Counter(item.gold for item in csqa) == {"A": 239, "B": 255, "C": 241, "D": 251, "E": 235}
    assert csqa[0].id == "1afa02df02c908a558b4036e80242fac" and csqa[0].gold == "A"
    imdb = get_task("imdb").load(DATA)
    assert Counter(item.gold for item in imdb) == {"negative": 500, "positive": 500}
    assert imdb[0].gold == "negative" and imdb[0].id == "0"


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        get_task("gsm8k").load(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "gsm8k" / "test.jsonl") in message
    assert "#### <integer>" in message


def test_malformed_jsonl_reports_line(tmp_path: Path) -> None:
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    good = json.dumps({"question": "q?", "answer": "x\n#### 3"})
    bad = json.dumps({"question": "q?", "answer": "no final answer"})
    (folder / "test.jsonl").write_text(f"{good}\n{good}\n{bad}\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        get_task("gsm8k").load(tmp_path)
    message = str(info.value)
    assert "line 3" in message and str(folder / "test.jsonl") in message
    assert "expected a JSON object with 'question' and 'answer' ending in '#### <integer>'" in message


def test_invalid_json_line_reports_line(tmp_path: Path) -> None:
    folder = tmp_path / "commonsenseqa"
    folder.mkdir()
    (folder / "dev_rand_split.jsonl").write_text("{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 1: not valid JSON"):
        get_task("csqa").load(tmp_path)


def test_malformed_json_array_reports_row(tmp_path: Path) -> None:
    folder = tmp_path / "arc"
    folder.mkdir()
    row = {
        "instruction": "Please choose the correct answer to the question: Q?\n\nAnswer1: a Answer2: b\n\n"
        "Answer format: answer1/answer2",
        "input": "",
        "output": "the correct answer is answer2",
        "answer": "answer2",
    }
    broken = dict(row, answer="answer7")
    (folder / "ARC-Easy-test.LLM-Adapters.json").write_text(json.dumps([row, broken]), encoding="utf-8")
    with pytest.raises(DataError, match=r"row 1: 'answer' 'answer7' is not answer1\.\.answer2"):
        get_task("arc-easy").load(tmp_path)
    (folder / "ARC-Easy-test.LLM-Adapters.json").write_text(json.dumps([row]), encoding="utf-8")
    (item,) = get_task("arc-easy").load(tmp_path)
    assert item.gold == "B" and item.choices == (("A", "a"), ("B", "b"))


def test_svamp_non_integer_answer_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "svamp"
    folder.mkdir()
    row = {"ID": "x", "Body": "b", "Question": "q?", "Equation": "( 1.0 / 2.0 )", "Answer": 0.5, "Type": "t"}
    (folder / "SVAMP.json").write_text(json.dumps([row]), encoding="utf-8")
    with pytest.raises(DataError, match="row 0: field 'Answer'"):
        get_task("svamp").load(tmp_path)


@pytest.mark.parametrize("name", ["svamp", "csqa", "summeval"])
def test_distillation_and_shots_never_use_evaluated_items(name: str) -> None:
    """Issue 37, point 9: the FEM's distillation prompts come from a split the evaluation does not use."""
    from formtax.runner.distill import _training_items

    task = get_task(name)
    evaluated = {item.id for item in task.load(DATA)}
    distilled = _training_items(task, 64, seed=0)
    assert len(distilled) == 64 and not {item.id for item in distilled} & evaluated
    assert not {item.id for item in task.shots(3, 0, set())} & evaluated
