"""A schema the grammar only approximates is served, and says so (issue 36): the answer is still checked against the
schema as given, and the response carries ``X-Formtax-Schema-Approximated``. The fake backend: milliseconds."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.serve.app import APPROXIMATED_HEADER, ServerThread, create_app  # noqa: E402


def _ask(client, schema):
    return client.chat.completions.with_raw_response.create(
        model="default", messages=[{"role": "user", "content": "q"}], max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})


def test_the_approximation_is_named_in_a_header():
    app = create_app(FakeBackend(random_logits(seed=4)), max_batch=4, window_s=0.0, timeout_s=60)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        raw = _ask(client, {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                            "maxItems": 3, "uniqueItems": True})
        assert raw.headers[APPROXIMATED_HEADER] == "uniqueItems: checked by the oracle only"
        body = raw.parse()
        extra = body.model_extra["formtax"]
        values = json.loads(body.choices[0].message.content)
        assert extra["parse_ok"] == (len(set(values)) == len(values))  # the oracle decides, on the schema as given
        raw = _ask(client, {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                            "additionalProperties": False})
        assert APPROXIMATED_HEADER not in raw.headers
