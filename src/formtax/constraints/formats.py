"""The oracle's format checker: JSON Schema ``format`` asserted, not only annotated (issue 45).

Every JSON answer is checked again by ``jsonschema`` on the schema as given; with this checker a ``format`` is part
of that check. It is jsonschema's own checker of the schema's draft (its optional dependencies, installed with
``jsonschema[format-nongpl]``, check every format they know), tightened where those dependencies admit what the
format's RFC refuses (ours, each measured on the JSON-Schema-Test-Suite's ``optional/format`` tests, where the
stock checker parsed 38 invalid instances):

* ``regex``: an ECMA-262 regular expression with the ``u`` flag, compiled by ``regress`` (Python's ``re`` admits
  ``(?P<name>...)``, ``(?#...)``, global inline flags and ``\\a``, which ECMA-262 does not);
* ``hostname`` / ``idn-hostname``: every label valid under IDNA 2008 (``idna``: a bad ``xn--`` A-label, a label
  with ``--`` in its 3rd and 4th position, a contextual code point out of context); no empty last label;
* ``uri-template``: RFC 6570's grammar (level 4), written below as a regular expression: ``uri_template``
  admits spaces, ``{a..b}``, ``{v:01}`` and ``{var=def}``;
* ``uri`` / ``uri-reference`` / ``iri`` / ``iri-reference``: an IP literal's address must parse
  (``ipaddress``: no leading zeros in an embedded IPv4 address).

A format that neither this checker nor the grammar checks is *unchecked*: named in ``Result.stats
["formats_unchecked"]`` and in the server's ``X-Formtax-Formats-Unchecked`` header.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from typing import Any

import jsonschema

# RFC 6570 section 2: literals, and expressions of an optional operator and a list of varspecs
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_LITERAL = r"(?:[^\x00-\x20\"'%<>\\^`{|}\x7f]|%[0-9A-Fa-f]{2})"
_URI_TEMPLATE = re.compile(rf"(?:{_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*")
_IP_LITERAL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:)?//(?:[^@/?#\[]*@)?\[([^\]]*)\]")


def _regex(value: object) -> bool:
    if not isinstance(value, str):
        return True
    import regress

    try:
        regress.Regex(value, "u")
    except regress.RegressError:
        return False
    return True


def _labels_ok(value: str) -> bool:
    import idna

    labels = value.split(".")
    if not value or labels[-1] == "":
        return False
    for label in labels:
        try:
            if label[2:4] == "--" and label[:4].lower() != "xn--":
                return False
            if label[:4].lower() == "xn--":
                idna.decode(label)
            elif not label.isascii():
                idna.encode(label)
        except (idna.IDNAError, UnicodeError):
            return False
    return True


def _passes(base: tuple[Callable[[object], bool], Any], value: object) -> bool:
    """jsonschema's own check (``base``: its function and the exceptions that mean "invalid")."""
    fn, raises = base
    try:
        return bool(fn(value))
    except raises:
        return False


def _hostname(base: tuple[Callable[[object], bool], Any]) -> Callable[[object], bool]:
    return lambda value: not isinstance(value, str) or (_passes(base, value) and _labels_ok(value))


def _uri(base: tuple[Callable[[object], bool], Any]) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        if not isinstance(value, str):
            return True
        if not _passes(base, value):
            return False
        m = _IP_LITERAL.match(value)
        if m is None or m.group(1)[:1] in ("v", "V"):  # IPvFuture is left to the base check
            return True
        try:
            ipaddress.IPv6Address(m.group(1).split("%25", 1)[0])
        except ValueError:
            return False
        return True

    return check


def _uri_template(value: object) -> bool:
    return not isinstance(value, str) or _URI_TEMPLATE.fullmatch(value) is not None


@functools.lru_cache(maxsize=16)
def format_checker(cls: type) -> jsonschema.FormatChecker:
    """``cls``'s format checker (a jsonschema validator class: the schema's draft), tightened (module docstring)."""
    base: jsonschema.FormatChecker = cls.FORMAT_CHECKER  # type: ignore[attr-defined]
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = dict(base.checkers)

    def put(name: str, fn: Callable[[object], bool]) -> None:
        checker.checkers[name] = (fn, ())

    put("regex", _regex)
    put("uri-template", _uri_template)
    for name in ("hostname", "idn-hostname"):
        if name in base.checkers:
            put(name, _hostname(base.checkers[name]))
    for name in ("uri", "uri-reference", "iri", "iri-reference"):
        if name in base.checkers:
            put(name, _uri(base.checkers[name]))
    return checker


CHECKED_FORMATS = frozenset(format_checker(jsonschema.Draft202012Validator).checkers)
"""The formats the oracle checks (draft 2020-12's names)."""


def schema_validator(schema: dict[str, Any]) -> Any:
    """The oracle's validator for ``schema``: jsonschema's, of the schema's own draft, with :func:`format_checker`,
    so ``format`` is asserted. The grammar may approximate a format as a plain string; this still refuses a
    value that breaks it."""
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=format_checker(cls))
