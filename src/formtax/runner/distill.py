"""Distilling the FEM's HMM from the language model itself, on CPU (docs/ALGORITHMS.md section 7).

Two forms:

* ``instruction-aware`` (Deco-G): the model answers *task-only* prompts (the task's instruction and a training
  question, no format instruction) and the HMM learns from those answers, so it knows how this model naturally
  writes in this task (e.g. "The final answer is 42"). Prompts come from the task's shot pool (its train split
  where it has one). Decoding is greedy by default (our choice: it is how the strategies decode at evaluation).
* ``unconditional`` (Ctrl-G): samples from a bare start token (the tokenizer's BOS, else its EOS), temperature 1.

Each response (EOS included when the model stopped) becomes a training sequence after an *empty token*; the HMM is
initialised from a hard labelling of positions (``ngram``: k-means of previous-token bigram statistics, so the
transition weights start from the n-gram frequencies of the model's own answers as Deco-G does, paper 001 section
3.1, the default of the instruction-aware form; ``kmeans``: k-means of the LM's last hidden state that predicts the
token, Ctrl-G's latent-variable distillation, the default of the unconditional form where the backend exposes
hidden states), refined by Baum-Welch, and the empty token's mass is then spread over what follows it
(:func:`formtax.fem.hmm.spread_empty`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from formtax import __version__
from formtax.decoding.engine import Backend
from formtax.decoding.loop import RowRequest, decode
from formtax.decoding.policies import FreePolicy
from formtax.errors import ConfigError
from formtax.fem.artifact import FORMS
from formtax.fem.hmm import HMM, baum_welch, bigram_labels, counts_hmm, kmeans, spread_empty
from formtax.tasks import Item, Task, get_task

Progress = Callable[[str, int, int], None]


@dataclass
class DistillConfig:
    task: str
    form: str = "instruction-aware"
    states: int = 128
    samples: int = 64
    max_tokens: int = 256
    em_iters: int = 5
    init: str = "auto"  # auto | kmeans | ngram
    temperature: float | None = None  # None: 0 (greedy) for instruction-aware, 1 for unconditional
    seed: int = 0
    batch_size: int = 8
    data_dir: str | None = None

    def check(self) -> None:
        if self.form not in FORMS:
            raise ConfigError(f"unknown distillation form {self.form!r}; use one of {', '.join(FORMS)}")
        if self.init not in ("auto", "kmeans", "ngram"):
            raise ConfigError(f"unknown HMM initialisation {self.init!r}; use auto, kmeans or ngram")
        if self.states < 1 or self.samples < 1 or self.max_tokens < 1 or self.em_iters < 0:
            raise ConfigError("--states, --samples and --max-tokens must be positive, --em-iters >= 0")

    @property
    def sample_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if self.form == "instruction-aware" else 1.0


def task_only_messages(task: Task, item: Item) -> list[dict[str, str]]:
    """A prompt with the task and the question but no format instruction (a task may provide its own through a
    ``task_only_messages(item)`` method)."""
    hook = getattr(task, "task_only_messages", None)
    if callable(hook):
        out: list[dict[str, str]] = hook(item)
        return out
    return [{"role": "user", "content": f"{task.instructions[0]}\n\nQuestion: {item.question}"}]


def collect_samples(backend: Backend, cfg: DistillConfig, task: Task | None,
                    progress: Progress | None = None) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """(prompt ids, response ids, item ids) of ``cfg.samples`` generations in the configured form."""
    tok = backend.tokenizer
    prompts: list[list[int]] = []
    ids: list[str] = []
    if cfg.form == "instruction-aware":
        assert task is not None
        task.load(Path(cfg.data_dir) if cfg.data_dir else None)
        items = _training_items(task, cfg.samples, cfg.seed)
        prompts = [tok.prompt_ids(task_only_messages(task, it)) for it in items]
        ids = [it.id for it in items]
    else:
        start = tok.hf.bos_token_id if tok.hf.bos_token_id is not None else min(tok.eos_ids)
        prompts = [[int(start)] for _ in range(cfg.samples)]
        ids = [f"sample-{k}" for k in range(cfg.samples)]
    temp = cfg.sample_temperature
    responses: list[list[int]] = []
    for k in range(0, len(prompts), cfg.batch_size):
        rows = [RowRequest(p, FreePolicy(tok.eos_ids), cfg.max_tokens, seed=cfg.seed * 1_000_003 + k + j)
                for j, p in enumerate(prompts[k : k + cfg.batch_size])]
        responses.extend(o.tokens for o in decode(backend, rows, temperature=temp))
        if progress is not None:
            progress("sample", len(responses), len(prompts))
    return prompts, responses, ids


def _training_items(task: Task, n: int, seed: int) -> list[Item]:
    """``n`` questions from the task's shot pool (the train split where there is one) in a seeded order, without
    repeats while the pool lasts; a larger ``n`` cycles through it again."""
    pool = task._cached_shot_pool()  # the pool ``Task.shots`` draws from
    if not pool:
        raise ConfigError(f"task {task.name!r} has no questions to distil from")
    order = np.random.default_rng(seed).permutation(len(pool))
    return [pool[int(order[k % len(pool)])] for k in range(n)]


def lm_hidden_states(backend: Backend, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                     progress: Progress | None = None) -> list[torch.Tensor] | None:
    """Per response, the LM's last hidden state *before* each response token ([n, d]); None if the backend has no
    in-process transformers model."""
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "forward"):
        return None
    device = getattr(backend, "device", torch.device("cpu"))
    out: list[torch.Tensor] = []
    with torch.inference_mode():
        for k, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            if not r:
                out.append(torch.zeros(0, 1))
                continue
            ids = torch.tensor([list(p) + list(r[:-1])], device=device)
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
            out.append(hs[len(p) - 1 :].float().cpu())
            if progress is not None:
                progress("hidden", k + 1, len(prompts))
    return out


def build_fem(backend: Backend, cfg: DistillConfig, progress: Progress | None = None,
              task: Task | None = None) -> tuple[HMM, dict[str, Any]]:
    """Distil an HMM from ``backend``'s model; returns it and the artifact metadata. ``task``: a task object to
    use instead of the registered ``cfg.task`` (e.g. a planted world's task, which needs its world)."""
    cfg.check()
    t0 = time.perf_counter()
    if task is None and (cfg.form == "instruction-aware" or cfg.task):
        task = get_task(cfg.task)
    prompts, responses, item_ids = collect_samples(backend, cfg, task, progress)
    v = backend.tokenizer.n_logits
    empty = v  # a training-only token id one past the vocabulary
    seqs = [[empty, *r] for r in responses if r]
    if not seqs:
        raise ConfigError("the model produced no tokens to distil from")
    init = cfg.init
    if init == "auto":  # each form's own paper: Deco-G's n-gram frequencies, Ctrl-G's hidden-state clusters
        init = "ngram" if cfg.form == "instruction-aware" else "auto"
    labels: list[list[int]] | None = None
    if init in ("auto", "kmeans"):
        hidden = lm_hidden_states(backend, prompts, responses, progress)
        if hidden is None:
            if init == "kmeans":
                raise ConfigError(f"--init kmeans needs a transformers backend; {backend.name!r} has no hidden states")
            init = "ngram"
        else:
            init = "kmeans"
            kept = [h for h, r in zip(hidden, responses, strict=True) if r]
            flat = kmeans(torch.cat(kept), cfg.states, seed=cfg.seed)
            labels = []
            i = 0
            for hs in kept:
                z = flat[i : i + len(hs)].tolist()
                i += len(hs)
                labels.append([z[0], *z])  # the empty token shares the first token's state (our choice)
    if labels is None:
        labels = bigram_labels(seqs, cfg.states, seed=cfg.seed)
    dtype = torch.float64 if cfg.states * (v + 1) <= 50_000_000 else torch.float32
    hmm0 = counts_hmm(seqs, labels, cfg.states, v + 1, seed=cfg.seed).to(dtype=dtype)
    hmm, history = baum_welch(hmm0, seqs, cfg.em_iters, progress=progress)
    hmm = spread_empty(hmm, empty).to(dtype=torch.float32)
    meta = {
        "model": backend.model_id,
        "tokenizer_sha256": backend.tokenizer.engine.key,
        "task": cfg.task,
        "form": cfg.form,
        "h": cfg.states,
        "n_samples": len(seqs),
        "n_tokens": sum(len(s) - 1 for s in seqs),
        "n_eos": sum(1 for r in responses if r and r[-1] in backend.tokenizer.eos_ids),
        "init": init,
        "em_iters": cfg.em_iters,
        "loglik": history,
        "loglik_per_token": [ll / max(1, sum(len(s) for s in seqs)) for ll in history],
        "prompts": "task-only (instruction, question; no format)" if cfg.form == "instruction-aware"
        else "unconditional (a start token)",
        "items": item_ids,
        "config": asdict(cfg),
        "sample_temperature": cfg.sample_temperature,
        "build_s": round(time.perf_counter() - t0, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "formtax_version": __version__,
    }
    return hmm, meta
