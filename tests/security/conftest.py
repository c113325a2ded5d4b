"""Fixtures of the security suite (issue 55): a server over the fake backend, started per module, with a probe that
measures ``/health`` while a request runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.serve.app import ServerThread, create_app  # noqa: E402


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    app = create_app(FakeBackend(random_logits(seed=0), context=1 << 20), window_s=0.02, temperature=0.0,
                     timeout_s=60)
    with ServerThread(app) as server:
        yield server


def health_while(srv: ServerThread, send: Callable[[], Any]) -> tuple[Any, list[float]]:
    """Run ``send()`` in a thread and probe ``/health`` every 0.1 s meanwhile: its result and the probes' times."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["r"] = send()
        except Exception as e:  # noqa: BLE001 - handed to the test
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    waits: list[float] = []
    while t.is_alive() or not waits:
        t0 = time.perf_counter()
        assert httpx.get(srv.url.removesuffix("/v1") + "/health", timeout=30).status_code == 200
        waits.append(time.perf_counter() - t0)
        time.sleep(0.1)
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"], waits
