"""What Deco-G's format estimation module costs per decoding step (ALGORITHMS.md section 7; paper 001 section 3.3).

1. 49k vocabulary: per-step wall time of ``decog`` (an HMM with H49 hidden states, top-K49 pruning, a real token DFA
   for ``The answer is: {int:0..}`` and its real backward tables) relative to a free step, on the default model,
   batch 1, N steps each (EOS banned on both sides, so both run exactly N steps). ``ratio`` = decog / free
   (target <= 1.5, lower is better).
2. 262k vocabulary: Gemma 3 270M (formtax[gemma]; its real 262,144-piece SentencePiece vocabulary and its real
   token DFA), the same measurement in the same run. Without the extra, the stand-in of earlier versions: the default
   model's tied embedding/LM head resized to 262,144 rows (the DFA then covers the 49k real tokens).
3. Pruning: one reweighting step at h = 4096 (synthetic HMM, 49k vocabulary, synthetic backward table), full state
   space vs the k = 200 most probable states: speed-up (target >= 5), the probability mass the k states keep, and the
   total-variation distance between the two reweighted distributions. The forward vector is the HMM's own filtering
   posterior after 64 tokens of real text. With ``--fem FILE``, also the mass the top-k states of a *distilled* HMM
   keep along real decodes (a random HMM's posterior is far more diffuse than a trained one's).

Per-step times are medians of the intervals between consecutive decoding steps (prefill excluded), with free and
decog runs interleaved. Both sides use ``--threads`` torch threads (default 1: this 2-core machine is shared, and
oversubscribed OpenMP regions cost milliseconds each). The HMMs are random (smoothed like trained ones): the cost does
not depend on the values. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import torch
from _common import PROMPTS, finish, load_default, load_gemma
from decode_loop import NoEos

from formtax.constraints.template import parse_template
from formtax.decoding import RowRequest, decode
from formtax.fem.dfa import FormatSpec, build_token_dfa, vocab_for
from formtax.fem.hmm import HMM
from formtax.fem.reweight import FemPolicy, FemRuntime, feasibility

TEMPLATE = "The answer is: {int:0..}"


def step_times(backend, prompt_ids: list[int], policy_factory, n: int,
               masses: list[float] | None = None) -> list[float]:
    """Intervals between consecutive steps of one row (the prefill excluded)."""
    stamps: list[float] = []
    out = decode(backend, [RowRequest(prompt_ids, policy_factory(), n)],
                 on_step=lambda _: stamps.append(time.perf_counter()))[0]
    assert len(out.tokens) == n, (len(out.tokens), out.finish_reason)
    if masses is not None:
        masses += [float(e["fem_mass"]) for e in out.events if "fem_mass" in e]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def compare(backend, h: int, k: int, n: int, repeats: int, seed: int = 0) -> dict[str, float]:
    tok = backend.tokenizer
    vocab = vocab_for(tok)
    dfa = build_token_dfa(FormatSpec(parse_template(TEMPLATE)), vocab)
    hmm = HMM.random(h, tok.n_logits, seed=seed)
    rt = FemRuntime(dfa, hmm, sorted(tok.eos_ids))
    t0 = time.perf_counter()
    rt.tables(n, min_tokens=n)
    tables_s = time.perf_counter() - t0
    ids = tok.prompt_ids([{"role": "user", "content": PROMPTS[0]}])
    free: list[float] = []
    fem: list[float] = []
    masses: list[float] = []

    def make_fem() -> FemPolicy:
        return FemPolicy(rt, n, gamma=1.0, top_k=k, min_tokens=n)  # EOS never allowed: exactly n steps

    step_times(backend, ids, lambda: NoEos(tok.eos_ids), n)  # warm-up (and the per-state tensors)
    step_times(backend, ids, make_fem, n)
    for _ in range(repeats):
        free += step_times(backend, ids, lambda: NoEos(tok.eos_ids), n)
        fem += step_times(backend, ids, make_fem, n, masses)
    out = {"free_ms": 1000 * statistics.median(free), "decog_ms": 1000 * statistics.median(fem),
           "tables_s": tables_s, "h": h, "k": k, "dfa_states": dfa.n_states, "vocab": tok.n_logits,
           "mass_mean": statistics.fmean(masses), "mass_min": min(masses)}
    out["ratio"] = out["decog_ms"] / out["free_ms"]
    return out


def pruning(h: int, k: int, vocab_size: int, repeats: int, text_ids: list[int], dfa) -> dict[str, float]:
    hmm = HMM.random(h, vocab_size, seed=1, concentration=0.5)
    rt = FemRuntime(dfa, hmm, [])
    g = torch.Generator().manual_seed(2)
    depth = 16  # enough remaining budget that the template is still reachable from the start state
    U = -torch.rand(depth, dfa.n_states, h, generator=g) * 20  # a synthetic backward table (log-probabilities)
    F = torch.as_tensor(feasibility(dfa, depth))
    logf = rt.log_pi.clone()
    for t in text_ids:
        logf = rt.hmm.forward_step(logf, t)
    logits = torch.randn(vocab_size, generator=g) * 3
    d = dfa.start

    def timed(top_k: int | None) -> tuple[float, object]:
        best: list[float] = []
        res = None
        for _ in range(repeats):
            t = time.perf_counter()
            res = rt.step(logits, logf, d, depth - 1, (U, F), 1.0, top_k)
            best.append(time.perf_counter() - t)
        return statistics.median(best), res

    rt.step(logits, logf, d, depth - 1, (U, F), 1.0, k)  # warm-up
    t_full, full = timed(None)
    t_k, pruned = timed(k)
    tv = 0.5 * float((torch.exp(full.scores) - torch.exp(pruned.scores)).abs().sum())  # type: ignore[attr-defined]
    return {"full_ms": 1000 * t_full, "pruned_ms": 1000 * t_k, "speedup": t_full / t_k,
            "retained_mass": pruned.kept_mass, "tv_distance": tv}  # type: ignore[attr-defined]


def trained_mass(backend, path: str, k: int, n: int) -> dict[str, float]:
    """The mass the top-k states keep along real decodes with a distilled HMM (``formtax fem build``)."""
    from formtax.fem.artifact import load_fem

    art = load_fem(path)
    tok = backend.tokenizer
    dfa = build_token_dfa(FormatSpec(parse_template(TEMPLATE)), vocab_for(tok))
    rt = FemRuntime(dfa, art.hmm, sorted(tok.eos_ids))
    masses: list[float] = []
    for q in PROMPTS[:4]:
        ids = tok.prompt_ids([{"role": "user", "content": q}])
        out = decode(backend, [RowRequest(ids, FemPolicy(rt, n, top_k=k), n)])[0]
        masses += [float(e["fem_mass"]) for e in out.events if "fem_mass" in e]
    return {"h": art.h, "k": k, "mean": statistics.fmean(masses), "min": min(masses), "steps": len(masses)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--h49", type=int, default=1024)
    ap.add_argument("--k49", type=int, default=64)
    ap.add_argument("--h-prune", type=int, default=4096)
    ap.add_argument("--k-prune", type=int, default=200)
    ap.add_argument("--skip-262k", action="store_true")
    ap.add_argument("--fem", default=None, help="a distilled artifact: also report the mass its top-k states keep")
    ap.add_argument("--k-trained", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    m = load_default()
    r49 = compare(m, args.h49, args.k49, args.steps, args.repeats)
    tok = m.tokenizer
    text_ids = tok.encode("Tom has 3 apples and buys 4 more, so he has 3 + 4 = 7 apples in total.\n" * 4)[:64]
    dfa49 = build_token_dfa(FormatSpec(parse_template(TEMPLATE)), vocab_for(tok))
    pr = pruning(args.h_prune, args.k_prune, tok.n_logits, 7, text_ids, dfa49)
    tm = trained_mass(m, args.fem, args.k_trained, 64) if args.fem else None
    gc.collect()
    r262: dict[str, float] = {}
    vocab_262k = "Gemma 3 270M (formtax[gemma]): its own 262144-piece SentencePiece vocabulary and token DFA"
    if not args.skip_262k:
        backend = load_gemma()
        if backend is None:
            from formtax.backends.hf import HFBackend

            big = load_default()
            big.model.resize_token_embeddings(262_144, mean_resizing=False)
            backend = HFBackend(big.model, tok.hf, big.model_id + " (head resized to 262144)", device="cpu")
            vocab_262k = ("SmolLM2 with its tied embedding/LM head resized to 262144 rows (formtax[gemma] not "
                          "installed); the DFA masks ids without text")
        r262 = compare(backend, args.h49, args.k49, args.steps, args.repeats)
    result = {
        "ratio": round(r49["ratio"], 3), "target": 1.5, "better": "lower",
        "free_ms_49k": round(r49["free_ms"], 2), "decog_ms_49k": round(r49["decog_ms"], 2),
        "h_49k": args.h49, "k_49k": args.k49, "tables_s_49k": round(r49["tables_s"], 2),
        "retained_mass_49k_mean": round(r49["mass_mean"], 4), "retained_mass_49k_min": round(r49["mass_min"], 4),
        "dfa_states": r49["dfa_states"], "template": TEMPLATE,
        "prune_speedup_h4096": round(pr["speedup"], 2), "prune_target": 5.0, "prune_h": args.h_prune,
        "prune_k": args.k_prune, "full_ms_h4096": round(pr["full_ms"], 2), "pruned_ms_h4096": round(pr["pruned_ms"], 2),
        "retained_mass_h4096": round(pr["retained_mass"], 4), "tv_pruned_vs_full": round(pr["tv_distance"], 4),
        "threads": args.threads, "steps": args.steps, "load_avg_1m": round(load, 2),
    }
    if tm:
        result |= {"trained_fem_h": tm["h"], "trained_fem_k": tm["k"], "trained_mass_mean": round(tm["mean"], 4),
                   "trained_mass_min": round(tm["min"], 4), "trained_mass_steps": tm["steps"]}
    if r262:
        result |= {"ratio_262k": round(r262["ratio"], 3), "free_ms_262k": round(r262["free_ms"], 2),
                   "decog_ms_262k": round(r262["decog_ms"], 2),
                   "vocab_262k": vocab_262k}
    finish(result)


if __name__ == "__main__":
    main()
