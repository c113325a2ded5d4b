"""Issue 48 point 9: one oversized request neither freezes the server nor keeps its memory. A 20 MB prompt is a 413
under the default body limit (before it is parsed), and, with the limit raised, a 400 from its length alone (before
it is tokenized); meanwhile ``/health`` answers in under a second, and the process' resident memory afterwards is
within 200 MB of where it started."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402
from formtax.serve.limits import default_body_limit  # noqa: E402
from tests.probes import health_while  # noqa: E402

PROMPT = "word " * 4_000_000  # 20 MB


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


@pytest.mark.parametrize("limit", [None, 64 << 20])
def test_a_20_mb_prompt_is_refused_and_the_server_stays_up(limit):
    backend = FakeBackend(random_logits(seed=0), context=8192)
    app = create_app(backend, window_s=0.0, temperature=0.0, max_body_bytes=limit)
    with ServerThread(app) as srv:
        httpx.post(srv.url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 2})  # warm
        before = _rss_mb()
        for _ in range(3):
            r, waits = health_while(srv, every=0.2, send=lambda: httpx.post(
                srv.url + "/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}]},
                timeout=120))
            assert max(waits) < 1.0, waits
            err = r.json()["error"]
            if limit is None:
                assert r.status_code == 413 and err["code"] == "request_too_large"
                assert str(default_body_limit(8192)) in err["message"]
            else:
                assert r.status_code == 400 and err["code"] == "context_length_exceeded"
                assert "at least" in err["message"]
        assert _rss_mb() - before < 200
        ok = httpx.post(srv.url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 2})
        assert ok.status_code == 200


def test_a_chunked_body_over_the_limit_is_413():
    app = create_app(FakeBackend(random_logits(seed=0)), window_s=0.0, max_body_bytes=10_000)

    def chunks():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}]}'

    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "10000" in r.json()["error"]["message"]
