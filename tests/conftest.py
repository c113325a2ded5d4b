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
