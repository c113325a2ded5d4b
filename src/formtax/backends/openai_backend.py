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

**Strategies.** ``free``, ``short``, ``constrained``, ``json`` and NL-to-Format's two calls are rows the server
decodes on its own; each row's policy is then replayed over the returned tokens (``rowplan.replay``), which
rebuilds the result exactly as the decode loop would and checks every token against the constraint. InWriting's
EOS switch is two requests: a free call to EOS (at most the preamble budget plus one token, to tell "the model
wanted EOS" from "the budget ran out") and a constrained continuation of prompt + preamble, which is the very
token sequence the single-pass form decodes (greedy or sampled: the switch is on the EOS/PAD drawn from the
unmasked distribution, which is where a free call with those stop tokens ends). Policies that must see the logits at every step (triggers, Deco-G, statistics wrappers,
the suffix strategies) are refused before the run.

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

import http.client
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from formtax.backends.base import Backend, Batch, Capability, TokenizerInfo
from formtax.backends.model_files import resolve_model
from formtax.backends.rowplan import RowPlan, lark_grammar, plan_row, replay
from formtax.constraints.spec import Constraint
from formtax.decoding.loop import RowOutput, RowRequest, Step, decode
from formtax.decoding.sampling import GREEDY, Sampling
from formtax.errors import CapabilityError, ConfigError, ConstraintError, FormtaxError

if TYPE_CHECKING:
    from formtax.strategies.base import Request, Result, Strategy

log = logging.getLogger(__name__)

EXACT_IDS_MAX = 128  # allowed sets up to this size get an exact masked mass on vLLM (logprob_token_ids; the
# server refuses more than its max_logprobs, 128 by default: a larger set takes the top-k approximation below)
SUPPORTED = "free, short, constrained, json, inwriting (EOS switch, greedy, no triggers), nl2format"


class ServerUnavailable(ConnectionError):
    """The server cannot be reached (after the retries): the run stops, completed records stay, re-run resumes."""


class ServerRefused(FormtaxError):
    """The server answered a request with a client error (4xx): an error for that request only."""


class _Client:
    """JSON over HTTP with retries (stdlib only: one dependency fewer, and every timeout is ours)."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float, retries: int, backoff: float) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"server URL must start with http:// or https:// (got {base_url!r})")
        self.base = url if url.endswith("/v1") else url + "/v1"
        self.root = self.base[: -len("/v1")]
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    def request(self, url: str, body: dict[str, Any] | None = None, retries: int | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        tries = (self.retries if retries is None else retries) + 1
        last: BaseException | None = None
        for attempt in range(tries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                detail = e.read()[:800].decode("utf-8", "replace")
                if e.code == 429 or e.code >= 500:
                    last = e
                    log.warning("server %s answered %s (try %d/%d)", url, e.code, attempt + 1, tries)
                    continue
                raise ServerRefused(f"server {url} refused the request ({e.code}): {detail}") from e
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, json.JSONDecodeError) as e:
                last = e
                log.warning("server %s: %s (try %d/%d)", url, e, attempt + 1, tries)
        raise ServerUnavailable(f"server {url} unreachable after {tries} tries: {last}")


@dataclass
class _Reply:
    tokens: list[int]
    finish: str | None
    text: str


class OpenAIBackend(Backend):
    """An OpenAI-compatible completions server (exact on vLLM; see the module docstring)."""

    name = "openai"
    capabilities = frozenset({Capability.GRAMMAR_PARAM, Capability.TOPK_LOGPROBS})

    def __init__(self, client: _Client, tok: TokenizerInfo, served_model: str, flavor: str,
                 server_version: str | None = None, top_logprobs: int = 20, concurrency: int = 16,
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
                concurrency: int = 16, flavor: str = "auto", top_logprobs: int = 20) -> OpenAIBackend:
        """Connect to ``server`` (or ``$FORMTAX_SERVER``); ``model`` names the local tokenizer (the server's model:
        the embedded default when None). Fails at once, with the reason, when the server cannot be reached."""
        from formtax.backends.vllm_backend import tokenizer_info

        server = server or os.environ.get("FORMTAX_SERVER")
        if not server:
            raise ConfigError("the openai backend needs a server URL: --server http://HOST:PORT/v1")
        if flavor not in ("auto", "vllm", "generic"):
            raise ConfigError(f"flavor must be auto, vllm or generic (got {flavor!r})")
        client = _Client(server, api_key or os.environ.get("OPENAI_API_KEY"), timeout, retries, backoff)
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

    # -- the dispatch hook ------------------------------------------------------------------------------------
    def _refuse(self, strategy: Strategy, why: str) -> CapabilityError:
        return CapabilityError(f"strategy {strategy.name!r} cannot run on server {self.client.base}: {why}")

    def _need_grammar(self, strategy: Strategy) -> None:
        if self.flavor != "vllm":
            raise self._refuse(strategy, "a constrained strategy needs a grammar parameter, and this server is not "
                                         "vLLM (flavor=generic); use a vLLM server with the guidance backend, or "
                                         "pass flavor=vllm if it speaks vLLM's structured_outputs")

    def check_strategy(self, strategy: Strategy, requests: Sequence[Request]) -> bool:
        from formtax.strategies.base import SinglePass
        from formtax.strategies.inwriting import InWriting
        from formtax.strategies.nl2format import NL2Format

        if self.flavor != "vllm" and any(r.top_k > 0 or r.min_p > 0.0 for r in requests):
            raise self._refuse(strategy, "top_k and min_p are vLLM's extensions of the OpenAI API; this server "
                                         "takes temperature and top_p only")
        if isinstance(strategy, InWriting):
            for r in requests:
                if not r.constrain:
                    continue
                if r.triggers:
                    raise self._refuse(strategy, "trigger switches need the logits of every step; only the EOS "
                                                 "switch compiles into requests")
                self._need_grammar(strategy)
            return True
        if isinstance(strategy, NL2Format):
            if any(r.constrain for r in requests):
                self._need_grammar(strategy)
            return True
        if isinstance(strategy, SinglePass):
            for r in requests:
                try:
                    policy = strategy.policy(self, r)
                except ConstraintError:
                    continue  # an error result for that request, as on every backend
                plan = plan_row(RowRequest([0], policy, r.max_tokens), strategy.whole_output_constraint(r, policy))
                if plan.kind == "live":
                    raise self._refuse(strategy, f"its policy ({type(plan.inner).__name__}) must see the logits of "
                                                 f"every step, which a server does not expose; supported: {SUPPORTED}")
                if plan.kind == "grammar":
                    self._need_grammar(strategy)
            return True
        raise self._refuse(strategy, f"no request form is known for it; supported: {SUPPORTED}")

    def run_strategy(self, strategy: Strategy, requests: Sequence[Request]) -> list[Result] | None:
        from formtax.strategies.inwriting import InWriting

        if isinstance(strategy, InWriting):
            results = self._run_inwriting(strategy, requests)
        else:
            results = strategy.run_rows(self, requests, self.decode_rows)  # type: ignore[attr-defined]
        for res in results:
            res.stats.update({"backend": self.name, "server": self.client.base, "served_model": self.served_model})
            if res.stats.get("constraint_ignored"):  # set by the replay (rowplan.replay)
                res.error = "the server returned text outside the constraint (caught by the replay and the oracle)"
        return results

    # -- requests ---------------------------------------------------------------------------------------------
    def _body(self, prompt: Sequence[int], max_tokens: int, sampling: Sampling, seed: int,
              stop_ids: frozenset[int], constraint: Constraint | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.served_model, "max_tokens": int(max_tokens),
                                "temperature": float(sampling.temperature)}
        if not sampling.greedy:
            body["seed"] = int(seed)
            if sampling.top_p < 1.0:
                body["top_p"] = sampling.top_p
            if sampling.top_k > 0:  # vLLM's extensions (check_strategy refuses them for a generic server)
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
        """Send the requests concurrently (the server batches them); the first failure cancels the rest."""
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
        plans: list[RowPlan] = [plan_row(r, w) for r, w in zip(rows, whole, strict=True)]
        for plan in plans:
            if plan.kind == "live":
                raise CapabilityError(f"the openai backend cannot step a {type(plan.inner).__name__} policy")
        measured = [k for k, p in enumerate(plans) if p.kind == "grammar" and getattr(p.inner, "_measure", True)]
        bodies = [self._body(list(r.prompt_ids) + p.prefix, r.max_tokens - len(p.prefix), sampling, r.seed,
                             p.stop_ids, p.constraint) for r, p in zip(rows, plans, strict=True)]
        found, data = self._probes([(list(rows[k].prompt_ids) + plans[k].prefix, plans[k].inner) for k in measured],
                                   *bodies)
        masses = dict(zip(measured, found, strict=True))
        replies = [self._reply(d) for d in data]
        wall = time.perf_counter() - t0
        outs = []
        for k, (row, plan, reply) in enumerate(zip(rows, plans, replies, strict=True)):
            mass, stats = masses.get(k, (None, {}))
            out = replay(row, plan.prefix + reply.tokens, reply.finish, mass)
            self._settle(out, reply, stats)
            out.wall_s = wall
            outs.append(out)
        return outs

    def _settle(self, out: RowOutput, reply: _Reply, stats: dict[str, Any]) -> None:
        """Name a finish the replay could not (a text-only server's stop), and attach the backend's statistics."""
        if out.finish_reason.startswith("engine-"):
            if self.flavor == "vllm":
                raise RuntimeError(f"server {self.client.base} ended a row with {reply.finish!r} before its policy")
            out.finish_reason = {"engine-stop": "eos", "engine-length": "length"}.get(out.finish_reason, "stop")
        if out.finish_reason == "constraint-error":
            stats = {**stats, "server_text": reply.text}
        if self.flavor != "vllm":
            stats = {**stats, "token_ids": "retokenized"}
        if stats:
            out.events.append({"step": 0, "stats": stats})

    def _run_inwriting(self, strategy: Any, requests: Sequence[Request]) -> list[Result]:
        """InWriting's EOS switch as two requests per row (see the module docstring)."""
        from formtax.strategies.base import Result, request_sampling
        from formtax.strategies.policies import ForcedPrefix, InWritingPolicy

        results: list[Result | None] = [None] * len(requests)
        plain = [k for k, r in enumerate(requests) if not r.constrain]
        if plain:
            for k, res in zip(plain, strategy.run_rows(self, [requests[k] for k in plain], self.decode_rows),
                              strict=True):
                results[k] = res
        items: list[tuple[int, list[int], list[int], InWritingPolicy]] = []
        for k, r in enumerate(requests):
            if not r.constrain:
                continue
            try:
                policy = strategy.policy(self, r)
            except ConstraintError as e:
                results[k] = Result(strategy=strategy.name, model=self.model_id, text="", error=str(e),
                                    finish_reason="constraint-error", parse_error=str(e))
                continue
            prefix, inner = ([*policy.prefix], policy.inner) if type(policy) is ForcedPrefix else ([], policy)
            if type(inner) is not InWritingPolicy:
                raise CapabilityError(f"unexpected InWriting policy {type(inner).__name__}")
            items.append((k, self._tok.prompt_ids(r.prompt), prefix, inner))
        t0 = time.perf_counter()
        first = [self._reply(d) for d in self._post_all([
            # a free call stopped at EOS/PAD is the switch rule itself, greedy or sampled: the drawn stop token
            self._body(p + pre, inner.preamble_budget + 1, request_sampling(requests[k]), requests[k].seed,
                       inner.stop_ids, None)
            for k, p, pre, inner in items])]
        switches: list[tuple[list[int], str]] = []
        for (k, _, _, inner), reply in zip(items, first, strict=True):
            toks, budget = reply.tokens, inner.preamble_budget
            if toks and toks[-1] in inner.stop_ids and len(toks) <= budget + 1:
                switches.append((toks[:-1], "eos"))  # the model wanted to stop here: that EOS is never emitted
            elif len(toks) > budget:
                switches.append((toks[:budget], "budget"))
            else:
                raise RuntimeError(f"server {self.client.base}: the free call of request {k} ended with "
                                   f"{reply.finish!r} after {len(toks)} tokens, neither at EOS nor at its budget")
        prompts2 = [p + pre + preamble for (_, p, pre, _), (preamble, _) in zip(items, switches, strict=True)]
        masses, data = self._probes(
            [(p2, inner.answer) for p2, (_, _, _, inner) in zip(prompts2, items, strict=True)],
            *[self._body(p2, requests[k].max_tokens - len(pre) - len(preamble), request_sampling(requests[k]),
                         requests[k].seed, inner.answer.eos_ids, requests[k].constraint)
              for p2, (k, _, pre, inner), (preamble, _) in zip(prompts2, items, switches, strict=True)])
        second = [self._reply(d) for d in data]
        wall = time.perf_counter() - t0
        for (k, p, pre, inner), (preamble, why), p2, call1, reply, (mass, stats) in zip(
                items, switches, prompts2, first, second, masses, strict=True):
            budget = requests[k].max_tokens - len(pre) - len(preamble)
            answer = replay(RowRequest(p2, inner.answer, budget, requests[k].seed), reply.tokens, reply.finish, mass)
            self._settle(answer, reply, stats)
            out = RowOutput(prompt_ids=list(p))
            out.tokens = [*pre, *preamble, *answer.tokens]
            out.steps = ([Step(t, "rc", True, False) for t in pre]
                         + [Step(t, "reasoning", False, True) for t in preamble] + answer.steps)
            out.events = [{"step": len(pre) + len(preamble), "switch": why}] + answer.events
            out.finish_reason = answer.finish_reason
            out.masked_mass = answer.masked_mass
            out.wall_s = wall
            out.forward_passes = len(call1.tokens) + len(reply.tokens)
            results[k] = strategy.assemble(self, requests[k], out, wall)
        return [r for r in results if r is not None]
