"""The backend protocol: one small interface every model engine implements.

A backend owns a model and its tokenizer. The decode loop (``formtax.decoding``) owns everything else. What a
backend gives the loop is a :class:`Batch`: rows are prefilled together, then each ``step`` appends one token per
live row and returns the next-token logits of every live row; rows leave with ``keep``; a row can be cropped back
to an earlier length (``crop``; the suffix strategies need it).

Capabilities are declared, so a strategy that needs what a backend lacks fails before a run starts
(:func:`require`), never half-way through a batch.

Engines that cannot hand the loop a steppable :class:`Batch` (vLLM, OpenAI-compatible servers) are
instances of :class:`~formtax.decoding.rowengine.RowEngine`: they decode whole rows, each row lowered by its own policy
(:mod:`formtax.decoding.lowering`). The protocol names no strategy: strategies adapt to engines, never the reverse.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from formtax.constraints.compile import EngineTokenizer
from formtax.errors import CapabilityError, ConfigError


class Capability(StrEnum):
    STEP_LOGITS = "step-logits"  # full next-token logits at every step, in-process
    KV_CROP = "kv-crop"  # crop a row's cache back to an earlier length
    GRAMMAR_PARAM = "grammar-param"  # only a whole-output grammar parameter (servers)
    # an engine that owns its loop ends a free-text row at a caller's stop strings itself (vLLM's ``stop``;
    # RowControls.stops): formtax serve's ``stop`` reaches such a row without formtax's loop
    STOP_STRINGS = "stop-strings"


class RenderedChat(str):
    """Chat messages the chat template already rendered (with a request's own template variables): a plain-text
    prompt that encodes as its messages would (the template wrote the special tokens), not as a raw string."""


PROMPT_MEMO = 64
"""How many prompts' ids a tokenizer keeps (:meth:`TokenizerInfo.prompt_ids`)."""

_PROMPTS_LOCK = threading.Lock()


def _prompt_key(prompt: Any, options: dict[str, Any]) -> str:
    """A prompt's identity for the memo: its kind, its text or messages, and the chat template's options."""
    kind = "rendered" if isinstance(prompt, RenderedChat) else ("text" if isinstance(prompt, str) else "chat")
    body = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)
    return f"{kind}\0{json.dumps(options, sort_keys=True, default=str)}\0{body}"


@dataclass
class TokenizerInfo:
    """What the loop and the strategies need to know of a tokenizer."""

    hf: Any  # the Hugging Face fast tokenizer
    eos_ids: frozenset[int]
    pad_id: int
    n_logits: int  # width of the model's logits row (may exceed the tokenizer's vocabulary)
    has_chat_template: bool
    # keyword arguments of the chat template, e.g. {"enable_thinking": False} (see :meth:`set_thinking`)
    chat_options: dict[str, Any] = field(default_factory=dict)
    _engine: EngineTokenizer | None = field(default=None, repr=False)
    _newline: frozenset[int] | None = field(default=None, repr=False)
    _max_bytes: int | None = field(default=None, repr=False)
    # the last prompts' ids: one request is tokenized once, though its context check, its strategy's check and its
    # row each ask (a server sees a request's prompt at each of those steps)
    _prompts: OrderedDict[str, tuple[int, ...]] = field(default_factory=OrderedDict, init=False, repr=False,
                                                         compare=False)

    @classmethod
    def from_hf(cls, hf_tokenizer: Any, generation_eos: Any, n_logits: int, model_id: str) -> TokenizerInfo:
        """The tokenizer of a Hugging Face model: EOS is the generation config's EOS id(s) plus the tokenizer's,
        so every backend stops on the same set; PAD falls back to the smallest EOS."""
        eos: set[int] = set()
        for e in (generation_eos, hf_tokenizer.eos_token_id):
            if isinstance(e, int):
                eos.add(e)
            elif isinstance(e, list):
                eos.update(e)
        if not eos:
            raise ConfigError(f"model {model_id}: the tokenizer defines no EOS token")
        pad = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else min(eos)
        return cls(hf=hf_tokenizer, eos_ids=frozenset(eos), pad_id=int(pad), n_logits=int(n_logits),
                   has_chat_template=bool(getattr(hf_tokenizer, "chat_template", None)))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def decode_text(self, ids: Sequence[int]) -> str:
        """Decode without special tokens (what a user reads)."""
        return str(
            self.hf.decode(
                [i for i in ids if i not in self.eos_ids], skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    @property
    def newline_ids(self) -> frozenset[int]:
        """Tokens whose text contains a newline (the ``short`` strategy stops on them); computed once."""
        if self._newline is None:
            vocab = self.hf.get_vocab()
            self._newline = frozenset(
                i for i in vocab.values() if i not in self.eos_ids and "\n" in self.decode([i])
            )
        return self._newline

    @property
    def max_token_bytes(self) -> int:
        """An upper bound on the bytes of text one token stands for: the longest vocabulary entry's UTF-8 length
        (a byte-level BPE character stands for one byte in one or two; SentencePiece's ``▁`` for one in
        three; a byte-fallback ``<0x0A>`` for one in six). Computed once."""
        if self._max_bytes is None:
            self._max_bytes = max((len(t.encode("utf-8")) for t in self.hf.get_vocab()), default=1)
        return self._max_bytes

    def fewest_tokens(self, prompt: str | list[dict[str, str]]) -> int:
        """A lower bound on the prompt's token count, from its length alone (no tokenizing): its non-whitespace
        bytes over twice :attr:`max_token_bytes` (whitespace may collapse; a normaliser may shorten a character,
        hence the 2). What lets a server refuse a prompt of megabytes before tokenizing it."""
        texts = [prompt] if isinstance(prompt, str) else [str(m.get("content") or "") for m in prompt]
        solid = sum(len(t.encode("utf-8", "replace")) - sum(map(t.count, " \t\n\r")) for t in texts)
        return solid // (2 * self.max_token_bytes)

    def chat_prompt(self, messages: list[dict[str, str]], extra: dict[str, Any] | None = None) -> str:
        """The prompt text for chat messages (the chat template when there is one, else plain concatenation);
        ``extra``: more variables for the template (a server request's ``chat_template_kwargs``)."""
        if self.has_chat_template:
            return str(self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                   **{**self.chat_options, **(extra or {})}))
        return "\n\n".join(m["content"] for m in messages) + "\n"

    def set_thinking(self, on: bool | None) -> None:
        """Turn a chat template's thinking switch on or off (Qwen3 and similar: ``enable_thinking``); None leaves
        the template's default. Paper 003 runs thinking off. A template without the switch is refused, since
        the setting would silently do nothing."""
        if on is None:
            self.chat_options.pop("enable_thinking", None)
            return
        template = getattr(self.hf, "chat_template", None) or ""
        if "enable_thinking" not in str(template):
            raise ConfigError("--thinking: this model's chat template has no thinking switch (enable_thinking)")
        self.chat_options["enable_thinking"] = bool(on)

    def prompt_text(self, prompt: str | list[dict[str, str]]) -> str:
        """The text a prompt is encoded from (what records keep): a plain string as is, messages through
        :meth:`chat_prompt`."""
        return prompt if isinstance(prompt, str) else self.chat_prompt(prompt)

    def prompt_ids(self, prompt: str | list[dict[str, str]]) -> list[int]:
        """Token ids of a prompt: chat messages through the chat template, a plain string as the tokenizer
        encodes it by its own convention (special tokens included, as ``model.generate`` users would). Messages
        concatenated for a model without a chat template are plain text too, so they get the tokenizer's own
        special tokens (Gemma's BOS, without which the pre-trained model is far off its training distribution);
        a chat template writes its own. Memoised for the last :data:`PROMPT_MEMO` prompts."""
        key = _prompt_key(prompt, {**self.chat_options, "\0template": self.has_chat_template})
        with _PROMPTS_LOCK:
            hit = self._prompts.get(key)
            if hit is not None:
                self._prompts.move_to_end(key)
                return list(hit)
        ids = self._prompt_ids(prompt)
        with _PROMPTS_LOCK:
            self._prompts[key] = tuple(ids)
            while len(self._prompts) > PROMPT_MEMO:
                self._prompts.popitem(last=False)
        return ids

    def _prompt_ids(self, prompt: str | list[dict[str, str]]) -> list[int]:
        if isinstance(prompt, RenderedChat):
            return list(self.hf.encode(prompt, add_special_tokens=not self.has_chat_template))
        if isinstance(prompt, str):
            return list(self.hf.encode(prompt, add_special_tokens=True))
        return list(self.hf.encode(self.chat_prompt(prompt), add_special_tokens=not self.has_chat_template))

    @property
    def engine(self) -> EngineTokenizer:
        """The grammar engine's view of this tokenizer (built lazily, once)."""
        if self._engine is None:
            self._engine = EngineTokenizer(self.hf, eos_ids=sorted(self.eos_ids))
        return self._engine


class Batch(ABC):
    """The KV state of a batch of rows being decoded together. Rows are addressed by live position."""

    @abstractmethod
    def prefill(self) -> torch.Tensor:
        """Run the prompts; return next-token logits [n_rows, n_logits] (float32)."""

    @abstractmethod
    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        """Append one token per live row; return the next logits [n_live, n_logits]."""

    def step_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`step` with the tokens as a tensor [n_live] on the logits' device (the decode loop's device step
        chose them there): a batch on an accelerator feeds them to the model without a copy back. The default
        reads them on the host."""
        return self.step([int(t) for t in tokens.tolist()])

    @abstractmethod
    def keep(self, live_positions: Sequence[int]) -> None:
        """Keep only these live rows (in this order); the others are finished and dropped."""

    def crop(self, live_position: int, n_generated: int) -> None:
        """Forget this row's generated tokens after the first ``n_generated`` (KV_CROP capability)."""
        raise CapabilityError(f"{type(self).__name__} cannot crop a row's cache")

    @property
    def joinable(self) -> bool:
        """Whether :meth:`join` can take new rows into this running batch (continuous batching)."""
        return False

    def join(self, other: Batch) -> None:
        """Append ``other``'s rows (a prefilled batch of the same backend) after this batch's live rows; their
        next step is this batch's next step."""
        raise CapabilityError(f"{type(self).__name__} cannot take rows into a running batch")


class Driver(StrEnum):
    """Who runs a backend's decode steps (:attr:`Backend.driver`): the one answer to "does formtax's loop step
    this backend?" that the entry points ask (streaming, the server's batching, closing's default)."""

    LOOP = "loop"  # formtax's decode loop steps the model's batch (transformers, the fake backend)
    ENGINE = "engine"  # an engine owns its loop; formtax's rows are stepped inside it (vLLM: decoding/rowengine.py)
    CALLS = "calls"  # whole-output calls with a grammar parameter (an OpenAI-compatible server)


class Backend(ABC):
    """A model engine behind the one small protocol."""

    name: str = "backend"
    capabilities: frozenset[Capability] = frozenset()

    @property
    def driver(self) -> Driver:
        """Who runs the decode steps (:class:`Driver`): formtax's loop wherever the backend hands out the logits
        of every step; an engine that owns its loop says :attr:`Driver.ENGINE` (RowEngine)."""
        return Driver.LOOP if Capability.STEP_LOGITS in self.capabilities else Driver.CALLS

    @property
    @abstractmethod
    def tokenizer(self) -> TokenizerInfo: ...

    @property
    @abstractmethod
    def model_id(self) -> str:
        """What produced the outputs (recorded in results and manifests)."""

    @abstractmethod
    def new_batch(self, prompts: Sequence[Sequence[int]]) -> Batch: ...

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model_id}

    @property
    def context_length(self) -> int | None:
        """The most tokens (prompt plus output) one row may hold, or None when the backend does not know it
        (then nothing is checked before the call)."""
        return None

    def generation_defaults(self) -> Any | None:
        """The model's own sampling defaults (a :class:`~formtax.decoding.sampling.Sampling`, from its
        ``generation_config``), or None when the backend does not know them."""
        return None


def require(backend: Backend, needs: frozenset[Capability], who: str) -> None:
    """Refuse, before any model call, a strategy whose needs the backend does not meet."""
    missing = needs - backend.capabilities
    if missing:
        raise CapabilityError(
            f"strategy {who!r} needs {', '.join(sorted(missing))}, which backend {backend.name!r} "
            f"does not provide (it provides: {', '.join(sorted(backend.capabilities)) or 'nothing'})"
        )
