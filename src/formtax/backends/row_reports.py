"""How formtax's rows travel to vLLM's engine and how their outputs come back (issue 44: no in-process registry).

A live row is stepped by formtax's logits processor inside vLLM's engine, which may be another process (vLLM's
engine core), several (tensor parallelism: every worker runs the processor) or Ray actors. Two things cross:

* **to the engine, the row's recipe** (:func:`seal`): the picklable callable that builds the row's policy from
  the engine's tokenizer (``RowRequest.recipe``), pickled and signed with HMAC-SHA256 under a secret that only
  formtax's backend and the engine processes it starts know (:data:`SECRET_ENV`, inherited by vLLM's processes;
  Ray workers get it through ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``). The engine unpickles only what verifies
  (:func:`unseal`), so a client of a public ``vllm serve`` cannot make the engine run a pickle; such clients use
  the plugin's plain arguments instead (formtax.vllm_plugin).
* **back to formtax, the row's output** (:func:`send`): when the row finishes inside the engine, its RowOutput
  (tokens, phases, forced/masked flags, events, masked mass, finish reason) as JSON, to the inbox whose address
  the row carries. Rows that the engine runs in formtax's own process use an in-memory inbox (:class:`MemoryInbox`);
  otherwise a ZeroMQ PULL socket on 127.0.0.1 (:class:`ZmqInbox`; pyzmq comes with vLLM). Ours, and why: vLLM's
  response has no field a logits processor can fill, and the engine's tokens alone cannot say where InWriting
  switched or what mass the mask removed. Several workers may report one row (tensor parallelism); the first
  report is taken.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import pickle
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from formtax.decoding.plan import RowOutput, Step

log = logging.getLogger(__name__)

SECRET_ENV = "FORMTAX_VLLM_SECRET"
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
REPORT_WAIT_S = 30.0  # how long formtax waits for a finished row's report after the engine returned it


def ensure_secret() -> bytes:
    """The recipes' signing secret, made now (and exported to the processes vLLM starts) if there is none."""
    value = os.environ.get(SECRET_ENV)
    if not value:
        value = secrets.token_hex(32)
        os.environ[SECRET_ENV] = value
    extra = [v for v in os.environ.get(RAY_COPY_ENV, "").split(",") if v]
    if SECRET_ENV not in extra:
        os.environ[RAY_COPY_ENV] = ",".join([*extra, SECRET_ENV])
    return value.encode()


def _pickler() -> Any:
    """cloudpickle where installed (it comes with vLLM): it pickles a strategy or answer type defined in a script
    or a test by value; plain pickle otherwise."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def seal(recipe: Callable[[Any], Any]) -> str:
    """A recipe as signed text for ``SamplingParams.extra_args`` (see the module docstring)."""
    blob = _pickler().dumps(recipe)
    tag = hmac.new(ensure_secret(), blob, hashlib.sha256).hexdigest()
    return tag + ":" + base64.b64encode(blob).decode()


def unseal(text: Any) -> Callable[[Any], Any]:
    """The recipe of :func:`seal`'s text; ValueError (one line) when it is not formtax's own or the secret is
    unknown here. Nothing is unpickled before the signature verifies."""
    secret = os.environ.get(SECRET_ENV, "").encode()
    if not secret:
        raise ValueError("formtax_recipe is accepted only from formtax's own vllm backend (this process has no "
                         f"{SECRET_ENV}); clients send formtax_strategy and formtax_answer")
    if not isinstance(text, str) or ":" not in text:
        raise ValueError("formtax_recipe: not a sealed recipe")
    tag, _, b64 = text.partition(":")
    try:
        blob = base64.b64decode(b64, validate=True)
    except ValueError:
        raise ValueError("formtax_recipe: not a sealed recipe") from None
    if not hmac.compare_digest(tag, hmac.new(secret, blob, hashlib.sha256).hexdigest()):
        raise ValueError("formtax_recipe: the signature does not verify (not from this formtax backend)")
    return pickle.loads(blob)  # noqa: S301 - signed by formtax's backend with the secret it shares with its engine


def row_args(recipe: Callable[[Any], Any], key: str, address: str, stream: bool = False) -> dict[str, str]:
    """The ``extra_args`` of a row that formtax's own backend sends to its plugin (formtax.vllm_plugin): the
    sealed recipe, the row's key, the inbox its report goes to, and whether it streams its tokens there."""
    args = {"formtax_recipe": seal(recipe), "formtax_row": key, "formtax_report": address}
    if stream:
        args["formtax_stream"] = "1"
    return args


# -- outputs back -----------------------------------------------------------------------------------------------
def encode_step(key: str, token: int, phase: str) -> bytes:
    """One streamed token of a row (its worker's pid: under tensor parallelism every worker sends it)."""
    return json.dumps({"key": key, "step": [int(token), str(phase)], "pid": os.getpid()}).encode()


def encode(key: str, out: RowOutput, error: str | None) -> bytes:
    """A finished row's report (JSON)."""
    payload = {"key": key, "error": error, "tokens": out.tokens,
               "steps": [[s.token, s.phase, s.forced, s.masked] for s in out.steps],
               "finish_reason": out.finish_reason, "masked_mass": out.masked_mass, "events": out.events}
    return json.dumps(payload, default=_plain).encode()


def _plain(value: Any) -> Any:
    """JSON for numpy and torch scalars in events."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def decode_report(payload: dict[str, Any], prompt_ids: Sequence[int]) -> tuple[RowOutput, str | None]:
    """The RowOutput of a report, and the error the engine's row recorded (None: none)."""
    out = RowOutput(prompt_ids=list(prompt_ids), tokens=[int(t) for t in payload["tokens"]],
                    steps=[Step(int(t), str(p), bool(f), bool(m)) for t, p, f, m in payload["steps"]],
                    finish_reason=str(payload["finish_reason"]), masked_mass=payload["masked_mass"],
                    events=list(payload["events"]))
    return out, payload.get("error")


class Inbox:
    """Where a backend's rows report (:func:`send`); :meth:`collect` waits for the rows it names, and a row that
    streams hands each token to its listener (:meth:`listen`) as the engine's row chooses it."""

    address: str

    def __init__(self) -> None:
        self._got: dict[str, dict[str, Any]] = {}
        self._listeners: dict[str, Callable[[int, str], None]] = {}
        self._streamer: dict[str, Any] = {}  # the one worker whose steps a row streams (tensor parallel: several)
        self._cond = threading.Condition()

    def listen(self, key: str, fn: Callable[[int, str], None]) -> None:
        """Hand row ``key``'s tokens and phases to ``fn`` as they come (until :meth:`collect` takes the row)."""
        with self._cond:
            self._listeners[key] = fn

    def deliver(self, data: bytes) -> None:
        payload = json.loads(data)
        key = str(payload["key"])
        with self._cond:
            if "step" in payload:
                fn = self._listeners.get(key)
                if fn is None or self._streamer.setdefault(key, payload.get("pid")) != payload.get("pid"):
                    return
            else:
                self._got.setdefault(key, payload)  # the first of several workers' reports
                self._cond.notify_all()
                return
        token, phase = payload["step"]
        fn(int(token), str(phase))

    def collect(self, keys: Sequence[str], timeout: float = REPORT_WAIT_S) -> dict[str, dict[str, Any]]:
        """The reports of ``keys`` that arrived within ``timeout`` (taken out of the inbox)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(k not in self._got for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for k in keys:
                self._listeners.pop(k, None)
                self._streamer.pop(k, None)
            return {k: self._got.pop(k) for k in keys if k in self._got}

    def close(self) -> None:
        """Release the inbox's resources."""


_MEMORY: dict[str, MemoryInbox] = {}


class MemoryInbox(Inbox):
    """The inbox of an engine that runs in formtax's own process (no copy, no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.address = f"mem://{uuid.uuid4().hex}"
        _MEMORY[self.address] = self

    def close(self) -> None:
        _MEMORY.pop(self.address, None)


class ZmqInbox(Inbox):
    """A ZeroMQ PULL socket bound on ``host`` (127.0.0.1: the engine's processes on this machine; a Ray cluster
    across machines needs an address its workers reach), read by a thread of its own so that streamed tokens
    reach their listeners while the engine runs."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__()
        import zmq

        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="formtax-row-reports", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                if self._sock.poll(100):
                    self.deliver(self._sock.recv())
            except Exception as e:  # noqa: BLE001 - a bad message never stops the inbox
                if self._closed.is_set():
                    return
                log.warning("formtax: an unreadable row report was dropped (%s)", e)

    def close(self) -> None:
        self._closed.set()
        self._reader.join(timeout=1.0)
        self._sock.close(linger=0)


_SENDERS: dict[tuple[int, str], Any] = {}
_SEND_LOCK = threading.Lock()


def send(address: str, data: bytes) -> None:
    """Deliver a report to ``address`` (from inside the engine). Never raises: a report that cannot be sent is
    logged, and formtax then refuses the row for want of it."""
    try:
        if address.startswith("mem://"):
            inbox = _MEMORY.get(address)
            if inbox is None:
                raise LookupError(f"no inbox {address} in this process")
            inbox.deliver(data)
            return
        import zmq

        with _SEND_LOCK:
            sock = _SENDERS.get((os.getpid(), address))  # a forked process makes its own socket
            if sock is None:
                sock = zmq.Context.instance().socket(zmq.PUSH)
                sock.setsockopt(zmq.SNDHWM, 0)
                sock.setsockopt(zmq.LINGER, 5000)
                sock.connect(address)
                _SENDERS[(os.getpid(), address)] = sock
            sock.send(data)
    except Exception as e:  # noqa: BLE001 - never the engine's step
        log.warning("formtax: a row's report to %s was not sent (%s)", address, e)
