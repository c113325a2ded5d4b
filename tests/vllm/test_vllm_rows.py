"""The vLLM backend's row machinery on a simulated engine (no vLLM needed, milliseconds).

``SimVLLM`` is the real :class:`VLLMBackend` with only its two engine touch points (``_params``, ``_generate``)
replaced by a small engine with vLLM's semantics over the fake model: a grammar masks the row *before* the logits
processor sees it, live rows are stepped exactly as ``EngineRowProcessor.apply`` steps them, greedy picks the
argmax, a stop token ends a request (and stays in its output), a stop string ends it as vLLM's detokenizer does
(tests/vllm/sim_stops.py), ``max_tokens`` caps it, and a call's sinks get each token as it is taken. Every strategy
must then give the very results the decode loop gives on the same fake model: that is the backend's contract.
"""

from __future__ import annotations

import llguidance
import pytest
import torch

import formtax
from formtax.backends.fake import FakeBackend, random_logits, scripted
from formtax.backends.vllm.backend import VLLMBackend
from formtax.backends.vllm.logits_processor import EngineRow
from formtax.backends.vllm.plugin import EngineSide, build_row
from formtax.constraints.compile import compile_grammar
from formtax.constraints.parse import parse_spec
from formtax.decoding.engine import Capability
from formtax.decoding.loop import RowRequest
from formtax.decoding.policies import ConstrainedPolicy, ForcedPrefix, FreePolicy
from formtax.decoding.rowengine import lark_grammar, lower_row, replay
from formtax.errors import CapabilityError, ConfigError
from tests.vllm.sim_stops import SimStops

Q = [[{"role": "user", "content": "What is 2+3?"}], [{"role": "user", "content": "Name a color."}],
     [{"role": "user", "content": "Count to three."}]]
SCRIPT = "Let me think. 2+3=5.\nThe answer is: 5"


class SimVLLM(VLLMBackend):
    """VLLMBackend over a simulated engine (see the module docstring). ``lie``: ignore every grammar, and with
    ``"processor"`` also every edit of formtax's processor."""

    def __init__(self, fn, lie: bool | str = False) -> None:
        fake = FakeBackend(fn)
        super().__init__(llm=None, tok=fake.tokenizer, model_id="sim-vllm")
        self.fn = fn
        self.lie = lie
        self.calls: list[int] = []
        self.probes: list[int] = []
        self.live_rows = 0

    def _params(self, sampling, seed, max_tokens, stop_ids, grammar=None, extra_args=None, stops=()):
        return {"max_tokens": max_tokens, "stop_ids": stop_ids, "grammar": grammar, "extra_args": extra_args,
                "sampling": sampling, "seed": seed, "stops": list(stops)}

    def _score_first(self, prompts, ids):
        """vLLM's raw log-probs of the first position (the mass probe of a grammar row)."""
        self.probes.append(len(prompts))
        return [{i: float(torch.log_softmax(self.fn(list(p)).double(), -1)[i]) for i in want}
                for p, want in zip(prompts, ids, strict=True)]

    def _generate(self, prompts, params, sinks=None):
        self.calls.append(len(prompts))
        self.live_rows += sum(1 for p in params if p["extra_args"])
        outs = []
        for k, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            seq, out, finish = list(prompt), [], "length"
            sink = sinks[k] if sinks else None
            # vLLM detokenizes a request with stop strings (only), skipping special tokens as the backend asks
            text = SimStops(self.tokenizer, prompt, p["stops"]) if p["stops"] else None
            # formtax's plugin builds the row from its recipe, as inside vLLM's engine
            live = build_row(EngineSide(self.tokenizer, "sim"), p["extra_args"], prompt, p["sampling"],
                             p["max_tokens"], p["seed"]) if p["extra_args"] else None
            matcher = None
            if p["grammar"] and not self.lie:
                grammar = llguidance.grammar_from("grammar", p["grammar"])  # what vLLM's guidance backend does
                matcher = compile_grammar(grammar, self.tokenizer.engine).matcher(self.tokenizer.n_logits)
            while len(out) < p["max_tokens"]:
                logits = self.fn(seq).float().clone()
                if matcher is not None:
                    logits[~matcher.allowed_mask()] = float("-inf")
                if live is not None:
                    live.catch_up(out)
                    edited = logits.clone()
                    live.apply(edited)
                    if self.lie != "processor":
                        logits = edited
                token = int(torch.argmax(logits))
                out.append(token)
                seq.append(token)
                if sink is not None:
                    sink([token])
                if matcher is not None:
                    matcher.consume(token)
                ended = token in p["stop_ids"]
                if text is not None and text.update(token, ended):
                    break
                if ended:
                    finish = "stop"
                    break
            outs.append((out, text.finish(finish) if text is not None else finish))
        return outs


def same(a, b):
    """Two results of the same request: equal in everything a backend decides."""
    assert a.token_ids == b.token_ids, (a.text, b.text)
    assert (a.text, a.answer_text, a.finish_reason, a.parse_ok, a.parsed) == (
        b.text, b.answer_text, b.finish_reason, b.parse_ok, b.parsed)
    assert a.phases == b.phases
    assert a.tokens.model_dump() == b.tokens.model_dump()
    assert (a.masked_mass is None) == (b.masked_mass is None)
    if a.masked_mass is not None:
        assert a.masked_mass == pytest.approx(b.masked_mass, abs=1e-9)
    for k in ("switch_step", "switch_reason"):
        assert a.stats.get(k) == b.stats.get(k)


CASES = [
    ("free", None, {}),
    ("short", None, {}),
    ("constrained", "The answer is: {int:0..999}", {}),
    ("constrained", "{choice:red|green|blue}", {}),
    ("constrained", "regex:[a-z]{2,5}", {}),
    ("constrained", 'json:{"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}', {}),
    ("json", "{int}", {}),
    ("inwriting", "The answer is: {int}", {}),
    ("nl2format", "The answer is: {int}", {}),
    ("free", None, {"reasoning": "Let's think."}),
    ("constrained", "The answer is: {int}", {"reasoning": "Let's think."}),
    ("inwriting", "The answer is: {int}", {"reasoning": "Let's think."}),
    ("inwriting", "The answer is: {int}", {"constrain": False}),
    ("json", "{int}", {"constrain": False}),
]


@pytest.mark.parametrize("closing", [False, True])
@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize(("strategy", "spec", "kw"), CASES)
def test_every_strategy_matches_the_decode_loop(strategy, spec, kw, seed, closing):
    """With closing mode too: vLLM then runs the rows live, the veto decided inside its logits processor."""
    fn = random_logits(seed=seed)
    ref = formtax.generate_batch(FakeBackend(fn), Q, strategy, spec, max_tokens=60, closing=closing, **kw)
    got = formtax.generate_batch(SimVLLM(fn), Q, strategy, spec, max_tokens=60, closing=closing, **kw)
    for a, b in zip(ref, got, strict=True):
        same(a, b)


@pytest.mark.parametrize("budget", [45, 80, 100])
def test_inwriting_switch_reasons_match_on_a_scripted_model(budget):
    # 45 switches on the preamble budget (45 - the answer reserve < the script), 80/100 where the model wants EOS
    fn = scripted(SCRIPT)
    ref = formtax.generate_batch(FakeBackend(fn), Q[:1], "inwriting", "The answer is: {int:0..9}", max_tokens=budget)
    got = formtax.generate_batch(SimVLLM(fn), Q[:1], "inwriting", "The answer is: {int:0..9}", max_tokens=budget)
    same(ref[0], got[0])
    assert got[0].stats["switch_reason"] == ("budget" if budget == 45 else "eos")


def test_short_with_a_choice_runs_its_statistics_wrapper_live():
    # short + choice wraps its policy (first-token mass): not a plain free row, so it is stepped in the processor
    fn = random_logits(seed=5)
    ref = formtax.generate_batch(FakeBackend(fn), Q, "short", "{choice:red|green|blue}", max_tokens=20)
    sim = SimVLLM(fn)
    got = formtax.generate_batch(sim, Q, "short", "{choice:red|green|blue}", max_tokens=20)
    for a, b in zip(ref, got, strict=True):
        same(a, b)
        assert a.stats.get("first_token_mass") == b.stats.get("first_token_mass")


@pytest.mark.parametrize("spec", ["The answer is: {int:0..999}", "regex:[0-9]{1,3}", "choice:red|green|blue",
                                  'json:{"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"], '
                                  '"additionalProperties": false}'])
def test_grammar_rows_run_on_the_engines_structured_outputs(spec):
    """Issue 56 item 4: a row that needs only its grammar (closing off, or closing provably idle: every completion
    fits, constraints/extent.py) is never stepped by formtax's processor; its first-step masked mass comes from one
    probe, and everything equals the decode loop."""
    fn = random_logits(seed=2)
    for closing in (False, True):
        ref = formtax.generate_batch(FakeBackend(fn), Q, "constrained", spec, max_tokens=40, closing=closing)
        sim = SimVLLM(fn)
        got = formtax.generate_batch(sim, Q, "constrained", spec, max_tokens=40, closing=closing)
        for a, b in zip(ref, got, strict=True):
            same(a, b)
            assert b.masked_mass is not None
        idle = not closing or not spec.startswith(("The", "json"))  # closing may act on an unbounded answer
        assert (sim.live_rows == 0) is idle and (sim.probes == [len(Q)]) is idle, (closing, sim.live_rows)


def test_rows_are_classified_by_their_policy():
    tok = FakeBackend().tokenizer
    c = parse_spec("The answer is: {int}")
    m = compile_grammar(c.grammar, tok.engine).matcher(tok.n_logits)
    free = FreePolicy(tok.eos_ids, tok.newline_ids)
    assert lower_row(RowRequest([1], free, 10), None).kind == "free"
    assert lower_row(RowRequest([1], ForcedPrefix([65, 66], free), 10), None).prefix == [65, 66]
    assert lower_row(RowRequest([1], ConstrainedPolicy(m, tok.eos_ids), 10), c).kind == "grammar"
    assert lower_row(RowRequest([1], ConstrainedPolicy(m, tok.eos_ids), 10), None).kind == "live"
    assert lower_row(RowRequest([1], ForcedPrefix([65] * 10, free), 10), None).kind == "live"  # prefix >= budget


def test_a_json_schema_grammar_becomes_lark_text():
    c = parse_spec('json:{"type": "integer"}')
    assert c.grammar.startswith("{")  # llguidance's JSON envelope, which vLLM's grammar field rejects
    lark = lark_grammar(c)
    assert lark.startswith("start: %json{")
    llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("grammar", lark))


def test_an_engine_that_ignores_the_constraint_is_caught():
    fn = random_logits(seed=1)
    # live rows run in formtax's processor, which forces its tokens: an engine that ignores the grammar parameter
    # changes nothing there
    ref = formtax.generate_batch(FakeBackend(fn), Q, "json", "{int}", max_tokens=80, closing=False)
    got = formtax.generate_batch(SimVLLM(fn, lie=True), Q, "json", "{int}", max_tokens=80, closing=False)
    for a, b in zip(ref, got, strict=True):
        same(a, b)
    # grammar rows go to the engine's structured outputs (issue 56): one that ignores the grammar is caught by the
    # replay, and the result is an error, never an answer outside the constraint
    for strategy in ("constrained", "nl2format"):
        got = formtax.generate_batch(SimVLLM(fn, lie=True), Q, strategy, "The answer is: {int}", max_tokens=80,
                                     closing=False)
        assert all(r.error is not None and not r.parse_ok for r in got), [r.text for r in got]
    # an engine that emits other tokens than the processor forced: the row is refused, never handed over
    with pytest.raises(RuntimeError, match="not the row's|was forced"):
        formtax.generate_batch(SimVLLM(fn, lie="processor"), Q, "constrained", "The answer is: {int}", max_tokens=80)
    # a grammar row the engine decodes by itself (no masked mass measured) is replayed: a token outside the grammar
    # ends it with constraint-error, and the token is never accepted
    tok = FakeBackend(fn).tokenizer
    c = parse_spec("The answer is: {int}")
    m = compile_grammar(c.grammar, tok.engine).matcher(tok.n_logits)
    row = RowRequest([1], ConstrainedPolicy(m, tok.eos_ids, measure=False), 20)
    bad = tok.encode("Nope")
    out = replay(row, bad)
    assert out.finish_reason == "constraint-error" and out.tokens == []
    assert out.events[-1]["stats"] == {"constraint_ignored": True, "rejected_token": bad[0]}


def test_live_row_forces_eos_after_its_policy_finishes():
    tok = FakeBackend().tokenizer
    eos = min(tok.eos_ids)
    live = EngineRow(RowRequest([1, 2], FreePolicy(tok.eos_ids, frozenset({10})), 5), eos, tok.n_logits)
    out: list[int] = []
    for want in (65, 10):  # the policy stops after the newline-like token 10
        logits = torch.zeros(tok.n_logits)
        logits[want] = 5.0
        live.catch_up(out)
        live.apply(logits)
        out.append(int(torch.argmax(logits)))
    logits = torch.zeros(tok.n_logits)
    live.catch_up(out)
    live.apply(logits)
    assert int(torch.argmax(logits)) == eos and live.done
    res = live.finalize([*out, eos], "stop")
    assert res.tokens == [65, 10] and res.finish_reason == "newline"  # the forced EOS is not part of the output


def test_the_backend_refuses_what_it_cannot_run():
    sim = SimVLLM(random_logits())
    assert Capability.KV_CROP not in sim.capabilities
    with pytest.raises(CapabilityError):
        sim.new_batch([[1, 2]])
    from formtax.strategies import list_strategies

    assert "suffix-last" in list_strategies()


@pytest.mark.parametrize(("strategy", "spec"), [("constrained", "The answer is: {int:0..999}"),
                                                ("inwriting", "The answer is: {int}"), ("json", "{int}")])
def test_sampled_live_rows_draw_what_the_loop_draws(strategy, spec):
    # a row from formtax's backend chooses its own tokens inside the engine, from its own seeded generator, with
    # the loop's rule: the same draws as the decode loop on the same logits, not merely the same distribution
    fn = random_logits(seed=4)
    kw = {"max_tokens": 50, "temperature": 0.9, "top_p": 0.95, "seed": 11, "closing": True}
    ref = formtax.generate_batch(FakeBackend(fn), Q, strategy, spec, **kw)
    got = formtax.generate_batch(SimVLLM(fn), Q, strategy, spec, **kw)
    assert len({tuple(r.token_ids) for r in ref}) > 1  # the rows really drew differently
    for a, b in zip(ref, got, strict=True):
        same(a, b)


def test_a_recipe_from_elsewhere_is_refused():
    from formtax.backends.vllm.plugin import _recipe_of
    from formtax.backends.vllm.row_reports import seal

    args = {"formtax_recipe": seal(print, "k", "mem://none"), "formtax_row": "k", "formtax_report": "mem://none"}
    assert _recipe_of(args)[1:] == ("k", "mem://none")
    for other in ({"formtax_row": "k2"}, {"formtax_report": "tcp://10.0.0.9:5555"}):  # bound to key and address
        with pytest.raises(ValueError, match="signature does not verify"):
            _recipe_of({**args, **other})
    tag, _, rest = args["formtax_recipe"].partition(":")
    forged = dict(args, formtax_recipe=("0" * len(tag)) + ":" + rest)
    with pytest.raises(ValueError, match="signature does not verify"):
        _recipe_of(forged)
    with pytest.raises(ValueError, match="needs formtax_row"):
        _recipe_of({"formtax_recipe": args["formtax_recipe"]})
    with pytest.raises(ValueError, match="comes alone"):
        _recipe_of({**args, "formtax_strategy": "json"})


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("strategy", "opts"), [("suffix-pipeline", {}), ("suffix-last", {}), ("suffix-min", {}),
                                                ("suffix-last", {"tau": 0.3}), ("suffix-beam", {}),
                                                ("suffix-beam", {"rule": "min"})])
def test_suffix_search_runs_as_two_requests_with_the_loops_outputs(strategy, opts, seed):
    # no rewind in the engine: the free pass is one request, T is completed by a second on x + y<t*; the outputs,
    # branch points and penalties are the one-row lazy form's (suffix-beam's output is the beam's, run lazily)
    fn = random_logits(seed=seed)
    kw = {"max_tokens": 60, "reasoning": "Let's see." if seed == 2 else None, **opts}
    ref = formtax.generate_batch(FakeBackend(fn), Q, strategy, "The answer is: {int}", **kw)
    got = formtax.generate_batch(SimVLLM(fn), Q, strategy, "The answer is: {int}", **kw)
    for a, b in zip(ref, got, strict=True):
        same(a, b)
        for k in ("t_star", "deltas", "free_end", "free_end_reason", "n_candidates", "answer_lead"):
            assert a.stats[k] == b.stats[k], k


def test_the_backend_knows_its_context_length():
    # formtax serve --backend vllm's banner and its context check read it (issue 57: it said "context unknown")
    sim = SimVLLM(random_logits())
    assert sim.context_length is None
    sim.engine["max_model_len"] = 4096
    assert sim.context_length == 4096


def stopped_at(stops):
    """The call's controls of a caller that sent ``stops`` (formtax serve's ``stop``: serve/batcher.py)."""
    from formtax.decoding.rowengine import ROW_CONTROLS, RowControls

    token = ROW_CONTROLS.set(RowControls(stops=tuple(stops)))
    return lambda: ROW_CONTROLS.reset(token)


@pytest.mark.parametrize(("strategy", "kw"), [("free", {}), ("short", {}), ("free", {"reasoning": "Let's think."})])
def test_stop_strings_end_a_free_row_where_the_loop_ends_it(strategy, kw):
    """A caller's stop strings end a free row (vLLM's own stop, replayed under formtax's rule): the row equals the
    decode loop's under formtax serve's hooks, which stop it at the same token (``stop-sequence``)."""
    from formtax.api import finish_results
    from formtax.decoding.loop import decode
    from formtax.serve.batcher import Job, prepare_job
    from formtax.serve.hooks import RequestHooks

    fn = random_logits(seed=4)
    base = formtax.generate(FakeBackend(fn), Q[0], strategy, max_tokens=40, **kw)
    stops = [base.text[len(base.text) // 2], "never"]
    fake = FakeBackend(fn)  # formtax serve's row on the decode loop, its policy under the request's hooks
    job = Job(Q[0], (), {"strategy": strategy, "answer": None, "max_tokens": 40, **kw}, 0,
              RequestHooks(stops=tuple(stops)))
    row = prepare_job(fake, job)
    (out,) = decode(fake, [row.row])
    (ref,) = finish_results(fake, row.strat, [row.request], [row.strat.assemble(fake, row.request, out, 0.0)])
    assert ref.finish_reason == "stop-sequence" and len(ref.token_ids) < len(base.token_ids)
    reset = stopped_at(stops)
    try:
        got = formtax.generate(SimVLLM(fn), Q[0], strategy, max_tokens=40, **kw)
    finally:
        reset()
    same(ref, got)


def test_stop_strings_are_refused_for_a_row_that_is_not_free_text():
    reset = stopped_at(["5"])
    try:
        with pytest.raises(ConfigError, match="stop: applies to free text only"):
            formtax.generate(SimVLLM(random_logits(seed=4)), Q[0], "constrained", "{int}", max_tokens=20)
    finally:
        reset()


def test_a_stop_string_only_the_engine_saw_ends_the_row_as_a_stop_sequence():
    """Where vLLM's text held a stop string formtax's rule does not find (a decoding difference), the engine's
    tokens stand and the row ends for the caller's reason, never as an engine fault."""

    class Stopper(SimVLLM):
        def _generate(self, prompts, params, sinks=None):
            outs = super()._generate(prompts, [{**p, "stops": []} for p in params], sinks)
            return [(tokens[:5], "stop-sequence") for tokens, _ in outs]

    fn = random_logits(seed=4)
    base = formtax.generate(FakeBackend(fn), Q[0], "free", max_tokens=40)
    reset = stopped_at(["\x00never in the text"])
    try:
        got = formtax.generate(Stopper(fn), Q[0], "free", max_tokens=40)
    finally:
        reset()
    assert got.token_ids == base.token_ids[:5] and got.finish_reason == "stop-sequence"
