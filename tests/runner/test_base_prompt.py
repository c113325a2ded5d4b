"""Base-model prompting (paper 000's pre-trained setting): a plain ``Question: / Answer:`` few-shot prompt, the same
for every strategy, chosen for a model without a chat template and recorded in every record and the run identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formtax.backends.model_files import has_chat_template
from formtax.errors import ConfigError
from formtax.parsing import parse_all
from formtax.records import read_records
from formtax.report import verify_report, write_report
from formtax.runner import RunConfig, run
from formtax.runner.grid import parse_strategy_spec, plan_grid
from formtax.runner.run import resolve_prompt_style
from formtax.tasks import OutputFormat, PromptStyle, get_task


def cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(task="arith", strategies=["free", "constrained", "json"], backend="fake",
                                   limit=3, batch_size=2, shots=2, prompt_style="base")
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_the_base_prompt_is_question_answer_blocks_ending_in_a_bare_answer() -> None:
    task = get_task("arith")
    items = task.load(None)[:1]
    shots = task.shots(2, 0, {items[0].id})
    text = task.base_prompt(items[0], shots)
    blocks = text.split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == f"Question: {items[0].question}\nAnswer:"
    for shot, block in zip(shots, blocks[:2], strict=True):
        assert block.startswith(f"Question: {shot.question}\nAnswer: ")
        # each shot's answer is what the strict parser reads as its gold answer
        answer = block.split("\nAnswer: ", 1)[1]
        assert parse_all(answer, task, shot, OutputFormat.REASON_ANSWER)["strict"].value == shot.gold
    assert not text.endswith(" ")


def test_every_strategy_and_output_format_gets_the_same_base_prompt() -> None:
    task = get_task("arith")
    items = task.load(None)[:2]
    specs = [parse_strategy_spec(s) for s in ("free", "constrained", "json", "suffix-last")]
    planned = plan_grid(task, items, specs, [(1, 1)], [0], 2, style=PromptStyle.BASE)
    assert {p.output_format for p in planned} == {"reason-answer", "answer-only", "json"}
    for it in items:
        prompts = {p.messages for p in planned if p.item.id == it.id}
        assert len(prompts) == 1 and isinstance(next(iter(prompts)), str)
    chat = plan_grid(task, items, specs, [(1, 1)], [0], 2)
    assert all(isinstance(p.messages, list) and p.prompt_style is PromptStyle.CHAT for p in chat)


def test_the_style_resolves_from_the_model_before_it_loads(tmp_path: Path) -> None:
    gsm8k, metatool = get_task("gsm8k"), get_task("metatool")
    auto = dict(task="gsm8k", strategies=["free"], backend="hf")
    assert resolve_prompt_style(RunConfig(**auto, model="gemma3-270m"), gsm8k) is PromptStyle.BASE  # type: ignore[arg-type]
    assert resolve_prompt_style(RunConfig(**auto), gsm8k) is PromptStyle.CHAT  # type: ignore[arg-type]
    # a benchmark with its own prompt keeps it on a base model
    assert resolve_prompt_style(RunConfig(**auto, model="gemma3-270m"), metatool) is PromptStyle.CHAT  # type: ignore[arg-type]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}), encoding="utf-8")
    assert has_chat_template(str(tmp_path)) is False
    assert resolve_prompt_style(RunConfig(**auto, model=str(tmp_path)), gsm8k) is PromptStyle.BASE  # type: ignore[arg-type]
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    assert has_chat_template(str(tmp_path)) is True
    assert has_chat_template("some-org/some-hub-model") is None
    assert resolve_prompt_style(RunConfig(**{**auto, "backend": "fake"}, model="gemma3-270m"), gsm8k) is PromptStyle.CHAT  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "message"), [
    ({"prompt_style": "plain"}, "--prompt-style must be one of chat, base"),
    ({"prompt_variants": "t1f1,t2f1"}, "one variant"),
    ({"task": "metatool", "limit": None, "shots": 0}, "has its benchmark's own prompt"),
])
def test_bad_base_settings_are_refused_before_anything_runs(tmp_path: Path, kw: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run(cfg(**kw), tmp_path / "out")
    assert not (tmp_path / "out" / "records.jsonl").exists()


def test_a_base_run_records_its_style_and_prompt_and_refuses_a_chat_resume(tmp_path: Path) -> None:
    s = run(cfg(), tmp_path)
    assert (s.done, s.errors) == (9, 0)
    records = read_records(tmp_path / "records.jsonl")
    task = get_task("arith")
    items = {it.id: it for it in task.load(None)}
    by_item: dict[str, set[str]] = {}
    for r in records:
        assert r.prompt_style == "base" and r.shots == 2
        assert r.prompt.startswith("Question: ") and r.prompt.endswith(f"Question: {items[r.item_id].question}\nAnswer:")
        by_item.setdefault(r.item_id, set()).add(r.prompt)
    assert all(len(p) == 1 for p in by_item.values())  # byte-identical across the three strategies
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["config_identity"]["prompt_style"] == "base"
    assert run(cfg(), tmp_path).done == 0  # resumes
    with pytest.raises(ConfigError, match="differs in: prompt_style"):
        run(cfg(prompt_style="chat"), tmp_path)
    write_report(tmp_path, n_resamples=100)
    assert verify_report(tmp_path) == []


def test_a_chat_run_keeps_its_old_identity(tmp_path: Path) -> None:
    """Chat is the style every earlier run had: it is left out of the identity, so those runs still resume."""
    run(cfg(prompt_style=None, shots=0), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert "prompt_style" not in manifest["config_identity"]
    assert {r.prompt_style for r in read_records(tmp_path / "records.jsonl")} == {"chat"}
