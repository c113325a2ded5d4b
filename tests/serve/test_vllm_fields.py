"""Issue 48 point 5: vLLM's request fields in ``formtax serve`` (formtax/serve/vllm_fields.py), each mapped to its
formtax equivalent and checked against its oracle: a client script written for ``vllm serve`` runs unchanged;
``repetition_penalty`` follows vLLM's rule on the model's own logits; ``min_tokens`` holds EOS back;
``chat_template_kwargs`` reach the template; fields with no equivalent say what to use. Also point 2's malformed
body and the completions' context ``param``."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from formtax.backends.fake import EOS, FakeBackend, random_logits, scripted  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402
from formtax.serve.hooks import Hooked, RequestHooks  # noqa: E402

USER = [{"role": "user", "content": "Say something."}]
SCRIPT = Path(__file__).parent / "clients" / "vllm_structured_outputs.py"


@pytest.fixture(scope="module")
def srv(start_fake_server):
    return start_fake_server(11, backend={"model_id": "fake", "context": 4096}, window_s=0.0, temperature=0.0,
                             timeout_s=60)


def _post(s: ServerThread, **body):
    return httpx.post(s.url + "/chat/completions", json={"messages": USER, "max_tokens": 60, **body}, timeout=60)


def test_a_vllm_client_script_runs_unchanged(srv):
    env = {**os.environ, "OPENAI_BASE_URL": srv.url, "MODEL": "fake"}
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1])["choice"] in ("yes", "no")


@pytest.mark.parametrize("seed", range(3))
def test_each_guided_field_is_its_constraint(srv, seed):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    cases = [({"guided_json": schema}, lambda t: jsonschema.validate(json.loads(t), schema)),
             ({"guided_json": json.dumps(schema)}, lambda t: jsonschema.validate(json.loads(t), schema)),
             ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t) or 1 / 0),
             ({"guided_choice": ["red", "green"]}, lambda t: t in ("red", "green") or 1 / 0),
             ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(json.loads(t), dict) or 1 / 0),
             ({"guided_grammar": 'start: "a" B\nB: /[0-9]+/'}, lambda t: re.fullmatch("a[0-9]+", t) or 1 / 0)]
    for body, check in cases:
        r = _post(srv, temperature=1.0, seed=seed, **body)
        assert r.status_code == 200, (body, r.text)
        check(r.json()["choices"][0]["message"]["content"])
        completion = httpx.post(srv.url + "/completions", json={"prompt": "x", "max_tokens": 60, "seed": seed,
                                                                "temperature": 1.0, **body}, timeout=60)
        check(completion.json()["choices"][0]["text"])


def test_top_k_and_min_p_filter_the_draw(srv):
    """top_k=1 is greedy whatever the temperature (vLLM's -1 and 0 are off); min_p=0.999 keeps the top token only."""
    greedy = _post(srv, temperature=0.0).json()["choices"][0]["message"]["content"]
    for extra in ({"top_k": 1}, {"min_p": 0.999}):
        got = [_post(srv, temperature=1.5, seed=s, **extra).json()["choices"][0]["message"]["content"]
               for s in range(3)]
        assert got == [greedy] * 3, extra
    off = {_post(srv, temperature=1.5, seed=s, top_k=-1).json()["choices"][0]["message"]["content"]
           for s in range(3)}
    assert len(off) > 1


def test_repetition_penalty_is_vllms_rule():
    """The scores a row chooses from are the model's logits with every prompt or output token's positive score
    divided by the penalty and its negative one multiplied (computed here from the logits, not from the hook)."""
    fn = random_logits(seed=2)
    backend = FakeBackend(fn)
    hooks = RequestHooks(repetition=1.7, prompt_ids=(65, 66, 300))

    class Free:
        coupled = False
        phase = "free"

        def plan(self, logits, step):
            from formtax.decoding.plan import Plan
            return Plan()

        def advance(self, token):
            return None

    row = Hooked(Free(), hooks, backend.tokenizer)
    row.advance(70)
    logits = fn([1, 2, 3])
    plan = row.plan(logits, 1)
    want = logits.clone()
    for t in (65, 66, 70):
        want[t] = logits[t] / 1.7 if logits[t] > 0 else logits[t] * 1.7
    assert torch.equal(plan.scores, want)


def test_min_tokens_holds_eos_back():
    app = create_app(FakeBackend(scripted("Hi.")), window_s=0.0, temperature=0.0)
    with ServerThread(app) as s:
        short = _post(s, model="fake-random").json()
        held = _post(s, model="fake-random", min_tokens=10).json()
        refused = _post(s, model="fake-random", min_tokens=10, guided_choice=["a", "b"])
    assert short["choices"][0]["message"]["content"] == "Hi." and short["usage"]["completion_tokens"] == 4
    assert held["usage"]["completion_tokens"] >= 10 and EOS not in held["formtax"]["token_ids"][:10]
    assert refused.status_code == 400 and "free text" in refused.json()["error"]["message"]


def _own_template(template: str) -> FakeBackend:
    """A fake backend whose tokenizer is its own copy (the byte tokenizer is shared and cached) with ``template``."""
    backend = FakeBackend(random_logits(seed=11), model_id="fake", context=4096)
    hf = copy.deepcopy(backend.tokenizer.hf)
    hf.chat_template = template
    backend._tok = dataclasses.replace(backend.tokenizer, hf=hf)
    return backend


def test_chat_template_kwargs_reach_the_template():
    """A template that reads none of them renders what it renders without them; one that reads one renders it
    (the prompt token count moves by the text it adds)."""
    from formtax.bytetok import CHAT_TEMPLATE

    for template, moved in ((CHAT_TEMPLATE, 0), ("{% if note %}NOTE:{{ note }}\n{% endif %}" + CHAT_TEMPLATE,
                                                 len("NOTE:abc\n"))):
        app = create_app(_own_template(template), window_s=0.0, temperature=0.0)
        with ServerThread(app) as s:
            plain = _post(s).json()
            noted = _post(s, chat_template_kwargs={"note": "abc", "enable_thinking": False}).json()
        assert noted["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + moved
        if not moved:
            assert noted["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


@pytest.mark.parametrize(("field", "needle"), [("use_beam_search", "suffix-min"), ("stop_token_ids", "use stop"),
                                               ("guided_whitespace_pattern", "one spacing")])
def test_fields_without_an_equivalent_say_what_to_use(srv, field, needle):
    r = _post(srv, **{field: True})
    assert r.status_code == 400 and needle in r.json()["error"]["message"] and r.json()["error"]["param"] == field


def test_malformed_bodies_and_params(srv):
    bad = httpx.post(srv.url + "/chat/completions", content=b'{"messages": [', headers={
        "content-type": "application/json"})
    err = bad.json()["error"]
    assert bad.status_code == 400 and "not valid JSON" in err["message"] and err["param"] is None
    two = _post(srv, guided_choice=["a"], guided_regex="a")
    assert two.status_code == 400 and "one guided format" in two.json()["error"]["message"]
    long = httpx.post(srv.url + "/completions", json={"prompt": "x" * 5000, "max_tokens": 10})
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"
