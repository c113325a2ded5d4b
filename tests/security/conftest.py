"""Fixtures of the security suite (issue 55): a server over the fake backend, started per module
(``tests/probes.py`` measures ``/health`` while a request runs)."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")

from formtax.serve.app import ServerThread  # noqa: E402


@pytest.fixture(scope="module")
def srv(start_fake_server) -> ServerThread:
    return start_fake_server(0, backend={"context": 1 << 20}, window_s=0.02, temperature=0.0, timeout_s=60)
