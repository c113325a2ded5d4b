"""Paper 003's answer forms and IMDb condition: the one-field JSON answer of InWriting and NL-to-Format (A.2,
Table 2), NL-to-Format's own first prompt, and Table 4 (the label prompt decoded to the alternative words)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.compile import compile_grammar
from formtax.constraints.jsonreason import JsonAnswerObject
from formtax.constraints.jsontail import trailing_json_object
from formtax.constraints.parse import parse_spec
from formtax.errors import ConfigError
from formtax.parsing.strict import parse_strict
from formtax.records.store import read_records
from formtax.report import write_report
from formtax.report.combine import write_pooled
from formtax.report.verify import verify_report
from formtax.runner.config import RunConfig
from formtax.runner.grid import AnswerForm, parse_strategy_spec
from formtax.runner.run import run
from formtax.tasks import Item, OutputFormat, get_task

TOK = FakeBackend(random_logits(seed=1)).tokenizer


def _engine_accepts(c, text: str) -> bool:
    m = compile_grammar(c.grammar, TOK.engine).matcher(TOK.n_logits)
    return all(m.consume(t) for t in TOK.encode(text)) and m.error is None and m.accepting


@settings(max_examples=150, deadline=None)
@given(value=st.one_of(st.integers(-5, 120), st.text(alphabet="abcz Q", max_size=6)),
       indent=st.sampled_from([None, 1]), seps=st.sampled_from([(", ", ": "), (",", ":")]))
def test_the_answer_object_engine_agrees_with_its_oracle(value, indent, seps):
    for spec in ("answer-json:{int:0..99}", "answer-json:{letters:4}", "answer-json:{str}",
                 "answer-json:number-or:{str}"):
        c = parse_spec(spec)
        text = json.dumps({"answer": value}, indent=indent, separators=seps)
        engine, oracle = _engine_accepts(c, text), c.validate(text)
        assert engine == oracle.ok, (spec, text)
        if oracle.ok:
            assert oracle.value == value  # the oracle extracts the answer itself


@pytest.mark.parametrize("fmt", [OutputFormat.ANSWER_JSON, OutputFormat.REASON_JSON, OutputFormat.JSON])
def test_fc_admits_the_number_an_integer_prompt_shows_unquoted(fmt):
    """Issue 37, point 3 (paper 003's Assumption 1): the JSON prompts of an integer task show
    ``{"answer": <answer>}`` unquoted, so FC must admit ``28`` as well as ``"28"``; VC admits only the integer;
    a task whose prompt quotes its answer keeps FC a string."""
    from formtax.constraints.jsonreason import JsonReasonAnswer

    task, item = get_task("arith"), Item(id="1", question="q", gold="28")
    assert '{"answer": <answer>}' in task.messages(item, OutputFormat.ANSWER_JSON, 1, 1, [])[-1]["content"]

    def accepts(level: str, answer: object) -> tuple[bool, bool]:
        c = parse_spec(task.answer_spec(level, item, fmt))
        if fmt is OutputFormat.JSON:
            c = JsonReasonAnswer(c, reason_tokens=8)
            text = json.dumps({"reason": "r", "answer": answer})
        else:
            text = json.dumps({"answer": answer})
        return _engine_accepts(c, text), c.validate(text).ok

    assert accepts("fc", 28) == (True, True)
    assert accepts("fc", "28") == (True, True)
    assert accepts("fc", "H E N E") == (True, True)  # FC is the format only
    assert accepts("vc", 28) == (True, True)
    assert accepts("vc", "28") == (False, False)
    letters = get_task("lastletter")
    assert "number-or" not in letters.answer_spec("fc", Item(id="1", question="q", gold="hene"), fmt)


def test_the_answer_object_is_found_at_the_end_of_free_text():
    c = parse_spec("answer-json:{int:0..99}")
    assert isinstance(c, JsonAnswerObject) and c.max_tokens is not None
    assert c.search('I add {"x": 1} to 2.\n{"answer": 28}\n').value == 28
    assert not c.search('{"answer": 28} and some more text').ok
    assert trailing_json_object('a {"answer": {"inner": 1}}') == '{"answer": {"inner": 1}}'
    assert trailing_json_object("no object") is None


@pytest.mark.parametrize(("text", "fmt", "want"), [
    ('Reasoning: 4 * 7.\n{"answer": 28}', OutputFormat.REASON_JSON, ("ok", "28")),
    ('{"answer": 28}', OutputFormat.ANSWER_JSON, ("ok", "28")),
    ('Reasoning.\n{"answer": 28}', OutputFormat.ANSWER_JSON, ("no_answer", None)),
    ('{"answer": 28} done', OutputFormat.REASON_JSON, ("no_answer", None)),
    ('{"answer": 28, "why": "x"}', OutputFormat.REASON_JSON, ("no_answer", None)),
    ('{"answer": "28.00"}', OutputFormat.REASON_JSON, ("invalid", None)),  # canonical only, as the JSON strategy
    ("The answer is: 28", OutputFormat.REASON_JSON, ("no_answer", None)),
])
def test_the_strict_parser_reads_the_json_answer_form(text, fmt, want):
    task = get_task("arith")
    r = parse_strict(text, task, Item(id="1", question="q", gold="28"), fmt)
    assert (r.status, r.value) == want


def test_the_json_form_spec():
    s = parse_strategy_spec("inwriting@vc:json+rc")
    assert (s.name, s.level, s.rc, s.json_answer, s.family) == ("inwriting", "vc", True, True, "inwriting:json")
    assert s.output_format(get_task("lastletter")) is OutputFormat.REASON_JSON
    for bad in ("json@vc:json", "free:json", "constrained:json", "inwriting:keyphrase", "json:plain", "decog:plain"):
        with pytest.raises(ConfigError, match="answer form"):
            parse_strategy_spec(bad)
    plain = parse_strategy_spec("nl2format@none:plain")
    assert (plain.name, plain.level, plain.json_answer, plain.family) == ("nl2format", "none", False, "nl2format")
    key = parse_strategy_spec("constrained@fc+rc").with_form(AnswerForm.KEYPHRASE)
    assert key.spec == "constrained@fc:keyphrase+rc" and parse_strategy_spec(key.spec) == key
    assert key.output_format(get_task("gsm8k")) is OutputFormat.REASON_KEYPHRASE


def test_the_key_phrase_form_needs_a_task_with_one(tmp_path):
    with pytest.raises(ConfigError, match="no key-phrase format"):
        run(RunConfig(task="arith", strategies=["free:keyphrase"], backend="fake", limit=1), tmp_path / "k")


def test_the_paper_plan_compares_the_explicit_plain_form_with_the_json_one(tmp_path):
    """--prompt-variants paper: the JSON form by default, its Table 2 twin written :plain; the answer-form table
    pairs them and verify accepts the rewritten specs."""
    out = tmp_path / "p"
    run(RunConfig(task="lastletter", strategies=["nl2format@vc", "nl2format@vc:plain"], backend="fake", limit=3,
                  max_tokens=96, prompt_variants="paper"), out)
    assert {r.strategy for r in read_records(out / "records.jsonl")} == {"nl2format@vc:json", "nl2format@vc:plain"}
    write_report(out, n_resamples=100)
    assert verify_report(out) == []
    table = (out / "tables" / "answer_forms.csv").read_text().splitlines()
    assert len(table) == 2 and "nl2format@vc:plain" in table[1]


def test_a_grid_with_both_answer_forms_runs_reports_and_verifies(tmp_path):
    strategies = ["inwriting@none", "inwriting@vc", "inwriting@none:json", "inwriting@vc:json",
                  "nl2format@none", "nl2format@vc", "nl2format@vc:json"]
    out = tmp_path / "r"
    run(RunConfig(task="lastletter", strategies=strategies, backend="fake", limit=4, max_tokens=96), out)
    recs = read_records(out / "records.jsonl")
    by = {r.strategy: r for r in recs if r.item_id == recs[0].item_id}
    assert by["inwriting@vc:json"].output_format == "reason-json"
    assert by["inwriting@vc:json"].answer_spec == "answer-json:{letters:4}"
    assert '{"answer": "<answer>"}' in by["inwriting@vc:json"].prompt
    assert by["inwriting@vc:json"].parses["strict"].status == "ok"  # the constrained object always parses
    # the levels and forms of one strategy reason under one budget (paper 003's equal max_preamble_tokens)
    assert len({r.budget["reasoning_tokens"] for r in recs if r.base_strategy.startswith("inwriting")}) == 1
    # NL-to-Format: one first call for both forms, the answer format only in the second call's prompt
    assert by["nl2format@vc"].prompt == by["nl2format@vc:json"].prompt
    assert by["nl2format@vc"].reasoning == by["nl2format@vc:json"].reasoning
    write_report(out, n_resamples=200)
    assert verify_report(out) == []
    table = (out / "tables" / "answer_forms.csv").read_text().splitlines()
    assert len(table) == 1 + 3  # inwriting none / vc and nl2format vc have both forms
    decomposition = (out / "tables" / "decomposition.csv").read_text()
    assert "inwriting:json" in decomposition  # each form is its own decomposition row


def test_the_json_form_needs_the_generic_prompts(tmp_path):
    with pytest.raises(ConfigError, match="own answer format"):
        run(RunConfig(task="eae-wikievents", strategies=["inwriting@vc:json"], backend="fake", limit=1),
            tmp_path / "m")
    with pytest.raises(ConfigError, match="base-model prompt"):
        run(RunConfig(task="arith", strategies=["inwriting@vc:json"], backend="fake", limit=1,
                      prompt_style="base"), tmp_path / "b")


def test_imdb_alternatives_keep_the_label_prompt_and_table_4_compares_them(tmp_path):
    for task in ("imdb", "imdb-alt"):
        run(RunConfig(task=task, strategies=["constrained@none", "constrained"], backend="fake", limit=5,
                      max_tokens=48), tmp_path / task)
    label, words = (read_records(tmp_path / t / "records.jsonl") for t in ("imdb", "imdb-alt"))
    assert [r.prompt for r in label] == [r.prompt for r in words]  # only the decoding differs
    assert {r.answer_spec for r in words if r.level == "vc"} == {
        "The answer is: {choice:bad|critical|unfavorable|disappointing|unsatisfactory|good|favorable|impressive|"
        "satisfying|enjoyable}"}
    both = tmp_path / "both"
    write_report(write_pooled([tmp_path / "imdb", tmp_path / "imdb-alt"], both), n_resamples=200)
    assert verify_report(both) == []
    rows = (both / "tables" / "imdb_alternatives.csv").read_text().splitlines()
    head = rows[0].split(",")
    row = dict(zip(head, rows[1].split(","), strict=False))
    assert row["strategy"] == "constrained" and row["strategy_unconstrained"] == "constrained@none"
    acc = {r.item_id: r.scores["strict"] for r in words if r.level == "vc"}
    assert float(row["acc_alternative"]) == pytest.approx(sum(acc.values()) / len(acc))
