"""Parser registry: every named parser sees every output, so runs report strict and lenient results side by side."""

from __future__ import annotations

from typing import Protocol

from formtax.errors import ConfigError
from formtax.parsing.lenient import parse_lenient
from formtax.parsing.result import ParseResult
from formtax.parsing.strict import parse_strict
from formtax.tasks.base import Item, OutputFormat, Task


class Parser(Protocol):
    """A parser: model output text -> ParseResult, given the task, item and requested output format."""

    def __call__(self, text: str, task: Task, item: Item, output_format: OutputFormat) -> ParseResult: ...


_PARSERS: dict[str, Parser] = {}


def register_parser(name: str, parser: Parser) -> None:
    """Register ``parser`` under ``name`` (unique)."""
    if name in _PARSERS and _PARSERS[name] is not parser:
        raise ConfigError(f"parser name {name!r} is registered twice")
    _PARSERS[name] = parser


def get_parser(name: str) -> Parser:
    """The parser registered as ``name``; ConfigError listing the known names otherwise."""
    parser = _PARSERS.get(name)
    if parser is None:
        raise ConfigError(f"unknown parser {name!r}; known parsers: {', '.join(list_parsers())}")
    return parser


def list_parsers() -> list[str]:
    """The registered parser names, in registration order (strict first)."""
    return list(_PARSERS)


def parse_all(text: str, task: Task, item: Item, output_format: OutputFormat) -> dict[str, ParseResult]:
    """Run every registered parser on one output."""
    return {name: parser(text, task, item, output_format) for name, parser in _PARSERS.items()}


register_parser("strict", parse_strict)
register_parser("lenient", parse_lenient)
