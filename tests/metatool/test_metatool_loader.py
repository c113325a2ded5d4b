"""The metatool loader: the shipped files pass every check; tampered copies fail with a message naming the
problem;
the abstention file's tool field is refused as a gold label; pair sampling keeps both halves."""

from __future__ import annotations

import json

import pytest
from test_metatool_support import copy_metatool_data

from formtax.errors import ConfigError, DataError
from formtax.studies.abstention.data import (
    N_ROWS,
    PAIRS,
    SUBTASK3,
    check_item_gold,
    load_pairs,
    parse_item_id,
    sample_positions,
)
from formtax.studies.abstention.task import MetatoolTask
from formtax.tasks import Item, get_task


def test_shipped_files_pass_every_check(data_dir):
    _, pairs = load_pairs(data_dir)
    assert len(pairs) == N_ROWS
    raw = json.loads((data_dir / "metatool" / SUBTASK3).read_text())
    for p, row in zip(pairs, raw, strict=True):
        assert len(p.tool_candidates) == len(p.abstain_candidates) == 10
        assert p.tool_candidates[0][0] == p.tool_gold == p.source_tool
        assert p.source_tool not in [n for n, _ in p.abstain_candidates]
        assert p.query == row["query"]


def test_abstention_prompts_are_the_original_bytes(data_dir):
    task = MetatoolTask()
    task.configure({"pairs": 25})
    raw = json.loads((data_dir / "metatool" / SUBTASK3).read_text())
    for item in task.load(data_dir):
        key = parse_item_id(item.id)
        prompt = str(item.meta["prompt"])
        assert prompt.count(item.question) == 2  # the query twice, as in the release
        if key.kind == "abstain":
            assert prompt == raw[key.position]["action_prompt"]
            assert item.gold == "None"
        else:
            assert "Here are some examples" not in prompt and prompt.endswith(
                f'User query: "{item.question}" tool: '
            )
            assert item.gold == item.choices[0][0]


def test_pairs_are_sampled_with_both_halves_and_nest(data_dir):
    task = get_task("metatool")
    assert isinstance(task, MetatoolTask)
    task.configure({"pairs": 7})
    items = task.load(data_dir)
    keys = [parse_item_id(it.id) for it in items]
    positions = sorted({k.position for k in keys})
    assert len(items) == 14 and positions == sample_positions(N_ROWS, 7, 0)
    assert sorted((k.position, k.kind) for k in keys) == sorted(
        (p, kd) for p in positions for kd in ("tool", "abstain")
    )
    assert set(sample_positions(N_ROWS, 3, 0)) <= set(positions)  # a larger sample extends a smaller one
    assert sample_positions(N_ROWS, 7, 1) != positions  # the seed matters
    assert len(set(sample_positions(N_ROWS, 200, 0))) == 200  # without replacement


def test_default_is_200_pairs_and_bad_options_are_refused(data_dir):
    task = MetatoolTask()
    task.configure({})
    assert len(task.load(data_dir)) == 400
    with pytest.raises(ConfigError, match="between 1 and 995"):
        MetatoolTask().configure({"pairs": 996})
    with pytest.raises(ConfigError, match="unknown task options"):
        MetatoolTask().configure({"pair": 3})
    with pytest.raises(ConfigError, match="integer"):
        MetatoolTask().configure({"pairs": "3"})


def test_tool_field_is_never_a_gold_label(data_dir):
    task = MetatoolTask()
    task.configure({"pairs": 1})
    _, abstain = task.load(data_dir)
    check_item_gold(abstain)  # the shipped item passes
    wrong = Item(
        id=abstain.id,
        question=abstain.question,
        gold=str(abstain.meta["source_tool"]),
        choices=abstain.choices,
        meta=abstain.meta,
    )
    with pytest.raises(DataError, match="'tool' field.*REMOVED"):
        check_item_gold(wrong)
    other = Item(
        id=abstain.id,
        question=abstain.question,
        gold=abstain.choices[0][0],
        choices=abstain.choices,
        meta=abstain.meta,
    )
    with pytest.raises(DataError, match="must be 'None'"):
        check_item_gold(other)


# -- tampered copies -----------------------------------------------------------------------------------------


def _rewrite_pairs(root, edit):
    path = root / "metatool" / PAIRS
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows = edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rewrite_s3(root, edit):
    path = root / "metatool" / SUBTASK3
    rows = json.loads(path.read_text())
    path.write_text(json.dumps(edit(rows)))


def _set(rows, i, key, value):
    rows[i][key] = value
    return rows


def _swap_gold(rows):
    c = rows[3]["subtask1_candidates"]
    c[0], c[1] = c[1], c[0]
    return rows


def _alter_prompt(rows):
    rows[5]["action_prompt"] = rows[5]["action_prompt"].replace("tool: None", "tool: Zapier", 1)
    return rows


TAMPERS = {
    "missing pairs file": (lambda r: (r / "metatool" / PAIRS).unlink(), r"task2_pairs.jsonl: file not found"),
    "missing template": (
        lambda r: (r / "metatool" / "prompt_template" / "Action_prompt_single_tool").unlink(),
        "file not found; expected the single-tool prompt template",
    ),
    "a pairs row dropped": (
        lambda r: _rewrite_pairs(r, lambda rows: rows[:-1]),
        "expected 995 rows, got 994",
    ),
    "an abstention row dropped": (
        lambda r: _rewrite_s3(r, lambda rows: rows[1:]),
        "expected a JSON array of 995",
    ),
    "nine candidates": (
        lambda r: _rewrite_pairs(
            r, lambda rows: _set(rows, 2, "subtask1_candidates", rows[2]["subtask1_candidates"][:9])
        ),
        "must list 10 tool names, got 9",
    ),
    "gold not first": (lambda r: _rewrite_pairs(r, _swap_gold), "is not the first of 'subtask1_candidates'"),
    "query differs": (
        lambda r: _rewrite_pairs(r, lambda rows: _set(rows, 4, "query", "something else")),
        "row 4: the query differs",
    ),
    "few-shot line altered": (
        lambda r: _rewrite_s3(r, _alter_prompt),
        "row 5: the prompt rebuilt from the template.*differs from 'action_prompt'",
    ),
    "removed tool offered": (
        lambda r: _rewrite_pairs(
            r,
            lambda rows: _set(
                rows,
                6,
                "subtask3_candidates",
                [rows[6]["query_source_tool"], *rows[6]["subtask3_candidates"][1:]],
            ),
        ),
        "removed tool .* is among the candidates",
    ),
    "unknown tool": (
        lambda r: _rewrite_pairs(
            r,
            lambda rows: _set(
                rows, 7, "subtask3_candidates", ["NoSuchTool", *rows[7]["subtask3_candidates"][1:]]
            ),
        ),
        r"\['NoSuchTool'\] are not tools",
    ),
    "not JSON": (lambda r: (r / "metatool" / SUBTASK3).write_text("[{"), "cannot read"),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_tampered_copy_fails_with_a_clear_message(name, data_dir, tmp_path):
    root = copy_metatool_data(data_dir, tmp_path)
    tamper, message = TAMPERS[name]
    load_pairs(root)  # the untouched copy loads
    tamper(root)
    with pytest.raises(DataError, match=message):
        load_pairs(root)
