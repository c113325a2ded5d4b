"""The ``openai`` backend against a real vLLM OpenAI-compatible server on 127.0.0.1 (skipped without vLLM).

The server (``conftest.vllm_server``) runs the embedded default model on a random free port with a bounded
start-up wait and is always shut down. Every strategy the protocol supports runs through it; constrained answers
pass their oracle; the outputs equal the in-process engine's (same engine, same dtype, same token-id prompts).
"""

from __future__ import annotations

import json

import pytest

import formtax
from formtax.constraints.parse import parse_spec
from formtax.errors import CapabilityError
from formtax.records import read_records
from formtax.runner import RunConfig, run
from formtax.strategies.base import Request
from formtax.strategies.basic import Json

pytest.importorskip("vllm.sampling_params")  # not bare "vllm": under pytest that can be this test folder
pytestmark = [pytest.mark.vllm, pytest.mark.model]

PROMPTS = [
    [{"role": "user", "content": "What is 7 + 5? Answer with a number."}],
    [{"role": "user", "content": "Name a primary color."}],
]
SUPPORTED = [
    ("free", None, {}),
    ("short", None, {}),
    ("constrained", "The answer is: {int}", {}),
    ("constrained", "{choice:red|blue|yellow}", {}),
    ("json", "{int}", {}),
    ("inwriting", "The answer is: {int}", {}),
    ("inwriting", "The answer is: {int}", {"reasoning": "Let's think step by step."}),
    ("nl2format", "The answer is: {int}", {}),
]


@pytest.mark.parametrize(("strategy", "spec", "kw"), SUPPORTED)
def test_every_supported_strategy_through_the_server(server_backend, vllm_backend, strategy, spec, kw):
    got = formtax.generate_batch(server_backend, PROMPTS, strategy, spec, max_tokens=56, **kw)
    if strategy == "json":  # a server takes the escape-free whole-output JSON grammar: decode that grammar in-process
        whole = Json().effective_constraint(Request("", parse_spec(spec), max_tokens=56), escapes=False)
        ref = formtax.generate_batch(vllm_backend, PROMPTS, "constrained", whole, max_tokens=56, **kw)
    else:  # a server takes whole-output calls, so closing is off there: the reference runs with it off too
        ref = formtax.generate_batch(vllm_backend, PROMPTS, strategy, spec, max_tokens=56, closing=False, **kw)
    for g, r in zip(got, ref, strict=True):
        assert g.error is None, g
        assert g.stats["server"] == server_backend.client.base and g.model == server_backend.model_id
        if spec is not None and strategy != "json":
            assert parse_spec(spec).validate(g.answer_text).ok or strategy in ("free", "short")
        if strategy not in ("free", "short"):
            assert g.parse_ok, g.answer_text
            if strategy == "json":  # the flexible layout's first set (whitespace + "{") exceeds EXACT_IDS_MAX
                assert g.stats["masked_mass_exact"] is False
                lo, hi = g.stats["masked_mass_bounds"]
                assert lo - 1e-3 <= r.masked_mass <= hi + 1e-3 and g.masked_mass == lo
            else:
                assert g.stats["masked_mass_exact"] is True  # the allowed set was small: logprob_token_ids
                assert g.masked_mass == pytest.approx(r.masked_mass, abs=1e-3)
        # the same engine and dtype behind the server: the same tokens as in-process
        assert g.token_ids == r.token_ids, (g.text, r.text)
        assert (g.finish_reason, g.phases, g.stats.get("switch_step")) == (
            r.finish_reason, r.phases, r.stats.get("switch_step"))


def test_unsupported_strategies_are_refused_with_the_reason(server_backend):
    with pytest.raises(CapabilityError, match="trigger"):
        formtax.generate(server_backend, PROMPTS[0], "inwriting", "The answer is: {int}", max_tokens=64,
                         triggers=["."])
    with pytest.raises(CapabilityError, match="logits of every step"):
        formtax.generate(server_backend, PROMPTS[1], "short", "choice:red|blue|yellow", max_tokens=16)


def test_a_resumable_run_through_the_server(vllm_server, tmp_path):
    url = vllm_server[0]
    cfg = RunConfig(task="arith", strategies=["constrained", "inwriting"], limit=2, max_tokens=56, batch_size=2,
                    backend="openai", backend_options={"server": url})
    s = run(cfg, tmp_path)
    recs = read_records(tmp_path / "records.jsonl")
    assert s.done == len(recs) == 4 and s.errors == 0
    assert all(r.model.endswith(f"@ {url}") for r in recs)
    assert all(r.constraint_ok for r in recs)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["backend"]["server"] == url and manifest["backend"]["flavor"] == "vllm"
    assert run(cfg, tmp_path).done == 0  # resumed: nothing left to do
