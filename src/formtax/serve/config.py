"""The settings of ``formtax serve`` (its flags), read by the app, the routes (``request.app.state.config``) and
every serving class. A module of its own so that each of them can import it without importing the others."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServeConfig:
    """The server's settings (``formtax serve``'s flags)."""

    max_batch: int = 16
    window_s: float = 0.01
    timeout_s: float = 600.0
    default_max_tokens: int = 256
    max_queue: int = 256
    temperature: float = 1.0  # OpenAI's default; ``--temperature`` sets the server's own
    served_model_names: tuple[str, ...] = ()  # names a request's ``model`` may use (default: its id, "default")
    api_key: str | None = None  # when set, requests need ``Authorization: Bearer <key>``
    strategy: str | None = None  # the default strategy of a request that names none
    answer: str | None = None  # the default answer SPEC of a request that gives no answer format
    stuck_after_s: float = 30.0
    max_body_bytes: int | None = None  # a request body over it is a 413; None: sized from the context (limits.py)
