"""vLLM's request fields in ``formtax serve``: a client written for ``vllm serve`` runs unchanged.

Mapped to formtax's equivalents:

* ``guided_json`` (a schema, or its JSON text), ``guided_regex``, ``guided_choice``, ``guided_grammar`` and
  ``structured_outputs`` (``{"json"|"regex"|"choice"|"grammar"|"json_object": ...}``, vLLM's newer form) are the
  answer constraint: a JSON Schema, a regex (matched whole, as vLLM matches it), a choice, a Lark grammar (the
  syntax llguidance reads, as vLLM's ``guidance`` backend does) or any JSON object. The strategy is
  ``constrained`` unless ``formtax.strategy`` names another. ``guided_decoding_backend`` is accepted: formtax's
  engine is llguidance whatever it names.
* ``top_k`` (``-1`` or ``0``: off) and ``min_p`` are sampling filters; ``repetition_penalty`` divides the positive
  scores and multiplies the negative ones of every token in the prompt and the output (vLLM's and transformers'
  rule); ``min_tokens`` keeps EOS away until that many tokens are out (free text only: a constrained answer ends
  where its grammar ends). These act in the row, so they need a single-pass strategy.
* ``chat_template_kwargs`` go to the chat template (e.g. ``enable_thinking``); a template that reads none of them
  renders what it renders without them.

vLLM fields with no formtax equivalent are refused with what to use instead (:data:`NO_EQUIVALENT`).
"""

from __future__ import annotations

import json
from typing import Any

from formtax.constraints.native import as_constraint
from formtax.constraints.spec import (
    ChoiceConstraint,
    Constraint,
    JsonConstraint,
    LarkConstraint,
    RegexConstraint,
)
from formtax.errors import ConfigError

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")

NO_EQUIVALENT = {
    "use_beam_search": "formtax's searches are strategies: formtax.strategy suffix-min or suffix-last (paper 000's "
                       "beam over the answer)",
    "length_penalty": "formtax's searches are strategies: formtax.strategy suffix-min or suffix-last",
    "ignore_eos": "use min_tokens to keep the model writing",
    "stop_token_ids": "use stop (strings)",
    "bad_words": "use logit_bias with -100 for each token",
    "include_stop_str_in_output": "the stop string is left out, as OpenAI leaves it out",
    "skip_special_tokens": "content is always the text without special tokens; formtax.token_ids has every token",
    "spaces_between_special_tokens": "content is always the text without special tokens",
    "prompt_logprobs": "use logprobs (the output's)",
    "truncate_prompt_tokens": "shorten the prompt; formtax refuses a prompt over the context with its length",
    "add_generation_prompt": "use /v1/completions with the prompt written out",
    "continue_final_message": "use /v1/completions with the prompt written out",
    "chat_template": "use the model's own template, or /v1/completions with the prompt written out",
    "guided_whitespace_pattern": "formtax writes JSON with one spacing (its whitespace is not configurable)",
    "return_tokens_as_token_ids": "formtax.token_ids in the response has every token id",
    "vllm_xargs": "use the formtax field (strategy, answer, reasoning, triggers, closing)",
}
"""vLLM fields formtax has no equivalent for, and what to send instead."""


def no_equivalent(field: str) -> str | None:
    """The one-line refusal of a vLLM field without an equivalent; None for any other field."""
    hint = NO_EQUIVALENT.get(field)
    return None if hint is None else f"{field}: vLLM's field has no equivalent in formtax serve; {hint}"


def guided_constraint(fields: dict[str, Any]) -> tuple[str, Constraint] | None:
    """The answer constraint of a request's guided fields: (the field that gave it, the constraint); None when
    it has none. Two at once are refused."""
    given = {k: v for k, v in fields.items() if k in GUIDED and v is not None}
    structured = fields.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict):
            raise ConfigError("structured_outputs must be an object, e.g. {\"json\": <schema>}")
        if structured.get("structural_tag") is not None:
            raise ConfigError("structured_outputs.structural_tag: not supported; use tools for calls")
        for k, v in structured.items():
            if k in STRUCTURED_KEYS and v not in (None, False):
                given[f"structured_outputs.{k}"] = v
    if not given:
        return None
    if len(given) > 1:
        raise ConfigError(f"give one guided format, not {' and '.join(sorted(given))}")
    ((name, value),) = given.items()
    kind = name.removeprefix("guided_").removeprefix("structured_outputs.")
    if kind == "json":
        try:
            schema = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError as e:
            raise ConfigError(f"{name}: not valid JSON ({e.msg} at character {e.pos})") from None
        if not isinstance(schema, dict):
            raise ConfigError(f"{name} must be a JSON Schema object")
        return name, as_constraint(schema)
    if kind == "json_object":
        return name, JsonConstraint({"type": "object"})
    if kind == "regex":
        return name, RegexConstraint(str(value))
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings")
        return name, ChoiceConstraint(value)
    grammar = LarkConstraint(str(value))
    grammar.check()
    return name, grammar
