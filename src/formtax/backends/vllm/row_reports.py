"""How formtax's rows travel to vLLM's engine and how their outputs come back (issue 44: no in-process registry).

A live row is stepped by formtax's logits processor inside vLLM's engine, which may be another process (vLLM's
engine core), several (tensor parallelism: every worker runs the processor) or Ray actors. Two things cross:

* **to the engine, the row's recipe** (:func:`seal`): the picklable callable that builds the row's policy from
  the engine's tokenizer (``RowRequest.recipe``), pickled and signed with HMAC-SHA256 under a secret that only
  formtax's backend and the engine processes it starts know. The signature covers the pickle, the row's key, its
  report address and this process's nonce (issue 55): a sealed recipe cannot be sent again with another key or to
  another address, and the plugin refuses a key it has seen (:func:`unseal`). The engine unpickles only what
  verifies, so a client of a public ``vllm serve`` cannot make the engine run a pickle; such clients use the
  plugin's plain arguments instead (formtax.vllm_plugin). The secret lives in this module
  (:func:`ensure_secret`); it is put in the environment only while formtax starts vLLM's engine
  (:func:`engine_environment`), which its engine processes and Ray workers (``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``)
  inherit, and taken out again, so no later child of formtax's process (a stock server it starts) has it.
* **back to formtax, the row's output** (:func:`send`): when the row finishes inside the engine, its RowOutput
  (tokens, phases, forced/masked flags, events, masked mass, finish reason) as JSON, signed with the same secret,
  to the inbox whose address the row carries. Rows that the engine runs in formtax's own process use an in-memory
  inbox (:class:`MemoryInbox`); otherwise a ZeroMQ PULL socket (:class:`ZmqInbox`; pyzmq comes with vLLM): by
  default ``ipc://`` in a directory only this user can enter (0700), or a TCP address for engines on other
  machines (:data:`REPORT_BIND_ENV`, :data:`REPORT_ADDRESS_ENV`). An inbox takes only what verifies, only for the
  rows it is waiting for (a report for an unknown or finished key is dropped, never kept), a streamed row's steps
  in order from one sender; its queue and message sizes are bounded. Ours, and why: vLLM's response has no field a
  logits processor can fill, and the engine's tokens alone cannot say where InWriting switched or what mass the
  mask removed. Several workers may report one row (tensor parallelism); the first report is taken.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from formtax.cache import LRU
from formtax.decoding.plan import RowOutput, Step

log = logging.getLogger(__name__)

SECRET_ENV = "FORMTAX_VLLM_SECRET"
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
REPORT_BIND_ENV = "FORMTAX_VLLM_REPORT_BIND"  # e.g. tcp://0.0.0.0:5555 (engines on other machines)
REPORT_ADDRESS_ENV = "FORMTAX_VLLM_REPORT_ADDRESS"  # the address the engines connect to (default: the bound one)
REPORT_WAIT_S = 30.0  # how long formtax waits for a finished row's report after the engine returned it
MAX_REPORT_BYTES = 16 << 20  # a report larger than this is dropped by the socket
QUEUE_MAX = 10_000  # reports queued per socket, either side (a sender drops what does not fit)
SEEN_KEYS = 65_536  # recipe keys the plugin remembers (a sealed recipe is accepted once)
_TAG = re.compile(r"[0-9a-f]{64}")
_NONCE = secrets.token_hex(8)  # this process's: part of every recipe it seals
_SECRET: list[bytes] = []  # the secret of this process (made once; from the environment in an engine process)
_SEEN: LRU[str, bool] = LRU(SEEN_KEYS)


def ensure_secret() -> bytes:
    """The recipes' and reports' signing secret: the environment's (an engine process inherits it), else made now
    and kept in this process only (module docstring)."""
    if not _SECRET:
        _SECRET.append((os.environ.get(SECRET_ENV) or secrets.token_hex(32)).encode())
    return _SECRET[0]


def _known_secret() -> bytes:
    """The secret where one was set or made (an engine process: its environment), else b""."""
    if _SECRET:
        return _SECRET[0]
    value = os.environ.get(SECRET_ENV, "")
    return ensure_secret() if value else b""


@contextlib.contextmanager
def engine_environment() -> Iterator[None]:
    """The secret in the environment while formtax starts vLLM's engine processes (and their Ray workers), and out
    of it afterwards (module docstring)."""
    secret = ensure_secret().decode()
    saved = {k: os.environ.get(k) for k in (SECRET_ENV, RAY_COPY_ENV)}
    os.environ[SECRET_ENV] = secret
    extra = [v for v in os.environ.get(RAY_COPY_ENV, "").split(",") if v]
    if SECRET_ENV not in extra:
        os.environ[RAY_COPY_ENV] = ",".join([*extra, SECRET_ENV])
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pickler() -> Any:
    """cloudpickle where installed (it comes with vLLM): it pickles a strategy or answer type defined in a script
    or a test by value; plain pickle otherwise."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def _digest(secret: bytes, *parts: bytes) -> str:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


def _same(tag: Any, want: str) -> bool:
    """A constant-time comparison that never raises (a non-ASCII or non-string tag is simply not equal)."""
    return isinstance(tag, str) and bool(_TAG.fullmatch(tag)) and hmac.compare_digest(tag.encode(), want.encode())


def seal(recipe: Callable[[Any], Any], key: str = "", address: str = "") -> str:
    """A recipe as signed text for ``SamplingParams.extra_args``, bound to the row's key and report address (see
    the module docstring)."""
    blob = _pickler().dumps(recipe)
    tag = _digest(ensure_secret(), _NONCE.encode(), key.encode(), address.encode(), blob)
    return f"{tag}:{_NONCE}:{base64.b64encode(blob).decode()}"


def unseal(text: Any, key: str = "", address: str = "", once: bool = False) -> Callable[[Any], Any]:
    """The recipe of :func:`seal`'s text for this key and address; ValueError (one line) when it is not formtax's
    own, was sealed for another row or address, or the secret is unknown here. ``once``: refuse a key seen before
    (a replay). Nothing is unpickled before the signature verifies."""
    secret = _known_secret()
    if not secret:
        raise ValueError("formtax_recipe is accepted only from formtax's own vllm backend (this process has no "
                         f"{SECRET_ENV}); clients send formtax_strategy and formtax_answer")
    if not isinstance(text, str) or text.count(":") != 2:
        raise ValueError("formtax_recipe: not a sealed recipe")
    tag, nonce, b64 = text.split(":")
    try:
        blob = base64.b64decode(b64, validate=True)
    except ValueError:
        raise ValueError("formtax_recipe: not a sealed recipe") from None
    want = _digest(secret, nonce.encode("utf-8", "replace"), key.encode("utf-8", "replace"),
                   address.encode("utf-8", "replace"), blob)
    if not _same(tag, want):
        raise ValueError("formtax_recipe: the signature does not verify (not from this formtax backend, or sealed "
                         "for another row or report address)")
    if once:
        seen = f"{nonce}:{key}"
        if _SEEN.get(seen):
            raise ValueError("formtax_recipe: this row's recipe was sent before (a replay)")
        _SEEN.put(seen, True)
    return pickle.loads(blob)  # noqa: S301 - signed by formtax's backend with the secret it shares with its engine


def row_args(recipe: Callable[[Any], Any], key: str, address: str, stream: bool = False) -> dict[str, str]:
    """The ``extra_args`` of a row that formtax's own backend sends to its plugin (formtax.vllm_plugin): the
    sealed recipe, the row's key, the inbox its report goes to, and whether it streams its tokens there."""
    args = {"formtax_recipe": seal(recipe, key, address), "formtax_row": key, "formtax_report": address}
    if stream:
        args["formtax_stream"] = "1"
    return args


# -- outputs back -----------------------------------------------------------------------------------------------
def _signed(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, default=_plain).encode()
    return _digest(ensure_secret(), data).encode() + b":" + data


def encode_step(key: str, token: int, phase: str, n: int = 0) -> bytes:
    """The ``n``-th streamed token of a row (its worker's pid: under tensor parallelism every worker sends it)."""
    return _signed({"key": key, "step": [int(token), str(phase)], "n": int(n), "pid": os.getpid()})


def encode(key: str, out: RowOutput, error: str | None) -> bytes:
    """A finished row's report (signed JSON)."""
    return _signed({"key": key, "error": error, "tokens": out.tokens,
                    "steps": [[s.token, s.phase, s.forced, s.masked] for s in out.steps],
                    "finish_reason": out.finish_reason, "masked_mass": out.masked_mass, "events": out.events})


def verified(data: bytes) -> dict[str, Any] | None:
    """The payload of a signed report, or None for one that does not verify under this process's secret."""
    tag, sep, body = data.partition(b":")
    secret = ensure_secret()
    if not sep:
        return None
    try:
        ok = _same(tag.decode("ascii"), _digest(secret, body))
    except UnicodeDecodeError:
        return None
    if not ok:
        return None
    payload = json.loads(body)
    return payload if isinstance(payload, dict) else None


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
    streams hands each token to its listener (:meth:`listen`) as the engine's row takes it. Only reports that
    verify, for the rows :meth:`expect` named and :meth:`collect` has not taken, are kept (module docstring)."""

    address: str

    def __init__(self) -> None:
        self._got: dict[str, dict[str, Any]] = {}
        self._expected: set[str] = set()
        self._listeners: dict[str, Callable[[int, str], None]] = {}
        self._streamer: dict[str, Any] = {}  # the one worker whose steps a row streams (tensor parallel: several)
        self._next: dict[str, int] = {}  # the index of the step a streamed row sends next
        self._cond = threading.Condition()
        self.dropped = 0  # reports refused: unsigned, forged, for unknown or finished rows, out of order

    def expect(self, key: str) -> None:
        """Row ``key`` was sent to the engine: its report (and steps) will be taken."""
        with self._cond:
            self._expected.add(key)

    def listen(self, key: str, fn: Callable[[int, str], None]) -> None:
        """Hand row ``key``'s tokens and phases to ``fn`` as they come (until :meth:`collect` takes the row)."""
        with self._cond:
            self._expected.add(key)
            self._listeners[key] = fn
            self._next[key] = 0

    def deliver(self, data: bytes) -> None:
        payload = verified(data)
        if payload is None:
            self.dropped += 1
            return
        key = str(payload.get("key"))
        with self._cond:
            if key not in self._expected:
                self.dropped += 1
                return
            if "step" in payload:
                fn = self._listeners.get(key)
                if fn is None or self._streamer.setdefault(key, payload.get("pid")) != payload.get("pid") \
                        or payload.get("n") != self._next.get(key):
                    self.dropped += 1
                    return
                self._next[key] += 1
            else:
                self._got.setdefault(key, payload)  # the first of several workers' reports
                self._cond.notify_all()
                return
        token, phase = payload["step"]
        fn(int(token), str(phase))

    def collect(self, keys: Sequence[str], timeout: float = REPORT_WAIT_S) -> dict[str, dict[str, Any]]:
        """The reports of ``keys`` that arrived within ``timeout`` (taken out of the inbox; later reports of these
        rows are dropped)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(k not in self._got for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            for k in keys:
                self._expected.discard(k)
                self._listeners.pop(k, None)
                self._streamer.pop(k, None)
                self._next.pop(k, None)
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
    """A ZeroMQ PULL socket, read by a thread of its own so that streamed tokens reach their listeners while the
    engine runs. ``bind``: where it listens (default: ``ipc://`` in a fresh 0700 directory; ``tcp://HOST:PORT``,
    port 0 for any, for engines on other machines); ``advertise``: the address engines connect to (default: the
    bound one; behind NAT or with a wildcard host, the address the workers reach)."""

    def __init__(self, bind: str | None = None, advertise: str | None = None) -> None:
        super().__init__()
        import zmq

        bind = bind or os.environ.get(REPORT_BIND_ENV) or None
        advertise = advertise or os.environ.get(REPORT_ADDRESS_ENV) or None
        self._dir: str | None = None
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, QUEUE_MAX)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPORT_BYTES)
        self._sock.setsockopt(zmq.LINGER, 0)
        if bind is None:
            self._dir = tempfile.mkdtemp(prefix="formtax-reports-")  # 0700: no other user reaches the socket
            bind = f"ipc://{self._dir}/reports"
        if bind.startswith("tcp://") and bind.rsplit(":", 1)[-1] in ("0", "*"):
            host = bind[len("tcp://"):].rsplit(":", 1)[0]
            port = self._sock.bind_to_random_port(f"tcp://{host}")
            bound = f"tcp://{host}:{port}"
        else:
            self._sock.bind(bind)
            bound = self._sock.getsockopt_string(zmq.LAST_ENDPOINT) if bind.startswith("tcp://") else bind
        if advertise is not None and advertise.startswith("tcp://") and advertise.count(":") == 1:
            advertise = f"{advertise}:{bound.rsplit(':', 1)[-1]}"  # a host alone: the bound port
        self.address = advertise or bound
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
                self.dropped += 1
                log.warning("formtax: an unreadable row report was dropped (%s)", e)

    def close(self) -> None:
        self._closed.set()
        self._reader.join(timeout=1.0)
        self._sock.close(linger=0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


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
                sock.setsockopt(zmq.SNDHWM, QUEUE_MAX)
                sock.setsockopt(zmq.LINGER, 5000)
                sock.connect(address)
                _SENDERS[(os.getpid(), address)] = sock
            sock.send(data, zmq.NOBLOCK)  # a full queue drops the report, never holds the engine's step
    except Exception as e:  # noqa: BLE001 - never the engine's step
        log.warning("formtax: a row's report to %s was not sent (%s)", address, e)
