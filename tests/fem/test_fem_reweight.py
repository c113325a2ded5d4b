"""The FEM's reweighting against brute-force enumeration, pruning, and the hard mask (ALGORITHMS.md section 7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from formtax.constraints.template import parse_template
from formtax.fem.dfa import FormatSpec, TokenVocab, build_token_dfa
from formtax.fem.hmm import HMM
from formtax.fem.reweight import FemPolicy, FemRuntime, backward_tables, feasibility

TOKENS = [b"a", b"b", b"1", b"\n", b"ab", b""]  # the last id is EOS
EOS = 5
CONTENT = [0, 1, 2, 3, 4]


def tiny(template: str = "ab{int:0..99}", prefix: str = "line", suffix: str = "none"):
    vocab = TokenVocab.from_bytes(TOKENS, {EOS}, (EOS,))
    return build_token_dfa(FormatSpec(parse_template(template), prefix=prefix, suffix=suffix,
                                      leading_space=False), vocab)


def brute_force(dfa, hmm: HMM, prefix: list[int], budget: int, logits: np.ndarray, gamma: float,
                min_tokens: int = 0) -> np.ndarray:
    """The reweighted distribution by enumerating every continuation up to the budget (each leaf of the
    recursion is one continuation, its probability the product of the HMM's matrices along it)."""
    A, B, pi = hmm.A.double().numpy(), hmm.B.double().numpy(), hmm.pi.double().numpy()
    f = pi.copy()
    for t in prefix:
        f = (f * B[:, t]) @ A
        f = f / f.sum()
    d = dfa.run(prefix)
    left = budget - len(prefix) - 1  # tokens after the one being chosen
    n0 = len(prefix)
    weight = np.zeros(len(TOKENS))
    for v in range(len(TOKENS)):
        if v == EOS:
            weight[v] = 1.0 if (dfa.accepting[d] and n0 >= min_tokens) else 0.0
            continue
        total = 0.0

        def rec(a: np.ndarray, s: int, n: int) -> None:
            nonlocal total
            if n == left:  # the budget runs out: alpha holds iff D accepts
                total += float(a.sum()) if dfa.accepting[s] else 0.0
                return
            if dfa.accepting[s] and n0 + 1 + n >= min_tokens:  # stop by EOS here
                total += float((a @ A) @ B[:, EOS])
            for u in CONTENT:
                rec((a @ A) * B[:, u], dfa.step(s, u), n + 1)

        rec(f * B[:, v], dfa.step(d, v), 0)
        weight[v] = total / float(f @ B[:, v])
    if not (weight > 0).any():
        return np.zeros(len(TOKENS))  # nothing can satisfy the constraint: the policy must stop
    logp = logits - np.log(np.exp(logits).sum())
    with np.errstate(divide="ignore"):
        s = np.where(weight > 0, logp + gamma * np.log(np.where(weight > 0, weight, 1.0)), -np.inf)
    s = s - s.max()
    return np.exp(s) / np.exp(s).sum()


def fem_distribution(dfa, hmm, prefix, budget, logits, gamma, top_k=None, min_tokens=0):
    rt = FemRuntime(dfa, hmm, [EOS], dtype=torch.float64)
    pol = FemPolicy(rt, budget, gamma=gamma, top_k=top_k, prefix=prefix, min_tokens=min_tokens)
    plan = pol.plan(torch.tensor(logits), len(prefix))
    if plan.stop is not None:
        return np.zeros(len(TOKENS)), plan
    assert plan.scores is not None and plan.allowed is not None
    p = torch.exp(plan.scores).numpy()
    assert np.all(p[~plan.allowed.numpy()] == 0)
    return p, plan


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("prefix", [[], [0, 3], [3, 4], [0, 1, 3, 0]])
@pytest.mark.parametrize("gamma", [1.0, 2.5])
def test_reweighting_equals_brute_force(seed: int, prefix: list[int], gamma: float) -> None:
    dfa = tiny()
    hmm = HMM.random(3, len(TOKENS), seed=seed, concentration=1.0, dtype=torch.float64)
    logits = np.random.default_rng(seed).normal(size=len(TOKENS)) * 2
    budget = len(prefix) + 4
    expected = brute_force(dfa, hmm, prefix, budget, logits, gamma)
    got, _ = fem_distribution(dfa, hmm, prefix, budget, logits, gamma)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("prefix", [[], [0, 3], [0, 1, 3, 0]])
@pytest.mark.parametrize("top_k", [None, 2])
def test_planted_truths_reweighting_equals_brute_force_and_the_lab(seed: int, prefix: list[int],
                                                                  top_k: int | None) -> None:
    """The calibration suite's own Deco-G (planted/exact_fem.py, written again from the specification) agrees
    with brute-force enumeration (unpruned) and with the lab's runtime (pruned)."""
    from formtax.planted.exact_fem import FemSpec, _forward, _step, _Tables

    dfa = tiny()
    hmm = HMM.random(3, len(TOKENS), seed=seed, concentration=1.0, dtype=torch.float64)
    logits = np.random.default_rng(seed).normal(size=len(TOKENS)) * 2
    budget = len(prefix) + 4
    spec = FemSpec(dfa, hmm, frozenset({EOS}), budget, 1.5, top_k, prefix)
    tables = _Tables(spec)
    logf = tables.log_pi - np.log(np.exp(tables.log_pi).sum())
    d = dfa.start
    for t in prefix:
        d, logf = dfa.step(d, t), _forward(tables, logf, t)
    _, score = _step(spec, tables, logits, logf, d, budget - len(prefix) - 1)
    got = np.exp(score)
    lab, _ = fem_distribution(dfa, hmm, prefix, budget, logits, 1.5, top_k=top_k)
    np.testing.assert_allclose(got, lab, rtol=1e-9, atol=1e-12)
    if top_k is None:
        np.testing.assert_allclose(got, brute_force(dfa, hmm, prefix, budget, logits, 1.5), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("template,prefix,suffix", [("1{letters:1}", "none", "none"), ("b{int}", "any", "any")])
def test_brute_force_other_shapes_and_min_tokens(template: str, prefix: str, suffix: str) -> None:
    vocab = TokenVocab.from_bytes(TOKENS, {EOS}, (EOS,))
    dfa = build_token_dfa(FormatSpec(parse_template(template), prefix=prefix, suffix=suffix, leading_space=False),
                          vocab)
    hmm = HMM.random(4, len(TOKENS), seed=7, concentration=1.0, dtype=torch.float64)
    logits = np.random.default_rng(3).normal(size=len(TOKENS))
    for pre in ([], [1], [2, 0]):
        if dfa.run(pre) == dfa.dead:
            continue
        for min_tokens in (0, 4):
            budget = len(pre) + 4
            expected = brute_force(dfa, hmm, pre, budget, logits, 1.5, min_tokens)
            got, _ = fem_distribution(dfa, hmm, pre, budget, logits, 1.5, min_tokens=min_tokens)
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_gamma_zero_is_the_masked_model() -> None:
    dfa = tiny()
    hmm = HMM.random(3, len(TOKENS), seed=0, dtype=torch.float64)
    logits = np.random.default_rng(0).normal(size=len(TOKENS))
    got, plan = fem_distribution(dfa, hmm, [0, 3], 7, logits, 0.0)
    allowed = plan.allowed.numpy()
    p = np.exp(logits) * allowed
    np.testing.assert_allclose(got, p / p.sum(), rtol=1e-12)


def test_pruning_with_k_equal_h_is_exact_and_smaller_k_records_mass() -> None:
    dfa = tiny()
    hmm = HMM.random(16, len(TOKENS), seed=5, dtype=torch.float64)
    logits = torch.tensor(np.random.default_rng(1).normal(size=len(TOKENS)))
    full, _ = fem_distribution(dfa, hmm, [0, 3], 6, logits.numpy(), 1.0, top_k=None)
    rt = FemRuntime(dfa, hmm, [EOS], dtype=torch.float64)
    tables = rt.tables(6)
    logf = rt.log_pi.clone()
    for t in [0, 3]:
        logf = rt.hmm.forward_step(logf, t)
    d = dfa.run([0, 3])
    unpruned = rt.step(logits, logf, d, 3, tables, 1.0, top_k=None)
    np.testing.assert_allclose(torch.exp(unpruned.scores).numpy(), full, rtol=1e-12)
    # k = h through the pruned code path (top-k selection, row gathering): the same distribution
    pruned_all = rt.step(logits, logf, d, 3, tables, 1.0, top_k=16)
    assert pruned_all.kept_mass == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(pruned_all.allowed, unpruned.allowed)
    np.testing.assert_allclose(pruned_all.scores.numpy(), unpruned.scores.numpy(), rtol=1e-12, atol=1e-12)
    # the policy treats k >= h as no pruning at all: bitwise the unpruned result
    a = FemPolicy(rt, 6, gamma=1.0, top_k=16, prefix=[0, 3]).plan(logits, 2)
    b = FemPolicy(rt, 6, gamma=1.0, top_k=None, prefix=[0, 3]).plan(logits, 2)
    assert a.scores is not None and b.scores is not None and torch.equal(a.scores, b.scores)
    # a smaller k keeps less than all the mass, records it, and differs from the full distribution
    small = rt.step(logits, logf, d, 3, tables, 1.0, top_k=2)
    assert 0.0 < small.kept_mass < 1.0
    expected_mass = torch.exp(torch.logsumexp(torch.topk(logf, 2).values, 0)).item()
    assert small.kept_mass == pytest.approx(expected_mass, rel=1e-12)
    assert not torch.allclose(small.scores, unpruned.scores)
    plan = FemPolicy(rt, 6, gamma=1.0, top_k=2, prefix=[0, 3]).plan(logits, 2)
    assert plan.event is not None and plan.event["fem_mass"] == pytest.approx(expected_mass, rel=1e-12)


def test_tables_are_probabilities_and_zero_exactly_where_unreachable() -> None:
    dfa = tiny()
    hmm = HMM.random(3, len(TOKENS), seed=2, dtype=torch.float64)
    U = backward_tables(dfa, hmm, 6, [EOS], out_dtype=torch.float64)
    F = feasibility(dfa, 6)
    assert bool((U <= 1e-12).all())  # log-probabilities
    for r in range(6):
        reach = dfa.dist <= r
        reach[dfa.dead] = False
        finite = torch.isfinite(U[r]).all(dim=1).numpy()
        assert (finite == reach).all()
        assert (F[r] == reach).all()


def test_hard_mask_holds_whatever_the_hmm_says() -> None:
    """An adversarial HMM that never emits the template: the output still matches, within budget."""
    dfa = tiny()
    hmm = HMM.random(3, len(TOKENS), seed=0, dtype=torch.float64)
    hmm.B[:, 4] = 1e-12
    hmm.B[:, 2] = 1e-12
    hmm.B /= hmm.B.sum(dim=1, keepdim=True)
    rt = FemRuntime(dfa, hmm, [EOS], dtype=torch.float64)
    rng = np.random.default_rng(0)
    for budget in (3, 4, 9):
        pol = FemPolicy(rt, budget, gamma=3.0)
        out: list[int] = []
        reason = None
        while reason is None and len(out) < budget:
            logits = torch.tensor(rng.normal(size=len(TOKENS)) * 5)
            logits[EOS] = 50.0  # the model wants to stop at once
            plan = pol.plan(logits, len(out))
            assert plan.scores is not None
            tok = int(torch.argmax(plan.scores))
            out.append(tok)
            reason = pol.advance(tok)
        body = [t for t in out if t != EOS]
        assert dfa.accepts(body), (budget, out)
