"""DSPy as a client of ``formtax serve`` (issue 59; run by tests/serve/test_agents.py in .venv-agents): the server
declared as a provider whose models take ``response_format`` (``dspy.lm15.register_provider`` with
``ModelSupport(response_schema=True)``; without it DSPy sends no schema to a model it does not know), then
``Predict`` and ``ChainOfThought`` with an int and a ``Literal`` output. Each call is one request (DSPy's history;
the test also counts them at the server), with the signature's schema as response_format, parsed as sent. Usage: ``python dspy_client.py
BASE_URL``; prints one JSON line per call."""

from __future__ import annotations

import json
import sys
from typing import Literal

import dspy
from dspy.lm15 import (
    AccessPolicy,
    EndpointSupport,
    ModelSupport,
    OpenAIChatCompat,
    ProviderDefinition,
    register_provider,
)

BASE = sys.argv[1]

# the recipe (docs/serve.md): formtax serve as an OpenAI-compatible provider that takes JSON Schemas
register_provider(ProviderDefinition.chat(
    AccessPolicy(provider="formtax", supports=EndpointSupport(complete=True, stream=True, models=True),
                 auth_modes=("bearer",), base_url=BASE),
    compat=OpenAIChatCompat(), placeholder_key="none"), supports=ModelSupport(response_schema=True))
lm = dspy.LM("formtax/default", api_base=BASE, api_key="none", cache=False, max_tokens=200, temperature=0.0)
dspy.configure(lm=lm, adapter=dspy.JSONAdapter())


class Count(dspy.Signature):
    """Count the apples."""

    question: str = dspy.InputField()
    answer: int = dspy.OutputField()


class Mood(dspy.Signature):
    """Classify the sentence's sentiment."""

    sentence: str = dspy.InputField()
    sentiment: Literal["positive", "negative", "neutral"] = dspy.OutputField()


cases = [("int", Count, {"question": "Tom has 3 apples and buys 4 more. How many?"}, "answer", int),
         ("Literal", Mood, {"sentence": "I love this."}, "sentiment", str)]
for module_name, module in (("Predict", dspy.Predict), ("ChainOfThought", dspy.ChainOfThought)):
    for field, sig, inputs, out, kind in cases:
        before = len(lm.history)
        try:
            pred = module(sig)(**inputs)
            value, error = getattr(pred, out), None
        except Exception as e:  # noqa: BLE001 - reported, and the test fails on it
            value, error = None, f"{type(e).__name__}: {e}"
        sent = [h["kwargs"].get("response_format") for h in lm.history[before:]]
        ok = error is None and isinstance(value, kind) and (field != "Literal" or value in
                                                            ("positive", "negative", "neutral"))
        print(json.dumps({"module": module_name, "field": field, "value": value, "ok": ok, "error": error,
                          "requests": len(sent), "structured": all(f is not None for f in sent)}))
