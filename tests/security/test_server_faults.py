"""Issue 55 points 1-3, 7 and 8: no request can wedge ``formtax serve``, fail another client's request, or get a
500; each reproduction from the review, over the fake backend."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from formtax.serve.schema import MAX_BODY_DEPTH
from tests.probes import health_while

M = [{"role": "user", "content": "hi"}]
REDOS = "^(\\w+\\s?)*$"  # exponential for Python's re on 40 letters and a "!"


def _post(srv, body, timeout=60.0) -> httpx.Response:
    return httpx.post(srv.url + "/chat/completions", content=json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=timeout)


def _schema_request(schema):
    return {"messages": M, "max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": schema}}}


REDOS_SCHEMAS = {
    "not-pattern": {"type": "object", "required": ["s"], "additionalProperties": False, "properties": {
        "s": {"type": "string", "pattern": "^[a-z]{40}!$", "not": {"pattern": REDOS}}}},
    "patternProperties": {"type": "object", "required": ["s"], "properties": {"s": {
        "type": "object", "required": ["k"], "properties": {"k": {"type": "string", "pattern": "^[a-z]{40}!$"}},
        "patternProperties": {"(a|aa)+$": {"type": "integer"}}}}},
    "propertyNames": {"type": "object", "required": ["s"], "additionalProperties": False, "properties": {
        "s": {"type": "object", "propertyNames": {"not": {"pattern": REDOS}},
              "required": ["aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"],
              "properties": {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!": {"type": "integer"}},
              "additionalProperties": False}}},
}


@pytest.mark.parametrize("name", sorted(REDOS_SCHEMAS))
def test_a_redos_schema_is_answered_quickly_while_health_answers(srv, name):
    t0 = time.perf_counter()
    r, waits = health_while(srv, lambda: _post(srv, _schema_request(REDOS_SCHEMAS[name])))
    assert time.perf_counter() - t0 < 10
    assert max(waits) < 1.0, waits
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["formtax"]["parse_ok"], body  # decided by RE2 after the backtracking engine's bound


def test_an_undecidable_check_is_flagged_not_hung(srv):
    """A pattern that backtracks and that no linear engine takes (a backreference): the check is reported
    unchecked (the ``formtax`` object, a header and the metrics), within the bound."""
    schema = {"type": "object", "required": ["s"], "additionalProperties": False, "properties": {
        "s": {"type": "string", "pattern": "^a{40}!$", "not": {"pattern": "^(a|aa)+\\1$"}}}}
    t0 = time.perf_counter()
    r = _post(srv, _schema_request(schema))
    assert time.perf_counter() - t0 < 10
    assert r.status_code == 200
    ext = r.json()["choices"][0]["formtax"]
    assert "could not be checked" in ext["unchecked"]
    assert r.headers.get("x-formtax-answer-unchecked") == "1"
    metrics = httpx.get(srv.url.removesuffix("/v1") + "/metrics").text
    assert "formtax:oracle_unchecked_total" in metrics


def test_a_seed_past_int64_is_a_400_and_the_request_beside_it_completes(srv):
    bodies = [{"messages": M, "max_tokens": 8, "seed": 2**64, "temperature": 1.0},
              {"messages": M, "max_tokens": 8, "seed": 2**64 - 1, "n": 2, "temperature": 1.0},
              {"messages": M, "max_tokens": 8, "temperature": 0.0}]
    with ThreadPoolExecutor(3) as pool:
        rs = list(pool.map(lambda b: _post(srv, b), bodies))
    assert [r.status_code for r in rs] == [400, 400, 200]
    assert rs[0].json()["error"]["param"] == "seed"


def test_the_last_int64_seed_with_n_2_samples_both_choices(srv):
    r = _post(srv, {"messages": M, "max_tokens": 8, "seed": 2**63 - 1, "n": 2, "temperature": 1.0})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2


def test_a_row_whose_policy_raises_fails_its_request_alone(srv, monkeypatch):
    """A fault while stepping one row (its policy raises) fails that request with a 500 in OpenAI's shape that
    echoes no exception; a request decoding beside it completes."""
    from formtax.decoding import policies

    real = policies.ConstrainedPolicy.advance

    def advance(self, token):
        if getattr(self.matcher, "grammar", "").find("boom") >= 0:
            raise RuntimeError("secret internal detail")
        return real(self, token)

    monkeypatch.setattr(policies.ConstrainedPolicy, "advance", advance)
    bad = {"messages": M, "max_tokens": 30, "formtax": {"answer": "regex:boom[a-z]+"}}
    good = {"messages": M, "max_tokens": 30, "formtax": {"answer": "regex:ok[a-z]+"}}
    with ThreadPoolExecutor(4) as pool:
        rs = list(pool.map(lambda b: _post(srv, b), [bad, good, good, bad]))
    assert [r.status_code for r in rs] == [500, 200, 200, 500]
    err = rs[0].json()["error"]
    assert err["type"] == "server_error" and "secret" not in err["message"] and "RuntimeError" not in err["message"]
    assert all(r.json()["choices"][0]["formtax"]["parse_ok"] for r in rs[1:3])


def test_1500_tools_keep_health_answering(srv):
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
        "additionalProperties": False}}} for i in range(1500)]
    body = {"messages": M, "max_tokens": 40, "tools": tools, "tool_choice": "required"}
    assert len(json.dumps(body)) > 250_000
    r, waits = health_while(srv, lambda: _post(srv, body, timeout=120))
    assert max(waits) < 1.0, waits
    assert r.status_code in (200, 400), r.text


def _nest(depth):
    s = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}}
    return s


MALFORMED = {
    "logit_bias": {"messages": M, "max_tokens": 2, "logit_bias": {"²": 5}},
    "logit_bias out of vocabulary": {"messages": M, "max_tokens": 2, "logit_bias": {"999999": 5}},
    "logit_bias value": {"messages": M, "max_tokens": 2, "logit_bias": {"5": 101}},
    "guided_json": {"messages": M, "max_tokens": 2, "guided_json": "{not json"},
    "tool_calls": {"messages": [{"role": "assistant", "tool_calls": ["x"]}, *M], "max_tokens": 2},
    "function_call": {"messages": [{"role": "assistant", "function_call": 3}, *M], "max_tokens": 2},
    "content": {"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 2},
    "properties": {"messages": M, "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a\ud800": {"type": "integer"}}}}}},
    "nested": {"messages": M, "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _nest(100)}}},
    "seed": {"messages": M, "max_tokens": 2, "seed": -(2**63) - 1, "temperature": 1.0},
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
def test_each_malformed_field_is_a_400_naming_it(srv, field):
    r = _post(srv, MALFORMED[field])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert field.split()[0] in err["message"], err
    assert "Error:" not in err["message"] and "Traceback" not in err["message"]


def test_the_depth_limit_leaves_every_schema_the_engine_takes():
    """The grammar engine refuses schemas past about 80 levels itself: the body limit refuses none it takes."""
    from formtax.constraints.native import as_constraint
    from formtax.errors import ConstraintError

    deepest_taken = 0
    for depth in range(40, 100, 4):
        try:
            as_constraint(_nest(depth)).check()
            deepest_taken = depth
        except ConstraintError:
            break
    assert 2 * deepest_taken + 8 < MAX_BODY_DEPTH


def test_json_object_never_repeats_a_key_over_http():
    """The review's repro (``{"Ava": 18, "Lena": 19, "Lena": 20}``): a model that wants to repeat a key cannot."""
    from formtax.backends.fake import FakeBackend, scripted
    from formtax.serve.app import ServerThread, create_app

    app = create_app(FakeBackend(scripted('{"Ava": 18, "Lena": 19, "Lena": 20}')), temperature=0.0)
    with ServerThread(app) as server:
        r = _post(server, {"messages": M, "max_tokens": 40, "response_format": {"type": "json_object"}})
    choice = r.json()["choices"][0]
    pairs = json.loads(choice["message"]["content"], object_pairs_hook=lambda p: p)
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    assert choice["formtax"]["parse_ok"] and choice["finish_reason"] in ("stop", "length")


def test_a_streamed_row_that_faults_ends_its_stream_alone(srv, monkeypatch):
    from formtax.decoding import policies

    real = policies.ConstrainedPolicy.advance
    calls = {"n": 0}

    def advance(self, token):
        if getattr(self.matcher, "grammar", "").find("boom") >= 0:
            calls["n"] += 1
            if calls["n"] > 3:  # after a few tokens have streamed
                raise RuntimeError("secret internal detail")
        return real(self, token)

    monkeypatch.setattr(policies.ConstrainedPolicy, "advance", advance)
    bad = {"messages": M, "max_tokens": 30, "stream": True, "formtax": {"answer": "regex:boom[a-z]{10,20}"}}
    good = {"messages": M, "max_tokens": 30, "formtax": {"answer": "regex:ok[a-z]+"}}
    with ThreadPoolExecutor(2) as pool:
        rb, rg = list(pool.map(lambda b: _post(srv, b), [bad, good]))
    assert rg.status_code == 200 and rg.json()["choices"][0]["formtax"]["parse_ok"]
    assert "secret" not in rb.text and "RuntimeError" not in rb.text
    if rb.status_code == 200:  # the stream had started: an error chunk ends it
        assert '"type": "server_error"' in rb.text or '"type":"server_error"' in rb.text
    else:
        assert rb.status_code == 500


def test_an_equal_key_batch_isolates_the_job_that_faults(monkeypatch):
    """Strategies that batch by equal settings (suffix-*, nl2format): a batch that fails is run job by job, so
    only the faulty job fails."""
    from formtax.backends.fake import FakeBackend, random_logits
    from formtax.serve import batcher as batcher_mod

    real = batcher_mod.run_jobs

    def run_jobs(backend, jobs):
        if any("boom" in str(j.prompt) for j in jobs):
            raise RuntimeError("boom")
        return real(backend, jobs)

    monkeypatch.setattr(batcher_mod, "run_jobs", run_jobs)
    b = batcher_mod.Batcher(FakeBackend(random_logits(seed=0)), window_s=0.2)
    try:
        kw = {"strategy": "suffix-last", "answer": "The answer is: {int:0..9}", "max_tokens": 40, "temperature": 0.0}
        jobs = [b.submit(p, ("k",), 0, None, **kw) for p in ("fine", "boom", "also fine")]
        outcomes = [j.future.exception(timeout=120) for j in jobs]
    finally:
        b.close()
    assert [o is None for o in outcomes] == [True, False, True]
    assert b.batches[0] == 3  # they did share a batch first
