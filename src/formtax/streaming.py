"""``formtax.stream`` / ``formtax.astream``: the output as it is decoded, as text deltas tagged with their phase,
then the final :class:`~formtax.strategies.base.Result`.

    for part in formtax.stream(m, "2 + 5?", "inwriting", "The answer is: {int}", max_tokens=96):
        if isinstance(part, formtax.Delta):
            print(part.text, end="")           # part.phase: "reasoning", "answer", "rc", ...
        else:
            result = part                      # the same Result formtax.generate returns

How: the strategy's own rows run through the ordinary decode loop (``SinglePass.run_rows``) with each row's policy
behind a :class:`Tap`, a transparent wrapper that reports every emitted token with the phase its policy was in.
So the Result is exactly ``generate``'s. Each phase run is detokenised cumulatively, as the Result's per-phase texts
are (``Result.phases``), and a delta is held back while it ends inside an incomplete UTF-8 character; the deltas
of a phase that carry tokens concatenate to that phase's text, and all deltas to ``Result.text`` whenever no
character straddles a phase boundary (InWriting's line break at a glued switch is a delta of its own, with no
tokens). A phase is the
policy's at the token: InWriting's switch moves from ``reasoning`` to ``answer`` live; strategies that decide the
split afterwards (Deco-G's last line) stream as ``reasoning`` and the Result holds the split.

Supported: single-pass strategies on step-wise backends (hf, the fake and planted backends). The suffix
strategies rewind (a streamed token could be taken back) and NL-to-Format calls twice: they are refused, as are
backends that decode outside formtax's loop (vllm, openai).
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from formtax.api import _backend, _prompt, check_context, resolve_closing, resolve_sampling, typed_result
from formtax.constraints.native import as_constraint
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Backend, Driver, TokenizerInfo
from formtax.decoding.loop import Policy, RowOutput, RowRequest, decode
from formtax.decoding.plan import Phase, Transparent
from formtax.decoding.sampling import Sampling, row_seeds
from formtax.errors import ConfigError
from formtax.strategies import Request, Result, get_strategy
from formtax.strategies.base import Prompt, SinglePass


@dataclass(frozen=True)
class Delta:
    """New text of the output, the phase it belongs to, and the tokens that completed it."""

    text: str
    phase: str
    token_ids: tuple[int, ...]


class Tap(Transparent):
    """A policy that reports each emitted token and its phase to ``sink``, changing nothing else."""

    def __init__(self, inner: Policy, sink: Callable[[int, str], None]) -> None:
        self.inner = inner
        self.sink = sink

    def advance(self, token: int) -> str | None:
        self.sink(token, self.inner.phase)
        return self.inner.advance(token)

    def __getattr__(self, name: str) -> Any:  # strategies may read their policy's own state
        return getattr(self.inner, name)


END = object()
"""Put on a :func:`deltas` queue after the last item."""


def stream(model: Backend, prompt: Prompt, strategy: str = "free", answer: Any = None, max_tokens: int = 256,
           reasoning: str | None = None, triggers: Sequence[str] = (), seed: int | None = None, constrain: bool = True,
           temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0,
           model_defaults: bool = False, raw: bool = False, closing: bool | None = None) -> Iterator[Delta | Result]:
    """Deltas as they are decoded, then the Result (module docstring; arguments as :func:`formtax.generate`)."""
    backend = _backend(model)
    strat = get_strategy(strategy)
    if not isinstance(strat, SinglePass):
        raise ConfigError(f"strategy {strategy!r} cannot stream: it rewinds or makes two calls (use generate)")
    if backend.driver is not Driver.LOOP:
        raise ConfigError(f"backend {backend.name!r} decodes outside formtax's loop and cannot stream")
    constraint = as_constraint(answer) if answer is not None else None
    sampling = resolve_sampling(backend, Sampling(temperature, top_p, top_k, min_p), model_defaults)
    req = Request(_prompt(prompt, raw), constraint, max_tokens=max_tokens, seed=row_seeds(seed, 1)[0],
                  reasoning_prefix=reasoning,
                  triggers=triggers, constrain=constrain, temperature=sampling.temperature, top_p=sampling.top_p,
                  top_k=sampling.top_k, min_p=sampling.min_p,
                  closing=resolve_closing(backend, closing))
    strat.check(backend, [req])
    check_context(backend, [req])
    q: queue.Queue[Any] = queue.Queue()

    def decoder(b: Backend, rows: Sequence[RowRequest], s: Sampling, whole: Sequence[Constraint | None]
                ) -> list[RowOutput]:
        tapped = [dataclasses.replace(r, policy=Tap(r.policy, lambda t, ph: q.put((t, ph)))) for r in rows]
        return decode(b, tapped, temperature=s)

    def work() -> None:
        try:
            (res,) = strat.run_rows(backend, [req], decoder)
            q.put(typed_result(res, constraint))
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)
        finally:
            q.put(END)

    threading.Thread(target=work, name="formtax-stream", daemon=True).start()
    yield from deltas(backend.tokenizer, q, seam=strategy == "inwriting")


def deltas(tok: TokenizerInfo, q: queue.Queue[Any], seam: bool = False) -> Iterator[Delta | Result]:
    """Deltas from a queue of ``(token, phase)`` items, then the Result put after them; an exception put there is
    raised; :data:`END` ends (module docstring: cumulative detokenisation per phase run, incomplete characters
    held back). Shared by :func:`stream` and the server's streamed requests (which decode in shared batches).

    ``seam``: the Result's text puts a line break where InWriting's switch glued the reasoning to the answer
    (:func:`~formtax.strategies.inwriting.reader_text`); that break comes as a delta of its own, in the answer's
    phase and with no tokens, so the deltas always concatenate to ``Result.text``."""
    run: list[int] = []  # the tokens of the current phase run, detokenised together
    run_phase = ""
    sent = ""  # what of the run's text was sent
    pending: list[int] = []
    last = ""  # the last character sent before the answer phase (for the seam)
    answered = False  # an answer delta with text was sent

    def flush(final: bool) -> Delta | None:
        nonlocal sent, pending
        text = tok.decode_text(run)
        if not final and text.endswith("\ufffd"):  # inside a multi-byte character: wait for the rest
            return None
        if len(text) <= len(sent) and not (final and pending):
            return None
        d = Delta(text[len(sent) :], run_phase, tuple(pending))
        sent, pending = text, []
        return d

    def sealed(d: Delta) -> list[Delta]:
        """``d``, after the seam's line break where it belongs (docstring)."""
        nonlocal last, answered
        if d.phase != Phase.ANSWER:
            last = d.text[-1] if d.text else last
            return [d]
        if not seam or answered or not d.text:
            return [d]
        answered = True
        glued = last and not last.isspace() and not d.text[0].isspace()
        return [Delta("\n", d.phase, ()), d] if glued else [d]

    while True:
        item = q.get()
        if item is END:
            return
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Result):
            d = flush(final=True)  # what an incomplete character held back, or an EOS (text "")
            if d is not None:
                yield from sealed(d)
            yield item
            continue
        token, phase = item
        if phase != run_phase and run:  # a new phase: the old run's text is complete as it is
            d = flush(final=True)
            if d is not None:
                yield from sealed(d)
            run, sent, pending = [], "", []
        run_phase = phase
        run.append(token)
        pending.append(token)
        d = flush(final=False)
        if d is not None:
            yield from sealed(d)


async def astream(model: Backend, prompt: Prompt, strategy: str = "free", answer: Any = None,
                  **kwargs: Any) -> AsyncIterator[Delta | Result]:
    """:func:`stream` for asyncio code (a server): decoding runs in a worker thread, the loop stays free."""
    it = stream(model, prompt, strategy, answer, **kwargs)
    done = object()
    while True:
        part = await asyncio.to_thread(next, it, done)
        if part is done:
            return
        assert isinstance(part, (Delta, Result))
        yield part
