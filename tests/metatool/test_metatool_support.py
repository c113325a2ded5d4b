"""Shared helpers of the metatool tests: a fake model that answers each prompt by a script, and a tampered
data
copy. (A module of helpers and their own checks; the other test files import it.)"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from formtax.backends.fake import EOS, N_LOGITS, FakeBackend

ASSISTANT = 259
_TOOL_NAME = re.compile(r"^\d+\. tool name: (.*?), tool description: ", re.M)
_QUERY = re.compile(r'User query: "(.*)" tool: \n?$', re.S)


def prompt_facts(prompt: str) -> tuple[str, list[str], str]:
    """(kind, candidates, query) read back from a rendered metatool prompt."""
    kind = "abstain" if "Here are some examples:" in prompt else "tool"
    names = _TOOL_NAME.findall(prompt)
    m = _QUERY.search(prompt)
    return kind, names, m.group(1) if m else ""


def scripted_model(choose: Callable[[str, list[str], str], str], model_id: str = "fake-scripted") -> FakeBackend:
    """A fake backend whose "model" writes ``choose(kind, candidates, query)`` after the prompt, then EOS.

    Under a mask it takes the allowed token with the highest logit (the script's token when allowed, else the
    lowest allowed byte), so every condition is deterministic.
    """
    targets: dict[tuple[int, ...], list[int]] = {}

    def fn(seq: Sequence[int]) -> torch.Tensor:
        start = max(i for i, t in enumerate(seq) if t == ASSISTANT) + 1
        key = tuple(seq[:start])
        if key not in targets:
            prompt = bytes(t for t in key if t < 256).decode("utf-8", "replace")
            targets[key] = list(choose(*prompt_facts(prompt)).encode())
        target, gen = targets[key], list(seq[start:])
        logits = torch.zeros(N_LOGITS)
        k = len(gen)
        logits[target[k] if k < len(target) and gen == target[:k] else EOS] = 10.0
        return logits

    return FakeBackend(fn, model_id=model_id)


def copy_metatool_data(src: Path, dst: Path) -> Path:
    """A writable copy of ``<data>/metatool`` under ``dst``; returns the data root to pass as data_dir."""
    shutil.copytree(src / "metatool", dst / "metatool")
    for p in (dst / "metatool").rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return dst


def test_prompt_facts_reads_a_real_prompt(data_dir):
    from formtax.studies.abstention.task import MetatoolTask

    task = MetatoolTask()
    task.configure({"pairs": 1})
    tool, abstain = task.load(data_dir)
    for item in (tool, abstain):
        kind, names, query = prompt_facts(str(item.meta["prompt"]))
        assert kind == item.meta["kind"] and names == [n for n, _ in item.choices] and query == item.question
