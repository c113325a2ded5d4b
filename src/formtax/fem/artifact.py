"""The FEM's HMM as a versioned artifact: one ``.npz`` (arrays + metadata) and a human-readable ``.json`` twin.

The ``.npz`` holds ``pi`` [h], ``A`` [h, h], ``B`` [h, V] (float32 probabilities) and ``meta`` (a JSON string):
the format name and version, the model, the tokenizer's sha256 (llguidance's key of the HF tokenizer JSON), the
vocabulary width, the task, the distillation form (``instruction-aware`` = Deco-G, ``unconditional`` = Ctrl-G),
``h`` and the data and training used. Loading checks the format and version; using an artifact with a backend
checks the tokenizer hash and the vocabulary width, so an HMM is never applied to token ids it was not trained on.
The ``.json`` next to it repeats the metadata for people; the loader reads only the ``.npz``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from formtax.cache import LRU
from formtax.errors import ConfigError
from formtax.fem.hmm import HMM

FEM_FORMAT = "formtax-fem"
FEM_VERSION = 1
FORMS = ("instruction-aware", "unconditional")
"""Deco-G's distillation (the model's own answers to task-only prompts) and Ctrl-G's (unconditional samples)."""


@dataclass(eq=False)
class FemArtifact:
    hmm: HMM
    meta: dict[str, Any]
    path: Path | None = None

    @property
    def form(self) -> str:
        return str(self.meta.get("form", ""))

    @property
    def h(self) -> int:
        return self.hmm.h

    def summary(self) -> dict[str, Any]:
        keys = ("model", "task", "form", "h", "vocab_size", "n_samples", "n_tokens", "init", "em_iters")
        return {k: self.meta.get(k) for k in keys} | {"path": str(self.path) if self.path else None}


def save_fem(path: Path | str, hmm: HMM, meta: dict[str, Any]) -> Path:
    """Write ``path`` (``.npz`` appended if missing) and its ``.json`` twin; returns the ``.npz`` path."""
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    hmm.check()
    full = {"format": FEM_FORMAT, "version": FEM_VERSION, "h": hmm.h, "vocab_size": hmm.vocab_size, **meta}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, pi=hmm.pi.float().cpu().numpy(), A=hmm.A.float().cpu().numpy(), B=hmm.B.float().cpu().numpy(),
             meta=np.array(json.dumps(full, sort_keys=True)))
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(full, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


_CACHE: LRU[tuple[str, int, int], FemArtifact] = LRU(4)


def load_fem(path: Path | str) -> FemArtifact:
    """Read an artifact (cached per file version); ConfigError naming the problem for anything unusable."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"FEM artifact {path} not found; build one with `formtax fem build --task T --out {path}`")
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k: torch.from_numpy(np.array(z[k], dtype=np.float32)) for k in ("pi", "A", "B")}
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not a formtax FEM artifact ({e})") from e
    if meta.get("format") != FEM_FORMAT:
        raise ConfigError(f"{path} is not a formtax FEM artifact (format {meta.get('format')!r})")
    if meta.get("version") != FEM_VERSION:
        raise ConfigError(f"{path} is a version {meta.get('version')} FEM artifact; this formtax reads version "
                          f"{FEM_VERSION}. Rebuild it with `formtax fem build`")
    hmm = HMM(arrays["pi"], arrays["A"], arrays["B"])
    try:
        hmm.check()
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from e
    return _CACHE.put(key, FemArtifact(hmm, meta, path))


def check_compatible(art: FemArtifact, tokenizer_sha256: str, n_logits: int) -> None:
    """Refuse an HMM trained for another tokenizer or vocabulary width."""
    where = str(art.path) if art.path else "the FEM artifact"
    want = art.meta.get("tokenizer_sha256")
    if want != tokenizer_sha256:
        raise ConfigError(
            f"{where} was built for another tokenizer (sha256 {str(want)[:12]}..., model {art.meta.get('model')!r}); "
            f"this model's tokenizer is {tokenizer_sha256[:12]}.... Rebuild it with `formtax fem build --model ...`"
        )
    if art.hmm.vocab_size != n_logits:
        raise ConfigError(f"{where} emits {art.hmm.vocab_size} token ids but the model has {n_logits} logits")
