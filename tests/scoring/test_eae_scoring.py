"""formtax.studies.eae.scoring: span keys, heads (rule and a stand-in spaCy parse), record encoding, AI/AC/AI+/AC+ counts."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from formtax.errors import DataError
from formtax.studies.eae.scoring import (
    Arg,
    Attachment,
    Counts,
    RuleHeads,
    SpacyHeads,
    decode_attachment,
    decode_gold,
    decode_prediction,
    encode_gold,
    encode_prediction,
    get_head_finder,
    normalize_span,
    prediction_in_passage,
    prf,
    rule_head,
    score_mention,
    score_sentence,
    sentence_key,
)

RULE = RuleHeads()


def arg(role: str, text: str) -> Arg:
    return Arg(role, text, rule_head(text))


# -- span keys ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("$ 89 million", "$89 million."),  # GENEVA's tokenised vs detokenised text, a trailing period
        ("April Fool ' s", "April Fool's"),
        ("The Taliban", '"the taliban"'),
        ("``Operation Desert Storm''", "Operation Desert Storm"),  # PTB quotes
        ("(Kabul)", "kabul"),
        ("  members\n", "Members,"),
    ],
)
def test_normalize_span_equal_keys(a: str, b: str) -> None:
    assert normalize_span(a) == normalize_span(b)


def test_normalize_span_values() -> None:
    assert normalize_span("$ 89 million") == "$89million"  # a currency symbol is not punctuation
    assert normalize_span("50%") == "50%"
    assert normalize_span("U.S.") == "u.s"  # only the ends are stripped
    assert normalize_span("") == "" and normalize_span(" ... ") == ""
    assert normalize_span("$89") != normalize_span("89")


# -- heads --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "head"),
    [
        ("of a state public health laboratory and Office of the Chief Medical Examiner", "laboratory"),
        ("The Taliban", "Taliban"),
        ("members of the Afghan security forces", "members"),
        ("in central Maidan Wardak province", "province"),
        ("members", "members"),
        ("$ 89 million", "million"),
        ("U.S. forces", "forces"),  # an initialism is one token, not a chunk-ending period
        ("Mr. Smith", "Smith"),
        ("April Fool's", "Fool's"),  # apostrophe words stay whole
        ("the soldiers who were killed", "soldiers"),
        ("his wife, Mary", "wife"),
        ('"the attack"', "attack"),  # leading quote stripped too
        ("and the rest", "rest"),  # no chunk before 'and': last token of the stripped span
        ("the", "the"),  # nothing left after stripping: the span itself
    ],
)
def test_rule_head(span: str, head: str) -> None:
    assert rule_head(span) == head
    assert RULE(span) == head and RULE.method == "rule"


@dataclass
class Tok:
    """A stand-in for a spaCy token: the attributes SpacyHeads reads."""

    text: str
    dep_: str
    pos_: str
    i: int
    head: Tok | None = None
    children: list[Tok] = field(default_factory=list)


class StandInNLP:
    """Returns a hand-made parse per text: (text, dep, pos, head index) rows; records what it was given."""

    meta = {"lang": "en", "name": "core_web_sm", "version": "3.7.1"}

    def __init__(self, parses: dict[str, list[tuple[str, str, str, int]]]) -> None:
        self.parses = parses
        self.seen: list[str] = []

    def __call__(self, text: str) -> list[Tok]:
        self.seen.append(text)
        rows = self.parses.get(text, [])
        toks = [Tok(t, dep, pos, i) for i, (t, dep, pos, _) in enumerate(rows)]
        for tok, (_, _, _, h) in zip(toks, rows, strict=True):
            tok.head = toks[h]
            if h != tok.i:
                toks[h].children.append(tok)
        return toks


PARSES = {
    "Taliban": [("Taliban", "ROOT", "PROPN", 0)],
    # of -> laboratory (pobj); a, state, public, health -> laboratory
    "of a state public health laboratory": [
        ("of", "ROOT", "ADP", 0),
        ("a", "det", "DET", 5),
        ("state", "compound", "NOUN", 5),
        ("public", "amod", "ADJ", 5),
        ("health", "compound", "NOUN", 5),
        ("laboratory", "pobj", "NOUN", 0),
    ],
    # a subordinator root without pobj/pcomp: its first nominal child is taken
    "whether troops withdrew": [
        ("whether", "ROOT", "SCONJ", 0),
        ("troops", "nsubj", "NOUN", 0),
        ("withdrew", "ccomp", "VERB", 0),
    ],
    "by": [("by", "ROOT", "ADP", 0)],  # a bare preposition: nothing to descend to
    "members of the forces": [
        ("members", "ROOT", "NOUN", 0),
        ("of", "prep", "ADP", 0),
        ("the", "det", "DET", 3),
        ("forces", "pobj", "NOUN", 1),
    ],
}


def test_spacy_heads_with_a_stand_in_parse() -> None:
    nlp = StandInNLP(PARSES)
    heads = SpacyHeads(nlp)
    assert heads.method == "spacy:en_core_web_sm-3.7.1"
    assert heads("The Taliban") == "Taliban" and nlp.seen[-1] == "Taliban"  # leading 'The' removed first
    assert heads("of a state public health laboratory") == "laboratory"  # ADP root -> its pobj
    assert heads("whether troops withdrew") == "troops"  # SCONJ root, no pobj -> first nominal child
    assert heads("by") == "by"
    assert heads("members of the forces") == "members"  # a nominal root is kept
    assert heads("unparsed text") == "unparsed text"  # no root at all: the span itself
    assert SpacyHeads(nlp, name="en_core_web_md").method == "spacy:en_core_web_md-3.7.1"


def test_spacy_heads_load_tries_the_pipelines_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[str] = []

    def load(name: str) -> Any:
        tried.append(name)
        if name != "en_core_web_lg":
            raise OSError(f"[E050] Can't find model '{name}'")
        nlp = StandInNLP(PARSES)
        nlp.meta = {"lang": "en", "name": "core_web_lg", "version": "3.8.0"}
        return nlp

    monkeypatch.setitem(sys.modules, "spacy", types.SimpleNamespace(load=load))
    heads = SpacyHeads.load()
    assert heads is not None and heads.method == "spacy:en_core_web_lg-3.8.0"
    assert tried == ["en_core_web_sm", "en_core_web_md", "en_core_web_lg"]


def test_get_head_finder_falls_back_to_the_rule_without_spacy() -> None:
    finder = get_head_finder()
    assert get_head_finder() is finder  # cached
    if importlib.util.find_spec("spacy") is None:
        assert finder.method == "rule" and finder("The Taliban") == "Taliban"
    else:
        assert finder.method.startswith(("spacy:", "rule"))


# -- encoding -----------------------------------------------------------------------------------------------


def test_gold_round_trip() -> None:
    args = [("Attacker", "The Taliban"), ("Victim", "members of the Afghan security forces")]
    s = encode_gold(args, RULE)
    assert json.loads(s)["args"][1] == {
        "role": "Victim",
        "text": "members of the Afghan security forces",
        "head": "members",
    }
    decoded, method = decode_gold(s)
    assert method == "rule"
    assert decoded == [
        Arg("Attacker", "The Taliban", "Taliban"),
        Arg("Victim", "members of the Afghan security forces", "members"),
    ]
    assert decode_gold(encode_gold([], RULE)) == ([], "rule")
    assert decode_attachment(s) is None  # a record written before attachments: its own sentence in the report
    at = Attachment(sentence_key("d", "The rebels attacked."), "Conflict.Attack", (2, 3))
    assert decode_attachment(encode_gold(args, RULE, at)) == at
    assert decode_gold(encode_gold(args, RULE, at)) == (decoded, "rule")
    with pytest.raises(DataError, match="attach"):
        decode_attachment(json.dumps({"args": [], "head_method": "rule", "attach": {"sentence": "s"}}))


def test_score_sentence_counts_key_sets() -> None:
    s = sentence_key("d", "x")
    a, b = Attachment(s, "Attack", (0, 1)), Attachment(s, "Attack", (3, 4))
    gold_a, gold_b = [arg("Attacker", "rebels")], [arg("Target", "village"), arg("Attacker", "rebels")]
    c = score_sentence([(a, [arg("Target", "village"), arg("Place", "village")], gold_a), (b, [], gold_b)])
    # AI keys: pred {village}, gold {rebels, village}; AC: pred {village/target, village/place}, gold
    # {rebels/attacker, village/target}; attached: village is B's, A predicted it
    assert (c["ai"], c["ai_pred"], c["ai_gold"]) == (1, 1, 2)
    assert (c["ac"], c["ac_pred"], c["ac_gold"]) == (1, 2, 2)
    assert (c["ai_plus"], c["ai_plus_pred"], c["ai_plus_gold"]) == (0, 1, 3)
    assert (c["ac_plus"], c["ac_plus_pred"], c["ac_plus_gold"]) == (0, 2, 3)
    assert score_sentence([(a, [arg("Attacker", "...")], [arg("Attacker", "...")])])["ai"] == 0  # empty key


def test_prediction_round_trip_and_none_values() -> None:
    values = {
        "Attacker": " The Taliban ",
        "Victim": "None",
        "Place": None,
        "Target": " n/a ",
        "X": "NULL",
        "Y": "",
    }
    s = encode_prediction(values, RULE, {"Attacker": True, "Victim": True})
    data = json.loads(s)
    assert list(data["args"]) == ["Attacker", "Victim", "Place", "Target", "X", "Y"]  # order kept
    assert data["args"] == {
        "Attacker": "The Taliban",
        "Victim": None,
        "Place": None,
        "Target": None,
        "X": None,
        "Y": None,
    }
    assert data["heads"]["Attacker"] == "Taliban" and data["heads"]["Victim"] is None
    assert data["in_passage"] == {"Attacker": True}  # only for filled roles
    assert data["head_method"] == "rule"
    assert decode_prediction(s) == ([Arg("Attacker", "The Taliban", "Taliban")], "rule")
    assert prediction_in_passage(s) == [True]
    with pytest.raises(ValueError, match="in_passage"):
        encode_prediction({"Victim": "members"}, RULE, {})


@pytest.mark.parametrize("bad", ["not json", "[]", '{"args": []}', '{"args": {}, "head_method": "rule"}'])
def test_decoders_refuse_malformed_text(bad: str) -> None:
    with pytest.raises(DataError):
        decode_prediction(bad)
    if bad != '{"args": {}, "head_method": "rule"}':
        with pytest.raises(DataError):
            decode_gold(bad)


# -- counting -----------------------------------------------------------------------------------------------

GOLD = [arg("Attacker", "The Taliban"), arg("Victim", "members"), arg("Place", "Maidan Wardak province")]


def test_hand_counted_mention() -> None:
    pred = [
        arg("Victim", "members"),  # span and role right: AI, AC, AI+, AC+
        arg("Target", "Maidan Wardak province"),  # span right, role wrong: AI, AI+
        arg("Attacker", "Taliban fighters"),  # span wrong, head 'fighters' wrong: nothing
        arg("Place", "in central Maidan Wardak province"),  # span wrong; head 'province' with the right role
    ]
    c = score_mention(pred, GOLD)
    # AI: {members, maidanwardakprovince} = 2 of 4 predicted, 3 gold; AC: (victim, members) = 1.
    # AI+: gold heads {Taliban, members, province}; predicted {members, province, fighters, province}:
    #   one-to-one, so 'province' counts once -> 2. AC+: (victim, members) and (place, province) -> 2.
    assert c == Counts(n_pred=4, n_gold=3, ai=2, ac=1, ai_head=2, ac_head=2)
    p, r, f1 = prf(c.ai, c.n_pred, c.n_gold)
    # P = 2/4 = 0.5, R = 2/3 = 0.667, F1 = 2PR/(P+R) = 4/7 = 0.571
    assert (p, r, f1) == pytest.approx((0.5, 2 / 3, 4 / 7))
    # AC: P = 1/4, R = 1/3, F1 = 2/7 = 0.286
    assert prf(c.ac, c.n_pred, c.n_gold) == pytest.approx((0.25, 1 / 3, 2 / 7))


def test_duplicates_role_case_and_normalisation() -> None:
    # the same role and span twice (after normalisation) is one prediction
    c = score_mention([arg("Victim", "members"), arg("victim", "Members.")], GOLD)
    assert (c.n_pred, c.ai, c.ac) == (1, 1, 1)
    # roles compare case-insensitively
    assert score_mention([arg("VICTIM", "members")], GOLD).ac == 1
    # "$ 89 million" (tokenised gold) matches "$89 million." (a model's copy)
    money = [arg("Money", "$ 89 million")]
    assert score_mention([arg("Money", "$89 million.")], money) == Counts(1, 1, 1, 1, 1, 1)
    # gold is de-duplicated the same way: recall can reach 1
    assert (
        score_mention(
            [arg("Victim", "members")], [arg("Victim", "members"), arg("Victim", "members ")]
        ).n_gold
        == 1
    )


def test_one_to_one_matching() -> None:
    # one span predicted for two roles: credited once for AI (gen-arg would count both predictions correct)
    pred = [arg("Victim", "members"), arg("Attacker", "members")]
    c = score_mention(pred, [arg("Victim", "members")])
    assert c == Counts(n_pred=2, n_gold=1, ai=1, ac=1, ai_head=1, ac_head=1)
    assert prf(c.ai, c.n_pred, c.n_gold) == pytest.approx((0.5, 1.0, 2 / 3))
    # a gold span filling two roles can be matched twice, once per gold argument
    both = [arg("Victim", "members"), arg("Target", "members")]
    assert score_mention(both, both) == Counts(2, 2, 2, 2, 2, 2)


def test_empty_keys_never_match() -> None:
    c = score_mention([Arg("Victim", "...", "...")], [Arg("Victim", "--", "--")])
    assert c == Counts(n_pred=1, n_gold=1)


def test_prf_conventions_and_counts_sum() -> None:
    assert prf(0, 0, 3) == (0.0, 0.0, 0.0)  # nothing predicted: P = 0
    assert prf(0, 2, 0) == (0.0, 0.0, 0.0)  # nothing to find: R = 0
    assert prf(0, 0, 0) == (0.0, 0.0, 0.0)
    assert prf(3, 3, 3) == (1.0, 1.0, 1.0)
    total = Counts(1, 2, 3, 4, 5, 6) + Counts(10, 20, 30, 40, 50, 60)
    assert total == Counts(11, 22, 33, 44, 55, 66)
    assert sum([Counts(1, 1, 1, 0, 1, 0)] * 3, Counts()) == Counts(3, 3, 3, 0, 3, 0)
