"""Any OpenAI-compatible server as a backend: strategies compiled into HTTP requests.

**Protocol (our choice).** The ``/v1/completions`` endpoint, never chat: formtax applies the chat template
itself, so the prompt is byte-identical to the in-process path's. On a vLLM server (detected by ``GET /version``;
the ``flavor`` option overrides) the requests use vLLM's extensions to be exact:

* the prompt goes as token ids, the output comes back as token ids (``return_token_ids``), and the stop set is
  token ids (``stop_token_ids``: EOS, plus every token containing a newline for ``short``);
* a constraint goes as ``structured_outputs: {"grammar": <Lark>}``: the very grammar formtax compiles (the server
  must run the llguidance backend: ``--structured-outputs-config '{"backend": "guidance"}'``). The old
  ``guided_*`` fields are silently ignored by current vLLM, so they are never sent.

Other servers get the prompt as text, ``stop: ["\\n"]`` for ``short``, and only unconstrained strategies: a
constraint they cannot be told about is refused before the run.

**Rows.** The server is a :class:`~formtax.decoding.rowengine.RowEngine`: it decodes rows whose policies lower to
free text or a whole-output grammar (``free``, ``short``, ``constrained``, ``json``, NL-to-Format's two calls,
InWriting's two-call EOS switch, which the strategy owns); each row's policy is then replayed over the returned
tokens (``rowengine.replay``), which rebuilds the result exactly as the decode loop would and checks every token
against the constraint. Policies that must see the logits at every step (triggers, Deco-G, statistics wrappers,
the suffix strategies) are refused before the run, by the strategies' own checks.

**Masked mass.** A constrained row's first-step logits are masked on the server, so a one-token probe request
without the grammar runs first. On vLLM it asks for the log-probs of exactly the allowed tokens
(``logprob_token_ids``) when there are at most ``EXACT_IDS_MAX`` of them: exact. Otherwise only the top-k
(``top_logprobs``, 20 by default) are known; then ``masked_mass`` is the lower bound (the forbidden mass among the
top k), and ``stats`` records ``masked_mass_exact = False``, the bounds and the top-k coverage.

**Faults.** Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; when the retries run
out, :class:`ServerUnavailable` (a ``ConnectionError``) stops the run: the runner keeps every completed record and
the same command resumes. A 4xx is :class:`ServerRefused` (that request's error). A server that returns text
outside the constraint is caught by the replay (and by the constraint's oracle): the row ends with
``constraint-error``, ``stats["constraint_ignored"]`` is set and the runner never scores its text as parsed.
Every result records which server and model answered (``Result.model``, ``stats["server"]``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from formtax.backends.model_files import resolve_model
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.decoding.loop import RowOutput, RowRequest, decode
from formtax.decoding.lowering import Lowering
from formtax.decoding.plan import Finish
from formtax.decoding.rowengine import LoweredRow, RowEngine, lark_grammar, lower_row, replay
from formtax.decoding.sampling import GREEDY, Sampling
from formtax.errors import CapabilityError, ConfigError, FormtaxError

log = logging.getLogger(__name__)

EXACT_IDS_MAX = 128  # allowed sets up to this size get an exact masked mass on vLLM (logprob_token_ids; the
# server refuses more than its max_logprobs, 128 by default: a larger set takes the top-k approximation below)


class ServerUnavailable(ConnectionError):
    """The server cannot be reached (after the retries): the run stops, completed records stay, re-run resumes."""


class ServerRefused(FormtaxError):
    """The server answered a request with a client error (4xx): an error for that request only."""


RETRY_AFTER_MAX_S = 60.0
"""The longest ``Retry-After`` the client waits before its next try."""


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date), capped at :data:`RETRY_AFTER_MAX_S`."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


class _Client:
    """JSON over HTTP with retries, on one ``httpx.Client``: its connections are pooled and reused across the
    concurrent requests of a batch. A 429 or 5xx is retried after the server's ``Retry-After`` (else exponential
    backoff); a connection error or timeout is retried; a refusal (4xx) and a body that is not JSON are not, since
    a second try would get the same answer."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float, retries: int, backoff: float,
                 connections: int = 64) -> None:
        import httpx

        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"server URL must start with http:// or https:// (got {base_url!r})")
        self.base = url if url.endswith("/v1") else url + "/v1"
        self.root = self.base[: -len("/v1")]
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.http = httpx.Client(timeout=timeout, headers=headers, limits=limits)

    def request(self, url: str, body: dict[str, Any] | None = None, retries: int | None = None) -> Any:
        import httpx

        tries = (self.retries if retries is None else retries) + 1
        last: BaseException | str | None = None
        wait_s = 0.0
        for attempt in range(tries):
            if attempt:
                time.sleep(wait_s)
            wait_s = self.backoff * 2 ** attempt
            try:
                resp = self.http.post(url, json=body) if body is not None else self.http.get(url)
            except httpx.HTTPError as e:  # connection refused or reset, timeouts
                last = e
                log.warning("server %s: %s (try %d/%d)", url, e, attempt + 1, tries)
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"{resp.status_code} {resp.text[:300]}"
                wait_s = retry_after(resp.headers.get("retry-after")) or wait_s
                log.warning("server %s answered %s (try %d/%d)", url, resp.status_code, attempt + 1, tries)
                continue
            if resp.status_code >= 400:
                raise ServerRefused(f"server {url} refused the request ({resp.status_code}): {resp.text[:800]}")
            try:
                return resp.json()
            except ValueError as e:
                raise ServerRefused(f"server {url} answered {resp.status_code} with a body that is not JSON: "
                                    f"{resp.text[:200]!r}") from e
        raise ServerUnavailable(f"server {url} unreachable after {tries} tries: {last}")

    def close(self) -> None:
        self.http.close()


@dataclass
class _Reply:
    tokens: list[int]
    finish: str | None
    text: str


class OpenAIBackend(RowEngine):
    """An OpenAI-compatible completions server (exact on vLLM; see the module docstring)."""

    name = "openai"
    lowerings = frozenset({Lowering.FREE, Lowering.GRAMMAR})
    ignored_constraint = "the server returned text outside the constraint (caught by the replay and the oracle)"
    capabilities = frozenset({Capability.GRAMMAR_PARAM})

    def __init__(self, client: _Client, tok: TokenizerInfo, served_model: str, flavor: str,
                 server_version: str | None = None, top_logprobs: int = 20, concurrency: int = 64,
                 tokenizer_path: str | None = None) -> None:
        self.client = client
        self._tok = tok
        self.served_model = served_model
        self.flavor = flavor
        self.server_version = server_version
        self.top_logprobs = top_logprobs
        self.concurrency = max(1, concurrency)
        self.tokenizer_path = tokenizer_path
        self._index: dict[str, list[int]] | None = None
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, model: str | None = None, server: str | None = None, served_model: str | None = None,
                api_key: str | None = None, timeout: float = 300.0, retries: int = 4, backoff: float = 0.5,
                concurrency: int = 64, flavor: str = "auto", top_logprobs: int = 20) -> OpenAIBackend:
        """Connect to ``server`` (or ``$FORMTAX_SERVER``); ``model`` names the local tokenizer (the server's model:
        the embedded default when None). Fails at once, with the reason, when the server cannot be reached."""
        from formtax.backends.model_files import tokenizer_info

        server = server or os.environ.get("FORMTAX_SERVER")
        if not server:
            raise ConfigError("the openai backend needs a server URL: --server http://HOST:PORT/v1")
        if flavor not in ("auto", "vllm", "generic"):
            raise ConfigError(f"flavor must be auto, vllm or generic (got {flavor!r})")
        client = _Client(server, api_key or os.environ.get("OPENAI_API_KEY"), timeout, retries, backoff,
                         connections=max(1, concurrency))
        try:
            listing = client.request(client.base + "/models")
        except ServerUnavailable as e:  # before any request: a configuration error (wrong URL, server not up)
            raise ConfigError(f"{e}; is the server running at {client.base}?") from e
        ids = [str(m.get("id")) for m in listing.get("data", [])] if isinstance(listing, dict) else []
        if served_model is None:
            if len(ids) != 1:
                raise ConfigError(f"server {client.base} serves {ids or 'no models'}; name one with served_model=")
            served_model = ids[0]
        elif ids and served_model not in ids:
            raise ConfigError(f"server {client.base} does not serve {served_model!r} (it serves {ids})")
        version = None
        if flavor == "auto":
            try:
                info = client.request(client.root + "/version", retries=0)
                version = str(info.get("version")) if isinstance(info, dict) and "version" in info else None
            except (ServerUnavailable, ServerRefused):
                version = None
            flavor = "vllm" if version is not None else "generic"
        src = resolve_model(model)
        tok = tokenizer_info(src.path)
        return cls(client, tok, served_model, flavor, version, top_logprobs, concurrency, src.path)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return f"{self.served_model} @ {self.client.base}"

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> Batch:
        raise CapabilityError("the openai backend has no steppable batch: a server decodes whole requests")

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model_id, "server": self.client.base,
                "served_model": self.served_model, "flavor": self.flavor, "server_version": self.server_version,
                "tokenizer": self.tokenizer_path}

    # -- what the strategies ask of a RowEngine ----------------------------------------------------------------
    def _refuse(self, who: str, why: str) -> CapabilityError:
        return CapabilityError(f"strategy {who!r} cannot run on server {self.client.base}: {why}")

    def check_rows(self, who: str, kinds: Collection[Lowering], samplings: Sequence[Sampling]) -> None:
        if self.flavor != "vllm" and any(s.top_k > 0 or s.min_p > 0.0 for s in samplings):
            raise self._refuse(who, "top_k and min_p are vLLM's extensions of the OpenAI API; this server "
                                    "takes temperature and top_p only")
        if Lowering.GRAMMAR in kinds and self.flavor != "vllm":
            raise self._refuse(who, "a constrained strategy needs a grammar parameter, and this server is not "
                                    "vLLM (flavor=generic); use a vLLM server with the guidance backend, or "
                                    "pass flavor=vllm if it speaks vLLM's structured_outputs")

    def engine_stats(self) -> dict[str, Any]:
        return {"backend": self.name, "server": self.client.base, "served_model": self.served_model}

    # -- requests ---------------------------------------------------------------------------------------------
    def _body(self, prompt: Sequence[int], max_tokens: int, sampling: Sampling, seed: int,
              stop_ids: frozenset[int], constraint: Constraint | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.served_model, "max_tokens": int(max_tokens),
                                "temperature": float(sampling.temperature)}
        if not sampling.greedy:
            body["seed"] = int(seed)
            if sampling.top_p < 1.0:
                body["top_p"] = sampling.top_p
            if sampling.top_k > 0:  # vLLM's extensions (check_rows refuses them for a generic server)
                body["top_k"] = sampling.top_k
            if sampling.min_p > 0.0:
                body["min_p"] = sampling.min_p
        if self.flavor == "vllm":
            body.update(prompt=list(prompt), return_token_ids=True, stop_token_ids=sorted(stop_ids),
                        skip_special_tokens=False)
            if constraint is not None:
                body["structured_outputs"] = {"grammar": lark_grammar(constraint)}
        else:
            body["prompt"] = self._tok.decode(prompt)
            if stop_ids - self._tok.eos_ids:
                body["stop"] = ["\n"]
        return body

    def _reply(self, data: Any) -> _Reply:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError) as e:
            raise ServerRefused(f"server {self.client.base}: malformed completion response: {str(data)[:300]}") from e
        text = str(choice.get("text") or "")
        ids = choice.get("token_ids")
        tokens = [int(t) for t in ids] if isinstance(ids, list) else self._tok.encode(text)
        return _Reply(tokens, choice.get("finish_reason"), text)

    def _post_all(self, bodies: Sequence[dict[str, Any]]) -> list[Any]:
        """Send the requests concurrently (the server batches them); the first failure cancels the rest. The default
        ``concurrency`` (64) covers a chunk of the runner's default batch with a probe per row, so no generation
        waits in the pool for a slot."""
        if not bodies:
            return []
        url = self.client.base + "/completions"
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies)))
        try:
            futures = [pool.submit(self.client.request, url, b) for b in bodies]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for f in done:
                exc = f.exception()
                if exc is not None:
                    for g in futures:
                        g.cancel()
                    raise exc
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _text_index(self) -> dict[str, list[int]]:
        with self._lock:
            if self._index is None:
                index: dict[str, list[int]] = {}
                for i in range(self._tok.n_logits):
                    index.setdefault(self._tok.decode([i]), []).append(i)
                self._index = index
            return self._index

    def _token_ids(self, key: str) -> list[int]:
        if key.startswith("token_id:"):
            return [int(key.split(":", 1)[1])]
        return self._text_index().get(key, [])

    def _probe_body(self, prompt: Sequence[int], allowed: torch.Tensor) -> dict[str, Any]:
        body = self._body(prompt, 1, GREEDY, 0, self._tok.eos_ids, None)
        body["logprobs"] = self.top_logprobs
        if self.flavor == "vllm":
            body["return_tokens_as_token_ids"] = True
            ids = allowed.nonzero().flatten().tolist()
            if 0 < len(ids) <= EXACT_IDS_MAX:
                body["logprobs"] = 1
                body["logprob_token_ids"] = ids
        return body

    def _mass(self, data: Any, allowed: torch.Tensor, exact_ids: bool) -> tuple[float | None, dict[str, Any]]:
        """(masked_mass, stats) from a probe's first-step log-probs (see the module docstring)."""
        try:
            top = data["choices"][0]["logprobs"]["top_logprobs"][0] or {}
        except (KeyError, IndexError, TypeError):
            return None, {"masked_mass_exact": False, "masked_mass_error": "the server returned no log-probs"}
        seen: set[int] = set()
        inside = outside = 0.0
        for key, lp in top.items():
            ids = self._token_ids(str(key))
            if len(ids) != 1 or ids[0] in seen or ids[0] >= allowed.shape[0]:
                continue  # unknown, ambiguous (several ids share the text) or repeated: not counted as covered
            seen.add(ids[0])
            p = math.exp(float(lp))
            if bool(allowed[ids[0]]):
                inside += p
            else:
                outside += p
        n_allowed = int(allowed.sum().item())
        if exact_ids and len(seen & set(allowed.nonzero().flatten().tolist())) == n_allowed:
            mass = max(0.0, 1.0 - inside)
            return mass, {"masked_mass_exact": True}
        coverage = inside + outside
        lo, hi = outside, min(1.0, outside + max(0.0, 1.0 - coverage))
        return lo, {"masked_mass_exact": False, "masked_mass_bounds": [lo, hi], "masked_mass_topk_coverage": coverage,
                    "masked_mass_k": len(top)}

    def _probes(self, items: Sequence[tuple[list[int], Any]], *also: dict[str, Any]
                ) -> tuple[list[tuple[float | None, dict[str, Any]]], list[Any]]:
        """Masked masses for (prompt, fresh ConstrainedPolicy) pairs, from one probe request each; ``also``:
        other request bodies sent concurrently with the probes (a row's generation does not wait for its probe:
        the probe is a separate greedy one-token request on the same prompt), their replies second."""
        allowed = [policy.matcher.allowed_mask() for _, policy in items]
        bodies = [self._probe_body(prompt, a) for (prompt, _), a in zip(items, allowed, strict=True)]
        replies = self._post_all([*bodies, *also])
        masses = [self._mass(d, a, "logprob_token_ids" in b)
                  for d, a, b in zip(replies[: len(bodies)], allowed, bodies, strict=True)]
        return masses, replies[len(bodies):]

    # -- decoding ---------------------------------------------------------------------------------------------
    def decode_rows(self, backend: Backend, rows: Sequence[RowRequest], sampling: Sampling,
                    whole: Sequence[Constraint | None]) -> list[RowOutput]:
        """A ``RowDecoder`` for rows a server can decode alone (free text, a whole-output grammar)."""
        if backend is not self:  # e.g. NL-to-Format's extractor on another engine
            return decode(backend, rows, temperature=sampling)
        t0 = time.perf_counter()
        lowered: list[LoweredRow] = [lower_row(r, w) for r, w in zip(rows, whole, strict=True)]
        for low in lowered:
            if low.kind == "live":
                raise CapabilityError(f"the openai backend cannot step a {type(low.inner).__name__} policy")
        measured = [k for k, p in enumerate(lowered) if p.kind == "grammar" and getattr(p.inner, "_measure", True)]
        bodies = [self._body(list(r.prompt_ids) + p.prefix, r.max_tokens - len(p.prefix), sampling, r.seed,
                             p.stop_ids, p.constraint) for r, p in zip(rows, lowered, strict=True)]
        found, data = self._probes([(list(rows[k].prompt_ids) + lowered[k].prefix, lowered[k].inner) for k in measured],
                                   *bodies)
        masses = dict(zip(measured, found, strict=True))
        replies = [self._reply(d) for d in data]
        wall = time.perf_counter() - t0
        outs = []
        for k, (row, low, reply) in enumerate(zip(rows, lowered, replies, strict=True)):
            mass, stats = masses.get(k, (None, {}))
            out = replay(row, low.prefix + reply.tokens, mass)
            self._settle(out, reply, stats)
            out.wall_s = wall
            outs.append(out)
        return outs

    def _settle(self, out: RowOutput, reply: _Reply, stats: dict[str, Any]) -> None:
        """Name a finish the replay could not (a text-only server's stop), and attach the backend's statistics."""
        if out.finish_reason == Finish.ENGINE_ENDED:
            if self.flavor == "vllm":
                raise RuntimeError(f"server {self.client.base} ended a row with {reply.finish!r} before its policy")
            out.finish_reason = {None: Finish.EOS, "": Finish.EOS, "stop": Finish.EOS, "length": Finish.LENGTH}.get(
                reply.finish, Finish.SERVER_STOP)
        if out.finish_reason == Finish.CONSTRAINT_ERROR:
            stats = {**stats, "server_text": reply.text}
        if self.flavor != "vllm":
            stats = {**stats, "token_ids": "retokenized"}
        if stats:
            out.events.append({"step": 0, "stats": stats})
