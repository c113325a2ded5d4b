"""EAE tasks: loaders on the shipped files (counts from SOURCE.md), the ACE05 loader on a hand-written fixture,
the answer constraints (VC admits exactly the passage's spans), prompts and the strict / lenient readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formtax.constraints import parse_spec
from formtax.constraints.compile import validate_with_engine
from formtax.errors import DataError
from formtax.studies.eae.data import ACE05_ROLES, align_tokens, geneva_roles, read_oneie, read_per_mention
from formtax.studies.eae.scoring import decode_gold, decode_prediction
from formtax.studies.eae.task import EaeTask, eae_recall_ceiling, passage_spans, role_phrase, role_phrases
from formtax.tasks import OutputFormat, get_task, resolve_data_dir

DATA = resolve_data_dir(None)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ace05_oneie_sample.json"


def whole_file(name):
    """Every mention of the test file: the evaluated items and the held-out dev split."""
    task = get_task(name)
    return task.load(DATA) + task._cached_shot_pool()


@pytest.fixture(scope="module")
def wiki():
    return whole_file("eae-wikievents")


@pytest.fixture(scope="module")
def geneva():
    return whole_file("eae-geneva")


@pytest.mark.parametrize(("name", "n_eval", "n_dev"), [("eae-wikievents", 290, 74), ("eae-geneva", 1452, 441)])
def test_the_dev_split_holds_out_whole_documents_for_shots_and_the_fem(name, n_eval, n_dev) -> None:
    """The FEM is distilled from the dev split's passages, never from the evaluated ones (paper 001's EAE FEM
    is built apart from the evaluation items, as GSM8K's comes from its train split)."""
    from formtax.runner import distill

    task = get_task(name)
    evaluated, dev = task.load(DATA), task._cached_shot_pool()
    assert (len(evaluated), len(dev)) == (n_eval, n_dev)
    docs = {EaeTask.mention(it).doc_id for it in evaluated}
    assert docs.isdisjoint({EaeTask.mention(it).doc_id for it in dev})
    assert [it.id for it in get_task(name).load(DATA)] == [it.id for it in evaluated]  # stable
    chosen = distill._training_items(task, 8, 0)
    assert {it.id for it in chosen} <= {it.id for it in dev}
    assert task.shots(2, 0, {it.id for it in evaluated})[0].id in {it.id for it in dev}
    assert "dev documents" in task.notes()["split"]


def n_args(items):
    return sum(len(decode_gold(it.gold)[0]) for it in items)


def test_wikievents_counts_match_source_md(wiki) -> None:
    # SOURCE.md: 365 mentions, 566 arguments; 1 mention (3 args) has a type missing from the ontology: skipped.
    assert len(wiki) == 364 and n_args(wiki) == 563
    rows = [json.loads(line) for line in (DATA / "eae/wikievents/test.per_mention.jsonl").open()]
    by_id = {r["id"]: r for r in rows}
    skipped = [r["id"] for r in rows if r["id"] not in {it.id for it in wiki}]
    assert len(skipped) == 1 and by_id[skipped[0]]["kairos_template"] is None
    for it in wiki:
        m = EaeTask.mention(it)
        assert list(m.roles) == by_id[it.id]["roles"]  # the ontology file's role list, as derived
        assert m.passage == by_id[it.id]["sentence"] and m.passage_source == "sentence"
        for a in m.args:  # surface text of the aligned tokens == the annotated text (WikiEvents: exact)
            assert a.text in [g["text"] for g in by_id[it.id]["arguments"]
                              if (g["start"], g["end"], g["role"]) == (a.start, a.end, a.role)]
    outside = [a for it in wiki for a in EaeTask.mention(it).args if a.start is None]
    assert len(outside) == 3
    assert eae_recall_ceiling(wiki) == pytest.approx(560 / 563)


def test_geneva_counts_and_the_oneie_reader_agree(geneva) -> None:
    # SOURCE.md: 1,893 mentions, 3,109 arguments, 115 event types, all in the ontology.
    assert len(geneva) == 1893 and n_args(geneva) == 3109
    assert len({EaeTask.mention(it).event_type for it in geneva}) == 115
    # GENEVA's original test.json is in the OneIE layout (the ACE05 loader's): it gives the same mentions.
    roles = geneva_roles("t", DATA / "eae/geneva/event_ontology.json")
    oneie = {m.id: m for m in read_oneie("t", DATA / "eae/geneva/test.json", roles)}
    assert len(oneie) == 1893
    for it in geneva:
        m = EaeTask.mention(it)
        o = oneie[m.id]
        assert (o.passage, o.roles, o.trigger) == (m.passage, m.roles, m.trigger)
        assert sorted((a.role, a.start, a.end) for a in o.args) == sorted((a.role, a.start, a.end) for a in m.args)
    # 821 of 3,109 gold arguments are longer than five tokens: out of reach of the 1-5 token slot.
    assert eae_recall_ceiling(geneva) == pytest.approx((3109 - 821) / 3109)


def test_ace05_loader_on_the_fixture(monkeypatch) -> None:
    mentions = read_oneie("eae-ace05", FIXTURE, ACE05_ROLES, extend_roles=True)
    assert [m.id for m in mentions] == ["FIXTURE_DOC_1-EV1", "FIXTURE_DOC_2-EV1", "FIXTURE_DOC_2-EV2",
                                        "FIXTURE_DOC_3-EV1"]
    attack = mentions[0]
    assert attack.roles == ACE05_ROLES["Conflict:Attack"] and attack.passage_source == "sentence"
    assert [(a.role, a.text) for a in attack.args] == [("Attacker", "Rebels"), ("Target", "the convoy"),
                                                       ("Place", "Harbor City")]
    assert attack.trigger == (1, 2, "attacked")
    fine = mentions[2]
    assert [(a.role, a.text) for a in fine.args] == [("Adjudicator", "The court"), ("Entity", "Acme Corp")]
    assert "$2 million" in passage_spans(fine)  # surface text from the sentence, not "$ 2 million"
    born = mentions[3]  # no sentence: the joined tokens; a role the table lacks is added
    assert born.passage_source == "tokens" and born.passage == "She was born in a small village ."
    assert born.roles == ("Person", "Place", "Birthplace")
    with pytest.raises(DataError, match="not listed"):
        read_oneie("eae-ace05", FIXTURE, ACE05_ROLES, extend_roles=False)
    monkeypatch.setenv("FORMTAX_ACE05", str(FIXTURE))
    items = whole_file("eae-ace05")
    assert len(items) == 4 and n_args(items) == 10
    assert len(get_task("eae-ace05").load(DATA)) == 3  # a document held out as the dev split
    monkeypatch.setenv("FORMTAX_ACE05", str(FIXTURE.parent / "missing.json"))
    with pytest.raises(DataError, match="FORMTAX_ACE05"):
        get_task("eae-ace05").load(DATA)


def test_bad_files_are_named(tmp_path) -> None:
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"id": "x", "tokens": ["a"], "event_type": "E", "trigger": {"start": 0, "end": 2}, '
                   '"arguments": []}\n')
    with pytest.raises(DataError, match=r"m.jsonl line 1: trigger offsets"):
        read_per_mention("t", bad, {"E": ("R",)})
    bad.write_text('{"id": "x", "tokens": ["a", "b"], "event_type": "E", "trigger": {"start": 0, "end": 1}, '
                   '"arguments": [{"role": "Z", "text": "b", "start": 1, "end": 2}]}\n')
    with pytest.raises(DataError, match="uses role 'Z'"):
        read_per_mention("t", bad, {"E": ("R",)})


def test_alignment_and_role_phrases() -> None:
    assert align_tokens("It cost $89 million.", ["It", "cost", "$", "89", "million", "."]) == [
        (0, 2), (3, 7), (8, 9), (9, 11), (12, 19), (19, 20)]
    assert align_tokens("a b", ["a", "c"]) is None
    assert role_phrase("Created_entity") == "created entity" and role_phrase("MedicalIssue") == "medical issue"
    assert role_phrases(["Place", "place"]) == ("Place", "place")  # a clash keeps the raw names


def _engine_accepts(spec: str, text: str) -> bool:
    ok, _ = validate_with_engine(parse_spec(spec).grammar, text)
    return ok


def test_vc_admits_exactly_the_passage_spans(monkeypatch) -> None:
    monkeypatch.setenv("FORMTAX_ACE05", str(FIXTURE))
    task = get_task("eae-ace05")
    item = whole_file("eae-ace05")[-1]  # "Rebels attacked the convoy near Harbor City on Tuesday, officials said."
    m = EaeTask.mention(item)
    spans = passage_spans(m)
    n = len(m.tokens)
    assert set(spans) == {m.span_text(s, e) for s in range(n) for e in range(s + 1, min(s + 5, n) + 1)} - {",", "."}
    vc = task.answer_spec("vc", item, OutputFormat.ANSWER_ONLY)
    lines = vc.split("\n")
    assert len(lines) == len(m.roles) == 4
    one_role = lines[0]  # "The attacker is {choice:...}": test the slot on one line
    options = parse_spec(one_role).template.slots[0].options
    assert set(options) == {"none", *spans}
    for span in ["none", *spans]:
        assert parse_spec(one_role).validate(f"The attacker is {span}").ok
        assert _engine_accepts(one_role, f"The attacker is {span}"), span
    for outside in ["convoy near Harbor City on Tuesday", "the Convoy", "Rebel", "Harbor  City", ",", "."]:
        assert not parse_spec(one_role).validate(f"The attacker is {outside}").ok
        assert not _engine_accepts(one_role, f"The attacker is {outside}"), outside
    full = "\n".join(f"The {p} is none" for p in item.meta["phrases"])
    assert _engine_accepts(vc, full) and parse_spec(vc).validate(full).ok
    # FC: any one-line text in the slot; JSON forms are records keyed by the raw role names
    fc = task.answer_spec("fc", item, OutputFormat.REASON_ANSWER)
    assert parse_spec(fc).validate(full.replace("none", "anything at all", 1)).ok
    js = parse_spec(task.answer_spec("vc", item, OutputFormat.JSON))
    assert js.validate('{"Attacker": "Rebels", "Target": null, "Instrument": null, "Place": "Harbor City"}').ok
    assert not js.validate('{"Attacker": "rebels", "Target": null, "Instrument": null, "Place": null}').ok
    assert parse_spec(task.answer_spec("fc", item, OutputFormat.JSON)).validate(
        '{"Attacker": "rebels", "Target": null, "Instrument": null, "Place": null}').ok


def test_prompts_name_the_roles_and_the_format(wiki) -> None:
    task = get_task("eae-wikievents")
    item = wiki[0]
    # the formats of a task with its own prompts (the JSON answer form and NL-to-Format's reasoning-only prompt
    # need the generic prompts: has_json_answer_form / generic_prompts are False here)
    assert not task.has_json_answer_form and not task.generic_prompts
    for fmt in (OutputFormat.REASON_ANSWER, OutputFormat.ANSWER_ONLY, OutputFormat.JSON):
        for fv in (1, 2, 3):
            text = task.messages(item, fmt, 1, fv, [])[0]["content"]
            assert item.question in text
            if fmt is OutputFormat.JSON:
                assert all(f'"{r}": <argument>' in text for r in item.meta["roles"])
            else:
                assert all(f"The {p} is <argument>" in text for p in item.meta["phrases"])
    shots = task.shots(2, 0, {item.id})
    text = task.messages(item, OutputFormat.REASON_ANSWER, 2, 1, shots)[0]["content"]
    assert "Examples:" in text and shots[0].question in text
    conv = task.conversion_messages(item, "The killer is the Taliban.", 1)[0]["content"]
    assert "The killer is the Taliban." in conv and "The victim is <argument>" in conv


def test_strict_and_lenient_readers(wiki) -> None:
    task = get_task("eae-wikievents")
    item = wiki[0]  # Life.Die: roles Victim, Place, Killer, MedicalIssue; gold Killer=The Taliban, Victim=members
    good = ("Let me think.\nThe victim is members\nThe place is none\nThe killer is The Taliban\n"
            "The medical issue is none.")
    p = task.parse_output(good, item, OutputFormat.REASON_ANSWER)
    assert p["strict"].status == "ok"
    args, method = decode_prediction(p["strict"].value)
    assert {(a.role, a.text) for a in args} == {("Victim", "members"), ("Killer", "The Taliban")}
    assert task.score(item, p["strict"].value)
    assert p["lenient"] == p["strict"]
    assert task.parse_output(good, item, OutputFormat.ANSWER_ONLY)["strict"].status == "no_answer"  # extra text
    # out of order: strict fails, lenient reads the role phrases anywhere
    messy = "So the Killer is the Taliban. Also, the victim is members; nothing else.\nDone"
    p = task.parse_output(messy, item, OutputFormat.REASON_ANSWER)
    assert p["strict"].status == "no_answer" and p["lenient"].status == "ok"
    args, _ = decode_prediction(p["lenient"].value)
    assert {(a.role, a.text) for a in args} == {("Killer", "the Taliban"), ("Victim", "members")}
    assert task.parse_output("I do not know.", item, OutputFormat.REASON_ANSWER)["lenient"].status == "no_answer"
    # JSON
    obj = {"reason": "r", "answer": {"Victim": "members", "Place": None, "Killer": "The Taliban",
                                     "MedicalIssue": None}}
    p = task.parse_output(json.dumps(obj), item, OutputFormat.JSON)
    assert p["strict"].status == "ok" and task.score(item, p["strict"].value)
    fenced = "```json\n" + json.dumps({"answer": {"Killer": "Taliban"}}) + "\n```"
    p = task.parse_output(fenced, item, OutputFormat.JSON)
    assert p["strict"].status == "no_answer" and p["lenient"].status == "ok"
    assert not task.score(item, p["lenient"].value)
    value = json.loads(p["lenient"].value)
    assert value["in_passage"] == {"Killer": True}


def test_items_carry_their_attachment_and_mentions_of_one_sentence_share_it(wiki) -> None:
    from collections import Counter

    from formtax.studies.eae.scoring import decode_attachment

    attachments = [decode_attachment(it.gold) for it in wiki]
    assert all(at is not None for at in attachments)
    for it, at in zip(wiki, attachments, strict=True):
        m = EaeTask.mention(it)
        assert at is not None and (at.event_type, at.trigger) == (m.event_type, m.trigger[:2])
    per_sentence = Counter(at.sentence for at in attachments if at is not None)
    assert max(per_sentence.values()) > 1  # some sentences hold several mentions: the attached metrics tell them apart
