"""Generative event argument extraction (paper 001 section 4.2) on WikiEvents, GENEVA and ACE05.

Given a passage (the trigger's sentence), a trigger and its event type's roles, the model writes one templated
phrase per role, ``The <role> is <argument>``, in the ontology's role order, one per line; ``<argument>`` is a span
copied from the passage or ``none``. The JSON output format is ``{"reason": ..., "answer": {<Role>: <argument> or
null, ...}}`` (roles as keys, the paper's "JSON blob", inside the ``json`` strategy's reason + answer object).

Constraint levels (``answer_spec``):

* FC: any single-line text of 1-5 tokens in each role's slot (``{str:5}``; the paper's 1-5 token argument slot, in
  the model's tokens), ``none`` included;
* VC: each slot is a choice over the passage's token n-grams of 1-5 tokens (their surface text; bare punctuation
  left out) plus ``none``.
  In the JSON form a VC value is one of those spans or ``null``; spans holding a double quote or a backslash are
  left out there (constrained JSON strings carry no escapes, see ``formtax.constraints.spec``).

Gold arguments longer than five tokens (none in WikiEvents, 821 of 3,109 in GENEVA) can never be produced under
either constraint; they stay in the gold, so recall is honest (the ceiling is reported by ``eae_recall_ceiling``).
A role with several gold fillers gets one slot, as in the paper's template.

Reading an output (:meth:`EaeTask.parse_output`, both parsers' values are :func:`formtax.studies.eae.scoring.encode_prediction`
JSON, so the report computes AI / AC / AI+ / AC+ from the records alone):

* ``strict``: the last ``len(roles)`` non-empty lines are exactly the role lines in order (answer-only: the whole
  output is those lines), one optional trailing period stripped; JSON: the whole output is one object with keys
  ``reason`` and ``answer``, ``answer`` holding exactly the roles as keys with string or null values.
* ``lenient``: per role, the last ``the <role> is <argument>`` anywhere in the text (case-insensitive, the raw role
  name accepted too, the argument cut at the line or sentence end), or the last JSON object with role keys.
  ``ok`` when at least one role was found; a role not found counts as no argument.

Splits (ours; the datasets ship only their test split): the documents holding about :data:`DEV_SHARE` of the
mentions, taken in the order of their doc ids' sha256, form a held-out dev split; the evaluated items are the
mentions of the other documents, and the shot pool (few-shot examples, and the prompts the FEM of decog / ctrlg is
distilled from) is the dev split, so an HMM never learns from the passages it is evaluated on (as GSM8K distils
from its train split). Whole documents are held out, so no passage is shared across the split.

Heads for AI+ / AC+ come from :func:`formtax.studies.eae.scoring.get_head_finder` (spaCy when an English pipeline is
installed, else the documented rule); gold and predictions record the method.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from formtax.constraints.parse import record_spec
from formtax.constraints.template import choice_slot
from formtax.errors import DataError
from formtax.parsing.result import NO_ANSWER, ParseResult
from formtax.studies.eae.data import (
    ACE05_ROLES,
    MAX_SPAN_WORDS,
    Mention,
    geneva_roles,
    kairos_roles,
    read_oneie,
    read_per_mention,
    read_roles_file,
)
from formtax.studies.eae.scoring import (
    Attachment,
    decode_gold,
    decode_prediction,
    encode_gold,
    encode_prediction,
    get_head_finder,
    normalize_span,
    sentence_key,
)
from formtax.tasks.base import AnswerKind, ConstraintLevel, Item, OutputFormat, Task
from formtax.tasks.registry import register_task

FC_SLOT = "{str:%d}" % MAX_SPAN_WORDS
NONE = "none"
ACE05_ENV = "FORMTAX_ACE05"

_ARG = ("<argument> is a phrase of at most five words copied exactly from the passage, or none if the passage does "
        "not mention that role")
_JSON_ARG = ("each <argument> is a phrase of at most five words copied exactly from the passage, in double quotes, "
             "or null if the passage does not mention that role")

_FORMATS: dict[OutputFormat, tuple[str, str, str]] = {
    OutputFormat.REASON_ANSWER: (
        "Think it through briefly, then end your response with exactly these lines, one per role, in this order:"
        "\n{lines}\nHere " + _ARG + ". Write nothing after these lines.",
        "First explain your reasoning. Finish with one line per role, in the order below:\n{lines}\nwhere " + _ARG
        + ".",
        "Reason about the event step by step. Your last lines must be the following, with each <argument> filled "
        "in:\n{lines}\n" + _ARG[0].upper() + _ARG[1:] + ".",
    ),
    OutputFormat.ANSWER_ONLY: (
        "Respond with exactly these lines, one per role, in this order, and nothing else:\n{lines}\nHere " + _ARG
        + ".",
        "Give only the answer lines below, filled in, with no explanation:\n{lines}\nwhere " + _ARG + ".",
        "Output nothing but these lines, in this order:\n{lines}\n" + _ARG[0].upper() + _ARG[1:] + ".",
    ),
    OutputFormat.JSON: (
        "Respond with one JSON object and nothing else, on a single line, in the form {json}, where the reason "
        "field holds your reasoning and " + _JSON_ARG + ".",
        "Your whole response must be a single JSON object of the form {json}. Put your reasoning in \"reason\"; "
        + _JSON_ARG + ".",
        "Reply in JSON only: exactly one object {json}. First reason inside the reason field; then "
        + _JSON_ARG + ".",
    ),
}


def role_phrase(role: str) -> str:
    """A role name as the template writes it: ``Created_entity`` -> ``created entity``, ``MedicalIssue`` ->
    ``medical issue``."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", role.replace("_", " ").replace("-", " "))
    return " ".join(s.split()).lower()


def role_phrases(roles: Sequence[str]) -> tuple[str, ...]:
    """Template phrases for a type's roles; the raw names when two roles would read the same."""
    phrases = tuple(role_phrase(r) for r in roles)
    if len(set(phrases)) != len(phrases) or any(not p for p in phrases):
        return tuple(roles)
    return phrases


def passage_spans(m: Mention, max_words: int = MAX_SPAN_WORDS) -> list[str]:
    """The surface text of every token n-gram of 1..``max_words`` tokens, first occurrence order, unique; spans
    without a letter or digit (",", "--") are left out: no argument is bare punctuation."""
    out: dict[str, None] = {}
    for start in range(len(m.tokens)):
        for end in range(start + 1, min(start + max_words, len(m.tokens)) + 1):
            text = m.span_text(start, end)
            if "\n" not in text and "\r" not in text and any(ch.isalnum() for ch in text):
                out.setdefault(text)
    return list(out)


DEV_SHARE = 0.2  # the share of mentions whose documents form the held-out dev split (ours)


def _unit(m: Mention) -> str:
    """What the split holds out whole: the mention's document (its own id where the file names no document)."""
    return m.doc_id or m.id


def dev_documents(mentions: Sequence[Mention], share: float = DEV_SHARE) -> frozenset[str]:
    """The documents of the dev split: in the order of their ids' sha256 (stable across runs and machines), as
    many as it takes to hold ``share`` of the mentions (at least one document, and never all of them when there
    are two or more)."""
    sizes: dict[str, int] = {}
    for m in mentions:
        sizes[_unit(m)] = sizes.get(_unit(m), 0) + 1
    order = sorted(sizes, key=lambda d: hashlib.sha256(d.encode("utf-8")).hexdigest())
    held: list[str] = []
    total = 0
    for d in order[: max(1, len(order) - 1)]:
        if held and total >= share * len(mentions):
            break
        held.append(d)
        total += sizes[d]
    return frozenset(held)


def _lit(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class EaeTask(Task):
    """An EAE benchmark: one item per event mention (see the module docstring)."""

    answer_kind: ClassVar[AnswerKind] = AnswerKind.SPANS
    instructions: ClassVar[tuple[str, str, str]] = (
        "Extract the arguments of an event from a passage. The event is signalled by the trigger word shown; for "
        "each role of its event type, find the words of the passage that fill that role.",
        "Read the passage and identify who or what takes part in the event marked by the trigger, role by role.",
        "For the event that the trigger word refers to, copy from the passage the phrase that plays each listed "
        "role.",
    )

    # -- data -------------------------------------------------------------------------------------------------
    def _mentions(self, data_dir: Path) -> list[Mention]:
        raise NotImplementedError

    def _load(self, data_dir: Path | None) -> list[Item]:
        return self._split(data_dir, dev=False)

    def _shot_pool(self, data_dir: Path | None) -> list[Item]:
        return self._split(data_dir, dev=True)

    def _split(self, data_dir: Path | None, dev: bool) -> list[Item]:
        heads = get_head_finder()
        mentions = self._mentions(self._require_dir(data_dir))
        held = dev_documents(mentions)
        return [self._item(m, heads) for m in mentions if (_unit(m) in held) == dev]

    def _item(self, m: Mention, heads: Any) -> Item:
        phrases = role_phrases(m.roles)
        question = (f"Passage: {m.passage}\nTrigger: \"{m.trigger[2]}\" (event type: {m.event_type})\n"
                    f"Roles: {'; '.join(phrases)}")
        return Item(
            id=m.id, question=question,
            gold=encode_gold([(a.role, a.text) for a in m.args], heads,
                             Attachment(sentence_key(m.doc_id, m.passage), m.event_type, (m.trigger[0], m.trigger[1]))),
            meta={"mention": m, "roles": m.roles, "phrases": phrases, "event_type": m.event_type,
                  "passage_source": m.passage_source},
        )

    def notes(self) -> dict[str, Any]:
        return {"split": f"evaluated: the mentions outside the dev documents (about {DEV_SHARE:.0%} of the mentions, "
                         "held out for few-shot examples and FEM distillation)"}

    @staticmethod
    def mention(item: Item) -> Mention:
        m = item.meta.get("mention")
        if not isinstance(m, Mention):
            raise DataError(f"item {item.id} carries no EAE mention (was it loaded by an eae task?)")
        return m

    # -- answer space -----------------------------------------------------------------------------------------
    def answer_spec(self, level: ConstraintLevel, item: Item, output_format: OutputFormat) -> str:
        m = self.mention(item)
        if OutputFormat(output_format) is OutputFormat.JSON:
            if level == "fc":
                return record_spec([(r, FC_SLOT) for r in m.roles])
            spans = [s for s in passage_spans(m) if '"' not in s and "\\" not in s and s.isprintable()]
            slot = choice_slot(spans) if spans else FC_SLOT
            return record_spec([(r, slot) for r in m.roles])
        slot = FC_SLOT if level == "fc" else self._vc_slot(item)
        return "\n".join(f"The {_lit(p)} is {slot}" for p in item.meta["phrases"])

    def _vc_slot(self, item: Item) -> str:
        spans = passage_spans(self.mention(item))
        return choice_slot([NONE, *(s for s in spans if s != NONE)])

    def answer_description(self, item: Item) -> str:
        return "for each role, a phrase of at most five words copied from the passage, or none"

    def normalize(self, value: str) -> str | None:
        return value.strip() or None

    def score(self, item: Item, value: str | None) -> bool:
        """Whether the mention is extracted exactly: the predicted (role, span) set equals the gold set (the
        report's AI / AC / AI+ / AC+ F1 are the study's metrics; this is the per-record accuracy)."""
        if value is None:
            return False
        pred, _ = decode_prediction(value)
        gold, _ = decode_gold(item.gold)
        key = {(a.role.casefold(), normalize_span(a.text)) for a in pred}
        return key == {(a.role.casefold(), normalize_span(a.text)) for a in gold}

    # -- prompts ----------------------------------------------------------------------------------------------
    def _format(self, item: Item, output_format: OutputFormat, variant: int) -> str:
        fmt = _FORMATS[OutputFormat(output_format)][variant - 1]
        lines = "\n".join(f"The {p} is <argument>" for p in item.meta["phrases"])
        obj = "{" + ", ".join(f'"{r}": <argument>' for r in item.meta["roles"]) + "}"
        return fmt.replace("{lines}", lines).replace("{json}", '{"reason": "<reasoning>", "answer": ' + obj + "}")

    def messages(self, item: Item, output_format: OutputFormat, task_variant: int, format_variant: int,
                 shots: Sequence[Item]) -> list[dict[str, str]]:
        parts = [self.instructions[task_variant - 1], self._format(item, output_format, format_variant)]
        if shots:
            examples = "\n\n".join(f"{s.question}\n{self.render_gold(s, output_format)}" for s in shots)
            parts.append(f"Examples:\n\n{examples}")
        parts.append(item.question)
        return [{"role": "user", "content": "\n\n".join(parts)}]

    def conversion_messages(self, item: Item, reasoning_text: str, format_variant: int,
                            output_format: OutputFormat = OutputFormat.ANSWER_ONLY) -> list[dict[str, str]]:
        """NL-to-Format's second call: the question, the first call's reasoning, the answer-only instruction (this
        task has no JSON answer form: ``has_json_answer_form`` is False, so ``output_format`` is the line's)."""
        content = "\n\n".join([
            "Below are a task, a response to it, and the answer format. Rewrite the response's final answer in "
            "that format.",
            item.question, f"Response:\n{reasoning_text.strip()}",
            self._format(item, OutputFormat.ANSWER_ONLY, format_variant),
        ])
        return [{"role": "user", "content": content}]

    def task_only_messages(self, item: Item) -> list[dict[str, str]]:
        """The prompt without a format instruction (instruction-aware FEM distillation)."""
        return [{"role": "user", "content": f"{self.instructions[0]}\n\n{item.question}"}]

    def render_gold(self, item: Item, output_format: OutputFormat) -> str:
        """The gold answer in an output format (few-shot examples): the first gold filler of each role."""
        gold, _ = decode_gold(item.gold)
        first: dict[str, str] = {}
        for a in gold:
            first.setdefault(a.role, a.text)
        roles, phrases = item.meta["roles"], item.meta["phrases"]
        if OutputFormat(output_format) is OutputFormat.JSON:
            return json.dumps({"reason": "", "answer": {r: first.get(r) for r in roles}}, ensure_ascii=False)
        return "\n".join(f"The {p} is {first.get(r, NONE)}" for r, p in zip(roles, phrases, strict=True))

    # -- reading outputs --------------------------------------------------------------------------------------
    def parse_output(self, text: str, item: Item, output_format: OutputFormat) -> dict[str, ParseResult]:
        fmt = OutputFormat(output_format)
        strict = _strict_json(text, item) if fmt is OutputFormat.JSON else _strict_lines(text, item, fmt)
        lenient = strict if strict is not None else _lenient(text, item)
        return {"strict": self._result(item, strict), "lenient": self._result(item, lenient)}

    def _result(self, item: Item, values: dict[str, str | None] | None) -> ParseResult:
        if values is None:
            return NO_ANSWER
        keys = _passage_keys(self.mention(item))
        in_passage = {r: normalize_span(v) in keys for r, v in values.items() if v is not None}
        value = encode_prediction(values, get_head_finder(), in_passage)
        return ParseResult("ok", value, json.dumps(values, ensure_ascii=False))


@lru_cache(maxsize=4096)
def _passage_keys(m: Mention) -> frozenset[str]:
    """The match keys of every token span of the passage (any length): is a predicted argument in the text?"""
    n = len(m.tokens)
    return frozenset(normalize_span(m.span_text(s, e)) for s in range(n) for e in range(s + 1, n + 1))


def _arg_value(raw: str) -> str | None:
    v = raw.strip()
    return None if v.casefold() in ("", NONE, "null", "n/a") else v


def _strict_lines(text: str, item: Item, fmt: OutputFormat) -> dict[str, str | None] | None:
    roles, phrases = item.meta["roles"], item.meta["phrases"]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if fmt is OutputFormat.ANSWER_ONLY and len(lines) != len(roles):
        return None
    if len(lines) < len(roles):
        return None
    out: dict[str, str | None] = {}
    for line, role, phrase in zip(lines[len(lines) - len(roles):], roles, phrases, strict=True):
        head = f"The {phrase} is "
        if not line.startswith(head):
            return None
        arg = line[len(head):]
        if arg.endswith(".") and not arg.endswith("..") and arg[:-1].strip():
            arg = arg[:-1]
        if not arg.strip():
            return None
        out[role] = _arg_value(arg)
    return out


def _strict_json(text: str, item: Item) -> dict[str, str | None] | None:
    try:
        obj = json.loads(text.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or set(obj) != {"reason", "answer"} or not isinstance(obj["reason"], str):
        return None
    return _role_object(obj["answer"], item, exact=True)


def _role_object(ans: Any, item: Item, exact: bool) -> dict[str, str | None] | None:
    roles = item.meta["roles"]
    if not isinstance(ans, dict):
        return None
    if exact and set(ans) != set(roles):
        return None
    by_fold = {str(k).casefold(): v for k, v in ans.items()}
    out: dict[str, str | None] = {}
    for r in roles:
        v = ans.get(r, by_fold.get(r.casefold()))
        if v is not None and not isinstance(v, str):
            if exact:
                return None
            continue
        if r in ans or r.casefold() in by_fold:
            out[r] = _arg_value(v) if isinstance(v, str) else None
    return out if out else None


def _lenient(text: str, item: Item) -> dict[str, str | None] | None:
    roles, phrases = item.meta["roles"], item.meta["phrases"]
    found: dict[str, str | None] = {}
    for role, phrase in zip(roles, phrases, strict=True):
        names = "|".join(re.escape(n).replace(r"\ ", r"[\s_-]+") for n in dict.fromkeys((phrase, role)))
        pattern = rf"(?i)\bthe\s+(?:{names})\s+(?:is|are|was|were)\s*:?\s*([^\n]+?)\s*(?:[.;](?=\s|$)|\n|$)"
        last = None
        for m in re.finditer(pattern, text):
            last = m.group(1)
        if last is not None:
            found[role] = _arg_value(last.strip().strip('"*'))
    if found:
        return found
    dec = json.JSONDecoder()
    best: dict[str, str | None] | None = None
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        inner = obj.get("answer", obj) if isinstance(obj, dict) else None
        got = _role_object(inner, item, exact=False)
        if got:
            best = got
    return best


def eae_recall_ceiling(items: Sequence[Item]) -> float:
    """The share of gold arguments a 1-5 token span slot can produce at all (in the sentence, <= 5 tokens)."""
    total = reachable = 0
    for it in items:
        for a in EaeTask.mention(it).args:
            total += 1
            reachable += a.start is not None and a.end is not None and a.end - a.start <= MAX_SPAN_WORDS
    return reachable / total if total else float("nan")


@register_task
class EaeWikiEvents(EaeTask):
    name: ClassVar[str] = "eae-wikievents"
    description: ClassVar[str] = (
        "WikiEvents test (KAIROS ontology): event argument extraction, one item per event mention (364; the one "
        "mention whose type is not in the ontology is skipped; 290 evaluated, the documents of 74 held out as the "
        "dev split for shots and FEM distillation), 'The <role> is <argument>' per role"
    )
    folder: ClassVar[str] = "eae/wikievents"

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / self.folder / "test.per_mention.jsonl", data_dir / self.folder / "event_role_KAIROS.json"]

    def _mentions(self, data_dir: Path) -> list[Mention]:
        mentions_file, ontology = self.data_files(data_dir)
        mentions, _ = read_per_mention(self.name, mentions_file, kairos_roles(self.name, ontology))
        return mentions


@register_task
class EaeGeneva(EaeTask):
    name: ClassVar[str] = "eae-geneva"
    description: ClassVar[str] = (
        "GENEVA test (FrameNet-derived, CC BY 3.0): event argument extraction, one item per event mention (1893; 1452 "
        "evaluated, the documents of 441 held out as the dev split), "
        "'The <role> is <argument>' per role"
    )
    folder: ClassVar[str] = "eae/geneva"

    def data_files(self, data_dir: Path) -> list[Path]:
        return [data_dir / self.folder / "test.per_mention.jsonl", data_dir / self.folder / "event_ontology.json"]

    def _mentions(self, data_dir: Path) -> list[Mention]:
        mentions_file, ontology = self.data_files(data_dir)
        mentions, skipped = read_per_mention(self.name, mentions_file, geneva_roles(self.name, ontology))
        if skipped:
            raise DataError(f"{self.name}: {mentions_file}: mentions with types missing from the ontology: "
                            f"{skipped[:5]}")
        return mentions


@register_task
class EaeAce05(EaeTask):
    """ACE05-E in the OneIE layout, for users who hold the LDC licence (nothing is shipped).

    The file is ``$FORMTAX_ACE05`` when set, else ``<data>/ace05/test.oneie.json``; the role lists are
    ``roles.json`` next to it when present (``{type: [roles]}``), else :data:`ACE05_ROLES`, extended by any role
    the file uses for a type (preprocessing pipelines differ slightly).
    """

    name: ClassVar[str] = "eae-ace05"
    description: ClassVar[str] = (
        "ACE05-E (LDC licence; bring your own OneIE-layout file via $FORMTAX_ACE05 or <data>/ace05/test.oneie.json): "
        "event argument extraction, one item per event mention"
    )

    def data_files(self, data_dir: Path) -> list[Path]:
        env = os.environ.get(ACE05_ENV)
        path = Path(env) if env else data_dir / "ace05" / "test.oneie.json"
        roles = path.parent / "roles.json"
        return [path, roles] if roles.is_file() else [path]

    def _mentions(self, data_dir: Path) -> list[Mention]:
        files = self.data_files(data_dir)
        if not files[0].is_file():
            raise DataError(f"{self.name}: {files[0]}: file not found; ACE05 is LDC-licensed and not shipped: point "
                            f"${ACE05_ENV} at your OneIE-layout test file (JSON Lines: tokens, entity_mentions, "
                            "event_mentions)")
        roles = read_roles_file(self.name, files[1]) if len(files) > 1 else ACE05_ROLES
        return read_oneie(self.name, files[0], roles, extend_roles=True)
