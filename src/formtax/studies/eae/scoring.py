"""Scoring for generative event argument extraction (EAE; paper 001 section 4.2): AI, AC, AI+ and AC+.

A model is given a passage, a trigger and the event type's roles, and fills each role with an argument string
(or nothing). The metrics are those of the EAE literature paper 001 builds on (TextEE's scorer, Huang et al. 2024,
from the same group, after OneIE / DEGREE): an argument is a key, and precision and recall are over the *sets* of
predicted and gold keys of a sentence, so a span is counted once, however many roles or mentions name it.

- **AI** (argument identification): (event type, span) — the span is an argument of an event of that type in the
  sentence, whatever the role and whichever trigger.
- **AC** (argument classification): (event type, span, role).
- **AI+ / AC+** (attached): the same keys with the trigger's offsets: the argument must also be attached to the
  right event mention (two mentions of one type in one sentence are told apart).
- **AI (head word) / AC (head word)**: formtax's extra metrics, per mention, comparing the *head words* of the
  strings instead of the whole strings (the right entity with another boundary still counts); they were named
  AI+ / AC+ here before the attached definitions (:func:`score_mention`).

Choices (the paper leaves them open), and why:

* **String matching, not offsets.** A generative model writes strings; mapping each back to token offsets
  needs a tie-breaking rule (47 WikiEvents arguments occur more than once in their sentence) that would be
  one more choice. Strings are compared through :func:`normalize_span`: casefold (the model may change
  sentence-initial case), drop *all* whitespace (GENEVA stores 371 arguments detokenised, "$89 million",
  while its tokens read "$ 89 million"; a model copying either form must match), and strip leading and
  trailing punctuation and quotes (a model that ends a value with a period, or quotes it, names the same
  span). Characters of Unicode category P* count as punctuation, plus the backquote (PTB-style opening
  quotes are two backquotes); ``%`` and ``#`` (category Po) are kept, as are symbols such as ``$``, since
  "50%" and "50", or "$89" and "89", are different values. An empty key (a value that is all
  punctuation) never matches anything.
* **Roles are compared case-insensitively**: "victim" and "Victim" name the same slot (checked: no event
  type of the KAIROS or GENEVA ontology has two roles differing only in case).
* **Sentences from the records.** A record keeps its mention's :class:`Attachment` (a key of the document and
  sentence, the event type, the trigger's token offsets) in its gold, so the attached metrics need nothing but
  the records. A record without one (written before it existed) is its own sentence with an unnamed type, where
  AI+ / AC+ equal AI / AC.
* **One-to-one matching** (the head-word metrics). gen-arg's scorer counts a prediction correct if it matches *any* gold argument,
  and divides that count by the gold count for recall. Two predictions of one gold span are then both
  correct, so a model that repeats a span across roles gains recall it did not earn, and recall can even
  exceed 1. Here the number correct is the size of a one-to-one matching between predicted and gold keys,
  so each gold argument is credited at most once and precision and recall stay in [0, 1]: for AI (roles
  ignored) the size of the multiset intersection of the span keys (a string predicted for two roles is
  credited once per gold occurrence); for AC, AI+ and AC+ the same on (role, key), head key and
  (role, head key).
* **De-duplication.** Predictions are de-duplicated on (role, span key): one role filled twice with the
  same string (after normalisation) is one prediction. Gold is de-duplicated the same way, because string
  scoring cannot tell two gold mentions with one text and role apart, and counting both would cap recall
  below one. Neither shipped test set has such a duplicate, so no gold count there changes.
* **Heads.** Neither WikiEvents nor GENEVA annotates heads. gen-arg takes the spaCy dependency root of the
  span after stripping a leading "the/a/an"; :class:`SpacyHeads` does that (parsing the span on its own,
  as a record keeps only strings), and when the root is a preposition or subordinator (22.8% of GENEVA
  spans are PPs or clauses, "of a state public health laboratory ...") takes its object instead, since the
  preposition is not the argument's head. Where spaCy or an English pipeline is unavailable,
  :func:`rule_head` approximates it with a documented rule. Heads are computed once, when records are
  written, and stored in them with the method's name (``head_method``), so a report never depends on the
  machine's spaCy and can refuse to mix two methods.
* **Empty-value words.** A predicted value "none", "null", "n/a" or "" (after strip and casefold) means the
  role is not filled: these are what a model writes when the format forces a value for every role.
* :func:`prf`: P = 0 when nothing is predicted and R = 0 when there is no gold (no credit without
  evidence; NaN would drop such cells from averages), F1 = 0 when P + R = 0.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from formtax.errors import DataError

# -- span keys ----------------------------------------------------------------------------------------------

_EXTRA_PUNCT = frozenset("`")
"""Characters stripped like punctuation though Unicode calls them symbols (PTB-style backquotes)."""
_KEPT = frozenset("%#")
"""Characters Unicode calls punctuation that carry a value's meaning ("50%", "#1"): never stripped."""


def _is_punct(ch: str) -> bool:
    return ch in _EXTRA_PUNCT or (ch not in _KEPT and unicodedata.category(ch).startswith("P"))


def normalize_span(text: str) -> str:
    """The matching key of an argument string: casefolded, without whitespace, ends stripped of punctuation."""
    key = "".join(text.casefold().split())
    start, end = 0, len(key)
    while start < end and _is_punct(key[start]):
        start += 1
    while end > start and _is_punct(key[end - 1]):
        end -= 1
    return key[start:end]


# -- heads --------------------------------------------------------------------------------------------------


class HeadFinder(Protocol):
    """Maps an argument string to its head word; ``method`` names the method (stored in records)."""

    method: str

    def __call__(self, text: str) -> str: ...


_TOKEN = re.compile(
    r"(?:[^\W\d_]\.){2,}"  # initialisms: U.S., U.N.
    r"|[A-Z][a-z]{0,3}\.(?=\s+\w)"  # short title-like abbreviations before a word: Mr. Smith, Gen. X, St. Louis
    r"|\d+(?:[.,:]\d+)+"  # numbers with separators: 3.5, 1,200, 10:30
    r"|\w+(?:['\u2019-]\w+)*"  # words, keeping apostrophes and hyphens inside: Fool's, al-Qaeda
    r"|[^\w\s]"  # any other character is a punctuation token of its own
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_PREPOSITIONS = _words(
    "of in on at to for from with by about into onto upon over under above below between among amongst "
    "against through throughout across toward towards within without near during before after since until "
    "till via per amid amidst behind beyond along around off out up down than as like despite besides "
    "beside inside outside regarding concerning"
)
_SUBORDINATORS = _words(
    "that which who whom whose whether if because when where while although though how what why"
)
_DETERMINERS = _words(
    "the a an this that these those some any each every all both no another such either neither "
    "his her its their our my your"
)
_LEADING = _PREPOSITIONS | _SUBORDINATORS | _DETERMINERS
"""Words stripped from the start of a span before looking for its head."""

_CONJUNCTIONS = _words("and or but nor")
_RELATIVES = _words("that which who whom whose where when")
_AUXILIARIES = _words("is was were are am be been being has have had")
_CHUNK_END = _PREPOSITIONS | _CONJUNCTIONS | _RELATIVES | _AUXILIARIES
"""Words that end the first noun chunk (with any punctuation token)."""


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_punct_token(token: str) -> bool:
    return all(_is_punct(ch) for ch in token)


def rule_head(text: str) -> str:
    """The head word of an argument string by rule (used when spaCy is unavailable).

    Leading punctuation tokens and leading prepositions, subordinators, determiners and possessives are
    stripped ("of a state public health laboratory" -> "state public health laboratory"); the first noun
    chunk is approximated as the tokens up to the first preposition, conjunction, relative pronoun,
    auxiliary or punctuation token, and its last token is the head (English noun phrases are head-final
    before their post-modifiers: "members of the Afghan security forces" -> "members"). Fallbacks: the last
    token of the stripped span (when it starts with a chunk-ending word), then the span itself.
    """
    tokens = _tokens(text)
    start = 0
    while start < len(tokens) and (_is_punct_token(tokens[start]) or tokens[start].casefold() in _LEADING):
        start += 1
    rest = tokens[start:]
    chunk: list[str] = []
    for token in rest:
        if _is_punct_token(token) or token.casefold() in _CHUNK_END:
            break
        chunk.append(token)
    if chunk:
        return chunk[-1]
    words = [t for t in rest if not _is_punct_token(t)]
    return words[-1] if words else text.strip()


class RuleHeads:
    """:func:`rule_head` as a :class:`HeadFinder`."""

    def __init__(self) -> None:
        self.method = "rule"

    def __call__(self, text: str) -> str:
        return rule_head(text)


SPACY_PIPELINES = ("en_core_web_sm", "en_core_web_md", "en_core_web_lg", "en_core_web_trf")
"""English pipelines tried in order by :func:`get_head_finder` (gen-arg uses the small one)."""

_GEN_ARG_DETERMINERS = frozenset({"the", "a", "an"})
_OBJECT_DEPS = ("pobj", "pcomp")
_NOMINAL_POS = frozenset({"NOUN", "PROPN", "PRON"})


def _is_preposition_or_subordinator(token: Any) -> bool:
    return token.pos_ in ("ADP", "SCONJ") or token.dep_ in ("prep", "mark")


class SpacyHeads:
    """Heads from a spaCy pipeline: the dependency root of the span, or the object of a root preposition.

    Like gen-arg, a leading "the/a/an" is removed before parsing. The span is parsed on its own (the
    records keep only strings), and its root is the first token that heads itself. A preposition or
    subordinator root is replaced by its first ``pobj``/``pcomp`` child, else by its first noun, proper
    noun or pronoun child. ``nlp`` is any callable returning spaCy-like tokens (``text``, ``dep_``, ``pos_``,
    ``head``, ``children``, ``i``), so the logic can be tested without spaCy.
    """

    def __init__(self, nlp: Any, name: str | None = None) -> None:
        self.nlp = nlp
        meta = dict(getattr(nlp, "meta", {}) or {})
        if name is None:
            lang, base = str(meta.get("lang", "")), str(meta.get("name", "unknown"))
            name = base if not lang or base.startswith(f"{lang}_") else f"{lang}_{base}"
        self.method = f"spacy:{name}-{meta.get('version', 'unknown')}"

    @classmethod
    def load(cls) -> SpacyHeads | None:
        """The first English pipeline of :data:`SPACY_PIPELINES` that loads; None without spaCy or one."""
        try:
            import spacy
        except ImportError:
            return None
        for name in SPACY_PIPELINES:
            try:
                return cls(spacy.load(name), name)
            except (OSError, ImportError, ValueError):
                continue
        return None

    def __call__(self, text: str) -> str:
        words = text.strip().split()
        if len(words) > 1 and words[0].casefold() in _GEN_ARG_DETERMINERS:
            words = words[1:]
        doc = list(self.nlp(" ".join(words)))
        roots = [t for t in doc if t.head.i == t.i]
        if not roots:
            return text.strip()
        root = roots[0]
        if _is_preposition_or_subordinator(root):
            children = list(root.children)
            objects = [c for c in children if c.dep_ in _OBJECT_DEPS]
            objects = objects or [c for c in children if c.pos_ in _NOMINAL_POS]
            if objects:
                root = objects[0]
        return str(root.text)


@functools.cache
def get_head_finder() -> HeadFinder:
    """The head finder of this machine: spaCy when it and an English pipeline load, else the rule (cached)."""
    spacy_heads = SpacyHeads.load()
    return spacy_heads if spacy_heads is not None else RuleHeads()


# -- encoding in records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One argument: its role, its string and the string's head word."""

    role: str
    text: str
    head: str


_NO_VALUE = frozenset({"", "none", "null", "n/a"})


def is_no_value(value: str | None) -> bool:
    """Whether a predicted value means "no argument" (None, or none/null/n/a/empty after strip+casefold)."""
    return value is None or value.strip().casefold() in _NO_VALUE


@dataclass(frozen=True)
class Attachment:
    """Where a mention's arguments attach: its sentence (a key of document and passage), event type, trigger."""

    sentence: str
    event_type: str
    trigger: tuple[int, int]  # the trigger's token offsets in the sentence, end-exclusive


def sentence_key(doc_id: str, passage: str) -> str:
    """A short stable key of one sentence of one document (mentions of one sentence share it)."""
    return hashlib.sha256(f"{doc_id}\x00{passage}".encode()).hexdigest()[:16]


def encode_gold(args: Sequence[tuple[str, str]], heads: HeadFinder, attach: Attachment | None = None) -> str:
    """The gold arguments of one mention as the JSON stored in ``Record.gold`` (order kept), with its attachment."""
    out = [{"role": role, "text": text, "head": heads(text)} for role, text in args]
    data: dict[str, Any] = {"args": out, "head_method": heads.method}
    if attach is not None:
        data["attach"] = {"sentence": attach.sentence, "event_type": attach.event_type,
                          "trigger": list(attach.trigger)}
    return json.dumps(data, ensure_ascii=False)


def decode_attachment(s: str) -> Attachment | None:
    """The attachment stored by :func:`encode_gold`; None in records written before it; DataError when malformed."""
    raw = _load(s, "gold").get("attach")
    if raw is None:
        return None
    trigger = raw.get("trigger") if isinstance(raw, dict) else None
    if not (isinstance(trigger, list) and len(trigger) == 2 and all(isinstance(t, int) for t in trigger)):
        raise DataError(f"EAE gold 'attach' needs sentence, event_type and a trigger [start, end]: {s!r:.200}")
    return Attachment(_str(raw.get("sentence"), "attach.sentence"), _str(raw.get("event_type"), "attach.event_type"),
                      (trigger[0], trigger[1]))


def _load(s: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(s)
    except (json.JSONDecodeError, TypeError) as exc:
        raise DataError(f"EAE {what} is not JSON: {s!r:.200}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("head_method"), str):
        raise DataError(f"EAE {what} must be an object with a 'head_method' string: {s!r:.200}")
    return data


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"EAE {what} must be a string, got {value!r}")
    return value


def decode_gold(s: str) -> tuple[list[Arg], str]:
    """(gold arguments, head method) from :func:`encode_gold`'s JSON; DataError when malformed."""
    data = _load(s, "gold")
    args = data.get("args")
    if not isinstance(args, list) or not all(isinstance(a, dict) for a in args):
        raise DataError(f"EAE gold 'args' must be a list of objects: {s!r:.200}")
    out = [
        Arg(_str(a.get("role"), "role"), _str(a.get("text"), "text"), _str(a.get("head"), "head"))
        for a in args
    ]
    return out, str(data["head_method"])


def encode_prediction(
    values: Mapping[str, str | None], heads: HeadFinder, in_passage: Mapping[str, bool]
) -> str:
    """One parsed prediction as JSON: every role's value (null when empty), its head and whether it is in
    the passage (non-null roles only; ``in_passage`` must cover them). Values are stored stripped."""
    args: dict[str, str | None] = {}
    head_of: dict[str, str | None] = {}
    found: dict[str, bool] = {}
    for role, value in values.items():
        if value is None or is_no_value(value):
            args[role] = head_of[role] = None
            continue
        if role not in in_passage:
            raise ValueError(f"in_passage has no entry for the filled role {role!r}")
        args[role] = value.strip()
        head_of[role] = heads(value.strip())
        found[role] = bool(in_passage[role])
    payload = {"args": args, "heads": head_of, "in_passage": found, "head_method": heads.method}
    return json.dumps(payload, ensure_ascii=False)


def _prediction_maps(s: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    data = _load(s, "prediction")
    args, heads, found = data.get("args"), data.get("heads"), data.get("in_passage")
    if not (isinstance(args, dict) and isinstance(heads, dict) and isinstance(found, dict)):
        raise DataError(f"EAE prediction needs 'args', 'heads' and 'in_passage' objects: {s!r:.200}")
    return args, heads, found, str(data["head_method"])


def decode_prediction(s: str) -> tuple[list[Arg], str]:
    """(the filled arguments, head method) from :func:`encode_prediction`'s JSON; DataError when malformed."""
    args, heads, _, method = _prediction_maps(s)
    out: list[Arg] = []
    for role, text in args.items():
        if text is None:
            continue
        out.append(Arg(role, _str(text, f"value of {role!r}"), _str(heads.get(role), f"head of {role!r}")))
    return out, method


def prediction_in_passage(s: str) -> list[bool]:
    """For each filled role of an encoded prediction (in order), whether its value was found in the passage."""
    args, _, found, _ = _prediction_maps(s)
    out: list[bool] = []
    for role, text in args.items():
        if text is None:
            continue
        flag = found.get(role)
        if not isinstance(flag, bool):
            raise DataError(f"EAE prediction: in_passage of the filled role {role!r} must be true/false")
        out.append(flag)
    return out


# -- counting -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Predicted and gold argument counts and the correct counts of the four metrics (summable)."""

    n_pred: int = 0
    n_gold: int = 0
    ai: int = 0
    ac: int = 0
    ai_head: int = 0
    ac_head: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.n_pred + other.n_pred,
            self.n_gold + other.n_gold,
            self.ai + other.ai,
            self.ac + other.ac,
            self.ai_head + other.ai_head,
            self.ac_head + other.ac_head,
        )


def _dedupe(args: Sequence[Arg]) -> list[Arg]:
    seen: set[tuple[str, str]] = set()
    out: list[Arg] = []
    for a in args:
        key = (a.role.casefold(), normalize_span(a.text))
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def _keys(args: list[Arg], field: str, with_role: bool) -> list[tuple[str, ...]]:
    """Matching keys: (span key of ``field``,) or (casefolded role, span key of ``field``)."""
    out: list[tuple[str, ...]] = []
    for a in args:
        key = normalize_span(getattr(a, field))
        out.append((a.role.casefold(), key) if with_role else (key,))
    return out


def _matched(pred: list[tuple[str, ...]], gold: list[tuple[str, ...]]) -> int:
    """Size of the one-to-one matching of equal keys (multiset intersection); an empty span key never matches."""
    common = Counter(pred) & Counter(gold)
    return sum(n for key, n in common.items() if key[-1] != "")


def score_mention(pred: Sequence[Arg], gold: Sequence[Arg]) -> Counts:
    """AI, AC, AI+ and AC+ correct counts of one mention (see the module docstring for the matching)."""
    p, g = _dedupe(pred), _dedupe(gold)
    return Counts(
        n_pred=len(p),
        n_gold=len(g),
        ai=_matched(_keys(p, "text", False), _keys(g, "text", False)),
        ac=_matched(_keys(p, "text", True), _keys(g, "text", True)),
        ai_head=_matched(_keys(p, "head", False), _keys(g, "head", False)),
        ac_head=_matched(_keys(p, "head", True), _keys(g, "head", True)),
    )


ATTACHED = ("ai", "ac", "ai_plus", "ac_plus")


def _attached_keys(args: Sequence[Arg], at: Attachment) -> dict[str, set[tuple[Any, ...]]]:
    keys: dict[str, set[tuple[Any, ...]]] = {m: set() for m in ATTACHED}
    for a in args:
        span, role = normalize_span(a.text), a.role.casefold()
        keys["ai"].add((span, at.event_type))  # the span first: an empty one never matches
        keys["ac"].add((span, at.event_type, role))
        keys["ai_plus"].add((span, at.event_type, at.trigger))
        keys["ac_plus"].add((span, at.event_type, at.trigger, role))
    return keys


def score_sentence(mentions: Sequence[tuple[Attachment, Sequence[Arg], Sequence[Arg]]]) -> Counter[str]:
    """AI, AC, AI+ and AC+ of one sentence in one run: ``mentions`` are (attachment, predicted, gold) of its event
    mentions. For each metric ``m``: ``m`` the correct keys, ``m_pred`` / ``m_gold`` the predicted / gold key
    sets' sizes (sets: a span counts once per key). A key with an empty span never matches."""
    pred: dict[str, set[tuple[Any, ...]]] = {m: set() for m in ATTACHED}
    gold: dict[str, set[tuple[Any, ...]]] = {m: set() for m in ATTACHED}
    for at, p, g in mentions:
        for m, keys in _attached_keys(p, at).items():
            pred[m] |= keys
        for m, keys in _attached_keys(g, at).items():
            gold[m] |= keys
    out: Counter[str] = Counter()
    for m in ATTACHED:
        out[m] = sum(1 for k in pred[m] & gold[m] if k[0] != "")
        out[f"{m}_pred"], out[f"{m}_gold"] = len(pred[m]), len(gold[m])
    return out


def prf(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall and F1; P = 0 without predictions, R = 0 without gold, F1 = 0 when P + R = 0."""
    p = correct / n_pred if n_pred else 0.0
    r = correct / n_gold if n_gold else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return p, r, f1
