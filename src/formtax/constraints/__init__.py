"""Constraints: specs (what users write), the compile cache, and per-request matchers."""

from formtax.constraints.compile import CompiledGrammar, EngineTokenizer, Matcher, compile_grammar
from formtax.constraints.native import as_constraint, from_pydantic
from formtax.constraints.spec import (
    ChoiceConstraint,
    Constraint,
    JsonConstraint,
    JsonReasonAnswer,
    LarkConstraint,
    RecordConstraint,
    RegexConstraint,
    TemplateConstraint,
    Validation,
    parse_spec,
    record_spec,
)
from formtax.constraints.template import Slot, Template, choice_slot, parse_template

__all__ = [
    "ChoiceConstraint", "CompiledGrammar", "Constraint", "EngineTokenizer", "JsonConstraint", "JsonReasonAnswer",
    "LarkConstraint", "Matcher", "RecordConstraint", "RegexConstraint", "Slot", "Template", "TemplateConstraint",
    "Validation", "as_constraint", "choice_slot", "compile_grammar", "from_pydantic", "parse_spec", "parse_template",
    "record_spec",
]
