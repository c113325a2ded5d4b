"""Probes the server tests share: how long ``/health`` takes while a request runs (a request must never hold the
server's event loop)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from formtax.serve.app import ServerThread


def health_while(srv: ServerThread, send: Callable[[], Any], every: float = 0.1) -> tuple[Any, list[float]]:
    """Run ``send()`` in a thread and probe ``/health`` every ``every`` s meanwhile: its result and the probes' times."""
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
        time.sleep(every)
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"], waits
