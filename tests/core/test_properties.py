"""Property tests: whatever the logits, a constrained output satisfies its constraint (independent oracles)."""

import json
import re

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.constraints import parse_spec

Q = [{"role": "user", "content": "q"}]

REGEXES = ["[0-9]{1,4}", "(yes|no|maybe)", "[a-z]{3}-[0-9]{2}", "ab*c", "(0|[1-9][0-9]*)\\.[0-9]{2}", "[A-C]"]
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 50}}, "required": ["a"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["x", "yy"]}},
     "required": ["ok", "tag"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3},
]
TEMPLATES = ["The answer is: {int}", "{int:0..999}", "{letters:4}", "Pick {choice:red|green|blue}.", "A={int:-5..5};"]

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


@given(seed=st.integers(0, 10_000), pattern=st.sampled_from(REGEXES))
@settings(max_examples=40)
def test_regex_outputs_fullmatch(seed, pattern):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "constrained", "regex:" + pattern, max_tokens=40)
    if r.finish_reason == "length-incomplete":  # an unbounded regex may honestly run out; it must say so
        assert r.error and not r.parse_ok
        return
    assert re.fullmatch(pattern, r.answer_text), (pattern, r.answer_text)
    assert r.parse_ok


@given(seed=st.integers(0, 10_000), schema=st.sampled_from(SCHEMAS))
@settings(max_examples=30)
def test_json_outputs_validate(seed, schema):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "constrained", "json:" + json.dumps(schema),
                         max_tokens=60)
    if r.finish_reason == "length-incomplete":
        assert r.error and not r.parse_ok
        return
    jsonschema.validate(json.loads(r.answer_text), schema)
    assert r.parse_ok


@given(seed=st.integers(0, 10_000), options=st.lists(st.text("abcxyz ", min_size=1, max_size=6), min_size=1,
                                                      max_size=5, unique=True))
@settings(max_examples=40)
def test_choice_outputs_are_one_of_the_choices(seed, options):
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, "constrained", "choice:" + "|".join(options),
                         max_tokens=20)
    assert r.answer_text in options
    assert r.parse_ok


@given(seed=st.integers(0, 10_000), template=st.sampled_from(TEMPLATES),
       strategy=st.sampled_from(["constrained", "inwriting", "json", "nl2format"]))
@settings(max_examples=60)
def test_templates_always_parse_within_budget(seed, template, strategy):
    c = parse_spec(template)
    budget = 120
    r = formtax.generate(FakeBackend(random_logits(seed=seed)), Q, strategy, template, max_tokens=budget)
    assert r.parse_ok, (strategy, template, r)
    assert r.error is None
    if strategy == "json":
        jsonschema.validate(json.loads(r.answer_text)["answer"], c.answer_schema())
    else:
        assert c.validate(r.answer_text).ok
    assert r.calls[0].generated <= budget


@given(seed=st.integers(0, 10_000), spec=st.sampled_from([*TEMPLATES, "choice:red|green|blue", "regex:[a-c]{2,4}"]),
       strategy=st.sampled_from(["suffix-last", "suffix-min", "suffix-beam", "decog"]),
       budget=st.sampled_from([24, 48, 96]), temperature=st.sampled_from([0.0, 1.0]))
@settings(max_examples=40)
def test_search_strategies_accept_only_valid_answers(tmp_path_factory, seed, spec, strategy, budget, temperature):
    """The fast profile of bench/fuzz.py for the strategies that search (suffix-*) or reweight (decog)."""
    from formtax.errors import FormtaxError
    from formtax.fem.artifact import save_fem
    from formtax.fem.hmm import HMM
    from formtax.strategies import Request, get_strategy

    b = FakeBackend(random_logits(seed=seed))
    options = {}
    if strategy == "decog":
        path = tmp_path_factory.getbasetemp() / "fuzz-fem.npz"
        if not path.is_file():
            save_fem(path, HMM.random(6, b.tokenizer.n_logits, seed=0),
                     {"form": "instruction-aware", "tokenizer_sha256": b.tokenizer.engine.key,
                      "model": b.model_id, "task": "fuzz"})
        options = {"fem": str(path)}
    req = Request(Q, parse_spec(spec), max_tokens=budget, temperature=temperature, seed=seed, options=options)
    try:
        (r,) = get_strategy(strategy).run(b, [req])
    except FormtaxError as e:  # refused up front, and says why: a budget below the answer's reserve, or
        assert "max_tokens" in str(e) or "budget" in str(e) or (  # decog given a regex (it needs a template)
            strategy == "decog" and spec.startswith("regex:") and "answer template" in str(e)), e
        return
    if r.parse_ok:
        assert parse_spec(spec).validate(r.answer_text or "").ok, (strategy, spec, r.answer_text)
