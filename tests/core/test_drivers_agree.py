"""Every driver of a row takes the same step (issue 56): the decode loop on the host, the loop's device step, a
row inside an engine's logits processor (choosing its tokens, or leaving the draw to the engine) and the replay
of an engine's tokens give the same tokens, the same per-step :class:`~formtax.decoding.step.Choice` flags
(forced, masked), finish reasons, events and masked masses, on the fake model, without vLLM.

The rows cover what a step can carry: a grammar's mask (with its masked mass), forced tokens, bans alone, closing's veto (its
re-choice and its fallback) and InWriting's divert, greedy and sampled from each row's seeded generator. A driver
that cannot take a row says so in :func:`takes` (the engine's own sampler draws from its own random stream, and
replay has no logits: no divert, no veto), and that is the only thing skipped.

Oracle: the host loop (``loop-host``), which the golden outputs pin (tests/core/test_golden_strategies.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from formtax.backends.fake import FakeBackend, random_logits
from formtax.backends.vllm.logits_processor import EngineRow, apply_rows
from formtax.constraints.native import as_constraint
from formtax.decoding.loop import decode
from formtax.decoding.plan import Finish, Plan, Policy, RowOutput, RowRequest
from formtax.decoding.rowengine import replay
from formtax.decoding.sampling import Sampling
from formtax.strategies import get_strategy
from formtax.strategies.base import Request, SinglePass

PROMPTS = [f"question {k}" for k in range(4)]
GREEDY, SAMPLED = Sampling(0.0), Sampling(0.9, top_p=0.95)


class Banning(Policy):
    """Free text less a few tokens (bans alone, no mask) until EOS or the budget."""

    def __init__(self, banned: Sequence[int], eos_ids: frozenset[int]) -> None:
        self.banned, self.eos_ids = list(banned), eos_ids

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        return Plan(banned=self.banned)

    def advance(self, token: int) -> str | None:
        return Finish.EOS if token in self.eos_ids else None


def strategy_rows(strategy: str, spec: str, max_tokens: int, closing: bool, prefix: str | None = None
                  ) -> Callable[[FakeBackend], list[Policy]]:
    def build(fake: FakeBackend) -> list[Policy]:
        strat = get_strategy(strategy)
        assert isinstance(strat, SinglePass)
        reqs = [Request(p, as_constraint(spec), max_tokens=max_tokens, closing=closing, reasoning_prefix=prefix)
                for p in PROMPTS]
        strat.check(fake, reqs)
        return [strat.policy(fake, r) for r in reqs]

    return build


def banning_rows(fake: FakeBackend) -> list[Policy]:
    tok = fake.tokenizer
    free = decode(fake, [RowRequest(tok.prompt_ids(p), Banning([], tok.eos_ids), 30) for p in PROMPTS])
    banned = sorted({t for o in free for t in o.tokens[:3]} - tok.eos_ids)  # what the model wants most
    return [Banning(banned, tok.eos_ids) for _ in PROMPTS]


CASES: dict[str, tuple[Callable[[FakeBackend], list[Policy]], int]] = {
    "constraint": (strategy_rows("constrained", "The answer is: {int:0..999}", 40, False), 40),
    "forced-prefix": (strategy_rows("constrained", "{choice:red|green|blue}", 30, False, "Let's think."), 30),
    "bans": (banning_rows, 30),
    # a budget a little over the witness: closing's veto refuses, re-chooses and falls back
    "closing-veto": (strategy_rows("constrained", "regex:[a-z]+ ok", 9, True), 9),
    "inwriting-divert": (strategy_rows("inwriting", "The answer is: {int}", 60, False), 60),
}
DRIVERS = ["loop-host", "loop-device", "engine-chooses", "engine-draws", "replay"]


def takes(driver: str, case: str, sampling: Sampling) -> bool:
    """Whether the driver can take the case's rows at all (module docstring)."""
    if driver == "engine-draws" and not sampling.greedy:
        return False  # the engine's sampler draws from its own random stream: the same law, other draws
    return not (driver == "replay" and case in ("closing-veto", "inwriting-divert"))


def rows_of(case: str, fake: FakeBackend, sampling: Sampling) -> list[RowRequest]:
    build, budget = CASES[case]
    tok = fake.tokenizer
    return [RowRequest(tok.prompt_ids(p), policy, budget, seed=7 + k, sampling=sampling)
            for k, (p, policy) in enumerate(zip(PROMPTS, build(fake), strict=True))]


def engine(fake: FakeBackend, fn: Callable[[Sequence[int]], torch.Tensor], rows: list[RowRequest],
           chooses: bool) -> list[RowOutput]:
    """An engine that owns its loop and calls a logits processor over the batch's rows each step: the
    processor's rows edit the logits, then the engine takes the argmax (a forced token is the only finite score);
    EOS ends a request, as does its cap (the row's budget and the one EOS after it)."""
    tok = fake.tokenizer
    eos = min(tok.eos_ids)
    live = [EngineRow(r, eos, tok.n_logits, r.sampling or GREEDY, chooses=chooses) for r in rows]
    outs: list[list[int]] = [[] for _ in rows]
    finish = ["length"] * len(rows)
    going = list(range(len(rows)))
    while going:
        logits = torch.stack([fn([*rows[k].prompt_ids, *outs[k]]).float() for k in going])
        for k in going:
            live[k].catch_up(outs[k])
        apply_rows(logits, [(live[k], j, None) for j, k in enumerate(going)])
        for j, k in enumerate(going):
            outs[k].append(int(torch.argmax(logits[j])))
            if outs[k][-1] in tok.eos_ids:
                finish[k] = "stop"
        going = [k for k in going if finish[k] != "stop" and len(outs[k]) < rows[k].max_tokens + 1]
    return [row.finalize(out, f) for row, out, f in zip(live, outs, finish, strict=True)]


def run(driver: str, case: str, sampling: Sampling, seed: int) -> list[RowOutput]:
    fn = random_logits(seed=seed)
    fake = FakeBackend(fn)
    rows = rows_of(case, fake, sampling)
    if driver in ("loop-host", "loop-device"):
        return decode(fake, rows, sampling, device_step=driver == "loop-device")
    if driver == "replay":  # an engine's tokens (the loop's, with the EOS an engine appends) checked by replay
        outs = decode(FakeBackend(fn), rows_of(case, fake, sampling), sampling)
        return [replay(r, [*o.tokens, *([] if o.finish_reason == Finish.EOS else [min(fake.tokenizer.eos_ids)])],
                       o.masked_mass) for r, o in zip(rows, outs, strict=True)]
    return engine(fake, fn, rows, chooses=driver == "engine-chooses")


def steps(out: RowOutput) -> list[tuple[int, str, bool, bool]]:
    return [(s.token, s.phase, s.forced, s.masked) for s in out.steps]


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("driver", DRIVERS)
def test_every_driver_takes_the_loops_steps(driver: str, case: str, sampling: Sampling, seed: int) -> None:
    if not takes(driver, case, sampling):
        pytest.skip(f"{driver} cannot take {case} rows {'greedy' if sampling.greedy else 'sampled'} (takes())")
    want = run("loop-host", case, sampling, seed)
    got = run(driver, case, sampling, seed)
    for a, b in zip(want, got, strict=True):
        assert b.tokens == a.tokens
        assert steps(b) == steps(a)
        assert b.finish_reason == a.finish_reason
        assert [e for e in b.events if "stats" not in e] == [e for e in a.events if "stats" not in e]
        assert (b.masked_mass is None) == (a.masked_mass is None)
        if a.masked_mass is not None:
            assert b.masked_mass == pytest.approx(a.masked_mass, abs=1e-9)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_cases_exercise_what_they_name(sampling: Sampling) -> None:
    """The rows above really carry what the drivers must agree on: a mask and its mass, bans that change the
    output, a veto that changed tokens, a divert that switched (else the agreement would prove little)."""
    outs = {case: run("loop-host", case, sampling, 0) for case in CASES}
    assert all(o.masked_mass is not None for o in outs["constraint"])
    assert all(o.steps[0].forced and not o.steps[0].masked for o in outs["forced-prefix"])
    assert all(s.masked and not s.forced for o in outs["bans"] for s in o.steps)
    changed = [e["stats"].get("closing_changed_tokens", 0) for o in outs["closing-veto"] for e in o.events
               if "stats" in e]
    assert sum(changed) > 0
    assert any(any("switch" in e for e in o.events) for o in outs["inwriting-divert"])
    if not sampling.greedy:  # the rows really drew, each from its own generator
        assert len({tuple(o.tokens) for o in outs["constraint"]}) > 1


@pytest.mark.parametrize("seed", [0, 3, 5, 11])
@pytest.mark.parametrize("case", ["constraint", "forced-prefix", "closing-veto", "inwriting-divert"])
def test_the_grammar_step_equals_the_planned_step(case: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's step of a plain grammar row (Policy.grammar_step: no plan built where the grammar holds the top
    token) gives the tokens, flags, finish and closing statistics that planning the same steps gives; and it is
    really taken (counted), with closing's veto acting through it."""
    from formtax.decoding.policies import ConstrainedPolicy

    own = ConstrainedPolicy.grammar_step
    taken = []

    def counted(self: ConstrainedPolicy, step: int):  # type: ignore[no-untyped-def]
        got = own(self, step)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(ConstrainedPolicy, "grammar_step", counted)
    fast = run("loop-host", case, GREEDY, seed)
    assert any(taken)
    monkeypatch.setattr(ConstrainedPolicy, "grammar_step", lambda self, step: None)
    planned = run("loop-host", case, GREEDY, seed)
    for a, b in zip(planned, fast, strict=True):
        assert (b.tokens, steps(b), b.finish_reason, b.events) == (a.tokens, steps(a), a.finish_reason, a.events)
        assert b.masked_mass == a.masked_mass
