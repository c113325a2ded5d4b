"""A vLLM reasoning parser for formtax's plugin rows: InWriting's reasoning in ``reasoning_content``, its answer in
``content`` (streamed and not); a json row's ``reason`` in ``reasoning_content`` beside the whole object.

    python -m vllm.entrypoints.openai.api_server ... \
        --logits-processors formtax.vllm_plugin:FormtaxLogitsProcessor \
        --reasoning-parser-plugin formtax.integrations.vllm_reasoning --reasoning-parser formtax

vLLM makes one parser per request and hands it the request (``adjust_request``; streamed, the request is read from
the caller's frame, where vLLM's stream parser holds it), so the parser knows the request's formtax strategy and
answer (``vllm_xargs``). Requests without formtax arguments, and formtax strategies
without a reasoning phase, are left alone: everything is ``content`` and their reasoning is over before it starts
(``is_reasoning_end`` is True, so vLLM's own structured outputs constrain them from the first token, as without a
reasoning parser).

Where the split falls: the text alone does not carry the row's phases, so the answer is found as
``formtax.parse`` finds it (strategies/reading.py): InWriting's answer is the suffix, from a line start, that the
answer's oracle accepts (the plugin writes a line break at the switch). Streamed, InWriting's finished lines go to
``reasoning_content`` as they come and the line being written is held back; when the row ends, vLLM asks for what
is left (``get_streaming_fallback_content``), which is the answer (a one-line answer, as InWriting's templates
are; an answer over several lines streams its first lines as reasoning, and the non-streamed split is exact).
A json row streams as ``content`` only (its reason is inside the object).

Ours, and why: vLLM's reasoning parsers split on marker tokens (``<think>``); formtax's switch writes none.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.reasoning import ReasoningParser, ReasoningParserManager

from formtax.backends.vllm.rows import RowSpec


@ReasoningParserManager.register_module("formtax")
class FormtaxReasoningParser(ReasoningParser):
    """formtax's reasoning split (module docstring)."""

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.spec: RowSpec | None = None
        self.looked = False  # the request was read (adjust_request, or a caller's frame when streaming)
        self.sent = 0  # characters of the streamed text handed out as reasoning

    def adjust_request(self, request: Any) -> Any:
        self.looked = True
        try:  # the request's own dict, which validate_params also handed the engine's witnesses in
            self.spec = RowSpec.of(getattr(request, "vllm_xargs", None), from_client=False)
        except ValueError:  # refused in validate_params with its reason
            self.spec = None
        return request

    @property
    def reasons(self) -> bool:
        """Whether this request's output has a reasoning phase this parser splits."""
        return self.spec is not None and self.spec.strategy in ("inwriting", "json")

    def _find_request(self) -> None:
        """Streamed, vLLM makes the parser without handing it the request: it is read from the caller's frame
        (vLLM's stream parser holds it as ``request``), once."""
        if self.looked:
            return
        self.looked = True
        frame = sys._getframe(1)
        for _ in range(12):
            if frame is None:
                return
            request = frame.f_locals.get("request")
            if request is not None and hasattr(request, "vllm_xargs"):
                self.adjust_request(request)
                return
            frame = frame.f_back  # type: ignore[assignment]

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        self._find_request()
        return not (self.spec is not None and self.spec.strategy == "inwriting")

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return list(input_ids)

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        self.adjust_request(request)
        if not self.reasons or self.spec is None:
            return None, model_output
        from formtax.api import parse

        res = parse(model_output, self.spec.answer, strategy=self.spec.strategy)
        if self.spec.strategy == "json":
            try:
                reason = json.loads(model_output).get("reason")
            except (ValueError, AttributeError):
                reason = None
            return (reason if isinstance(reason, str) and reason else None), model_output
        if res.answer_text is None or not model_output.endswith(res.answer_text):
            return None, model_output
        return (res.reasoning or None), res.answer_text

    def extract_reasoning_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                    previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                    delta_token_ids: Sequence[int]) -> DeltaMessage | None:
        self._find_request()
        if self.spec is None or self.spec.strategy != "inwriting":
            return DeltaMessage(content=delta_text) if delta_text else None
        cut = current_text.rfind("\n")  # finished lines are reasoning; a line's break goes with the next line,
        if cut <= self.sent:  # so the break at the switch belongs to neither side
            return None
        out = current_text[self.sent:cut]
        self.sent = cut
        return DeltaMessage(reasoning=out) if out else None

    def get_streaming_fallback_content(self, previous_text: str, request: Any) -> str | None:
        """What is left when an InWriting row ends: its answer (the line being written)."""
        rest = previous_text[self.sent:]
        return (rest[1:] if self.sent and rest.startswith("\n") else rest) or None
