"""Built-in calibration worlds, generated from a seed: each plants one effect of the papers with a known size.

Every builder returns a :class:`~formtax.planted.world.World` whose ``study`` section names the strategies and
settings that measure its effect, and whose ``study["planted"]`` states the effect the world's author intends
(e.g. ``validity_gain`` = the share of items whose dominant answer is a validity failure). ``formtax calibrate``
prints three numbers per quantity: *planted* (intended), *exact* (implied by the lab's own definitions: its
prompts, masks, parsers and scorers, computed without the decode loop) and *estimate* (what the run measured,
with the report's interval). planted != exact points at a definition (a parser that forgives ``28.00``);
exact outside the interval, more often than 5% of the time, points at the pipeline or the statistics.

Items come in *types* (which continuation the model prefers); per-item probabilities are drawn around the type,
so items are heterogeneous, as a benchmark's are. Under greedy decoding the dominant continuation decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from formtax.planted.world import World, parse_world

RC = "Let's think step by step."


def _probs(rng: np.random.Generator, dominant: int, n: int, top: float) -> list[float]:
    """``n`` probabilities with ``dominant`` holding about ``top`` (a Dirichlet draw for the rest)."""
    rest = rng.dirichlet(np.ones(n - 1)) * (1.0 - top)
    out = list(rest[:dominant]) + [top] + list(rest[dominant:])
    out = [float(round(p, 12)) for p in out]
    out[dominant] += 1.0 - sum(out)
    return out


def _kinds(types: list[str], shares: tuple[float, ...], n_items: int) -> list[str]:
    """Item types in blocks by share (rounded; the first type takes the remainder), in the order given."""
    counts = [int(round(s * n_items)) for s in shares]
    counts[0] += n_items - sum(counts)
    return [t for t, c in zip(types, counts, strict=True) for _ in range(c)]


def _cont(text: Any, p: float, after: list[tuple[Any, float]] | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"text": text, "p": p}
    if after:
        d["after_end"] = [{"text": t, "p": q} for t, q in after]
    return d


def format_validity(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2", top: float = 0.7) -> World:
    """Paper 003 A.4.1: format and validity failures that InWriting's FC and VC repair.

    Types (shares 0.4 / 0.2 / 0.2 / 0.2): ``ok`` (a correct answer line), ``decimal`` (``The answer is: 28.00``,
    a validity failure: VC's digits-only slot stops it after ``28``), ``noline`` (the right number but no answer
    line, a format failure: FC's template adds the line) and ``wrong``. Planted: format gain 0.2, validity gain
    0.2 (the ``decimal`` share), accuracy none 0.4 / fc 0.6 / vc 0.8 under greedy decoding.
    """
    rng = np.random.default_rng(seed)
    types = ["ok", "decimal", "noline", "wrong"]
    kinds = _kinds(types, (0.4, 0.2, 0.2, 0.2), n_items)
    items = []
    for k, kind in enumerate(kinds):
        a, b = int(rng.integers(10, 60)), int(rng.integers(10, 40))
        g, w = a + b, a + b + int(rng.integers(1, 9))
        why = f"{a} plus {b} is"
        conts = [
            (f"{why} {g}.\nThe answer is: {g}", [(f"The answer is: {g}", 1.0)]),
            (f"{why} {g}.\nThe answer is: {g}.00", [(f"The answer is: {g}.00", 0.95), (f"The answer is: {g}", 0.05)]),
            (f"{why} {g}. So the result is {g}.", [(f"The answer is: {g}", 1.0)]),
            (f"{why} {w}.\nThe answer is: {w}", [(f"The answer is: {w}", 1.0)]),
        ]
        ps = _probs(rng, types.index(kind), 4, top)
        items.append({"id": f"q{k:03d}", "question": f"What is {a} plus {b}? (item {k})", "gold": str(g),
                      "continuations": [_cont(t, p, af) for (t, af), p in zip(conts, ps, strict=True)],
                      "meta": {"type": kind}})
    return parse_world({
        "name": "format-validity", "tokenizer": tokenizer, "items": items,
        "description": format_validity.__doc__.split("\n\n")[0] if format_validity.__doc__ else "",
        "study": {"strategies": ["inwriting@none", "inwriting@fc", "inwriting@vc"], "reasoning_tokens": 96,
                  "planted": {"decomposition/inwriting/format_gain": 0.2,
                              "decomposition/inwriting/validity_gain": 0.2}},
    })


_WORDS = ("Yamileth", "Dane", "Aron", "Dee", "Homoh", "Aniba", "Grewar", "Mordoch", "Bjarndis", "Leveron",
          "Lalesca", "Hasiic", "Elrayan", "Weixu", "Samphoas", "Stierlin", "Thwmas", "Rahymoff")


def letters_validity(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2", top: float = 0.7) -> World:
    """Paper 003 A.4.1's LastLetter cases, which only a validity constraint repairs: the model reads the right
    letters but answers ``H E N E`` (spaced capitals) or ``hen`` (the final letter dropped). Under VC the
    ``{letters:4}`` slot masks the space after the first capital (the model's next choice is the rest unspaced,
    ``HENE``, which the strict parser reads as ``hene``) and masks the early end (the model's next choice is the
    missing letter). Types (shares 0.2 each): ``ok``, ``case`` (``HENE``: right at every level, since the strict
    parser reads either case and VC admits what it scores as correct), ``spaced``, ``dropped``, ``noline`` (the
    right letters in a sentence, no answer line: a format failure). Made to go on after its end (InWriting's
    switch), the model repeats its own answer, with the canonical one as its second choice. Planted: format gain
    0.2, validity gain 0.4, strict accuracy none 0.4 / fc 0.6 / vc 1.0 under greedy decoding."""
    rng = np.random.default_rng(seed)
    types = ["ok", "case", "spaced", "dropped", "noline"]
    kinds = _kinds(types, (0.2, 0.2, 0.2, 0.2, 0.2), n_items)
    items = []
    for k, kind in enumerate(kinds):
        words = [str(w) for w in rng.choice(_WORDS, size=4, replace=False)]
        gold = "".join(w[-1] for w in words).lower()
        upper = gold.upper()
        why = "The last letters are " + ", ".join(w[-1] for w in words) + "."
        right = f"The answer is: {gold}"
        capitals = f"The answer is: {upper}"
        # each failure keeps the canonical answer as the model's (small) second choice at the point of failure
        spaced = f"The answer is: {' '.join(upper)}"
        dropped = f"The answer is: {gold[:-1]}"
        conts: list[tuple[str, list[tuple[Any, float]]]] = [
            (f"{why}\n{right}", [(right, 1.0)]),
            (f"{why}\n{capitals}", [(capitals, 1.0)]),
            # segments fix the token boundaries: the unspaced rest follows the first capital as the second choice
            (f"{why}\n{spaced}", [(["The answer is:", f" {upper[0]}", " " + " ".join(upper[1:])], 0.95),
                                    (["The answer is:", f" {upper[0]}", upper[1:]], 0.05)]),
            # segments fix the token boundary, so the right answer extends the dropped one token by token
            (f"{why}\n{dropped}", [(["The answer is:", f" {gold[:-1]}"], 0.95),
                                     (["The answer is:", f" {gold[:-1]}", gold[-1]], 0.05)]),
            (f"{why} Together they spell {gold}.", [(right, 1.0)]),
        ]
        ps = _probs(rng, types.index(kind), len(types), top)
        items.append({"id": f"w{k:03d}", "question": f'Take the last letter of each word in "{" ".join(words)}" '
                      f"and concatenate them. (item {k})", "gold": gold,
                      "continuations": [_cont(t, p, af) for (t, af), p in zip(conts, ps, strict=True)],
                      "meta": {"type": kind}})
    return parse_world({
        "name": "letters-validity", "tokenizer": tokenizer, "answer": {"kind": "letters", "length": 4},
        "items": items, "description": (letters_validity.__doc__ or "").split("\n\n")[0],
        "study": {"strategies": ["inwriting@none", "inwriting@fc", "inwriting@vc"], "reasoning_tokens": 96,
                  "planted": {"decomposition/inwriting/format_gain": 0.2,
                              "decomposition/inwriting/validity_gain": 0.4}},
    })


def reasoning_rc(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2", top: float = 0.7) -> World:
    """A reasoning gain: after the forced "Let's think step by step." (RC) the model reasons to the right answer
    on ``rc_help`` items where it otherwise answers wrong. Types: ``ok`` 0.5, ``rc_help`` 0.3 (wrong without RC,
    right with it), ``wrong`` 0.2 (wrong either way). Planted reasoning gain 0.3 (vc 0.5 -> vc+rc 0.8)."""
    rng = np.random.default_rng(seed)
    shares = {"ok": 0.5, "rc_help": 0.3, "wrong": 0.2}
    kinds = [t for t, s in shares.items() for _ in range(int(round(s * n_items)))]
    kinds += ["ok"] * (n_items - len(kinds))
    items = []
    for k, kind in enumerate(kinds):
        a, b = int(rng.integers(10, 60)), int(rng.integers(10, 40))
        g, w = a + b, a + b + int(rng.integers(1, 9))
        why = f"{a} plus {b} is"
        right = (f"{why} {g}.\nThe answer is: {g}", [(f"The answer is: {g}", 1.0)])
        wrong = (f"{why} {w}.\nThe answer is: {w}", [(f"The answer is: {w}", 1.0)])
        plain_top = 0 if kind == "ok" else 1
        rc_top = 1 if kind == "wrong" else 0
        p_plain = _probs(rng, plain_top, 2, top)
        p_rc = _probs(rng, rc_top, 2, top)
        rc_mass = 1e-3  # how rarely the model would write the RC phrase unprompted
        conts = [_cont(t, p * (1 - rc_mass), af) for (t, af), p in zip([right, wrong], p_plain, strict=True)]
        conts += [_cont([RC, " " + t], p * rc_mass, af) for (t, af), p in zip([right, wrong], p_rc, strict=True)]
        items.append({"id": f"q{k:03d}", "question": f"What is {a} plus {b}? (item {k})", "gold": str(g),
                      "continuations": conts, "meta": {"type": kind}})
    return parse_world({
        "name": "reasoning-rc", "tokenizer": tokenizer, "items": items,
        "study": {"strategies": ["inwriting@vc", "inwriting@vc+rc"], "reasoning_tokens": 64,
                  "planted": {"decomposition/inwriting/reasoning_gain": 0.3}},
    })


TOOLS = ("search", "calculator", "weather", "None")


def abstention(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2", top: float = 0.6) -> World:
    """Paper 002's masking-repairs-abstention effect. A choice task (tools + ``None``); the free condition writes
    a long answer that often misnames; under the one-line prompt (short and constrained share it) the model
    first writes an explanation line on ``explains`` items, so short (cut at the newline) has no answer and the
    mask (which only allows ``The answer is: <tool>``) repairs it. Types: ``direct`` 0.5 (answers in one line),
    ``explains`` 0.3 (explanation first; the masked path is the answer line), ``wrong`` 0.2. Planted:
    delta_mask (constrained - short) = 0.3, delta_length (short - free) = 0.5 - 0.8 = -0.3 (free is right on
    direct and explains items)."""
    rng = np.random.default_rng(seed)
    shares = {"direct": 0.5, "explains": 0.3, "wrong": 0.2}
    kinds = [t for t, s in shares.items() for _ in range(int(round(s * n_items)))]
    kinds += ["direct"] * (n_items - len(kinds))
    items = []
    for k, kind in enumerate(kinds):
        gold = TOOLS[int(rng.integers(0, len(TOOLS)))]
        other = TOOLS[(TOOLS.index(gold) + 1 + int(rng.integers(0, len(TOOLS) - 1))) % len(TOOLS)]
        q = f"Which tool answers request number {k}?"
        free_ok = kind != "wrong"
        pf = _probs(rng, 0 if free_ok else 1, 2, top)
        free = [_cont(f"I would pick a tool here.\nThe answer is: {gold}", pf[0]),
                _cont(f"I would pick a tool here.\nThe answer is: {other}", pf[1])]
        line_right = f"The answer is: {gold}"
        line_wrong = f"The answer is: {other}"
        explain = f"This needs some thought.\nThe answer is: {gold}"
        dom = {"direct": 0, "explains": 2, "wrong": 1}[kind]
        ps = _probs(rng, dom, 3, top)
        if kind == "explains" and ps[0] <= ps[1]:  # the masked path: the right line beats the wrong one
            ps[0], ps[1] = ps[1], ps[0]
        short = [_cont(line_right, ps[0]), _cont(line_wrong, ps[1]), _cont(explain, ps[2])]
        items.append({"id": f"q{k:03d}", "question": q, "gold": gold, "continuations": free,
                      "contexts": [{"format": "answer-only", "continuations": short}],
                      "meta": {"type": kind}})
    return parse_world({
        "name": "abstention", "tokenizer": tokenizer, "answer": {"kind": "choice", "labels": list(TOOLS)},
        "items": items,
        "study": {"strategies": ["free", "short", "constrained"], "max_tokens": 64,
                  "planted": {"paired/constrained/short/diff": 0.3, "paired/free/short/diff": 0.3}},
    })


def abstention_languages(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2") -> World:
    """Paper 002's second language: every question of :func:`abstention` asked again in a second language
    (item ``qNNN-l2``), where the model is less sure of itself (its dominant continuations hold 0.4 instead of
    0.6, drawn with another seed). D_paired = (b - c) / |S| compares, on the items both languages get right under
    short, how often the constraint loses only language 2 (b) against only language 1 (c); with sampled,
    independent requests its truth is ``sum_i s1 s2 (c1 - c2) / sum_i s1 s2`` over the per-item probabilities of
    a right answer (s: short, c: constrained). Not planted by hand: the exact truth is the reference."""
    first = abstention(n_items, seed, tokenizer).model_dump(exclude={"sha256"})
    second = abstention(n_items, seed + 1, tokenizer, top=0.4).model_dump(exclude={"sha256"})
    for it in first["items"]:
        it["meta"].update(language="l1", pair=it["id"])
    for a, b in zip(first["items"], second["items"], strict=True):
        b["meta"].update(language="l2", pair=a["id"])
        b["id"] = f"{a['id']}-l2"
        b["question"] = b["question"].replace("Which tool answers", "Welches Werkzeug beantwortet")
    first["items"] += second["items"]
    first["name"] = "abstention-languages"
    first["study"] = {"strategies": ["short", "constrained"], "max_tokens": 64,
                      "planted": {}}
    return parse_world(first)


def suffix_branch(n_items: int = 24, seed: int = 0, tokenizer: str = "smollm2") -> World:
    """Paper 000's bifurcation point: the free run states the right answer early (where the template could start
    at no cost, delta = 0) and then keeps talking to a wrong final line on ``drifts`` items (0.5). The pipeline
    (branch at the end) inherits the drift; suffix-last branches at the early answer. Planted: suffix-last -
    suffix-pipeline = 0.5."""
    rng = np.random.default_rng(seed)
    items = []
    for k in range(n_items):
        a, b = int(rng.integers(10, 60)), int(rng.integers(10, 40))
        g, w = a + b, a + b + int(rng.integers(1, 9))
        drifts = k % 2 == 0
        tail = f" Hmm, maybe it is {w}." if drifts else " That is it."
        final = [(f" The answer is: {w if drifts else g}", 1.0)]  # what it writes if made to go on at the end
        items.append({"id": f"q{k:03d}", "question": f"What is {a} plus {b}? (item {k})", "gold": str(g),
                      "continuations": [
                          _cont([f"{a} plus {b} is {g}.", " The answer is:", f" {g}.", tail], 0.6, final),
                          _cont([f"{a} plus {b} is {g}.", " Let me check.", tail], 0.4, final)],
                      "meta": {"type": "drifts" if drifts else "steady"}})
    return parse_world({
        "name": "suffix-branch", "tokenizer": tokenizer, "items": items,
        "study": {"strategies": ["suffix-pipeline", "suffix-last", "suffix-min", "suffix-beam"],
                  "max_tokens": 64 if tokenizer == "smollm2" else 160,
                  "planted": {"paired/suffix-last/suffix-pipeline/diff": 0.5}},
    })


def missing(n_items: int = 20, seed: int = 0, tokenizer: str = "smollm2") -> World:
    """Errored requests: every fourth item always fails (an engine error), the rest follow ``format_validity``.
    The report must drop exactly the failing items, from every compared cell alike."""
    base = format_validity(n_items, seed, tokenizer).model_dump(exclude={"sha256"})
    for k, it in enumerate(base["items"]):
        if k % 4 == 3:
            it["meta"]["fail"] = True
    base["name"] = "missing"
    base["study"] = {"strategies": ["inwriting@none", "inwriting@fc", "inwriting@vc"], "reasoning_tokens": 96,
                     "planted": {}}
    return parse_world(base)


def decog_format(n_items: int = 30, seed: int = 0, tokenizer: str = "smollm2", top: float = 0.7) -> World:
    """Paper 001's setting: free reasoning that a format estimation module steers into the answer line. Types
    (shares 0.4 / 0.3 / 0.3): ``ok`` (the reasoning, then the answer as its last line), ``noline`` (the right
    number in a sentence and no answer line: a format failure; made to go on after its end the model writes the
    answer line) and ``wrong``. Deco-G's hard mask bans EOS until the last line is the template, so the
    ``noline`` items get their answer line; the HMM (distilled from this world's own task-only outputs,
    ``study.fem``) reweights which continuation is taken. Planted: format gain 0.3 (decog@vc - decog@none), if
    the HMM does not turn the dominant continuation: the exact truth says what it does."""
    rng = np.random.default_rng(seed)
    types = ["ok", "noline", "wrong"]
    kinds = _kinds(types, (0.4, 0.3, 0.3), n_items)
    items = []
    for k, kind in enumerate(kinds):
        a, b = int(rng.integers(10, 60)), int(rng.integers(10, 40))
        g, w = a + b, a + b + int(rng.integers(1, 9))
        line = f"\nThe answer is: {g}"  # the last line Deco-G's format asks for
        conts: list[tuple[Any, list[tuple[Any, float]]]] = [
            ([f"{a} plus {b} is {g}.", "\nThe answer is:", f" {g}"], [(line, 1.0)]),
            ([f"{a} plus {b} makes {g}."], [(line, 1.0)]),
            ([f"{a} plus {b} is {w}.", "\nThe answer is:", f" {w}"], [(f"\nThe answer is: {w}", 1.0)]),
        ]
        ps = _probs(rng, types.index(kind), 3, top)
        items.append({"id": f"d{k:03d}", "question": f"What is {a} plus {b}? (item {k})", "gold": str(g),
                      "continuations": [_cont(t, p, af) for (t, af), p in zip(conts, ps, strict=True)],
                      "meta": {"type": kind}})
    return parse_world({
        "name": "decog-format", "tokenizer": tokenizer, "items": items,
        "description": (decog_format.__doc__ or "").split("\n\n")[0],
        "study": {"strategies": ["decog@none", "decog@vc"], "max_tokens": 64 if tokenizer == "smollm2" else 96,
                  "fem": {"distill": {"states": 8, "samples": 24, "em_iters": 3, "max_tokens": 48}},
                  "planted": {"paired/decog@none/decog@vc/diff": -0.3}},
    })


def json_answer_forms(n_items: int = 40, seed: int = 0, tokenizer: str = "smollm2") -> World:
    """Paper 003's NL-to-Format in the JSON answer form: how the second call writes ``{"answer": <answer>}``.
    Types (shares 0.2 each): ``compact`` (``{"answer": 36}``), ``pretty`` (``{\\n "answer": 36\\n}``, indent 1:
    the answer object's grammar caps each whitespace run at a few tokens, ours, and a byte-level tokenizer spends a
    token per space),
    ``newline`` (the object after a line break), ``prefaced`` (``Answer: {"answer": 36}``; made to start with
    the object, the model writes it compactly) and ``wrong`` (a compact object with a wrong number). Every object
    shows the integer unquoted, as the prompt does.

    The paper's rules: the unconstrained second call is only prompted and its whole output parsed (a JSON parser
    reads the pretty, the compact and the newline-led object; the prefaced one is not the object the prompt asks
    for); FC admits every answer the prompt admits (Assumption 1), so the unquoted number passes FC and the
    prefix does not; VC admits the same integers here. Planted: strict accuracy none 0.6 / fc 0.8 / vc 0.8,
    format gain 0.2, validity gain 0, under greedy decoding."""
    rng = np.random.default_rng(seed)
    types = ["compact", "pretty", "newline", "prefaced", "wrong"]
    kinds = _kinds(types, (0.2, 0.2, 0.2, 0.2, 0.2), n_items)
    items = []
    for k, kind in enumerate(kinds):
        a, b = int(rng.integers(10, 60)), int(rng.integers(10, 40))
        g, w = a + b, a + b + int(rng.integers(1, 9))
        compact = '{"answer": %d}' % g
        written = {"compact": compact, "pretty": '{\n "answer": %d\n}' % g, "newline": "\n" + compact,
                   "prefaced": "Answer: " + compact, "wrong": '{"answer": %d}' % w}[kind]
        conversion = [_cont(written, 0.9), _cont(compact, 0.1)] if kind == "prefaced" else [_cont(written, 1.0)]
        items.append({"id": f"j{k:03d}", "question": f"What is {a} plus {b}? (item {k})", "gold": str(g),
                      "continuations": [_cont(f"{a} plus {b} is {w if kind == 'wrong' else g}.", 1.0)],
                      "contexts": [{"format": "conversion", "continuations": conversion}],
                      "meta": {"type": kind}})
    return parse_world({
        "name": "json-answer-forms", "tokenizer": tokenizer, "items": items,
        "description": (json_answer_forms.__doc__ or "").split("\n\n")[0],
        "study": {"strategies": ["nl2format@none:json", "nl2format@fc:json", "nl2format@vc:json"], "max_tokens": 48,
                  "planted": {"accuracy/nl2format@none:json/acc_strict": 0.6,
                              "accuracy/nl2format@fc:json/acc_strict": 0.8,
                              "decomposition/nl2format:json/format_gain": 0.2,
                              "decomposition/nl2format:json/validity_gain": 0.0}},
    })


BUILTIN: dict[str, Callable[..., World]] = {
    "format-validity": format_validity,
    "letters-validity": letters_validity,
    "reasoning-rc": reasoning_rc,
    "abstention": abstention,
    "abstention-languages": abstention_languages,
    "suffix-branch": suffix_branch,
    "missing": missing,
    "decog-format": decog_format,
    "json-answer-forms": json_answer_forms,
}
