"""Every answer that parses is valid: formats asserted by the oracle, duplicate keys refused, errors that say where,
and closing that completes a format (issue 45, points 1-4 and 7).

Oracles: the JSON-Schema-Test-Suite's ``optional/format`` tests (vendored, MIT) with their ``valid`` flags, and
``json.loads`` with a pairs hook for repeated keys.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import as_constraint
from formtax.constraints.compile import validate_with_engine
from formtax.constraints.formats import CHECKED_FORMATS
from formtax.constraints.spec import JsonConstraint
from formtax.errors import ConstraintError
from formtax.serve.shapes import UNCHECKED_HEADER, headers

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import schema_coverage  # noqa: E402

BAD = '"not a valid value!! :: ##"'
FORMATS = ["email", "date", "ipv4", "uri", "hostname", "json-pointer", "iri", "idn-email", "uri-reference",
           "date-time", "time", "uuid", "ipv6", "idn-hostname", "iri-reference", "relative-json-pointer", "duration"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_value_that_breaks_its_format_is_not_parsed(fmt):
    c = as_constraint({"type": "string", "format": fmt})
    v = c.validate(BAD)
    assert not v.ok and "is not a" in (v.error or "")
    assert fmt in CHECKED_FORMATS and c.unchecked_formats == ()


@pytest.mark.parametrize(("fmt", "text"), [("uri-reference", '"://"'), ("uri-template", '"a{b"'),
                                           ("uri-template", '"{var=def}"'), ("regex", '"(?P<n>x)"'),
                                           ("hostname", '"xn--X"'), ("json-pointer", '"{ "')])
def test_the_reported_instances_are_refused(fmt, text):
    assert not JsonConstraint({"type": "string", "format": fmt}).validate(text).ok


@pytest.fixture(scope="module")
def formats():
    return schema_coverage.run_suite(schema_coverage.FORMATS)


def test_the_vendored_format_suite_parses_no_invalid_instance(formats):
    total = schema_coverage.Tally()
    for t in formats.values():
        total.add(t)
    assert len(formats) == 21 and total.schemas == 28 and total.refused == 0
    assert total.invalid_parsed == 0
    assert total.invalid_rejected >= 380 and total.valid_parsed >= 300
    assert formats["unknown"].unchecked == 1  # a format no one knows is named, never claimed as checked


def test_an_unknown_format_is_named_unchecked_in_stats_and_header():
    schema = {"type": "object", "properties": {"p": {"type": "string", "format": "ports"},
                                               "d": {"type": "string", "format": "date"}}, "required": ["p", "d"]}
    assert JsonConstraint(schema).unchecked_formats == ("ports",)
    r = formtax.generate(FakeBackend(random_logits(seed=2)), "q", "constrained", schema, max_tokens=80, raw=True)
    assert r.stats["formats_unchecked"] == ["ports"]
    assert headers(r)[UNCHECKED_HEADER] == "ports"
    r = formtax.generate(FakeBackend(random_logits(seed=2)), "q", "constrained", {"type": "string", "format": "date"},
                         max_tokens=40, raw=True)
    assert "formats_unchecked" not in r.stats and UNCHECKED_HEADER not in headers(r)


def test_an_approximated_format_answer_is_checked_by_the_oracle():
    """json-pointer is a plain string in the grammar: a generated value that is no pointer comes back unparsed."""
    schema = {"type": "string", "format": "json-pointer"}
    seen = set()
    for seed in range(12):  # closing off: with it, closing keeps to answers the oracle accepts (issue 58)
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", schema, max_tokens=12,
                             raw=True, closing=False)
        text = r.answer_text or ""
        value = json.loads(text) if r.finish_reason in ("eos", "constraint-complete", "length") and text else None
        if isinstance(value, str):
            ok = value == "" or value.startswith("/")
            assert r.parse_ok == (ok and "~" not in value.replace("~0", "").replace("~1", "")), text
            seen.add(r.parse_ok)
    assert False in seen  # random text is rarely a pointer: the oracle refused at least one
    for seed in range(4):  # closing on: the oracle's word keeps the answer a pointer
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", schema, max_tokens=12,
                             raw=True)
        assert r.parse_ok and r.stats["closing_parse"] == "oracle", (r.answer_text, r.stats)


def test_duplicate_keys_are_refused():
    c = as_constraint({"type": "object", "properties": {"apples": {"type": "integer"}}})
    v = c.validate('{"apples": 1, "applesauce": "Apple Salsa", "applesauce": "Apple"}')
    assert not v.ok and "duplicate key 'applesauce'" in (v.error or "")
    assert c.validate('{"apples": 1, "applesauce": "Apple"}').ok
    j = formtax.constraints.parse_spec('{choice:yes|no}')
    from formtax.constraints.jsonreason import JsonReasonAnswer
    wrapped = JsonReasonAnswer(j, reason_tokens=8)
    assert not wrapped.validate('{"reason": "a", "reason": "b", "answer": "yes"}').ok
    assert wrapped.validate('{"reason": "b", "answer": "yes"}').ok


def test_a_refused_pattern_keeps_the_engines_reason():
    with pytest.raises(ConstraintError, match=r"regex parse error: .*look-around.*is not supported"):
        _ = as_constraint({"type": "string", "pattern": "(?=a)b"}).grammar


def test_a_schema_error_names_its_json_path():
    with pytest.raises(ConstraintError, match=r"invalid JSON schema: properties\.a\.type: 'integr' is not"):
        as_constraint({"properties": {"a": {"type": "integr"}}})


def test_a_json_schema_written_as_a_spec_gets_a_hint():
    with pytest.raises(ConstraintError, match=r"json:"):
        as_constraint('{"type":"integer"}')


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "email"},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"},
                                      "e": {"type": "string", "format": "email"},
                                      "u": {"type": "string", "format": "uuid"}}, "required": ["d", "e", "u"]},
])
def test_closing_completes_a_format_it_used_to_refuse(schema):
    """Before issue 45 the witness search never tried an email's "@" and refused every budget."""
    b = FakeBackend(random_logits(seed=1))
    r = formtax.generate(b, "q", "constrained", schema, max_tokens=200, raw=True)
    assert r.parse_ok, (r.text, r.finish_reason)
    assert validate_with_engine(JsonConstraint(schema).grammar, r.answer_text or "")[0]


def test_closing_never_refuses_a_compilable_schema_of_the_vendored_suites():
    """Every schema of the vendored suites (required and optional/format) that compiles and admits something has a
    witness, and closing at the witness's length plus a margin answers (before issue 45: none for email)."""
    from formtax.constraints.closing import start_witness
    from formtax.constraints.compile import compile_grammar

    b = FakeBackend(random_logits(seed=0))
    tok = b.tokenizer
    checked = 0
    for path in sorted([*schema_coverage.SUITE.glob("*.json"), *schema_coverage.FORMATS.glob("*.json")]):
        for k, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            if not isinstance(group["schema"], dict):
                continue
            try:
                c = JsonConstraint(group["schema"])
                compiled = compile_grammar(c.grammar, tok.engine)
            except ConstraintError:
                continue
            if compiled.matches_nothing(tok.n_logits, tok.eos_ids):
                continue
            w = start_witness(compiled, tok.n_logits)
            assert w is not None, f"{path.stem}[{k}]: no witness"
            r = formtax.generate(b, "q", "constrained", c, max_tokens=len(w) + 8, raw=True)
            assert r.error is None and r.finish_reason in ("eos", "constraint-complete", "length"), (path.stem, k)
            checked += 1
    assert checked >= 360
