"""Answer templates: text with typed slots, e.g. ``The answer is: {int}``.

Syntax (documented in the README):

* literal text is matched byte for byte (no leading space is added or removed);
* ``{{`` and ``}}`` stand for literal braces;
* a slot is ``{TYPE}`` or ``{TYPE:ARG}``:

  ===================  ======================================================================================
  ``{int}``            any integer (optional ``-``, no leading zeros, at most 15 digits)
  ``{int:LO..HI}``     an integer in [LO, HI]; either bound may be omitted (``{int:0..}``)
  ``{letters}``        1 to 64 ASCII letters, either case (strict parsing reads ``HENE`` as ``hene``)
  ``{letters:N}``      exactly N ASCII letters, either case
  ``{choice:a|b|c}``   one of the alternatives, spelled exactly
  ``{str}``            any non-empty single-line text (at most 64 tokens)
  ``{str:N}``          any non-empty single-line text of at most N tokens, 1 <= N <= 64
  ===================  ======================================================================================

Inside a ``{choice:...}`` argument a backslash escapes the characters that would otherwise end or split
it: ``\\|``, ``\\{``, ``\\}`` and ``\\\\`` stand for ``|``, ``{``, ``}`` and ``\\``, so an alternative can be
any text (e.g. a passage span); a backslash before any other character stays literal, as it is everywhere
outside a choice argument. :func:`choice_slot` writes the escaped slot for given alternatives, and
``Slot.source`` re-escapes, so ``parse_template(slot.source)`` gives the same slot back.

The token cap of ``{str}`` / ``{str:N}`` is enforced by the engine (a Lark ``max_tokens`` attribute) and is
the slot's token range in the FEM; the Python oracle has no tokenizer, so it checks the text only.

Each slot knows three renderings of itself: a Lark fragment for llguidance (the engine that masks tokens), a
Python regex (the independent oracle that validates outputs and extracts values from free text), and a JSON
Schema fragment (for the ``json`` strategy's typed ``answer`` field). Integers are written ``[0-9]`` rather than
``\\d`` because engines read ``\\d`` as any Unicode digit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from formtax.constraints.finalanswer import word_slot
from formtax.errors import ConstraintError

_NEEDS_JSON_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
MAX_INT_DIGITS = 15  # 10**15 - 1 is exact in a double: the engine reads JSON bounds as floats
INT_LIMIT = 10**MAX_INT_DIGITS - 1
STR_SLOT_MAX_TOKENS = 64
LETTERS_MAX = 64


@dataclass(frozen=True)
class Slot:
    """One typed hole of a template."""

    kind: str  # int | letters | choice | str
    lo: int | None = None
    hi: int | None = None
    n: int | None = None
    options: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        if self.kind == "int":
            if self.lo is None and self.hi is None:
                return "{int}"
            return "{int:%s..%s}" % ("" if self.lo is None else self.lo, "" if self.hi is None else self.hi)
        if self.kind == "letters":
            return "{letters}" if self.n is None else "{letters:%d}" % self.n
        if self.kind == "choice":
            return "{choice:%s}" % "|".join(escape_choice_option(o) for o in self.options)
        return "{str}" if self.n is None else "{str:%d}" % self.n

    # -- renderings -------------------------------------------------------------------------------------------
    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of this slot's value (used for the json strategy's ``answer`` field)."""
        if self.kind == "int":
            return {
                "type": "integer",
                "minimum": -INT_LIMIT if self.lo is None else self.lo,
                "maximum": INT_LIMIT if self.hi is None else self.hi,
            }
        if self.kind == "letters":
            n = "{%d}" % self.n if self.n is not None else "{1,%d}" % LETTERS_MAX
            return {"type": "string", "pattern": f"^[A-Za-z]{n}$"}
        if self.kind == "choice":
            return {"enum": list(self.options)}
        return {"type": "string", "minLength": 1}

    def lark_body(self) -> str:
        """The right-hand side of this slot's Lark rule."""
        if self.kind == "int":
            # no JSON whitespace around the number: two adjacent int slots used to admit "2 42" (and a budget
            # spent on spaces), which the template's own oracle rejects
            schema = {**self.json_schema(), "x-guidance": {"whitespace_flexible": False}}
            return "%json" + json.dumps(schema, separators=(",", ":"))
        if self.kind == "letters":
            n = "{%d}" % self.n if self.n is not None else "{1,%d}" % LETTERS_MAX
            return f"/[A-Za-z]{n}/"
        if self.kind == "choice":
            return "(" + " | ".join(lark_string(o) for o in self.options) + ")"
        return r"/[^\n\r]+/"

    def lark_attrs(self) -> str:
        return "[max_tokens=%d]" % self.max_tokens() if self.kind == "str" else ""

    def py_regex(self) -> str:
        """A Python regex for the slot's surface form (a superset for bounded ints; check with ``accepts``)."""
        if self.kind == "int":
            return r"-?(?:0|[1-9][0-9]{0,%d})" % (MAX_INT_DIGITS - 1)
        if self.kind == "letters":
            return "[A-Za-z]{%d}" % self.n if self.n is not None else "[A-Za-z]{1,%d}" % LETTERS_MAX
        if self.kind == "choice":
            # Longest first so that no alternative is cut at a shorter prefix.
            return "(?:" + "|".join(re.escape(o) for o in sorted(self.options, key=len, reverse=True)) + ")"
        return r"[^\n\r]+"

    def accepts(self, text: str) -> bool:
        if re.fullmatch(self.py_regex(), text) is None:
            return False
        if self.kind == "int":
            v = int(text)
            if text == "-0" and self.lo is not None and self.lo >= 0:
                # the engine writes "-0" (as 0) only where the range admits negatives, i.e. has a sign at all;
                # the oracle follows it (found by the engine/oracle agreement test: "-010" for {int:0..9}{int:10..99})
                return False
            return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)
        return True

    def convert(self, text: str) -> Any:
        return int(text) if self.kind == "int" else text

    def max_tokens(self) -> int:
        """An upper bound on the tokens this slot can take (every token carries at least one byte)."""
        if self.kind == "int":
            if self.lo is not None and self.hi is not None:  # JSON integers: no leading zeros, no "+"
                return max(len(str(self.lo)), len(str(self.hi)))
            return MAX_INT_DIGITS + 1
        if self.kind == "letters":
            return self.n if self.n is not None else LETTERS_MAX
        if self.kind == "choice":
            return max(len(o.encode()) for o in self.options)
        return self.n if self.n is not None else STR_SLOT_MAX_TOKENS


@dataclass(frozen=True)
class Template:
    """A parsed template: alternating literal strings and slots."""

    source: str
    parts: tuple[str | Slot, ...]

    @property
    def slots(self) -> tuple[Slot, ...]:
        return tuple(p for p in self.parts if isinstance(p, Slot))

    @property
    def is_single_slot(self) -> bool:
        return len(self.parts) == 1 and isinstance(self.parts[0], Slot)

    def lark(self, top: str = "start", json_string: bool = False) -> str:
        """A Lark grammar for llguidance that accepts exactly this template's language, with ``top`` as its
        rule (the others are ``{top}_slot{i}``) so that it can be embedded in a larger grammar.

        ``json_string``: the body of a JSON string, written without escapes (JSON's ``answer`` field): a free
        text slot then excludes ``"``, ``\\`` and control characters, and literal text or choices that would need
        escaping are refused (ConstraintError), so the engine's language is exactly the template's.
        """

        rules: list[str] = []
        seq: list[str] = []
        for i, part in enumerate(self.parts):
            if isinstance(part, Slot):
                name = f"{top}_slot{i}" if top != "start" else f"slot{i}"
                body = part.lark_body()
                if json_string and part.kind == "str":
                    body = r'/[^"\\\x00-\x1F\x7F\n\r]+/'
                if json_string and part.kind == "choice" and any(_NEEDS_JSON_ESCAPE.search(o) for o in part.options):
                    raise ConstraintError(f"template {self.source!r}: a choice that needs JSON escaping cannot be "
                                          "a JSON answer")
                rules.append(f"{name}{part.lark_attrs()}: {body}")
                seq.append(name)
            else:
                if json_string and _NEEDS_JSON_ESCAPE.search(part):
                    raise ConstraintError(f"template {self.source!r}: text {part!r} needs JSON escaping and cannot "
                                          "be a JSON answer")
                seq.append(lark_string(part))
        return "\n".join([f"{top}: {' '.join(seq)}", *rules]) + "\n"

    def py_regex(self, capture: bool = True) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, Slot):
                out.append(f"({part.py_regex()})" if capture else f"(?:{part.py_regex()})")
            else:
                out.append(re.escape(part))
        return "".join(out)

    def match(self, text: str) -> list[Any] | None:
        """Fullmatch ``text``; the converted slot values, or None when it does not match.

        Every way of splitting ``text`` among the slots is tried until one satisfies every slot's bounds (a
        regex's first split need not: ``{int:0..9}{int:10..99}`` reads ``242`` as 24|2 first, then 2|42). The
        fast path is the regex's own split; the search runs only when a bound rejects it.
        """
        m = re.fullmatch(self.py_regex(), text)
        if m is None:
            return None
        raws = list(m.groups())
        if all(slot.accepts(raw) for slot, raw in zip(self.slots, raws, strict=True)):
            return [slot.convert(raw) for slot, raw in zip(self.slots, raws, strict=True)]
        found = self._split(0, text, 0)
        return None if found is None else [slot.convert(raw) for slot, raw in zip(self.slots, found, strict=True)]

    def _split(self, k: int, text: str, pos: int) -> list[str] | None:
        """Slot texts for ``parts[k:]`` matching ``text[pos:]`` exactly, every slot within its bounds; longest
        slot text first (as the engine's lexemes prefer)."""
        if k == len(self.parts):
            return [] if pos == len(text) else None
        part = self.parts[k]
        if not isinstance(part, Slot):
            return self._split(k + 1, text, pos + len(part)) if text.startswith(part, pos) else None
        pattern = re.compile(part.py_regex())
        for end in range(len(text), pos, -1):
            raw = text[pos:end]
            if pattern.fullmatch(raw) and part.accepts(raw):
                rest = self._split(k + 1, text, end)
                if rest is not None:
                    return [raw, *rest]
        return None

    def search_last(self, text: str) -> tuple[str, list[Any]] | None:
        """The last occurrence of the template inside free text (used by lenient parsing of free strategies). An
        occurrence whose last character is a digit and that the text continues with more of the number (``19`` of
        ``19.99``, ``1`` of ``1,234``: :func:`continues_number`) is not one: a slot never ends inside a number
        (issue 49: the same text gives the same answer to every reader)."""
        found: tuple[str, list[Any]] | None = None
        for m in re.finditer(self.py_regex(), text):
            if continues_number(text, m.end()):
                continue
            vals = []
            for slot, raw in zip(self.slots, m.groups(), strict=True):
                if not slot.accepts(raw):
                    break
                vals.append(slot.convert(raw))
            else:
                found = (m.group(0), vals)
        return found

    def max_tokens(self) -> int:
        literal = sum(len(p.encode()) for p in self.parts if isinstance(p, str))
        return literal + sum(s.max_tokens() for s in self.slots)

    def json_string_bytes(self) -> int:
        """Bytes the template's text can take inside a JSON string, quotes excluded: literal text as JSON escapes
        it, int and letters slots as they are (nothing in them needs an escape), every other slot at worst an
        escape per byte. The json strategy reserves this (rather than twice :meth:`max_tokens`)."""
        total = 0
        for p in self.parts:
            if isinstance(p, str):
                total += len(json.dumps(p, ensure_ascii=False).encode()) - 2
            elif p.kind in ("int", "letters"):
                total += p.max_tokens()
            else:
                total += 2 * p.max_tokens()
        return total


def lark_string(s: str) -> str:
    """A Lark string literal (JSON escaping is a subset Lark accepts)."""
    return json.dumps(s, ensure_ascii=False)


# A choice argument may hold backslash escapes (so an escaped brace does not end the slot); other arguments
# may not hold braces at all. Groups 1/2: a choice and its raw argument; 3/4: any other slot and its argument.
_SLOT_RE = re.compile(r"\{(choice):((?:\\[\s\S]|[^{}\\])*)\}|\{(?!choice:)([a-z]+)(?::([^{}]*))?\}")
_CHOICE_ESCAPES = "|{}\\"


def escape_choice_option(option: str) -> str:
    """``option`` as written inside ``{choice:...}``: a backslash before each ``|``, ``{``, ``}``, ``\\``."""
    return "".join("\\" + ch if ch in _CHOICE_ESCAPES else ch for ch in option)


def split_choice_arg(arg: str) -> list[str]:
    """Split a raw choice argument on unescaped ``|``, resolving escapes (other backslashes stay literal)."""
    options: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(arg):
        ch = arg[i]
        if ch == "\\" and i + 1 < len(arg) and arg[i + 1] in _CHOICE_ESCAPES:
            current.append(arg[i + 1])
            i += 2
            continue
        if ch == "|":
            options.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    options.append("".join(current))
    return options


def choice_slot(options: Sequence[str]) -> str:
    """The slot text ``{choice:...}`` for arbitrary alternatives, escaped so that it parses back to exactly
    them (tasks build choices from passage spans, which may hold ``|``, braces or backslashes)."""
    if isinstance(options, str):
        raise ConstraintError(f"choice_slot: pass a sequence of alternatives, not the string {options!r}")
    return _choice(tuple(options), "choice_slot").source


def _parse_int_range(arg: str, source: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"\s*(-?[0-9]+)?\s*\.\.\s*(-?[0-9]+)?\s*", arg)
    if m is None:
        raise ConstraintError(f"template {source!r}: bad integer range {arg!r}; write {{int:LO..HI}}, e.g. {{int:0..999}}")
    lo = int(m.group(1)) if m.group(1) is not None else None
    hi = int(m.group(2)) if m.group(2) is not None else None
    for v in (lo, hi):
        if v is not None and abs(v) > INT_LIMIT:
            raise ConstraintError(f"template {source!r}: bound {v} has more than {MAX_INT_DIGITS} digits")
    if lo is not None and hi is not None and lo > hi:
        raise ConstraintError(f"template {source!r}: empty integer range {lo}..{hi}")
    return lo, hi


def _make_slot(kind: str, arg: str | None, source: str) -> Slot:
    if kind == "int":
        if arg is None:
            return Slot("int")
        lo, hi = _parse_int_range(arg, source)
        return Slot("int", lo=lo, hi=hi)
    if kind == "letters":
        if arg is None:
            return Slot("letters")
        if not arg.strip().isdigit() or not 1 <= int(arg) <= LETTERS_MAX:
            raise ConstraintError(f"template {source!r}: {{letters:N}} needs 1 <= N <= {LETTERS_MAX}, got {arg!r}")
        return Slot("letters", n=int(arg))
    if kind == "choice":
        return _choice(tuple(split_choice_arg(arg)) if arg else (), f"template {source!r}")
    if kind == "str":
        if arg is None:
            return Slot("str")
        if re.fullmatch(r"\s*[0-9]+\s*", arg) is None or not 1 <= int(arg) <= STR_SLOT_MAX_TOKENS:
            raise ConstraintError(
                f"template {source!r}: {{str:N}} needs 1 <= N <= {STR_SLOT_MAX_TOKENS} tokens, got {arg!r}"
            )
        return Slot("str", n=int(arg))
    raise ConstraintError(
        f"template {source!r}: unknown slot type {{{kind}}}; known: {{int}}, {{int:LO..HI}}, {{letters}}, "
        "{letters:N}, {choice:a|b}, {str}, {str:N}"
    )


def _choice(options: tuple[str, ...], where: str) -> Slot:
    """A choice slot, checked: ``where`` names what is being parsed in the error message."""
    if not options or any(o == "" for o in options):
        raise ConstraintError(f"{where}: {{choice:...}} needs non-empty alternatives a|b|c")
    dup = sorted({o for o in options if options.count(o) > 1})
    if dup:
        raise ConstraintError(f"{where}: duplicate alternatives {dup} in a choice")
    return Slot("choice", options=options)


def parse_template(source: str) -> Template:
    """Parse template text into literals and slots; a clear ConstraintError on any bad slot."""
    parts: list[str | Slot] = []
    literal: list[str] = []
    i = 0
    while i < len(source):
        ch = source[i]
        if source.startswith("{{", i) or source.startswith("}}", i):
            literal.append(ch)
            i += 2
            continue
        if ch == "{":
            m = _SLOT_RE.match(source, i)
            if m is None:
                end = source.find("}", i)
                bad = source[i : end + 1] if end >= 0 else source[i:]
                hint = "write {{ for a literal brace"
                if source.startswith("{choice:", i):
                    hint = "inside {choice:...} write \\| \\{ \\} \\\\ for a literal | { } \\"
                elif re.match(r'\s*[{\[]\s*"', source):  # a JSON Schema where a template was expected
                    hint = f"a JSON Schema is written json:{source.strip()} (or passed as a dict)"
                raise ConstraintError(f"template {source!r}: malformed slot {bad!r} ({hint})")
            if literal:
                parts.append("".join(literal))
                literal = []
            if m.group(1) is not None:
                parts.append(_make_slot(m.group(1), m.group(2), source))
            else:
                parts.append(_make_slot(m.group(3), m.group(4), source))
            i = m.end()
            continue
        if ch == "}":
            raise ConstraintError(f"template {source!r}: unmatched '}}' at {i} (write }}}} for a literal brace)")
        literal.append(ch)
        i += 1
    if literal:
        parts.append("".join(literal))
    if not parts:
        raise ConstraintError("empty template")
    if not any(isinstance(p, Slot) for p in parts):
        raise ConstraintError(f"template {source!r} has no slot; use regex:... or choice:... for fixed text")
    return Template(source=source, parts=tuple(parts))


DIGIT_CONTINUATION = re.compile(r"[.,]?[0-9]")


def key_phrase_of(template: Template) -> str | None:
    """The key phrase of a template that is a phrase then one word-like slot (``The final answer is {int}``), whose
    answers the shared final-answer rule reads (:mod:`formtax.constraints.finalanswer`); None for any other."""
    parts = template.parts
    if len(parts) != 2 or not isinstance(parts[0], str) or not isinstance(parts[1], Slot) or not parts[0].strip():
        return None
    return parts[0] if word_slot(parts[1].kind, parts[1].options) else None


def continues_number(text: str, end: int) -> bool:
    """Whether the match ending at ``end`` stops inside a number: its last character is a digit and the text goes
    on with a digit, or with ``.`` / ``,`` and a digit (a decimal part, a thousands group)."""
    return end > 0 and text[end - 1].isdigit() and DIGIT_CONTINUATION.match(text, end) is not None
