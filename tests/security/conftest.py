"""Fixtures of the security suite (issue 55): a server over the fake backend, started per module
(``tests/probes.py`` measures ``/health`` while a request runs)."""

from __future__ import annotations

from collections.abc import Iterator

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
