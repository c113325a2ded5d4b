"""Planted worlds: a model written as data, whose every output probability is known exactly.

A *world* is a JSON (or YAML) file. It names a tokenizer, an answer kind and a list of items; each item holds a
question, its gold answer and a finite set of *continuations* (output texts with probabilities). The planted model
(:mod:`formtax.planted.backend`) writes continuation ``c`` with probability ``p_c``, token by token along the
continuation's canonical tokenisation and then EOS. A continuation may be given as a list of *segments*, each
tokenised on its own and concatenated: that is how a world pins a token boundary (e.g. the RC prefix
``"Let's think step by step."`` must be exactly the tokens the strategy forces).

The distribution is defined off the world's paths too, so a mask never leaves a row without mass (our choice,
documented here and in the README):

- on a path, ``P(v) = (1 - floor) * P_world(v | path) + floor / V``;
- off every path (a forced or masked token the world does not continue), ``off_path = "eos"`` (the default)
  makes the model want to stop, ``P(EOS) = 1 - floor`` with the floor spread over the vocabulary, and
  ``off_path = "uniform"`` makes every token equally likely.

Different prompts can see different continuations: an item's ``contexts`` list holds ``prompt_contains`` /
``continuations`` pairs; the first whose substring appears in the rendered prompt applies, else the item's own
``continuations``. That is how a world gives the JSON prompt, the answer-only prompt or NL-to-Format's
conversion prompt their own behaviour. The backend finds the item of a prompt by its question text, so no
question may contain another.

Bad worlds are refused before anything runs, with one line naming the item and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from formtax.errors import ConfigError

WORLD_VERSION = 1
PROB_TOLERANCE = 1e-9


class WorldError(ConfigError):
    """A world file that cannot be used (the message names the item and the field)."""


class Continuation(BaseModel):
    """An output text (or segments) with its probability; ``after_end``: what the model writes if it is made to
    go on where it wants to stop (e.g. InWriting's answer after the preamble), each with its probability, holding
    ``World.after_end_mass`` of the end's mass (the rest stays on EOS)."""

    model_config = ConfigDict(extra="forbid")

    text: str | list[str]
    p: float = Field(ge=0.0, le=1.0)
    after_end: list[Continuation] = Field(default_factory=list)

    @property
    def segments(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)

    @property
    def full_text(self) -> str:
        return "".join(self.segments)


PromptFormat = Literal["reason-answer", "answer-only", "json", "conversion"]


class Context(BaseModel):
    """Continuations for the prompts that match: ``format`` (the output format the prompt asks for, or
    ``conversion`` for NL-to-Format's second call) and/or ``prompt_contains`` (a substring); both when both given."""

    model_config = ConfigDict(extra="forbid")

    format: PromptFormat | None = None
    prompt_contains: str | None = Field(default=None, min_length=1)
    continuations: list[Continuation] = Field(min_length=1)

    def matches(self, prompt: str, fmt: str | None) -> bool:
        if self.format is not None and self.format != fmt:
            return False
        return self.prompt_contains is None or self.prompt_contains in prompt


class WorldItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    gold: str
    choices: list[tuple[str, str]] = Field(default_factory=list)
    continuations: list[Continuation] = Field(min_length=1)
    contexts: list[Context] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)


class AnswerSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["integer", "letters", "choice"] = "integer"
    vc_min: int | None = 0  # integer: the VC range
    vc_max: int | None = None
    length: int | None = None  # letters: the exact length (default: the gold's length per item)
    labels: list[str] = Field(default_factory=list)  # choice: the labels (default: A-E)


class World(BaseModel):
    """The parsed world file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    formtax_world: int = WORLD_VERSION
    name: str = Field(min_length=1)
    description: str = ""
    tokenizer: Literal["smollm2", "bytes"] = "smollm2"
    floor: float = Field(default=1e-12, gt=0.0, lt=0.01)
    off_path: Literal["eos", "uniform"] = "eos"
    after_end_mass: float = Field(default=1e-3, gt=0.0, lt=0.5)
    study: dict[str, Any] = Field(default_factory=dict)  # default run settings: strategies, max_tokens, ...
    answer: AnswerSpace = Field(default_factory=AnswerSpace)
    items: list[WorldItem] = Field(min_length=1)
    sha256: str = ""  # filled by load_world: the file's hash (provenance)

    @field_validator("formtax_world")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != WORLD_VERSION:
            raise ValueError(f"this formtax reads world version {WORLD_VERSION}, the file says {v}")
        return v

    def item(self, item_id: str) -> WorldItem:
        for it in self.items:
            if it.id == item_id:
                return it
        raise KeyError(item_id)


def _where(loc: tuple[Any, ...], data: Any) -> str:
    """'item q3, field continuations[1].p' from a pydantic error location."""
    parts = [str(x) for x in loc]
    if len(loc) >= 2 and loc[0] == "items" and isinstance(loc[1], int):
        items = data.get("items") if isinstance(data, dict) else None
        ident = None
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            ident = items[loc[1]].get("id")
        rest = ".".join(p if not p.isdigit() else f"[{p}]" for p in parts[2:]).replace(".[", "[")
        return f"item {ident if ident is not None else '#' + str(loc[1])}, field {rest or '(item)'}"
    return "field " + ".".join(parts)


def parse_world(data: Any, source: str = "<world>") -> World:
    """Validate a decoded world document; WorldError naming the item and field otherwise."""
    try:
        world = World.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise WorldError(f"{source}: {_where(tuple(err['loc']), data)}: {err['msg']}") from None
    _check_semantics(world, source)
    return world


def _check_semantics(world: World, source: str) -> None:
    seen: set[str] = set()
    for it in world.items:
        for k, c in enumerate(it.contexts):
            if c.format is None and c.prompt_contains is None:
                raise WorldError(f"{source}: item {it.id}, field contexts[{k}]: give format or prompt_contains")
        if it.id in seen:
            raise WorldError(f"{source}: item {it.id}, field id: duplicate item id")
        seen.add(it.id)
        lists = [("continuations", it.continuations)] + [
            (f"contexts[{k}].continuations", c.continuations) for k, c in enumerate(it.contexts)
        ]
        for name, conts in lists:
            total = math.fsum(c.p for c in conts)
            if abs(total - 1.0) > PROB_TOLERANCE:
                raise WorldError(f"{source}: item {it.id}, field {name}: probabilities sum to {total!r}, not 1")
            for k, cont in enumerate(conts):
                if not cont.segments or any(s == "" for s in cont.segments):
                    raise WorldError(f"{source}: item {it.id}, field {name}[{k}].text: empty text or segment")
                if cont.after_end:
                    sub = math.fsum(a.p for a in cont.after_end)
                    if abs(sub - 1.0) > PROB_TOLERANCE:
                        raise WorldError(f"{source}: item {it.id}, field {name}[{k}].after_end: probabilities "
                                         f"sum to {sub!r}, not 1")
                    if any(a.after_end for a in cont.after_end):
                        raise WorldError(f"{source}: item {it.id}, field {name}[{k}].after_end: nested after_end")
    questions = [(it.id, it.question) for it in world.items]
    for a_id, a in questions:
        for b_id, b in questions:
            if a_id != b_id and a in b:
                raise WorldError(f"{source}: item {a_id}, field question: it is contained in item {b_id}'s "
                                 "question, so prompts cannot be told apart")


def load_world(path: str | Path) -> World:
    """Read and validate a world file (JSON, or YAML when PyYAML is installed and the suffix says so)."""
    p = Path(path)
    if not p.is_file():
        raise WorldError(f"world file not found: {p}")
    raw = p.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise WorldError(f"{p}: reading YAML worlds needs PyYAML (pip install pyyaml); or write JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise WorldError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise WorldError(f"{p}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    world = parse_world(data, str(p))
    world.sha256 = hashlib.sha256(raw).hexdigest()
    return world


def write_world(world: World, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(world.model_dump_json(indent=1, exclude={"sha256"}) + "\n", encoding="utf-8")
    return p


# -- the token trie -------------------------------------------------------------------------------------------


@dataclass
class Trie:
    """The continuations of one (item, context) as a token trie: node 0 is the root (nothing generated yet).

    ``children[n]`` maps a token to the next node, ``mass[n]`` is the total probability of the continuations
    through node ``n``; every continuation ends with an EOS edge into a leaf.
    """

    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    mass: list[float] = field(default_factory=lambda: [0.0])
    texts: list[str] = field(default_factory=list)

    def add(self, tokens: list[int], p: float) -> None:
        node = 0
        self.mass[0] += p
        for t in tokens:
            nxt = self.children[node].get(t)
            if nxt is None:
                nxt = len(self.children)
                self.children[node][t] = nxt
                self.children.append({})
                self.mass.append(0.0)
            node = nxt
            self.mass[node] += p

    def walk(self, tokens: list[int]) -> int | None:
        """The node reached by ``tokens`` from the root, or None once they leave every path."""
        node = 0
        for t in tokens:
            nxt = self.children[node].get(t)
            if nxt is None or self.mass[nxt] <= 0.0:
                return None
            node = nxt
        return node

    def next_probs(self, node: int) -> dict[int, float]:
        """P_world(token | node) over the node's children (continuations with p = 0 are not paths)."""
        total = self.mass[node]
        return {t: self.mass[c] / total for t, c in self.children[node].items() if self.mass[c] > 0.0}


def _tokens(c: Continuation, encode: Any, decode: Any, where: str) -> list[int]:
    ids: list[int] = []
    for s in c.segments:
        seg = list(encode(s))
        if decode(seg) != s:
            raise WorldError(f"{where}.text: the tokenizer cannot map {s!r} (it decodes back as {decode(seg)!r})")
        ids.extend(seg)
    return ids


AFTER_END_REPEATS = 2
"""How often an ``after_end`` answer is written again when the model is made to go on after it (module docs)."""


def build_trie(conts: list[Continuation], encode: Any, decode: Any, eos: int, where: str,
               after_end_mass: float = 1e-3) -> Trie:
    """Tokenise each continuation (segment by segment) and insert it with its ``after_end`` branches; refuse
    text the tokenizer cannot map."""
    trie = Trie()
    for k, c in enumerate(conts):
        ids = _tokens(c, encode, decode, f"{where}[{k}]")
        alpha = after_end_mass if c.after_end else 0.0
        trie.add(ids + [eos], c.p * (1.0 - alpha))
        for j, a in enumerate(c.after_end):
            again = _tokens(a, encode, decode, f"{where}[{k}].after_end[{j}]")
            # made to go on after its answer, the model writes it again (AFTER_END_REPEATS times at most), so a
            # sampled InWriting preamble that runs into the answer still has a path under the answer's mask
            mass, path = c.p * alpha * a.p, list(ids)
            for depth in range(AFTER_END_REPEATS + 1):
                path = path + again
                last = depth == AFTER_END_REPEATS
                trie.add(path + [eos], mass * (1.0 if last else 1.0 - alpha))
                mass *= alpha
        trie.texts.append(c.full_text)
    return trie
