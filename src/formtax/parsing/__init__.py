"""Answer extraction from model outputs: a strict parser (the exact requested format) and a lenient one."""

from formtax.parsing.lenient import parse_lenient
from formtax.parsing.registry import Parser, get_parser, list_parsers, parse_all, register_parser
from formtax.parsing.result import ParseResult, ParseStatus
from formtax.parsing.strict import parse_strict

__all__ = [
    "ParseResult",
    "ParseStatus",
    "Parser",
    "get_parser",
    "list_parsers",
    "parse_all",
    "parse_lenient",
    "parse_strict",
    "register_parser",
]
