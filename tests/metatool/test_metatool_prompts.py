"""One prompt for the three conditions (checked, and refused when it differs); the second language replaces
only
the query, both occurrences, and every other byte is asserted unchanged; the first-token masked mass."""

from __future__ import annotations

import json

import pytest
import torch

from formtax.backends.fake import FakeBackend
from formtax.errors import ConfigError, DataError
from formtax.runner.grid import check_prompt_identity, parse_strategy_spec, plan_grid
from formtax.strategies.firstmass import allowed_first_tokens, first_token_mass
from formtax.studies.abstention.data import (
    N_ROWS,
    Template,
    build_prompt,
    parse_item_id,
    read_exclusions,
    read_translations,
    sample_positions,
    translate_prompt,
)
from formtax.studies.abstention.task import MetatoolTask
from formtax.tasks import OutputFormat

SPECS = [parse_strategy_spec(s) for s in ("free", "short", "constrained")]


def _task(data_dir, **options):
    task = MetatoolTask()
    task.configure({"pairs": 3, **options})
    return task, task.load(data_dir)


def test_three_conditions_get_byte_identical_prompts(data_dir):
    task, items = _task(data_dir)
    planned = plan_grid(task, items, SPECS, [(1, 1)], [0, 1], 0)
    assert {p.output_format for p in planned} == {"reason-answer", "answer-only"}  # free differs in format...
    render = FakeBackend().tokenizer.chat_prompt
    check_prompt_identity(planned, render, across_formats=True)  # ...but not in prompt
    by_item: dict[str, set[str]] = {}
    for p in planned:
        by_item.setdefault(p.item.id, set()).add(render(p.messages))
    assert all(len(v) == 1 for v in by_item.values())
    assert {p.answer for p in planned if p.item.id == items[1].id} == {
        "choice:" + "|".join([n for n, _ in items[1].choices] + ["None"])
    }


def test_a_differing_prompt_is_refused(data_dir):
    task, items = _task(data_dir)
    planned = plan_grid(task, items, SPECS, [(1, 1)], [0], 0)
    doctored = next(p for p in planned if p.spec.name == "free")
    doctored.messages = [{"role": "user", "content": doctored.messages[0]["content"] + " "}]
    # free is the only strategy with its output format, so the per-format check alone cannot see this
    check_prompt_identity(planned, repr)
    with pytest.raises(ConfigError, match="must share one prompt"):
        check_prompt_identity(planned, repr, across_formats=True)


def test_other_prompt_variants_and_shots_are_refused(data_dir):
    task, items = _task(data_dir)
    with pytest.raises(ConfigError, match="one prompt"):
        task.messages(items[0], OutputFormat.ANSWER_ONLY, 2, 1, [])
    with pytest.raises(ConfigError, match="no formtax shots"):
        task.shots(2, 0, set())


def _translations(tmp_path, positions, language="ko", text=lambda p: f"번역된 질문 {p}번"):
    path = tmp_path / "tr.json"
    path.write_text(
        json.dumps(
            {"language": language, "queries": {str(p): text(p) for p in positions}}, ensure_ascii=False
        )
    )
    return path


def test_translation_replaces_both_query_occurrences_and_nothing_else(data_dir, tmp_path):
    positions = sample_positions(N_ROWS, 3, 0)
    task, items = _task(data_dir, translations=str(_translations(tmp_path, positions + [1])))
    by_id = {it.id: it for it in items}
    assert len(items) == 12
    for it in items:
        key = parse_item_id(it.id)
        if key.language == "en":
            continue
        english = by_id[f"{key.position:03d}-{key.kind}"]
        prompt, original = str(it.meta["prompt"]), str(english.meta["prompt"])
        assert prompt.count(it.question) == 2 and english.question not in prompt
        assert prompt.split(it.question) == original.split(english.question)  # every other byte unchanged
        assert it.choices == english.choices and it.gold == english.gold


def test_a_translation_may_exclude_positions_with_a_reason(data_dir, tmp_path):
    positions = sample_positions(N_ROWS, 3, 0)
    path = tmp_path / "ex.json"
    path.write_text(json.dumps({"language": "ko", "queries": {str(p): f"질문 {p}" for p in positions[:2]},
                                "excluded": {str(positions[2]): "idiom without a Korean equivalent"}},
                               ensure_ascii=False))
    assert read_exclusions(path) == {positions[2]: "idiom without a Korean equivalent"}
    task, items = _task(data_dir, translations=str(path))
    assert len(items) == 6 + 4  # every pair in English, two in Korean
    assert {parse_item_id(it.id).position for it in items if parse_item_id(it.id).language == "ko"} == set(
        positions[:2])
    assert task.notes() == {"translation_exclusions": {f"{positions[2]:03d}": "idiom without a Korean equivalent"}}
    for content, message in [
        ({"language": "ko", "queries": {"1": "x"}, "excluded": {"1": "why"}}, "both translated and excluded"),
        ({"language": "ko", "queries": {"1": "x"}, "excluded": {"2": " "}}, "needs a reason"),
        ({"language": "ko", "queries": {"1": "x"}, "excluded": ["2"]}, "'excluded' must be an object"),
    ]:
        bad = tmp_path / "bad-ex.json"
        bad.write_text(json.dumps(content))
        with pytest.raises(DataError, match=message):
            read_exclusions(bad)


def test_a_bare_mapping_is_a_translations_file_too(tmp_path):
    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"12": "q"}))
    assert read_translations(path) == ("l2", {12: "q"})


def test_translate_prompt_refuses_any_other_change():
    template = Template('"Query:\n', "\nTools:\n", "end")
    tools = [("A", "a tool"), ("B", "b tool")]
    en = build_prompt(template, "find a cafe", tools, [("q1", "A")])
    ok = build_prompt(template, "카페 찾기", tools, [("q1", "A")])
    assert translate_prompt(en, "find a cafe", "카페 찾기", ok) == ok
    changed = build_prompt(template, "카페 찾기", [("A", "a tool"), ("B", "b  tool")], [("q1", "A")])
    with pytest.raises(DataError, match="differs from the original outside the query"):
        translate_prompt(en, "find a cafe", "카페 찾기", changed)
    with pytest.raises(DataError, match="occurs 1 times"):
        translate_prompt(en.replace("find a cafe", "x", 1), "find a cafe", "y", ok)


def test_translation_file_problems_are_named(data_dir, tmp_path):
    positions = sample_positions(N_ROWS, 3, 0)
    task = MetatoolTask()
    task.configure({"pairs": 3, "translations": str(_translations(tmp_path, positions[:2]))})
    with pytest.raises(ConfigError, match="no translation for 1 sampled positions"):
        task.load(data_dir)
    bad = tmp_path / "bad.json"
    for content, message in [
        ({"language": "en", "queries": {"1": "x"}}, "other than 'en'"),
        ({"queries": {"1000": "x"}}, "not a position"),
        ({"queries": {"1": "two\nlines"}}, "one non-empty line"),
    ]:
        bad.write_text(json.dumps(content))
        with pytest.raises(DataError, match=message):
            read_translations(bad)


# -- first-token masked mass ---------------------------------------------------------------------------------


def test_allowed_first_tokens_are_prefixes_of_bare_and_spaced_spellings():
    tok = FakeBackend().tokenizer  # one token per byte
    allowed = allowed_first_tokens(tok, ["Zapier", "None"])
    assert sorted(int(i) for i in torch.nonzero(allowed)) == sorted([ord("Z"), ord("N"), ord(" ")])


def test_first_token_mass_exact_and_topk_bound():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.0, -1.0])
    allowed = torch.tensor([False, True, False, True, False, False])
    got = first_token_mass(logits, allowed, k=3)
    p = torch.softmax(logits.double(), -1)
    assert got["masked_mass"] == pytest.approx(float(1 - p[1] - p[3]))
    assert got["masked_mass_topk"] == pytest.approx(float(p[0] + p[2]))  # forbidden among the top 3
    assert got["topk_coverage"] == pytest.approx(float(p[0] + p[1] + p[2]))
    lb, cov = got["masked_mass_topk"], got["topk_coverage"]
    assert lb <= got["masked_mass"] <= lb + 1 - cov + 1e-12
    assert got["n_allowed"] == 2 and got["k"] == 3
