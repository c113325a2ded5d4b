"""Issue 44 point 5: per-row sampling in formtax's own loop. Rows of one batch carry their own temperature,
top-p/k, min-p and seed; each equals the row decoded alone under its settings; each draws from a generator on its
logits' device; and the server's continuous batch admits a request whatever its sampling settings."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

import formtax.decoding.step as step
from formtax.backends.fake import FakeBackend, random_logits
from formtax.decoding.loop import decode, row_generator
from formtax.decoding.plan import RowRequest
from formtax.decoding.policies import FreePolicy
from formtax.decoding.sampling import GREEDY, Sampling

SETTINGS = [GREEDY, Sampling(1.0), Sampling(0.7, top_p=0.9), Sampling(1.3, top_k=5), Sampling(1.0, min_p=0.2)]


def _row(backend, k: int, sampling: Sampling | None) -> RowRequest:
    tok = backend.tokenizer
    return RowRequest(tok.encode(f"prompt {k}"), FreePolicy(tok.eos_ids), 24, seed=100 + k, sampling=sampling)


def test_each_row_samples_under_its_own_settings():
    backend = FakeBackend(random_logits(seed=3))
    together = decode(backend, [_row(backend, k, s) for k, s in enumerate(SETTINGS)])
    alone = [decode(backend, [_row(backend, k, None)], s)[0] for k, s in enumerate(SETTINGS)]
    assert [o.tokens for o in together] == [o.tokens for o in alone]
    assert len({tuple(o.tokens) for o in together}) == len(SETTINGS)


def test_rows_joining_a_running_batch_keep_their_settings():
    backend = FakeBackend(random_logits(seed=3))
    pending = [_row(backend, k, s) for k, s in enumerate(SETTINGS)]
    first, rest = pending[0], pending[1:]
    outs = decode(backend, [first], admit=lambda n: [rest.pop(0)] if rest else [])
    alone = [decode(backend, [_row(backend, k, None)], s)[0] for k, s in enumerate(SETTINGS)]
    assert [o.tokens for o in outs] == [o.tokens for o in alone]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_the_generator_and_the_logits_share_a_device(device, monkeypatch):
    seen: list[tuple[torch.device, torch.device]] = []
    real = step.choose

    def checked(logits, plan, sampling, gen):
        if gen is not None:
            seen.append((logits.device, gen.device))
        return real(logits, plan, sampling, gen)

    monkeypatch.setattr(step, "choose", checked)
    backend = FakeBackend(random_logits(seed=1), device=device)
    decode(backend, [_row(backend, k, Sampling(1.0)) for k in range(3)])
    assert seen and all(a.type == b.type == torch.device(device).type for a, b in seen)
    assert row_generator(GREEDY, 1, torch.device(device)) is None


def test_the_server_admits_any_sampling_into_the_running_batch():
    """A short greedy request sent while a long sampled one decodes joins its batch (it used to wait for the
    whole session, which only took rows of equal sampling settings), and is answered first."""
    pytest.importorskip("uvicorn")
    from formtax.serve.app import ServerThread, create_app

    fn = random_logits(seed=2)

    def slow(seq):
        time.sleep(0.01)
        return fn(seq)

    app = create_app(FakeBackend(slow), window_s=0.0, temperature=0.0)
    user = [{"role": "user", "content": "hi"}]
    done: dict[str, float] = {}
    with ServerThread(app) as srv:
        def long() -> None:
            httpx.post(srv.url + "/chat/completions", json={"messages": user, "max_tokens": 150, "temperature": 1.0,
                                                            "seed": 1}, timeout=120)
            done["long"] = time.monotonic()

        t = threading.Thread(target=long)
        t.start()
        time.sleep(0.3)
        r = httpx.post(srv.url + "/chat/completions", json={"messages": user, "max_tokens": 5}, timeout=120)
        done["short"] = time.monotonic()
        t.join()
    assert r.status_code == 200 and done["short"] < done["long"]
    assert max(app.state.batcher.batches) == 2  # one session held both rows
