"""The planted backend: a real :class:`~formtax.decoding.engine.Backend` whose "network" is a world file.

Every row's next-token distribution comes from its item's continuation trie (:mod:`formtax.planted.world`), so
the probability of any output under any strategy is known exactly (:mod:`formtax.planted.exact`). Batches step,
drop rows and crop caches like the transformers backend's, over the embedded default's real tokenizer (SmolLM2's
49k byte-level BPE: multi-token answers, space-prefixed tokens and llguidance masks are the real ones) or the
byte tokenizer of the fake backend for tiny tests.

Logits are ``log P`` in float32, so greedy decoding follows the most probable world token, sampling at
temperature 1 draws from exactly the world's probabilities, and a mask renormalises over what it allows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from formtax.decoding.engine import Backend, Batch, Capability, TokenizerInfo
from formtax.errors import ConfigError
from formtax.planted.world import Trie, World, WorldError, build_trie, load_world


@lru_cache(maxsize=2)
def planted_tokenizer(kind: str) -> TokenizerInfo:
    """The tokenizer a world names: ``smollm2`` (the embedded default's, with its EOS set and logits width) or
    ``bytes`` (the fake backend's byte tokenizer)."""
    if kind == "bytes":
        from formtax.backends.fake import EOS, N_LOGITS, PAD
        from formtax.bytetok import byte_tokenizer

        return TokenizerInfo(hf=byte_tokenizer(), eos_ids=frozenset({EOS}), pad_id=PAD, n_logits=N_LOGITS,
                             has_chat_template=True)
    if kind == "smollm2":
        from transformers import AutoTokenizer

        from formtax.backends.model_files import resolve_model

        src = resolve_model(None)  # converts the embedded GGUF once; only the tokenizer and config are read
        folder = Path(src.path)
        hf = AutoTokenizer.from_pretrained(folder)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        gen_path = folder / "generation_config.json"
        gen = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else {}
        return TokenizerInfo.from_hf(hf, gen.get("eos_token_id"), int(config["vocab_size"]), "smollm2 tokenizer")
    raise ConfigError(f"unknown planted tokenizer {kind!r}; known: smollm2, bytes")


def _format_markers() -> list[tuple[str, str]]:
    from formtax.tasks.prompts import _CONVERSION_INTRO, _FORMAT_TEMPLATES

    marks = [(_CONVERSION_INTRO, "conversion")]
    for fmt, variants in _FORMAT_TEMPLATES.items():
        marks.extend((v.split("{", 1)[0], fmt.value) for v in variants)
    return marks


def prompt_format(text: str) -> str | None:
    """The output format a prompt asks for (by the lab's own format descriptions), ``conversion`` for
    NL-to-Format's second call, None for a prompt the lab did not write."""
    for marker, fmt in _format_markers():
        if marker and marker in text:
            return fmt
    return None


@dataclass
class RowModel:
    """The planted model for one prompt: its item, the trie of the context that applies, and the logits rule."""

    item_id: str
    context: int  # -1: the item's own continuations; k: contexts[k]
    trie: Trie
    n_logits: int
    eos: int
    floor: float
    off_path: str

    def __post_init__(self) -> None:
        v = self.n_logits
        self._floor_logit = math.log(self.floor / v)
        self._off = torch.full((v,), self._floor_logit, dtype=torch.float32)
        if self.off_path == "eos":
            self._off[self.eos] = math.log((1.0 - self.floor) + self.floor / v)
        elif self.off_path == "uniform":
            self._off.fill_(-math.log(v))

    def probs_at(self, node: int | None) -> dict[int, float]:
        """The on-path tokens' probabilities at ``node`` (float64, before the float32 logits); {} off path."""
        if node is None:
            return {}
        v = self.n_logits
        return {t: (1.0 - self.floor) * p + self.floor / v for t, p in self.trie.next_probs(node).items()}

    def logits_at(self, node: int | None) -> torch.Tensor:
        if node is None:
            return self._off.clone()
        row = torch.full((self.n_logits,), self._floor_logit, dtype=torch.float32)
        for t, p in self.probs_at(node).items():
            row[t] = math.log(p)
        return row

    def node(self, generated: Sequence[int]) -> int | None:
        return self.trie.walk(list(generated))

    def logits(self, generated: Sequence[int]) -> torch.Tensor:
        return self.logits_at(self.node(generated))


class PlantedBatch(Batch):
    def __init__(self, models: list[RowModel], prompts: Sequence[Sequence[int]]) -> None:
        self.models = models
        self.seqs = [list(p) for p in prompts]
        self.plen = [len(p) for p in prompts]
        self.nodes: list[int | None] = [0] * len(prompts)
        self.calls = 0

    def _logits(self) -> torch.Tensor:
        self.calls += 1
        return torch.stack([m.logits_at(n) for m, n in zip(self.models, self.nodes, strict=True)])

    def prefill(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        if len(tokens) != len(self.seqs):
            raise ValueError(f"step got {len(tokens)} tokens for {len(self.seqs)} live rows")
        for k, t in enumerate(tokens):
            self.seqs[k].append(int(t))
            if len(self.seqs[k]) <= self.plen[k]:  # a re-fed prompt token after a crop into the prompt
                self.nodes[k] = 0
            else:
                n = self.nodes[k]
                nxt = None if n is None else self.models[k].trie.children[n].get(int(t))
                self.nodes[k] = nxt if nxt is not None and self.models[k].trie.mass[nxt] > 0.0 else None
        return self._logits()

    def keep(self, live_positions: Sequence[int]) -> None:
        self.models = [self.models[i] for i in live_positions]
        self.seqs = [self.seqs[i] for i in live_positions]
        self.plen = [self.plen[i] for i in live_positions]
        self.nodes = [self.nodes[i] for i in live_positions]

    def crop(self, live_position: int, n_generated: int) -> None:
        """Keep the prompt and the first ``n_generated`` tokens (``-1`` also drops the prompt's last token, which
        the caller feeds again), as the transformers backend does."""
        k = live_position
        generated = len(self.seqs[k]) - self.plen[k]
        if not -1 <= n_generated <= generated:
            raise ValueError(f"cannot crop row to {n_generated} generated tokens (it has {generated})")
        self.seqs[k] = self.seqs[k][: self.plen[k] + n_generated]
        # The node describes the sequence *before* the token the caller feeds next.
        self.nodes[k] = self.models[k].node(self.seqs[k][self.plen[k]:]) if n_generated >= 0 else 0


class PlantedBackend(Backend):
    """``--backend planted --world W`` (or ``load_backend("planted", model=W)``)."""

    name = "planted"
    capabilities = frozenset({Capability.STEP_LOGITS, Capability.KV_CROP})

    def __init__(self, world: World, path: str | None = None) -> None:
        self.world = world
        self.path = path
        self._tok = planted_tokenizer(world.tokenizer)
        self._eos = int(self._tok.hf.eos_token_id) if self._tok.hf.eos_token_id is not None else min(self._tok.eos_ids)
        self._tries: dict[tuple[str, int], Trie] = {}
        self._rows: dict[tuple[int, ...], RowModel] = {}
        self.batches = 0
        self.check_mappable()

    @classmethod
    def load(cls, path: str | Path) -> PlantedBackend:
        return cls(load_world(path), str(Path(path).resolve()))

    def check_mappable(self) -> None:
        """Tokenise every continuation now, so a text the tokenizer cannot map fails before any run."""
        for it in self.world.items:
            self.trie(it.id, -1)
            for k in range(len(it.contexts)):
                self.trie(it.id, k)

    def trie(self, item_id: str, context: int) -> Trie:
        key = (item_id, context)
        if key not in self._tries:
            it = self.world.item(item_id)
            conts = it.continuations if context < 0 else it.contexts[context].continuations
            where = f"world {self.world.name}: item {it.id}, field " + (
                "continuations" if context < 0 else f"contexts[{context}].continuations")
            self._tries[key] = build_trie(conts, self._tok.encode, self._tok.decode, self._eos, where,
                                          self.world.after_end_mass)
        return self._tries[key]

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return f"planted:{self.world.name}@{self.world.sha256[:12] or 'inline'}"

    def row_model(self, prompt_ids: Sequence[int]) -> RowModel:
        """The planted model of a prompt: the item whose question it contains, and the context that applies."""
        key = tuple(prompt_ids)
        if key not in self._rows:
            text = self._tok.decode(list(prompt_ids))
            found = [(text.rfind(it.question), k) for k, it in enumerate(self.world.items) if it.question in text]
            if not found:
                raise WorldError(f"planted world {self.world.name}: the prompt contains no item's question")
            it = self.world.items[max(found)[1]]  # the asked question comes last (after any few-shot examples)
            if it.meta.get("fail"):  # a planted failure: the request errors, as a real engine's might
                raise WorldError(f"planted failure: item {it.id} of world {self.world.name} always errors")
            fmt = prompt_format(text)
            context = next((k for k, c in enumerate(it.contexts) if c.matches(text, fmt)), -1)
            self._rows[key] = RowModel(it.id, context, self.trie(it.id, context), self._tok.n_logits, self._eos,
                                       self.world.floor, self.world.off_path)
        return self._rows[key]

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> PlantedBatch:
        self.batches += 1
        return PlantedBatch([self.row_model(p) for p in prompts], prompts)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": self.model_id, "world": self.world.name,
                "world_sha256": self.world.sha256, "origin": self.path, "tokenizer": self.world.tokenizer,
                "floor": self.world.floor, "off_path": self.world.off_path}
