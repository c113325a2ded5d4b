"""The openai backend against a scripted OpenAI-compatible server on 127.0.0.1 (no vLLM needed, seconds).

The scripted server speaks the subset of vLLM's completions protocol the backend uses (token-id prompts and
outputs, ``structured_outputs``, ``logprobs``) and misbehaves on demand: it can ignore constraints, answer 503,
hang past the client's timeout, or die mid-run. Every fault must end in a clear error or a recorded constraint
failure, never in a silently wrong record; a run stopped by a dead server must resume to completion.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import formtax
from formtax.backends import load_backend
from formtax.backends.openai_backend import ServerRefused, ServerUnavailable
from formtax.constraints.parse import parse_spec
from formtax.errors import CapabilityError, ConfigError, FormtaxError
from formtax.records import read_records
from formtax.runner import RunConfig, run
from formtax.strategies.reserve import answer_reserve

pytestmark = pytest.mark.model  # the default model's tokenizer (no weights are run)

Q = [{"role": "user", "content": "What is 7 + 5?"}]
REASONING = "Let me think. 7 + 5 = 12."
ANSWER = "The answer is: 12"


class Script:
    """What the server does; tests change it while the server runs."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.eos = min(tok.eos_ids)
        self.lie = False  # ignore structured_outputs
        self.fail_first = 0  # answer 503 to this many completion requests first
        self.die_after: int | None = None  # stop serving after this many completions
        self.hang_s = 0.0
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    def completion(self, body: dict) -> tuple[int, dict]:
        with self.lock:
            self.bodies.append(body)
            n = len(self.bodies)
        if n <= self.fail_first:
            return 503, {"error": "overloaded"}
        if self.hang_s:
            time.sleep(self.hang_s)
        if body.get("logprobs") is not None:  # a masked-mass probe: 60% on "The" (allowed), the rest elsewhere
            the = self.tok.encode("The")[0]
            other = self.tok.encode("Let")[0]
            top = {f"token_id:{the}": math.log(0.6), f"token_id:{other}": math.log(0.3)}
            ids = body.get("logprob_token_ids")
            if ids:  # the exact form: the log-probs of exactly the allowed ids
                top = {f"token_id:{i}": (math.log(0.6) if i == the else -30.0) for i in ids}
            return 200, self._choice([the], "length", {"top_logprobs": [top]})
        grammar = body.get("structured_outputs")
        text = ANSWER if grammar and not self.lie else (REASONING if not grammar else "I think it is 12")
        ids = self.tok.encode(text)[: body["max_tokens"]]
        finish = "length" if len(ids) == body["max_tokens"] else "stop"
        return 200, self._choice(ids + ([self.eos] if finish == "stop" else []), finish)

    def _choice(self, ids: list[int], finish: str, logprobs: dict | None = None) -> dict:
        return {"choices": [{"text": self.tok.decode(ids), "token_ids": ids, "finish_reason": finish,
                             "logprobs": logprobs}], "model": "scripted"}


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout test)
                    pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "scripted"}]})
                elif self.path == "/version":
                    self._send(200, {"version": "scripted-vllm"})
                else:
                    self._send(404, {"error": "no such path"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                code, payload = outer.script.completion(body)
                self._send(code, payload)
                s = outer.script
                if s.die_after is not None and len(s.bodies) >= s.die_after:
                    threading.Thread(target=outer.stop, daemon=True).start()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tok(default_model):
    return default_model.tokenizer


@pytest.fixture
def fake_vllm(tok):
    s = ScriptedServer(Script(tok))
    try:
        yield s
    finally:
        s.stop()


def probes_and_calls(bodies: list[dict]) -> tuple[list[dict], list[dict]]:
    """The masked-mass probes and the generation calls, each in the order sent.

    Probes travel in the same concurrent pool as the generation requests, so their order relative to a call
    sent alongside is not fixed; a probe is the request that asks for log-probs.
    """
    probes = [b for b in bodies if b.get("logprobs") is not None]
    return probes, [b for b in bodies if b.get("logprobs") is None]


def connect(fake_vllm, **kw):
    return load_backend("openai", None, server=fake_vllm.url, retries=kw.pop("retries", 2), backoff=0.01, **kw)


def test_strategies_compile_into_the_expected_requests(fake_vllm):
    m = connect(fake_vllm)
    assert m.flavor == "vllm" and m.model_id == f"scripted @ {fake_vllm.url}"
    r = formtax.generate(m, Q, "constrained", "The answer is: {int}", max_tokens=40)
    [probe], [call] = probes_and_calls(fake_vllm.script.bodies)
    assert probe["max_tokens"] == 1 and probe["logprob_token_ids"]  # the exact masked-mass probe
    assert call["structured_outputs"]["grammar"].startswith("start:") and "guided_choice" not in call
    assert call["prompt"] == m.tokenizer.prompt_ids(Q)  # token ids: byte-identical to the in-process prompt
    assert r.parse_ok and r.parsed == 12 and r.answer_text == ANSWER
    assert r.masked_mass == pytest.approx(0.4) and r.stats["masked_mass_exact"] is True
    assert r.stats["server"] == fake_vllm.url and r.model == m.model_id


def test_inwriting_is_a_free_call_then_a_constrained_continuation(fake_vllm):
    m = connect(fake_vllm)
    r = formtax.generate(m, Q, "inwriting", "The answer is: {int}", max_tokens=80)
    [_probe], [free, cont] = probes_and_calls(fake_vllm.script.bodies)
    pre = m.tokenizer.encode(REASONING)
    budget = 80 - answer_reserve(parse_spec("The answer is: {int}"))
    assert "structured_outputs" not in free and free["max_tokens"] == budget + 1  # tells EOS from the budget
    assert cont["prompt"] == m.tokenizer.prompt_ids(Q) + pre  # the very sequence the single pass decodes
    assert r.stats["switch_reason"] == "eos" and r.stats["switch_step"] == len(pre)
    assert r.phases["reasoning"] == REASONING and r.answer_text == ANSWER and r.parse_ok


def test_sampled_inwriting_switches_on_the_free_calls_drawn_eos(fake_vllm):
    """The sampled rule: the free call samples at the request's temperature and stops at a drawn EOS/PAD."""
    m = connect(fake_vllm)
    r = formtax.generate(m, Q, "inwriting", "The answer is: {int}", max_tokens=80, temperature=0.7, seed=3)
    [_probe], [free, cont] = probes_and_calls(fake_vllm.script.bodies)
    assert free["temperature"] == pytest.approx(0.7) and cont["temperature"] == pytest.approx(0.7)
    assert r.stats["switch_reason"] == "eos" and r.parse_ok


def test_top_k_only_masked_mass_is_a_labelled_bound(tok):
    s = ScriptedServer(Script(tok))
    try:
        m = load_backend("openai", None, server=s.url, flavor="vllm", retries=0)
        import formtax.backends.openai_backend as ob

        old, ob.EXACT_IDS_MAX = ob.EXACT_IDS_MAX, 0  # as if the allowed set were too large to ask for
        try:
            r = formtax.generate(m, Q, "constrained", "The answer is: {int}", max_tokens=40)
        finally:
            ob.EXACT_IDS_MAX = old
        assert r.stats["masked_mass_exact"] is False
        lo, hi = r.stats["masked_mass_bounds"]
        assert r.masked_mass == pytest.approx(0.3) and lo == pytest.approx(0.3) and hi == pytest.approx(0.4)
        assert r.stats["masked_mass_topk_coverage"] == pytest.approx(0.9)
    finally:
        s.stop()


def test_a_server_that_ignores_the_constraint_is_a_recorded_constraint_failure(fake_vllm, tmp_path):
    fake_vllm.script.lie = True
    m = connect(fake_vllm)
    r = formtax.generate(m, Q, "constrained", "The answer is: {int}", max_tokens=40)
    assert r.finish_reason == "constraint-error" and not r.parse_ok and r.parsed is None
    assert r.stats["constraint_ignored"] is True and "I think it is 12" in r.stats["server_text"]
    s = run(RunConfig(task="arith", strategies=["constrained"], limit=3, batch_size=3, backend="openai",
                      backend_options={"server": fake_vllm.url}), tmp_path, backend=m)
    recs = read_records(tmp_path / "records.jsonl")
    assert s.done == 3 and len(recs) == 3
    for rec in recs:  # never scored as parsed, whatever the parsers would read in the text
        assert rec.constraint_ok is False
        assert all(p.status == "invalid" for p in rec.parses.values())
        assert not any(rec.scores.values())


def test_5xx_is_retried(fake_vllm):
    fake_vllm.script.fail_first = 2
    m = connect(fake_vllm, retries=3)
    r = formtax.generate(m, Q, "free", None, max_tokens=40)
    assert r.text == REASONING and len(fake_vllm.script.bodies) == 3


def test_unreachable_server_fails_at_once_with_the_reason(fake_vllm):
    url = fake_vllm.url
    fake_vllm.stop()
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="unreachable after 2 tries.*is the server running"):
        load_backend("openai", None, server=url, retries=1, backoff=0.01)
    assert time.perf_counter() - t < 10


def test_a_hanging_server_times_out(fake_vllm):
    m = connect(fake_vllm, timeout=0.5, retries=1)
    fake_vllm.script.hang_s = 2.0
    with pytest.raises(ServerUnavailable):
        formtax.generate(m, Q, "free", None, max_tokens=40)


def test_unsupported_strategies_are_refused_before_any_request(fake_vllm):
    m = connect(fake_vllm)
    with pytest.raises(CapabilityError, match="trigger"):
        formtax.generate(m, Q, "inwriting", "The answer is: {int}", max_tokens=80, triggers=["."])
    with pytest.raises(CapabilityError, match="logits of every step"):  # a statistics wrapper (first-token mass)
        formtax.generate(m, Q, "short", "choice:red|blue", max_tokens=8)
    assert fake_vllm.script.bodies == []


def test_a_generic_server_gets_no_constrained_strategy(fake_vllm):
    m = connect(fake_vllm, flavor="generic")
    with pytest.raises(CapabilityError, match="grammar parameter"):
        formtax.generate(m, Q, "constrained", "The answer is: {int}", max_tokens=40)
    r = formtax.generate(m, Q, "free", None, max_tokens=40)  # text prompt, text output, re-tokenized
    assert isinstance(fake_vllm.script.bodies[-1]["prompt"], str) and r.text == REASONING


def test_client_errors_are_that_requests_error(fake_vllm):
    m = connect(fake_vllm)
    fake_vllm.script.completion = lambda body: (400, {"error": "bad grammar"})  # type: ignore[method-assign]
    with pytest.raises(ServerRefused, match="400"):
        formtax.generate(m, Q, "free", None, max_tokens=40)


def test_a_server_dying_mid_run_stops_the_run_and_the_run_resumes(tok, tmp_path):
    dying = ScriptedServer(Script(tok))
    dying.script.die_after = 4  # two chunks of two requests, then gone
    cfg = RunConfig(task="arith", strategies=["free"], limit=8, batch_size=2, backend="openai",
                    backend_options={"server": dying.url, "retries": 1, "backoff": 0.01})
    try:
        with pytest.raises(FormtaxError, match="re-run the same command to resume"):
            run(cfg, tmp_path)
    finally:
        dying.stop() if dying.thread.is_alive() else None
    before = (tmp_path / "records.jsonl").read_bytes()
    assert before.count(b"\n") == 4
    assert json.loads((tmp_path / "manifest.json").read_text())["status"] == "failed"
    healthy = ScriptedServer(Script(tok))
    try:
        cfg.backend_options = {"server": healthy.url}  # another server: not part of the run's identity
        s = run(cfg, tmp_path)
    finally:
        healthy.stop()
    after = (tmp_path / "records.jsonl").read_bytes()
    assert after.startswith(before)
    recs = read_records(tmp_path / "records.jsonl")
    assert s.skipped == 4 and s.done == 4 and len({r.request_id for r in recs}) == len(recs) == 8
    assert {r.model for r in recs} == {f"scripted @ {dying.url}", f"scripted @ {healthy.url}"}


def test_the_cli_names_an_unreachable_server(fake_vllm, tmp_path, capsys):
    from formtax.cli.main import main

    url = fake_vllm.url
    fake_vllm.stop()
    rc = main(["run", "--task", "arith", "--strategies", "free", "--limit", "2", "--backend", "openai",
               "--server", url, "--engine-opt", "retries=0", "--out", str(tmp_path / "run")])
    assert rc == 2 and url in capsys.readouterr().err


def test_a_local_server_computes_on_every_core_unless_told_otherwise(monkeypatch):
    """serve()'s environment on CPUs: the engine's threads bound to every core this process may use (vLLM's own
    default reserves one for its API process), and a variable the user set is kept."""
    import os

    from formtax.backends.vllm.backend import _server_cpu_env

    for k in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(k, raising=False)
    cores = sorted(os.sched_getaffinity(0))
    env = _server_cpu_env(cpu=True)
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["OMP_NUM_THREADS"] == str(len(cores))
    assert [int(c) for c in env["VLLM_CPU_OMP_THREADS_BIND"].split(",")] == cores
    assert "OMP_NUM_THREADS" not in _server_cpu_env(cpu=False)  # a GPU server keeps vLLM's defaults
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _server_cpu_env(cpu=True)["OMP_NUM_THREADS"] == "1"
