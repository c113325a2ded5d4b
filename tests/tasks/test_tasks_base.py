"""Core task helpers: sampling, data-folder resolution, normalisers, answer slots and the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formtax.errors import ConfigError, DataError
from formtax.tasks import Item, Task, get_task, list_tasks, register_task, resolve_data_dir, sample_items
from formtax.tasks.kinds import normalize_integer, normalize_letters
from formtax.tasks.svamp import SvampTask

ALL_TASKS = [
    "aime",
    "arc-challenge",
    "arc-easy",
    "arith",
    "csqa",
    "eae-ace05",
    "eae-geneva",
    "eae-wikievents",
    "gsm8k",
    "imdb",
    "imdb-alt",
    "jsonl",
    "lastletter",
    "lastletter-ext",
    "metatool",
    "planted",
    "summeval",
    "svamp",
]


def _items(n: int) -> list[Item]:
    return [Item(id=str(i), question=f"q{i}", gold=str(i)) for i in range(n)]


def test_sample_items_is_a_stable_seeded_permutation() -> None:
    items = _items(50)
    first = sample_items(items, 10, seed=3)
    assert first == sample_items(items, 10, seed=3)
    assert [item.id for item in first] != [str(i) for i in range(10)]
    assert sample_items(items, 20, seed=3)[:10] == first
    assert sample_items(items, 10, seed=4) != first
    assert len({item.id for item in sample_items(items, 50, seed=3)}) == 50
    assert len(sample_items(items, 500, seed=3)) == 50


def test_sample_items_without_limit_keeps_order() -> None:
    items = _items(7)
    assert sample_items(items, None, seed=123) == items
    with pytest.raises(ConfigError):
        sample_items(items, -1, seed=0)


def test_items_are_hashable_despite_meta() -> None:
    item = Item(id="1", question="q", gold="a", meta={"k": [1]})
    assert hash(item) == hash(Item(id="1", question="q", gold="a", meta={"k": [2]}))
    assert {item: 1}[item] == 1


def test_resolve_data_dir_explicit_env_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORMTAX_DATA", raising=False)
    assert resolve_data_dir(tmp_path) == tmp_path.resolve()
    with pytest.raises(DataError, match="nope"):
        resolve_data_dir(tmp_path / "nope")
    monkeypatch.setenv("FORMTAX_DATA", str(tmp_path / "missing-env"))
    with pytest.raises(DataError, match="missing-env"):
        resolve_data_dir(None)
    monkeypatch.setenv("FORMTAX_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path.resolve()
    monkeypatch.delenv("FORMTAX_DATA")
    import formtax.tasks.base as base

    checkout = tmp_path / "checkout" / "formtax"
    (checkout.parent / "shared" / "data").mkdir(parents=True)
    checkout.mkdir()
    monkeypatch.setattr(base, "project_root", lambda: checkout)
    assert resolve_data_dir(None) == (checkout.parent / "shared" / "data").resolve()  # beside the checkout first
    monkeypatch.setattr(base, "project_root", lambda: None)  # an installed wheel: the current directory's
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(DataError) as info:
        resolve_data_dir(None)
    assert str(tmp_path / "shared" / "data") in str(info.value)
    assert str(work / "shared" / "data") in str(info.value)
    (work / "shared" / "data").mkdir(parents=True)
    assert resolve_data_dir(None) == (work / "shared" / "data").resolve()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert resolve_data_dir(None) == (tmp_path / "shared" / "data").resolve()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("18", "18"),
        (" 1,450,000 ", "1450000"),
        ("$18.00", "18"),
        ("18.0", "18"),
        ("-3", "-3"),
        ("\u22123", "-3"),
        ("+7", "7"),
        ("007", "7"),
        ("18.5", None),
        ("twelve", None),
        ("18 dollars", None),
        ("", None),
    ],
)
def test_normalize_integer(raw: str, expected: str | None) -> None:
    assert normalize_integer(raw) == expected


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_normalize_integer_accepts_formatted_numbers(n: int) -> None:
    assert normalize_integer(f"{n:,}") == str(n)
    assert normalize_integer(f"{n}.00") == str(n)
    if n >= 0:
        assert normalize_integer(f"${n:,}") == str(n)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("hene", "hene"),
        ("H E N E", "hene"),
        ('"Hene".', "hene"),
        ("h-e-n-e", "hene"),
        ("he1e", None),
        ("", None),
    ],
)
def test_normalize_letters(raw: str, expected: str | None) -> None:
    assert normalize_letters(raw) == expected


def test_choice_normalize_is_exact_label_match() -> None:
    task = get_task("csqa")
    assert task.normalize("b") == "B"
    assert task.normalize(" C ") == "C"
    assert task.normalize("(B)") is None
    assert task.normalize("F") is None
    assert task.normalize("bank") is None


def test_answer_slots() -> None:
    item = Item(id="0", question="q", gold="1")
    assert {get_task(name).answer_slot("fc", item) for name in ALL_TASKS} == {"{str}"}
    assert get_task("gsm8k").answer_slot("vc", item) == "{int:0..}"
    assert get_task("svamp").answer_slot("vc", item) == "{int:0..}"
    assert get_task("arith").answer_slot("vc", item) == "{int:0..}"
    assert get_task("aime").answer_slot("vc", item) == "{int:0..999}"
    assert get_task("lastletter").answer_slot("vc", item) == "{letters:4}"
    assert get_task("lastletter-ext").answer_slot("vc", item) == "{letters:8}"
    three = Item(id="0", question="q", gold="A", choices=(("A", "x"), ("B", "y"), ("C", "z")))
    assert get_task("arc-easy").answer_slot("vc", three) == "{choice:A|B|C}"
    assert get_task("imdb").answer_slot("vc", item) == "{choice:positive|negative}"
    with pytest.raises(ConfigError):
        get_task("gsm8k").answer_slot("rc", item)  # type: ignore[arg-type]


def test_registry_lists_and_rejects_unknown_names() -> None:
    assert list_tasks() == ALL_TASKS
    with pytest.raises(ConfigError) as info:
        get_task("gsm9k")
    assert "gsm9k" in str(info.value)
    for name in ALL_TASKS:
        assert name in str(info.value)
    assert get_task("gsm8k") is not get_task("gsm8k")
    assert all(get_task(name).description for name in ALL_TASKS)


def test_registry_rejects_a_second_class_with_the_same_name() -> None:
    with pytest.raises(ConfigError, match="registered twice"):

        @register_task
        class Dup(SvampTask):
            pass

    assert isinstance(get_task("svamp"), Task)
