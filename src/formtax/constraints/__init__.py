"""Constraints: specs (what users write), the compile cache, and per-request matchers."""

from formtax.constraints.compile import CompiledGrammar, EngineTokenizer, Matcher, compile_grammar
from formtax.constraints.spec import (
    ChoiceConstraint,
    Constraint,
    JsonConstraint,
    JsonReasonAnswer,
    LarkConstraint,
    RegexConstraint,
    TemplateConstraint,
    Validation,
    as_constraint,
    from_pydantic,
    parse_spec,
)
from formtax.constraints.template import Slot, Template, parse_template

__all__ = [
    "ChoiceConstraint", "CompiledGrammar", "Constraint", "EngineTokenizer", "JsonConstraint", "JsonReasonAnswer",
    "LarkConstraint", "Matcher", "RegexConstraint", "Slot", "Template", "TemplateConstraint", "Validation",
    "as_constraint", "compile_grammar", "from_pydantic", "parse_spec", "parse_template",
]
