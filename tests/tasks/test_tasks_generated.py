"""Generated tasks (arith, lastletter) and the IMDb alternative-word mapping."""

from __future__ import annotations

import sys

import pytest

from formtax.errors import ConfigError
from formtax.tasks import Item, get_task
from formtax.tasks.arith import ArithTask, generate
from formtax.tasks.lastletter import import_names_dataset, is_simple_name
from formtax.tasks.rng import StableRng


def test_stable_rng_is_fixed() -> None:
    # Pinned outputs: a change here silently changes every generated benchmark.
    rng = StableRng(0)
    assert [rng.next_u64() for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    assert [StableRng(7).randint(1, 6) for _ in range(3)] == [StableRng(7).randint(1, 6)] * 3
    assert sorted(StableRng(1).sample(range(10), 10)) == list(range(10))


def test_arith_is_deterministic_and_correct() -> None:
    items = get_task("arith").load(None)
    assert len(items) == 1000
    assert items == ArithTask().load(None)
    assert items != ArithTask(seed=1).load(None)
    assert len({item.question for item in items}) > 990
    op_counts = {len(item.meta["ops"]) for item in items}
    assert op_counts == {1, 2, 3}
    assert set("".join(item.meta["ops"] for item in items)) == set("+-*/")
    for item in items:
        assert int(item.gold) >= 0
        assert item.solution is not None
        # Re-evaluate the worked solution: each step "a op b = c." must be exact.
        for step in item.solution.split(". ")[1:]:
            lhs, rhs = step.rstrip(".").split(" = ")
            a, op, b = lhs.split(" ")
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}.get(
                op, int(a) // int(b)
            ) == int(rhs)
            if op == "/":
                assert int(a) % int(b) == 0
        assert item.solution.endswith(f"= {item.gold}.")


def test_arith_shots_come_from_a_separate_stream() -> None:
    task = get_task("arith")
    items = task.load(None)
    shots = task.shots(3, seed=0, exclude_ids=set())
    assert all(shot.id.startswith("shot-") for shot in shots)
    assert not {shot.question for shot in shots} & {item.question for item in items}
    assert shots == task.shots(3, seed=0, exclude_ids=set())
    assert generate(5, 3) == generate(5, 3)


@pytest.mark.parametrize(
    ("name", "simple"),
    [
        ("Homoh", True),
        ("Aniba", True),
        ("Juan Pablo", False),
        ("Mary-Ann", False),
        ("D'Angelo", False),
        ("José", False),
        ("A", False),
        ("McKenzie", False),
    ],
)
def test_compound_names_are_excluded(name: str, simple: bool) -> None:
    assert is_simple_name(name) is simple


def test_missing_names_dataset_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "names_dataset", None)
    with pytest.raises(ConfigError, match=r"pip install 'formtax\[lastletter\]'"):
        import_names_dataset()


def test_lastletter_generation() -> None:
    pytest.importorskip("names_dataset")
    from formtax.tasks.lastletter import name_pool

    pool = name_pool()
    assert pool == tuple(sorted(set(pool))) and len(pool) > 1000
    assert all(is_simple_name(name) for name in pool)
    for name, n in (("lastletter", 4), ("lastletter-ext", 8)):
        task = get_task(name)
        items = task.load(None)
        assert len(items) == 1000 and items == get_task(name).load(None)
        for item in items[:200]:
            names = item.meta["names"]
            assert len(names) == n == len(set(names)) == len(item.gold)
            assert item.gold == "".join(word[-1] for word in names).lower()
            assert (
                item.question
                == f'Take the last letters of each word in "{" ".join(names)}" and concatenate them.'
            )
            assert task.normalize(item.gold) == item.gold
        assert task.answer_slot("vc", items[0]) == f"{{letters:{n}}}"
        shots = task.shots(2, seed=0, exclude_ids=set())
        assert all(shot.id.startswith("shot-") and shot.solution for shot in shots)
    assert get_task("lastletter").load(None)[0].gold != get_task("lastletter-ext").load(None)[0].gold[:4]


def test_imdb_alt_maps_words_to_classes() -> None:
    task = get_task("imdb-alt")
    for word in ("bad", "Critical", "UNFAVORABLE", "disappointing", " Unsatisfactory "):
        assert task.normalize(word) == "negative"
    for word in ("Good", "favorable", "Impressive", "satisfying", "Enjoyable"):
        assert task.normalize(word) == "positive"
    assert task.normalize("positive") is None
    assert task.normalize("negative") is None
    assert task.normalize("great") is None
    item = Item(id="0", question="q", gold="positive")
    assert task.score(item, task.normalize("Enjoyable"))
    assert not task.score(item, task.normalize("Bad"))
    assert not task.score(item, None)
    assert task.display_answer(item) == "positive"  # shots show the label the (imdb) prompt asks for
    plain = get_task("imdb")
    assert plain.normalize("Positive") == "positive"
    assert plain.normalize("good") is None
