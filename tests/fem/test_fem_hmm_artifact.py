"""The HMM (forward update, initialisation, Baum-Welch, the empty-token spread), distillation on the fake backend,
and the versioned artifact."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from formtax.backends.fake import FakeBackend
from formtax.errors import ConfigError
from formtax.fem.artifact import FEM_VERSION, check_compatible, load_fem, save_fem
from formtax.fem.hmm import HMM, baum_welch, bigram_labels, counts_hmm, em_step, kmeans, spread_empty
from formtax.runner.distill import DistillConfig, build_fem


def sample(hmm: HMM, n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        z = int(torch.multinomial(hmm.pi, 1, generator=g))
        seq = []
        for _ in range(length):
            seq.append(int(torch.multinomial(hmm.B[z], 1, generator=g)))
            z = int(torch.multinomial(hmm.A[z], 1, generator=g))
        out.append(seq)
    return out


def test_forward_step_is_the_filtering_recursion() -> None:
    hmm = HMM.random(5, 7, seed=1, dtype=torch.float64)
    logf = hmm.log_init()
    f = hmm.pi.numpy().copy()
    for v in [3, 0, 6, 6, 2]:
        logf = hmm.forward_step(logf, v)
        f = (f * hmm.B[:, v].numpy()) @ hmm.A.numpy()
        f /= f.sum()
        np.testing.assert_allclose(torch.exp(logf).numpy(), f, rtol=1e-12)
    # the log-likelihood is the product of the one-step predictions
    seq = [1, 2, 3, 4]
    a = hmm.pi.numpy() * hmm.B[:, seq[0]].numpy()
    for v in seq[1:]:
        a = (a @ hmm.A.numpy()) * hmm.B[:, v].numpy()
    assert hmm.loglik(seq) == pytest.approx(float(np.log(a.sum())), rel=1e-12)


def test_baum_welch_never_decreases_the_likelihood_and_approaches_the_truth() -> None:
    truth = HMM(torch.tensor([1.0, 0.0], dtype=torch.float64),
                torch.tensor([[0.1, 0.9], [0.8, 0.2]], dtype=torch.float64),
                torch.tensor([[0.45, 0.45, 0.05, 0.05], [0.05, 0.05, 0.45, 0.45]], dtype=torch.float64))
    data = sample(truth, 40, 30, seed=0)
    start = counts_hmm(data, bigram_labels(data, 2, seed=0), 2, 4, seed=0)
    hmm, history = baum_welch(start, data, 15, smooth=0.0, smooth_emission=0.0, batch=16)
    assert all(b >= a - 1e-6 for a, b in zip(history, history[1:], strict=False))
    true_ll = sum(truth.loglik(s) for s in data)
    assert history[-1] >= true_ll - 0.01 * abs(true_ll)  # EM reaches (at least) the generator's likelihood
    # batching does not change the statistics
    one, ll1 = em_step(start, data, 0.0, 0.0)
    two, hist = baum_welch(start, data, 1, smooth=0.0, smooth_emission=0.0, batch=7)
    assert hist[0] == pytest.approx(ll1, rel=1e-10)
    np.testing.assert_allclose(two.B.numpy(), one.B.numpy(), rtol=1e-9)


def test_spread_empty_moves_the_initial_mass_to_what_follows() -> None:
    hmm = HMM.random(3, 5, seed=2, dtype=torch.float64)
    out = spread_empty(hmm, 4)
    w = hmm.pi * hmm.B[:, 4]
    np.testing.assert_allclose(out.pi.numpy(), ((w / w.sum()) @ hmm.A).numpy(), rtol=1e-12)
    assert out.B.shape == (3, 4)
    np.testing.assert_allclose(out.B.numpy(), (hmm.B[:, :4] / hmm.B[:, :4].sum(1, keepdim=True)).numpy())
    out.check()


def test_initialisations() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50, 3, generator=g) + 10, torch.randn(50, 3, generator=g) - 10])
    lab = kmeans(x, 2)
    assert len(set(lab[:50].tolist())) == 1 and len(set(lab[50:].tolist())) == 1 and lab[0] != lab[-1]
    data = [[0, 1, 0, 1, 2, 3], [2, 3, 0, 1]]
    labels = bigram_labels(data, 3)
    assert [len(z) for z in labels] == [6, 4]
    used = len({z for zs in labels for z in zs})
    hmm = counts_hmm(data, labels, used + 2, 4)  # unused states become noisy copies of used ones, not uniform rows
    hmm.check()
    extra = hmm.B[used:].numpy()
    assert (extra.max(axis=1) > 0.3).all() and not np.allclose(extra[0], extra[1])


def test_distillation_on_the_fake_backend_both_forms(tmp_path) -> None:
    backend = FakeBackend()
    seen: list[str] = []
    for form in ("instruction-aware", "unconditional"):
        cfg = DistillConfig(task="arith", form=form, states=6, samples=5, max_tokens=24, em_iters=2)
        hmm, meta = build_fem(backend, cfg, progress=lambda stage, done, total: seen.append(stage))
        hmm.check()
        assert hmm.vocab_size == backend.tokenizer.n_logits and hmm.h == 6
        assert meta["form"] == form and meta["init"] == "ngram" and meta["n_samples"] == 5
        assert meta["tokenizer_sha256"] == backend.tokenizer.engine.key
        assert all(b >= a - 1e-6 for a, b in zip(meta["loglik"], meta["loglik"][1:], strict=False))
    assert "sample" in seen and "em" in seen
    with pytest.raises(ConfigError, match="kmeans"):
        build_fem(backend, DistillConfig(task="arith", states=4, samples=2, max_tokens=8, init="kmeans"))


def test_artifact_round_trip_and_refusals(tmp_path) -> None:
    hmm = HMM.random(4, 9, seed=3)
    meta = {"model": "m", "tokenizer_sha256": "abc", "task": "t", "form": "unconditional"}
    path = save_fem(tmp_path / "f", hmm, meta)
    assert path.name == "f.npz" and path.with_suffix(".json").is_file()
    art = load_fem(path)
    assert art.meta["version"] == FEM_VERSION and art.form == "unconditional" and art.h == 4
    for name in ("pi", "A", "B"):
        np.testing.assert_allclose(getattr(art.hmm, name).numpy(), getattr(hmm, name).numpy(), rtol=1e-6)
    check_compatible(art, "abc", 9)
    with pytest.raises(ConfigError, match="another tokenizer"):
        check_compatible(art, "xyz", 9)
    with pytest.raises(ConfigError, match="emits 9 token ids"):
        check_compatible(art, "abc", 10)
    # another version, another format, a missing file, a broken file
    for patch, message in (({"version": FEM_VERSION + 1}, "version"), ({"format": "other"}, "not a formtax FEM")):
        bad = tmp_path / f"bad{len(message)}.npz"
        with np.load(path) as z:
            arrays = {k: z[k] for k in ("pi", "A", "B")}
            m = json.loads(str(z["meta"])) | patch
        np.savez(bad, **arrays, meta=np.array(json.dumps(m)))
        with pytest.raises(ConfigError, match=message):
            load_fem(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_fem(tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a formtax FEM"):
        load_fem(tmp_path / "junk.npz")
