"""Your own task without Python (``--task jsonl:PATH``) and with it (``@register_task`` + ``--import``): items,
answer specs, strict / lenient parsing and records are the built-in tasks' own, on the fake backend."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from formtax.cli.main import main
from formtax.errors import ConfigError, DataError
from formtax.parsing import parse_all
from formtax.tasks import OutputFormat, get_task
from formtax.tasks.jsonl import JsonlTask


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _task(path: Path, **options: str) -> JsonlTask:
    task = get_task("jsonl").configure({"path": str(path), **options})  # type: ignore[attr-defined]
    assert isinstance(task, JsonlTask)
    return task


def test_integer_file_with_a_row_that_narrows_its_slot(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", [{"id": "q1", "question": "2 + 3?", "answer": 5},
                                        {"question": "Legs of a spider?", "answer": "8", "answer_spec": "{int:0..20}"}])
    task = _task(path, answer_spec="{int:0..}")
    items = task.load(None)
    assert [i.id for i in items] == ["q1", "2"] and [i.gold for i in items] == ["5", "8"]
    assert task.answer_slot("vc", items[0]) == "{int:0..}" and task.answer_slot("vc", items[1]) == "{int:0..20}"
    assert task.answer_slot("fc", items[1]) == "{str}"
    ok = parse_all("So 5.\nThe answer is: 5", task, items[0], OutputFormat.REASON_ANSWER)
    assert ok["strict"].value == "5" and ok["strict"].status == "ok"
    loose = parse_all("The answer is: 5.00", task, items[0], OutputFormat.REASON_ANSWER)
    assert loose["strict"].status == "invalid" and loose["lenient"].value == "5"  # strict does not repair


def test_choice_rows_and_a_choice_spec(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [{"question": "Sky colour?", "answer": "B", "choices": ["red", "blue"]},
                                        {"question": "Grass?", "answer": "A", "choices": {"A": "green", "B": "pink"}}])
    task = _task(path, answer_kind="choice")
    items = task.load(None)
    assert "(B) blue" in items[0].question and task.answer_slot("vc", items[0]) == "{choice:A|B}"
    assert parse_all("The answer is: B", task, items[0], OutputFormat.REASON_ANSWER)["strict"].value == "B"
    yn = _task(_write(tmp_path / "y.jsonl", [{"question": "Is 7 prime?", "answer": "Yes"}]),
               answer_spec="{choice:yes|no}")
    item = yn.load(None)[0]
    assert item.gold == "yes"
    assert parse_all("I think yes, it is.", yn, item, OutputFormat.REASON_ANSWER)["lenient"].value == "yes"


def test_text_kind_compares_casefolded_lines(tmp_path: Path) -> None:
    task = _task(_write(tmp_path / "t.jsonl", [{"question": "Capital of France?", "answer": "Paris"}]),
                 answer_spec="{str}")
    item = task.load(None)[0]
    assert task.score(item, task.normalize("  paris ")) and not task.score(item, task.normalize("Lyon"))


@pytest.mark.parametrize(("rows", "options", "message"), [
    ([{"question": "q", "answer": 1}], {}, "needs --answer-spec"),
    ([{"question": "q", "answer": 1}], {"answer_spec": "{int}", "answer_kind": "letters"}, "contradicts"),
    ([{"question": "q", "answer": 1}], {"answer_spec": "The answer: {int}"}, "one slot"),
    ([{"question": "q", "answer": 1}], {"answer_spec": "{int}", "colour": "red"}, "does not take colour"),
])
def test_bad_options_are_one_clear_error(tmp_path: Path, rows: list[dict[str, object]],
                                         options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _task(_write(tmp_path / "b.jsonl", rows), **options)


@pytest.mark.parametrize(("row", "message"), [
    ({"answer": 1}, "field 'question' must be non-empty text"),
    ({"question": "q"}, "field 'answer'"),
    ({"question": "q", "answer": "many"}, "not an answer of kind integer"),
    ({"question": "q", "answer": 1, "answer_spec": "{letters:3}"}, "not a slot of kind integer"),
])
def test_bad_rows_name_their_line(tmp_path: Path, row: dict[str, object], message: str) -> None:
    path = _write(tmp_path / "r.jsonl", [{"question": "ok", "answer": 1}, row])
    with pytest.raises(DataError, match=f"line 2: .*{message}"):
        _task(path, answer_spec="{int}").load(None)


def test_cli_run_report_verify_with_shots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = _write(tmp_path / "items.jsonl", [{"id": f"q{i}", "question": f"What is {i} + 1?", "answer": i + 1}
                                             for i in range(4)])
    shots = _write(tmp_path / "shots.jsonl", [{"id": "s1", "question": "What is 40 + 2?", "answer": 42,
                                              "solution": "40 + 2 = 42."}])
    out = tmp_path / "run"
    argv = ["run", "--task", f"jsonl:{items}", "--answer-spec", "{int:0..}", "--shots-file", str(shots),
            "--shots", "1", "--strategies", "free,constrained", "--backend", "fake", "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 8 and {r["task"] for r in records} == {"jsonl"}
    assert all("What is 40 + 2?" in r["prompt"] for r in records)
    assert all(r["parses"]["strict"]["status"] == "ok" for r in records if r["strategy"] == "constrained")
    assert main(argv) == 0  # resumes: nothing new
    printed = capsys.readouterr().out
    assert "0 requests run, 8 already recorded" in printed
    # issue 49: a results table when run ends, one line per strategy (constrained parses every answer)
    table = printed.split("8 already recorded")[1]
    assert "strategy" in table and "accuracy" in table and "intervals and paired tests: formtax report" in table
    line = next(x for x in table.splitlines() if x.startswith("constrained"))
    assert line.split()[1:5] == ["4", "0", "100%", "100%"]
    assert main(["report", str(out), "--replicates", "100"]) == 0 and main(["verify", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert str(items.resolve()) in manifest["data_files"]


def test_register_task_example_through_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's @register_task example, imported with --import and run by name."""
    (tmp_path / "my_tasks.py").write_text(textwrap.dedent('''
        from pathlib import Path
        from typing import ClassVar

        from formtax.tasks import Item, register_task
        from formtax.tasks.kinds import IntegerTask


        @register_task
        class Doubling(IntegerTask):
            """Double a number (items generated in code, no data files)."""

            name: ClassVar[str] = "doubling"
            description: ClassVar[str] = "double a number"
            instructions = ("Double the number.", "Multiply the number by two.", "Compute twice the number.")

            def _needs_data(self) -> bool:
                return False

            def data_files(self, data_dir: Path) -> list[Path]:
                return []

            def _load(self, data_dir: Path | None) -> list[Item]:
                return [Item(id=str(n), question=f"What is twice {n}?", gold=str(2 * n)) for n in range(1, 6)]
    '''), encoding="utf-8")
    import sys

    from formtax.tasks import catalog, registry

    monkeypatch.syspath_prepend(str(tmp_path))
    assert catalog.BUILTIN  # every built-in task registered before the registry is copied
    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))  # the test's task leaves with the test
    monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
    out = tmp_path / "run"
    assert main(["run", "--import", "my_tasks", "--task", "doubling", "--strategies", "constrained",
                 "--backend", "fake", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 5 and all(r["task"] == "doubling" for r in records)
    assert main(["run", "--import", "no_such_module_xyz", "--task", "doubling", "--strategies", "free",
                 "--backend", "fake", "--out", str(out)]) == 2
