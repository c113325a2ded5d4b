"""Closing mode's reach (issue 58): a completion wherever one fits, a hopeless budget refused at once.

Oracles: the JSON-Schema-Test-Suite's own valid instances (their length bounds the shortest completion), ``jsonschema``
on the schema as given (``Result.parse_ok``), and :func:`min_json_bytes` checked against those instances (a lower
bound must never exceed one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints.closing_bound import min_json_bytes
from formtax.constraints.compile import validate_with_engine
from formtax.constraints.spec import JsonConstraint
from formtax.errors import ConfigError, ConstraintError

SUITE = Path(__file__).parents[1] / "fixtures" / "json-schema-test-suite" / "draft2020-12"
LEAN = ("additionalProperties", "anyOf", "items", "oneOf", "pattern", "properties", "required", "not")


def suite_cases(files: tuple[str, ...] | None = None) -> list[tuple[str, dict, str]]:
    """(where, schema, its shortest valid instance as the grammar lays it out) for every compiled schema of the
    vendored suite with a valid instance the grammar admits and the oracle accepts."""
    out = []
    for path in sorted(SUITE.glob("*.json")):
        if files is not None and path.stem not in files:
            continue
        for k, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            schema = group["schema"]
            if not isinstance(schema, dict):
                continue
            try:
                c = JsonConstraint(schema)
                grammar = c.grammar
            except ConstraintError:
                continue
            texts = [json.dumps(t["data"]) for t in group["tests"] if t["valid"]]
            texts = [t for t in texts if validate_with_engine(grammar, t)[0] and c.validate(t).ok]
            if texts:
                out.append((f"{path.stem}[{k}]", schema, min(texts, key=lambda t: len(t.encode()))))
    return out


def run_case(where: str, schema: dict, instance: str, seed: int) -> None:
    budget = len(instance.encode()) + 2  # the byte tokenizer: one token a byte
    try:
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", schema, max_tokens=budget,
                             raw=True)
    except ConfigError as e:
        raise AssertionError(f"{where}: refused at {budget} tokens although {instance!r} fits: {e}") from e
    assert r.tokens.total <= budget
    if JsonConstraint(schema).approximations and not r.parse_ok:
        # closing said before decoding that it keeps only the grammar here (no answer the oracle accepts found)
        assert r.stats.get("closing_parse") == "grammar-only", (where, r.answer_text, r.stats)
    else:
        assert r.parse_ok, (where, budget, r.answer_text, r.finish_reason)


LEAN_CASES = suite_cases(LEAN)


@pytest.mark.parametrize("where, schema, instance", LEAN_CASES, ids=[c[0] for c in LEAN_CASES])
def test_every_suite_schema_completes_at_its_instance_length(where, schema, instance):
    run_case(where, schema, instance, seed=len(where))


def test_the_whole_suite_completes_at_its_instance_lengths():
    cases = suite_cases()
    assert len(cases) > 300
    for k, case in enumerate(cases):
        run_case(*case, seed=k)


def test_the_lower_bound_never_exceeds_a_valid_instance():
    for where, schema, instance in suite_cases():
        assert min_json_bytes(schema) <= len(instance.encode()), where


def test_an_unanchored_pattern_parses_at_16_tokens():
    schema = {"type": "object", "required": ["k0"], "properties": {"k0": {"type": "string", "pattern": "[a-z]{3,40}"}}}
    for seed in range(4):
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", schema, max_tokens=16,
                             raw=True)
        assert r.parse_ok and r.tokens.total <= 16, (r.answer_text, r.finish_reason)


@pytest.mark.parametrize("n", [1000, 3000])
@pytest.mark.parametrize("anchored", [True, False])
def test_many_required_properties_are_refused_by_the_lower_bound(n, anchored):
    pattern = "^[a-z]{3,40}$" if anchored else "[a-z]{3,40}"
    schema = {"type": "object", "required": [f"p{i}" for i in range(n)],
              "properties": {f"p{i}": {"type": "string", "pattern": pattern} for i in range(n)}}
    with pytest.raises(ConfigError, match=r"every instance takes at least \d+ bytes and one token carries at most 1"):
        formtax.generate(FakeBackend(random_logits(seed=0)), "q", "constrained", schema, max_tokens=16, raw=True)


def test_an_approximated_schema_keeps_to_the_oracle():
    """``not`` is left out of the grammar: closing steers to an answer the oracle accepts, and says so."""
    schema = {"type": "integer", "not": {"const": 0}}
    for seed in range(6):
        r = formtax.generate(FakeBackend(random_logits(seed=seed)), "q", "constrained", schema, max_tokens=3,
                             raw=True)
        assert r.stats["closing_parse"] == "oracle" and r.parse_ok, (r.answer_text, r.stats)


def test_exact_schemas_carry_no_closing_parse_flag():
    r = formtax.generate(FakeBackend(random_logits(seed=0)), "q", "constrained", {"type": "integer"}, max_tokens=4,
                         raw=True)
    assert "closing_parse" not in r.stats


def test_the_server_response_carries_the_closing_parse_flag():
    from formtax.serve.shapes import extension

    schema = {"type": "integer", "not": {"const": 0}}
    r = formtax.generate(FakeBackend(random_logits(seed=0)), "q", "constrained", schema, max_tokens=3, raw=True)
    assert extension(r)["closing_parse"] == "oracle"
    exact = formtax.generate(FakeBackend(random_logits(seed=0)), "q", "constrained", {"type": "integer"},
                             max_tokens=3, raw=True)
    assert "closing_parse" not in extension(exact)


def record_of_choices(fields: int = 6) -> str:
    """A record SPEC like the EAE study's JSON answers: each field a choice over ~590 word n-grams of a passage."""
    import random

    from formtax.constraints.parse import record_spec
    from formtax.constraints.template import choice_slot

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(120)]
    grams = list(dict.fromkeys(" ".join(words[i:i + k]) for i in range(len(words)) for k in range(1, 6)))
    return record_spec([(f"Role{k}", choice_slot(grams)) for k in range(fields)])


def test_a_record_of_large_choices_is_closed_not_refused():
    """Closing on a grammar too large for the wide byte search (the EAE study's JSON answers: before the narrow
    search and the merge after forced bytes its start search ran out of time and every such request was refused):
    the json strategy's request decodes and its answer parses."""
    r = formtax.generate(FakeBackend(random_logits(seed=1)), "q", "json", record_of_choices(), max_tokens=463)
    assert r.stats["closing"] is True and r.parse_ok and r.tokens.total <= 463


def test_the_narrow_search_is_the_wide_one_where_it_turned_nothing_away():
    """Where the narrow byte search (8 states a length) turned no state away, the wide one (48) meets the same
    states and finds the same completion; on a record of large choices it does turn states away, and its
    completion is real (the engine accepts it) and, with the merge after forced bytes, within a byte a field of
    the shortest (every field's shortest alternative)."""
    import re

    from formtax.constraints import parse_spec
    from formtax.constraints.clock import search_clock
    from formtax.constraints.shortest import byte_matcher, shortest_bytes

    def both(grammar: str) -> tuple:
        return tuple(shortest_bytes(byte_matcher(grammar), b"", 400, search_clock() + 60, max_width=w)
                     for w in (8, 48))

    whole = 0
    for spec in ("The answer is: {int}", "choice:yes|no|maybe|yesterday", r"regex:(\w+ )*[0-9]+\.",
                 'json:{"type":"object","properties":{"a":{"type":"string","maxLength":6},"n":{"type":"integer"}},'
                 '"required":["a","n"]}', 'json:{"type":"array","items":{"type":"integer"},"minItems":3}'):
        narrow, wide = both(parse_spec(spec).grammar)
        assert narrow.data is not None and wide.data is not None and len(wide.data) <= len(narrow.data), spec
        if not narrow.narrowed:
            whole += 1
            assert (narrow.data, narrow.work) == (wide.data, wide.work), spec
    assert whole >= 2  # the template and the choice, here
    grammar = parse_spec(record_of_choices()).grammar
    narrow, wide = both(grammar)
    assert narrow.narrowed and narrow.data is not None and wide.data is not None
    assert validate_with_engine(grammar, narrow.data.decode())[0] and validate_with_engine(grammar, wide.data.decode())[0]
    alts = [re.findall(r'"((?:[^"\\]|\\.)*)"', line.split(":", 1)[1]) for line in grammar.splitlines()
            if re.match(r"\w+_f\d+:", line)]
    shortest = len(wide.data) - sum(len(v) for v in re.findall(rb': ("[^"]*"|null)', wide.data)) \
        + sum(min(len(a.encode().decode("unicode_escape")) for a in field) for field in alts)
    assert len(wide.data) <= shortest + len(alts)
