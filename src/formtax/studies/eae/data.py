"""Event argument extraction data: one :class:`Mention` per event mention, from three file layouts.

* ``per-mention`` JSON Lines (the files derived in ``../shared/data/eae/*/test.per_mention.jsonl``): one row per
  mention with the trigger sentence's ``tokens`` and ``sentence``, ``event_type``, ``trigger{start,end,text}`` and
  ``arguments[{role,text,start,end}]`` (sentence-relative token offsets, end-exclusive; ``start``/``end`` null for an
  argument outside the sentence).
* ``OneIE`` JSON Lines, the usual preprocessed form of ACE05-E (OneIE, DEGREE, TextEE) and GENEVA's own
  ``test.json``: one row per sentence with ``tokens``, optional ``sentence``, ``entity_mentions[{id,start,end,text}]``
  and ``event_mentions[{id,event_type,trigger{start,end,text},arguments[{entity_id,role,text}]}]``; an argument's
  span is its entity mention's offsets.
* Ontologies: WikiEvents' KAIROS file (``{type: {"roles": [...]}}``), GENEVA's ``{type: {"arguments": {role: ...}}}``
  and, for ACE05, :data:`ACE05_ROLES` (or a ``{type: [roles]}`` JSON file next to the data).

The passage shown to the model is the trigger's sentence *as written* (``sentence``), not the space-joined tokens:
each token is aligned to its characters by a left-to-right search (:func:`align_tokens`), so an argument's text is
the sentence's own substring (``$89 million``, not ``$ 89 million``). When a row has no ``sentence`` or a token
cannot be aligned, the passage is the space-joined tokens instead (recorded as ``passage_source``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from formtax.errors import DataError
from formtax.tasks.io import RowError, read_json, read_jsonl, require_object, require_str

MAX_SPAN_WORDS = 5
"""The longest argument the answer slot allows, in passage tokens (paper 001 section 4.2: 1 to 5 tokens)."""


@dataclass(frozen=True)
class GoldArg:
    role: str
    text: str  # the passage's surface text for in-sentence arguments, the file's text otherwise
    start: int | None  # sentence token offsets, end-exclusive; None outside the sentence
    end: int | None


@dataclass(frozen=True)
class Mention:
    id: str
    doc_id: str
    tokens: tuple[str, ...]
    passage: str
    offsets: tuple[tuple[int, int], ...]  # per token, (char start, char end) in ``passage``
    passage_source: str  # "sentence" (aligned) | "tokens" (space-joined)
    event_type: str
    trigger: tuple[int, int, str]
    roles: tuple[str, ...]
    args: tuple[GoldArg, ...]

    def span_text(self, start: int, end: int) -> str:
        """The passage's text of tokens ``start:end``."""
        return self.passage[self.offsets[start][0] : self.offsets[end - 1][1]]


def align_tokens(sentence: str, tokens: Sequence[str]) -> list[tuple[int, int]] | None:
    """Each token's (start, end) characters in ``sentence``, found left to right with only whitespace skipped
    between tokens; None when a token is not where it should be (e.g. a normalised quote)."""
    out: list[tuple[int, int]] = []
    pos = 0
    for tok in tokens:
        i = sentence.find(tok, pos)
        if i < 0 or sentence[pos:i].strip():
            return None
        out.append((i, i + len(tok)))
        pos = i + len(tok)
    return out


def passage_of(tokens: Sequence[str], sentence: str | None) -> tuple[str, tuple[tuple[int, int], ...], str]:
    """(passage, token offsets, source): the sentence when the tokens align to it, else the joined tokens."""
    if sentence is not None:
        aligned = align_tokens(sentence, tokens)
        if aligned is not None:
            return sentence, tuple(aligned), "sentence"
    offsets: list[tuple[int, int]] = []
    pos = 0
    for tok in tokens:
        offsets.append((pos, pos + len(tok)))
        pos += len(tok) + 1
    return " ".join(tokens), tuple(offsets), "tokens"


def _span(row: Mapping[str, Any], key: str, n: int) -> tuple[int, int]:
    obj = row.get(key)
    if not isinstance(obj, dict):
        raise RowError(f"field {key!r} must be an object with 'start' and 'end'")
    start, end = obj.get("start"), obj.get("end")
    if not isinstance(start, int) or not isinstance(end, int) or not 0 <= start < end <= n:
        raise RowError(f"{key} offsets {start!r}..{end!r} are not a token span of a {n}-token sentence")
    return start, end


def _tokens(row: Mapping[str, Any]) -> list[str]:
    tokens = row.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
        raise RowError("field 'tokens' must be a non-empty list of non-empty strings")
    return tokens


def _mention(mid: str, doc_id: str, tokens: list[str], sentence: str | None, event_type: str,
             trigger: tuple[int, int], args: list[tuple[str, str, int | None, int | None]],
             roles: Sequence[str]) -> Mention:
    passage, offsets, source = passage_of(tokens, sentence)

    def text_of(start: int, end: int) -> str:
        return passage[offsets[start][0] : offsets[end - 1][1]]

    gold = tuple(GoldArg(role, text_of(s, e) if s is not None and e is not None else text, s, e)
                 for role, text, s, e in args)
    return Mention(id=mid, doc_id=doc_id, tokens=tuple(tokens), passage=passage, offsets=offsets,
                   passage_source=source, event_type=event_type,
                   trigger=(trigger[0], trigger[1], text_of(*trigger)), roles=tuple(roles), args=gold)


# -- ontologies ---------------------------------------------------------------------------------------------------

def _dedup(roles: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(roles))


def _ontology(task: str, path: Path, key: str, shape: str) -> dict[str, tuple[str, ...]]:
    """event type -> role list, where each type's entry holds its roles under ``key`` (a list, or an object whose
    keys are the roles), de-duplicated in file order."""
    expected = f"a JSON object {{event_type: {{{key!r}: {shape}, ...}}}}"
    data = read_json(task, path, expected)
    if not isinstance(data, dict):
        raise DataError(f"{task}: {path}: expected {expected}")
    out: dict[str, tuple[str, ...]] = {}
    for etype, entry in data.items():
        roles = entry.get(key) if isinstance(entry, dict) else None
        if not isinstance(roles, list | dict) or not all(isinstance(r, str) for r in roles):
            raise DataError(f"{task}: {path}: type {etype!r} has no {key!r} {shape}; expected {expected}")
        out[etype] = _dedup(list(roles))
    return out


def kairos_roles(task: str, path: Path) -> dict[str, tuple[str, ...]]:
    """WikiEvents' KAIROS ontology: event type -> its ``roles`` list."""
    return _ontology(task, path, "roles", "[role, ...]")


def geneva_roles(task: str, path: Path) -> dict[str, tuple[str, ...]]:
    """GENEVA's ontology: event type -> the keys of its ``arguments`` object (in file order)."""
    return _ontology(task, path, "arguments", "{role: {...}}")


ACE05_ROLES: dict[str, tuple[str, ...]] = {
    "Business:Declare-Bankruptcy": ("Org", "Place"),
    "Business:End-Org": ("Org", "Place"),
    "Business:Merge-Org": ("Org", "Place"),
    "Business:Start-Org": ("Agent", "Org", "Place"),
    "Conflict:Attack": ("Attacker", "Target", "Instrument", "Place"),
    "Conflict:Demonstrate": ("Entity", "Place"),
    "Contact:Meet": ("Entity", "Place"),
    "Contact:Phone-Write": ("Entity", "Place"),
    "Justice:Acquit": ("Defendant", "Adjudicator", "Place"),
    "Justice:Appeal": ("Plaintiff", "Adjudicator", "Place"),
    "Justice:Arrest-Jail": ("Person", "Agent", "Place"),
    "Justice:Charge-Indict": ("Defendant", "Prosecutor", "Adjudicator", "Place"),
    "Justice:Convict": ("Defendant", "Adjudicator", "Place"),
    "Justice:Execute": ("Person", "Agent", "Place"),
    "Justice:Extradite": ("Person", "Agent", "Destination", "Origin"),
    "Justice:Fine": ("Entity", "Adjudicator", "Place"),
    "Justice:Pardon": ("Defendant", "Adjudicator", "Place"),
    "Justice:Release-Parole": ("Person", "Entity", "Place"),
    "Justice:Sentence": ("Defendant", "Adjudicator", "Place"),
    "Justice:Sue": ("Plaintiff", "Defendant", "Adjudicator", "Place"),
    "Justice:Trial-Hearing": ("Defendant", "Prosecutor", "Adjudicator", "Place"),
    "Life:Be-Born": ("Person", "Place"),
    "Life:Die": ("Victim", "Agent", "Instrument", "Place"),
    "Life:Divorce": ("Person", "Place"),
    "Life:Injure": ("Victim", "Agent", "Instrument", "Place"),
    "Life:Marry": ("Person", "Place"),
    "Movement:Transport": ("Artifact", "Agent", "Vehicle", "Origin", "Destination"),
    "Personnel:Elect": ("Person", "Entity", "Place"),
    "Personnel:End-Position": ("Person", "Entity", "Place"),
    "Personnel:Nominate": ("Person", "Agent", "Place"),
    "Personnel:Start-Position": ("Person", "Entity", "Place"),
    "Transaction:Transfer-Money": ("Giver", "Recipient", "Beneficiary", "Place"),
    "Transaction:Transfer-Ownership": ("Buyer", "Seller", "Beneficiary", "Artifact", "Place"),
}
"""ACE 2005's 33 event subtypes and their entity argument roles, from the ACE English Events Guidelines v5.4.3,
as kept by the ACE05-E preprocessing (OneIE / DEGREE): time and value roles (Time-*, Crime, Sentence, Money,
Price, Position) are dropped. Copies preprocessed by other pipelines may use a role the guidelines do not list
for a subtype: :func:`read_oneie` with ``extend_roles`` adds every role the data uses for a type."""


# -- row readers --------------------------------------------------------------------------------------------------

_PER_MENTION = ("a JSON object with 'id', 'tokens', 'sentence', 'event_type', 'trigger{start,end}' and "
                "'arguments[{role,text,start,end}]' (sentence token offsets, end-exclusive, null outside the "
                "sentence)")


def _per_mention_row(_: int, obj: Any) -> dict[str, Any]:
    row = require_object(obj)
    tokens = _tokens(row)
    out: dict[str, Any] = {"id": require_str(row, "id"), "event_type": require_str(row, "event_type"),
                           "doc_id": str(row.get("doc_id", "")), "tokens": tokens,
                           "sentence": row.get("sentence") if isinstance(row.get("sentence"), str) else None,
                           "trigger": _span(row, "trigger", len(tokens))}
    args = row.get("arguments")
    if not isinstance(args, list):
        raise RowError("field 'arguments' must be a list")
    parsed: list[tuple[str, str, int | None, int | None]] = []
    for a in args:
        a = require_object(a)
        role, text = require_str(a, "role"), require_str(a, "text")
        if a.get("start") is None and a.get("end") is None:
            parsed.append((role, text, None, None))
        else:
            s, e = _span({"arg": a}, "arg", len(tokens))
            parsed.append((role, text, s, e))
    out["arguments"] = parsed
    return out


def read_per_mention(task: str, path: Path, roles: Mapping[str, tuple[str, ...]]) -> tuple[list[Mention], list[str]]:
    """Mentions of a per-mention file, and the ids skipped because their type is not in the ontology (gen-arg's
    scorer skips them too). A used role missing from its type's list is a DataError: the role list is the
    answer template, so that argument could never be produced."""
    rows = read_jsonl(task, path, _PER_MENTION, _per_mention_row)
    mentions: list[Mention] = []
    skipped: list[str] = []
    for row in rows:
        type_roles = roles.get(row["event_type"])
        if type_roles is None:
            skipped.append(row["id"])
            continue
        for role, *_ in row["arguments"]:
            if role not in type_roles:
                raise DataError(f"{task}: {path}: mention {row['id']} uses role {role!r}, not in the ontology's "
                                f"roles of {row['event_type']} {list(type_roles)}")
        mentions.append(_mention(row["id"], row["doc_id"], row["tokens"], row["sentence"], row["event_type"],
                                 row["trigger"], row["arguments"], type_roles))
    _check_unique(task, path, mentions)
    return mentions, skipped


_ONEIE = ("a JSON object with 'tokens', 'entity_mentions[{id,start,end}]' and "
          "'event_mentions[{id,event_type,trigger{start,end},arguments[{entity_id,role}]}]' (OneIE layout)")


def _oneie_row(_: int, obj: Any) -> dict[str, Any]:
    row = require_object(obj)
    tokens = _tokens(row)
    entities: dict[str, tuple[int, int, str]] = {}
    for ent in row.get("entity_mentions") or []:
        ent = require_object(ent)
        s, e = _span({"entity": ent}, "entity", len(tokens))
        entities[require_str(ent, "id")] = (s, e, str(ent.get("text", "")))
    events = row.get("event_mentions")
    if not isinstance(events, list):
        raise RowError("field 'event_mentions' must be a list")
    parsed_events = []
    for ev in events:
        ev = require_object(ev)
        args = []
        for a in ev.get("arguments") or []:
            a = require_object(a)
            eid = require_str(a, "entity_id")
            if eid not in entities:
                raise RowError(f"argument entity_id {eid!r} of event {ev.get('id')!r} is not in entity_mentions")
            s, e, text = entities[eid]
            args.append((require_str(a, "role"), str(a.get("text", text)), s, e))
        parsed_events.append((require_str(ev, "id"), require_str(ev, "event_type"),
                              _span(ev, "trigger", len(tokens)), args))
    sentence = row.get("sentence") if isinstance(row.get("sentence"), str) else None
    doc = str(row.get("doc_id", row.get("wnd_id", "")))
    return {"tokens": tokens, "sentence": sentence, "doc_id": doc, "events": parsed_events}


def read_oneie(task: str, path: Path, roles: Mapping[str, tuple[str, ...]] | None,
               extend_roles: bool = False) -> list[Mention]:
    """Mentions of a OneIE-layout file. ``roles`` gives each type's role list; with ``extend_roles`` a type's
    list is extended by the roles the file uses for it (and a type missing from ``roles`` gets those), which is
    what ACE05 copies preprocessed by different pipelines need; otherwise an unknown type or role is an error."""
    rows = read_jsonl(task, path, _ONEIE, _oneie_row)
    table: dict[str, tuple[str, ...]] = dict(roles or {})
    if extend_roles:
        for row in rows:
            for _, etype, _, args in row["events"]:
                table[etype] = _dedup([*table.get(etype, ()), *(a[0] for a in args)])
    mentions: list[Mention] = []
    for row in rows:
        for mid, etype, trigger, args in row["events"]:
            type_roles = table.get(etype)
            if type_roles is None:
                raise DataError(f"{task}: {path}: event type {etype!r} (mention {mid}) is not in the ontology")
            unknown = [a[0] for a in args if a[0] not in type_roles]
            if unknown:
                raise DataError(f"{task}: {path}: mention {mid} uses roles {unknown} not listed for {etype}")
            mentions.append(_mention(mid, row["doc_id"], row["tokens"], row["sentence"], etype, trigger, args,
                                     type_roles))
    _check_unique(task, path, mentions)
    return mentions


def read_roles_file(task: str, path: Path) -> dict[str, tuple[str, ...]]:
    """A ``{event_type: [role, ...]}`` JSON file (an ACE05 ontology a user brings)."""
    expected = "a JSON object {event_type: [role, ...]}"
    data = read_json(task, path, expected)
    if not isinstance(data, dict) or not all(
        isinstance(v, list) and all(isinstance(r, str) for r in v) for v in data.values()
    ):
        raise DataError(f"{task}: {path}: expected {expected}")
    return {k: _dedup(v) for k, v in data.items()}


def _check_unique(task: str, path: Path, mentions: Sequence[Mention]) -> None:
    seen: set[str] = set()
    for m in mentions:
        if m.id in seen:
            raise DataError(f"{task}: {path}: duplicate mention id {m.id!r}")
        seen.add(m.id)
