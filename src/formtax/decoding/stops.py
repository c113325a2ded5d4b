"""A caller's stop strings (OpenAI's and vLLM's ``stop``): where a free-text row ends and where its content is cut,
one rule for every route.

* **Where the row ends** (:class:`StopScan`): after each token the row's decoded text is checked; the row finishes
  (``Finish.STOP_SEQUENCE``) at the first token after which a stop string appears in it. The token that completes
  the stop string stays in the row (its tokens and ``Result.text``), as vLLM keeps it in ``token_ids``. formtax's
  loop checks it through ``formtax serve``'s hooks (serve/hooks.py); an engine that owns its loop applies the stop
  strings itself (vLLM's own ``stop``) and its row is replayed under :class:`StopStrings`, so both end the row at the
  same token.
* **Where the content is cut** (:func:`stop_cut`): before the stop string that completes first in the text (ties:
  the first in the caller's list), the stop string left out, as vLLM cuts its output text
  (``vllm/v1/engine/detokenizer.py``, ``check_stop_strings``) and as OpenAI returns it. The text of a row that ended
  at a stop holds every stop string it contains in its last token, so this is the stop string that ended the row.

Ours, and why: formtax checks the text of the row's last tokens rather than the whole text, so a long row costs the
same per step: a window of as many tokens as the longest stop string can span (four per character, for tokenizers
that spell a character in UTF-8 bytes), and a few more.
"""

from __future__ import annotations

from collections.abc import Sequence

from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.plan import Finish, Policy, Transparent

UTF8_MAX = 4
"""Bytes in a UTF-8 character at most: a byte-fallback tokenizer may spend a token on each."""
WINDOW_SLACK = 8
"""Tokens decoded beyond the most a stop string can span (tokens without text: special tokens)."""


class StopScan:
    """Whether one of ``stops`` has appeared in a row's text, token by token (module docstring)."""

    def __init__(self, tok: TokenizerInfo, stops: Sequence[str]) -> None:
        self.tok = tok
        self.stops = tuple(stops)
        self.generated: list[int] = []
        self.window = UTF8_MAX * max((len(s) for s in self.stops), default=0) + WINDOW_SLACK

    def seen(self, token: int) -> bool:
        """Take the row's next token; True when a stop string appears in the text so far."""
        self.generated.append(token)
        if not self.stops:
            return False
        tail = self.tok.decode_text(self.generated[-self.window:])
        return any(s in tail for s in self.stops)


def stop_cut(text: str, stops: Sequence[str]) -> int | None:
    """Where ``text``'s content ends: the start of the stop string that completes first in it (ties: the first of
    ``stops``), or None when no stop string is in it."""
    best: tuple[int, int] | None = None  # (end, start)
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i + len(s) < best[0]):
            best = (i + len(s), i)
    return None if best is None else best[1]


class StopStrings(Transparent):
    """``inner`` ending at a caller's stop string (:class:`StopScan`), everything else handed through: how a row an
    engine stopped at a stop string is replayed (decoding/rowengine.py's ``replay``). Where the inner policy ends the
    row at a token (EOS, the ``short`` strategy's newline) that finish stands, as in formtax's own loop."""

    def __init__(self, inner: Policy, scan: StopScan) -> None:
        self.inner = inner
        self.scan = scan
        self.coupled = inner.coupled

    def advance(self, token: int) -> str | None:
        reason = self.inner.advance(token)
        if reason is None and self.scan.seen(token):
            return Finish.STOP_SEQUENCE
        return reason
