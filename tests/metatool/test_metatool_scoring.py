"""The deterministic abstention scorer on hand-written outputs: every rule, one test each."""

from __future__ import annotations

import pytest

from formtax.studies.abstention.scoring import ABSTAIN, Category, find_mentions, score_output

CANDS = ["Zapier", "web_scraper", "WordCloud", "URLTool", "PDF&URLTool", "Chess", "Now", "SSH", "a_b", "News"]
TOOL_GOLD = "Zapier"


def cat(text: str, gold: str = ABSTAIN) -> Category:
    return score_output(text, CANDS, gold).category


@pytest.mark.parametrize(
    ("text", "gold", "category"),
    [
        # abstention item: None, and no candidate or one only after it
        ("None.", ABSTAIN, Category.CORRECT),
        ("'None.' No tool fits.", ABSTAIN, Category.CORRECT),
        ("None. Zapier would not help here.", ABSTAIN, Category.CORRECT),
        ("Zapier? No: None.", ABSTAIN, Category.ORDER),  # the candidate comes first: refused by ordering
        ("Zapier", ABSTAIN, Category.WRONG),
        (
            "None, though Zapier or WordCloud might",
            ABSTAIN,
            Category.D2,
        ),  # two candidates: D2 even after None
        ("I cannot help with that.", ABSTAIN, Category.D0),
        # tool-needed item: exactly the gold, ahead of any None
        ("Zapier", TOOL_GOLD, Category.CORRECT),
        ("Zapier. None of the others fit.", TOOL_GOLD, Category.CORRECT),
        ("Zapier, Zapier and Zapier again", TOOL_GOLD, Category.CORRECT),  # one distinct candidate
        ("None... actually Zapier", TOOL_GOLD, Category.ORDER),
        ("None.", TOOL_GOLD, Category.WRONG),
        ("WordCloud", TOOL_GOLD, Category.WRONG),
        ("None, or WordCloud", TOOL_GOLD, Category.WRONG),
        ("Zapier or WordCloud", TOOL_GOLD, Category.D2),
        ("", TOOL_GOLD, Category.D0),
    ],
)
def test_rules(text, gold, category):
    s = score_output(text, CANDS, gold)
    assert s.category is category
    assert s.correct is (category is Category.CORRECT)


def test_word_boundaries():
    # a name inside a longer word or identifier is not a mention; punctuation and non-Latin text are
    # boundaries
    assert cat("Nonetheless, the Chessboard and SSHd and ZapierX", TOOL_GOLD) is Category.D0
    assert cat("Zapier를 쓰세요", TOOL_GOLD) is Category.CORRECT
    assert cat("(Zapier)", TOOL_GOLD) is Category.CORRECT
    assert cat("web_scraper_v2 or a_bc", TOOL_GOLD) is Category.D0  # underscores are word characters
    assert cat("use web scraper", TOOL_GOLD) is Category.D0  # the exact spelling only


def test_case_sensitive():
    assert cat("none of these", ABSTAIN) is Category.D0
    assert cat("zapier", TOOL_GOLD) is Category.D0
    assert cat("now is the time", TOOL_GOLD) is Category.D0  # the ordinary word is not the tool "Now"
    assert (
        cat("Now is the time", TOOL_GOLD) is Category.WRONG
    )  # ... but the capitalised name is (a known limit)


def test_longest_first_no_name_inside_another():
    m = find_mentions("Try PDF&URLTool", CANDS)
    assert [x.name for x in m] == ["PDF&URLTool"]  # '&' is a boundary, so URLTool alone would match inside
    assert score_output("PDF&URLTool", CANDS, "PDF&URLTool").correct
    assert cat("PDF&URLTool then URLTool", TOOL_GOLD) is Category.D2
    # the result does not depend on the order the candidates are given in
    assert find_mentions("Try PDF&URLTool", list(reversed(CANDS))) == m


def test_mentions_are_in_text_order_with_spans():
    text = "News, then None, then News"
    m = find_mentions(text, CANDS)
    assert [(x.name, text[x.start : x.end]) for x in m] == [
        ("News", "News"),
        ("None", "None"),
        ("News", "News"),
    ]
    s = score_output(text, CANDS, ABSTAIN)
    assert s.named == ("News",) and s.abstained and s.decision == "News" and s.category is Category.ORDER


def test_only_the_items_own_candidates_count():
    # "Calculator" is a real MetaTool tool, but not one of this item's ten: it is not an answer
    assert cat("Calculator", TOOL_GOLD) is Category.D0


def test_refuses_an_answer_space_it_is_not_defined_on():
    with pytest.raises(ValueError, match="never a gold label"):
        score_output("None", CANDS, "timeport")  # the abstention file's removed tool as the gold
    with pytest.raises(ValueError, match="cannot also be a candidate"):
        score_output("None", [*CANDS[:9], "None"], ABSTAIN)
    with pytest.raises(ValueError, match="duplicate"):
        score_output("x", ["A", "A"], "A")
