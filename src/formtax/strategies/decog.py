"""Deco-G and Ctrl-G: free reasoning guided into the answer format by a format estimation module (paper 001).

Both decode once, reweighting the model's next-token distribution by an HMM's estimate that the text will end in
the format (:mod:`formtax.fem.reweight`), with a hard mask on top so that every output is in the format. The
format is the request's answer template placed as the *last line* of a free reasoning text (the
``reason-answer`` output format the prompts ask for), with an optional leading space; ``placement = "anywhere"``
instead requires the key phrase to appear anywhere (text may follow it), as Deco-G does for GSM8K.

* ``decog``: an instruction-aware HMM (``formtax fem build --form instruction-aware``, initialised from n-gram
  frequencies as the paper's section 3.1), top-k state pruning keeping 5% of the states by default (the paper's
  "top 5% (k = 200)" of about 4096; ``state_top_k=200`` gives an absolute k; docs/ALGORITHMS.md section 7 has the
  measured effect of both), gamma = 1 (the paper tunes it per model; ours is a starting point). Each record keeps the retained mass per step
  (``stats.fem_mass``); the report's ``fem_mass`` table and figure show it per step (the paper's
  hidden-state concentration figure).
* ``ctrlg``: Ctrl-G's setting: an HMM from unconditional samples (``--form unconditional``), the full state space,
  gamma = 1.

Options (``Request.options``; ``formtax generate --fem``; ``formtax run --fem``): ``fem`` (an artifact path, a
loaded :class:`~formtax.fem.artifact.FemArtifact`, or a spec ``NAME=FILE,NAME.OPTION=VALUE,OPTION=VALUE`` naming a
file per strategy), ``gamma``, ``state_top_k`` (``top_k`` in a spec; ``"5%"``: a fraction of the states; an integer: absolute; 0 or "none" = no pruning), ``placement`` (``end`` | ``anywhere``),
``leading_space`` (true), ``slot_tokens`` (``LO..HI``: every slot's token range), ``allow_form`` (true: use an
artifact of the other distillation form). The artifact's form must match the strategy unless ``allow_form``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from formtax.cache import LRU
from formtax.constraints.finalanswer import final_answer
from formtax.constraints.spec import ChoiceConstraint, Constraint, TemplateConstraint
from formtax.constraints.template import Slot, Template, key_phrase_of
from formtax.decoding.engine import Backend
from formtax.decoding.loop import Policy, RowOutput
from formtax.decoding.plan import Phase
from formtax.decoding.policies import FreePolicy
from formtax.errors import ConfigError
from formtax.fem.artifact import FemArtifact, check_compatible, load_fem
from formtax.fem.dfa import FormatSpec, TokenDFA, TokenVocab, token_dfa, vocab_for
from formtax.fem.reweight import FemPolicy, FemRuntime
from formtax.strategies.base import Request, Result, SinglePass, prefix_ids, register, with_prefix
from formtax.strategies.options import FemOptions

FEM_STRATEGIES = FemOptions.strategies  # the strategies that read the ``fem`` option (declared by their model)
# anywhere: the answer a whole word, as every reader reads it (fem/dfa.py's "word" suffix, issue 60)
PLACEMENTS = {"end": ("line", "none"), "anywhere": ("any", "word")}
# what a --fem spec may also set (``top_k``: the spec's spelling of state_top_k)
OPTIONS = (*(k for k in FemOptions.model_fields if k != "fem"), "top_k")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_fem_spec(spec: str, strategy: str) -> tuple[str | None, dict[str, str]]:
    """``FILE`` or a comma list of ``NAME=FILE`` / ``NAME.OPTION=VALUE`` / ``OPTION=VALUE``: the file and options
    that apply to ``strategy``."""
    spec = spec.strip()
    if "=" not in spec:
        return spec or None, {}
    path: str | None = None
    opts: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"--fem: {part!r} is not NAME=FILE or OPTION=VALUE (in {spec!r})")
        key = key.strip()
        if key in FEM_STRATEGIES:
            if key == strategy:
                path = value.strip()
        elif "." in key:
            name, _, opt = key.partition(".")
            if name == strategy:
                opts[opt] = value.strip()
        else:
            opts.setdefault(key, value.strip())
    return path, opts


@dataclass(frozen=True)
class FemSettings:
    artifact: FemArtifact
    gamma: float
    top_k: int | None
    placement: str
    leading_space: bool
    slot_tokens: tuple[int, int] | None


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE | _FALSE:
        return s in _TRUE
    raise ConfigError(f"option {key!r} must be true or false, got {value!r}")


def answer_template(constraint: Constraint | None) -> Template:
    """The template the FEM enforces: a template constraint, or a choice as a one-slot template."""
    if isinstance(constraint, TemplateConstraint):
        return constraint.template
    if isinstance(constraint, ChoiceConstraint):
        return Template(source="{choice}", parts=(Slot("choice", options=tuple(constraint.options)),))
    kind = constraint.kind if constraint is not None else "none"
    raise ConfigError(f"the FEM strategies need an answer template (e.g. 'The answer is: {{int}}') or a choice; "
                      f"got a {kind} constraint")


RUNTIME_CACHE_BYTES = int(os.environ.get("FORMTAX_FEM_CACHE_BYTES", 2 * 1024**3))
"""Memory the cached runtimes may hold (their tables grow with the DFA's states x h x budget); least recently used
ones are dropped beyond it, the newest always kept. At most 8 are kept in any case."""
_RUNTIMES: LRU[tuple[int, int, str], FemRuntime] = LRU(8, weigh=FemRuntime.nbytes, max_weight=RUNTIME_CACHE_BYTES)


def fem_runtime(artifact: FemArtifact, dfa: TokenDFA, eos_ids: Sequence[int], device: torch.device) -> FemRuntime:
    """One :class:`FemRuntime` per (artifact, DFA, device), so the tables are computed once per budget."""
    key = (id(artifact), id(dfa), str(device))
    hit = _RUNTIMES.get(key)
    if hit is not None:
        return hit
    return _RUNTIMES.put(key, FemRuntime(dfa, artifact.hmm, eos_ids, device=device))


class FemStrategy(SinglePass):
    """The shared machinery of ``decog`` and ``ctrlg``."""

    form: ClassVar[str]
    default_top_k: ClassVar[int | str | None]
    default_gamma: ClassVar[float] = 1.0
    output_format = "reason-answer"
    task_output_format = True  # GSM8K: Deco-G's key phrase "The final answer is ...", placed anywhere

    # -- options ---------------------------------------------------------------------------------------------
    Options = FemOptions

    def settings(self, request: Request) -> FemSettings:
        """The request's options (:class:`~formtax.strategies.options.FemOptions`) with the ``--fem`` spec's
        extras beneath them, interpreted: the artifact loaded, this strategy's defaults filled in."""
        given = self.options_of(request)
        opts: dict[str, Any] = {k: v for k, v in given.model_dump().items() if v is not None and k != "fem"}
        fem = given.fem
        if isinstance(fem, str):
            path, extra = parse_fem_spec(fem, self.name)
            unknown = sorted(set(extra) - set(OPTIONS))
            if unknown:
                raise ConfigError(f"--fem: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
            opts = {**extra, **opts}
            fem = path
        if fem is None:
            raise ConfigError(
                f"strategy {self.name!r} needs an HMM: pass --fem FILE (formtax run / generate) or "
                f"options={{'fem': FILE}}; build one with `formtax fem build --task T --form {self.form} --out FILE`"
            )
        art = fem if isinstance(fem, FemArtifact) else load_fem(str(fem))
        allow = _as_bool("allow_form", opts.pop("allow_form", False))
        if art.form != self.form and not allow:
            raise ConfigError(
                f"strategy {self.name!r} uses a {self.form} HMM, but {art.path or 'the artifact'} is {art.form!r}; "
                f"give one per strategy (--fem decog=FILE1,ctrlg=FILE2) or set allow_form=true"
            )
        try:
            gamma = float(opts.pop("gamma", self.default_gamma))
            raw_k = opts.pop("state_top_k", opts.pop("top_k", self.default_top_k))
            top_k = resolve_top_k(raw_k, art.h)
        except ValueError as e:
            raise ConfigError(f"strategy {self.name!r}: bad gamma or top_k ({e})") from e
        if gamma < 0 or (top_k is not None and top_k < 1):
            raise ConfigError(f"strategy {self.name!r}: gamma must be >= 0 and top_k >= 1 (got {gamma}, {top_k})")
        placement = str(opts.pop("placement", "end"))
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
        leading = _as_bool("leading_space", opts.pop("leading_space", True))
        slot_tokens = None
        raw_slot = opts.pop("slot_tokens", None)
        if raw_slot is not None:
            m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", str(raw_slot))
            if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
                raise ConfigError(f"slot_tokens must be LO..HI with 1 <= LO <= HI, got {raw_slot!r}")
            slot_tokens = (int(m.group(1)), int(m.group(2)))
        return FemSettings(art, gamma, top_k, placement, leading, slot_tokens)

    def format_spec(self, request: Request, s: FemSettings) -> FormatSpec:
        template = answer_template(request.constraint)
        prefix, suffix = PLACEMENTS[s.placement]
        bounds = tuple(s.slot_tokens for _ in template.slots) if s.slot_tokens else ()
        return FormatSpec(template, prefix=prefix, suffix=suffix, leading_space=s.leading_space, slot_tokens=bounds)

    def _prepare(self, backend: Backend, request: Request) -> tuple[FemSettings, TokenDFA]:
        s = self.settings(request)
        tok = backend.tokenizer
        check_compatible(s.artifact, tok.engine.key, tok.n_logits)
        return s, token_dfa(self.format_spec(request, s), vocab_for(tok))

    # -- the strategy ------------------------------------------------------------------------------------------
    def check(self, backend: Backend, requests: Sequence[Request]) -> None:
        super().check(backend, requests)
        for r in requests:
            if not r.constrain:
                continue
            _, dfa = self._prepare(backend, r)
            pre = prefix_ids(backend, r)
            need = len(pre) + int(dfa.dist[dfa.run(pre)])
            if need > r.max_tokens:
                raise ConfigError(f"strategy {self.name!r}: max_tokens={r.max_tokens} cannot fit the answer, which "
                                  f"needs at least {need} tokens; raise max_tokens")

    def policy(self, backend: Backend, request: Request) -> Policy:
        tok = backend.tokenizer
        if not request.constrain:
            return with_prefix(backend, request, FreePolicy(tok.eos_ids, phase=Phase.REASONING))
        s, dfa = self._prepare(backend, request)
        device = torch.device(getattr(backend, "device", "cpu"))
        rt = fem_runtime(s.artifact, dfa, sorted(tok.eos_ids), device)
        pre = prefix_ids(backend, request)
        pol = FemPolicy(rt, request.max_tokens, gamma=s.gamma, top_k=s.top_k, prefix=pre)
        pol.phase = Phase.REASONING
        return with_prefix(backend, request, pol)

    def fill_answer(self, res: Result, request: Request, out: RowOutput, phases: dict[str, str],
                    constrained: bool) -> None:
        """The answer is the last line(s) (or, placed ``anywhere``, the last occurrence of the template, followed by an
        ``after`` phase); what precedes it is reasoning. A token counts in the phase where its last byte falls."""
        if not constrained or self._vocab is None:
            res.answer_text = None
            return
        vocab = self._vocab
        s = self.settings(request)
        eos = set(vocab.eos_ids)
        data = vocab.text([t for t in out.tokens if t not in eos])
        span = _answer_span(data, answer_template(request.constraint), s)
        if span is None:  # not in the format (only after an error finish): the answer stays unread
            res.answer_text = None
            return
        start, end = span
        if s.leading_space and data[start : start + 1] == b" ":
            start += 1
        res.answer_text = data[start:end].decode("utf-8", errors="replace")
        res.reasoning = data[:start].decode("utf-8", errors="replace")
        rc = res.phases.get("rc", "")
        res.phases = {**({"rc": rc} if rc else {}), "reasoning": res.reasoning[len(rc) :],
                      "answer": res.answer_text}
        if end < len(data):
            res.phases["after"] = data[end:].decode("utf-8", errors="replace")
        n_rc = sum(1 for st in out.steps if st.phase == Phase.RC)
        pos = n_before = n_answer = 0
        for t in out.tokens:  # a token is counted where it ends
            pos += len(vocab.tokens[t])
            if t in eos or pos > end:
                break
            if pos > start:
                n_answer += 1
            else:
                n_before += 1
        by_phase = {"rc": n_rc} if n_rc else {}
        by_phase["reasoning"] = n_before - n_rc
        n_after = len(out.tokens) - n_before - n_answer
        if end < len(data):
            by_phase["answer"] = n_answer
            by_phase["after"] = n_after
        else:
            by_phase["answer"] = n_answer + n_after  # the EOS belongs to the answer
        res.tokens.by_phase = by_phase

    _vocab: TokenVocab | None = None

    def assemble(self, backend: Backend, request: Request, out: RowOutput, batch_wall: float) -> Result:
        self._vocab = vocab_for(backend.tokenizer)  # fill_answer reads the output's bytes through it
        res = super().assemble(backend, request, out, batch_wall)
        if request.constrain:
            s = self.settings(request)
            mass = [float(e["fem_mass"]) for e in out.events if "fem_mass" in e]
            secs = [float(e["fem_s"]) for e in out.events if "fem_s" in e]
            res.stats.update({
                "fem_form": s.artifact.form, "fem_task": s.artifact.meta.get("task"), "fem_h": s.artifact.h,
                "fem_top_k": s.top_k if s.top_k is not None and s.top_k < s.artifact.h else None,
                "fem_gamma": s.gamma, "fem_placement": s.placement,
                "fem_mass": [round(m, 6) for m in mass],
                "fem_mass_min": round(min(mass), 6) if mass else None,
                "fem_mass_mean": round(sum(mass) / len(mass), 6) if mass else None,
                "fem_ms_per_step": round(1000 * sum(secs) / len(secs), 3) if secs else None,
            })
        return res


def _answer_span(data: bytes, template: Template, s: FemSettings) -> tuple[int, int] | None:
    """Byte span of the answer: the last lines (``end``: as many as the template has, its slots being single-line
    text), or, placed ``anywhere``, the last key phrase and its answer read by the one rule every strategy's reader
    shares (:func:`formtax.constraints.finalanswer.final_answer`, issue 60), so a decog record and a free record
    with the same text get the same strict verdict; a template that is not a phrase and one word-like slot keeps
    its last occurrence."""
    if s.placement == "end":
        start = len(data)
        for _ in range(1 + sum(p.count("\n") for p in template.parts if isinstance(p, str))):
            start = data.rfind(b"\n", 0, start)
            if start < 0:
                break
        return start + 1, len(data)
    phrase = key_phrase_of(template)
    if phrase is not None:
        text = data.decode("utf-8", errors="surrogateescape")  # round-trips every byte, so offsets map back
        found = final_answer(text, phrase)
        if found is None:
            return None
        return (len(text[: found.phrase_start].encode("utf-8", errors="surrogateescape")),
                len(text[: found.end].encode("utf-8", errors="surrogateescape")))
    spec = FormatSpec(template, prefix="none", suffix="none", leading_space=False)
    last = None
    for m in re.finditer(spec.py_regex(), data):
        last = (m.start(), m.end())
    return last


def resolve_top_k(raw: Any, h: int) -> int | None:
    """Hidden states kept per step: ``"5%"`` is a fraction of the HMM's ``h`` (at least 1), an integer is
    absolute, ``0`` / ``"none"`` / None keeps all. Deco-G's paper keeps 200 of 4096 states (about 5%), so the
    default is the fraction: a fixed 200 never pruned the 64-256-state HMMs formtax builds on CPUs."""
    if raw is None or str(raw).strip().lower() in ("0", "none"):
        return None
    text = str(raw).strip()
    if text.endswith("%"):
        frac = float(text[:-1]) / 100.0
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"a top_k fraction must be in (0%, 100%], got {text}")
        return max(1, math.ceil(frac * h))
    return int(text)


@register
class DecoG(FemStrategy):
    name = "decog"
    summary = ("Deco-G: free reasoning reweighted by an instruction-aware HMM + token DFA of the answer template "
               "(top-k state pruning, gamma; needs --fem); 100% format compliance")
    form = "instruction-aware"
    default_top_k = "5%"


@register
class CtrlG(FemStrategy):
    name = "ctrlg"
    summary = "Ctrl-G: like decog with an HMM distilled from unconditional samples, full state space (needs --fem)"
    form = "unconditional"
    default_top_k = None

