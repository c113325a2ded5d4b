"""Constraints: specs (what users write), the compile cache, and per-request matchers.

Names are imported lazily (PEP 562) so that a light submodule (``template``, ``spec``) does not load torch and
llguidance's torch bindings through this package: ``formtax ls`` and ``--help`` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from formtax._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "CompiledGrammar": "formtax.constraints.compile",
    "EngineTokenizer": "formtax.constraints.compile",
    "Matcher": "formtax.constraints.compile",
    "compile_grammar": "formtax.constraints.compile",
    "as_constraint": "formtax.constraints.native",
    "from_pydantic": "formtax.constraints.native",
    "ChoiceConstraint": "formtax.constraints.spec",
    "Constraint": "formtax.constraints.spec",
    "JsonConstraint": "formtax.constraints.spec",
    "JsonLayout": "formtax.constraints.jsonreason",
    "JsonReasonAnswer": "formtax.constraints.jsonreason",
    "LarkConstraint": "formtax.constraints.spec",
    "RecordConstraint": "formtax.constraints.record",
    "RegexConstraint": "formtax.constraints.spec",
    "TemplateConstraint": "formtax.constraints.spec",
    "Validation": "formtax.constraints.spec",
    "parse_spec": "formtax.constraints.parse",
    "record_spec": "formtax.constraints.parse",
    "Slot": "formtax.constraints.template",
    "Template": "formtax.constraints.template",
    "choice_slot": "formtax.constraints.template",
    "parse_template": "formtax.constraints.template",
}

if TYPE_CHECKING:
    from formtax.constraints.compile import CompiledGrammar, EngineTokenizer, Matcher, compile_grammar
    from formtax.constraints.jsonreason import JsonLayout, JsonReasonAnswer
    from formtax.constraints.native import as_constraint, from_pydantic
    from formtax.constraints.parse import parse_spec, record_spec
    from formtax.constraints.record import RecordConstraint
    from formtax.constraints.spec import (
        ChoiceConstraint,
        Constraint,
        JsonConstraint,
        LarkConstraint,
        RegexConstraint,
        TemplateConstraint,
        Validation,
    )
    from formtax.constraints.template import Slot, Template, choice_slot, parse_template


__getattr__ = lazy_getattr("formtax.constraints", _LAZY, globals())


__all__ = [
    "ChoiceConstraint",
    "CompiledGrammar",
    "Constraint",
    "EngineTokenizer",
    "JsonConstraint",
    "JsonLayout",
    "JsonReasonAnswer",
    "LarkConstraint",
    "Matcher",
    "RecordConstraint",
    "RegexConstraint",
    "Slot",
    "Template",
    "TemplateConstraint",
    "Validation",
    "as_constraint",
    "choice_slot",
    "compile_grammar",
    "from_pydantic",
    "parse_spec",
    "parse_template",
    "record_spec",
]
