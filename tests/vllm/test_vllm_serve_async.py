"""``formtax serve --backend vllm`` on vLLM's async engine (skipped without vLLM).

Each request is served in its own thread and joins the engine's running batch with its own sampling; tokens
stream as the engine emits them (free rows from the engine's output, live rows from formtax's processor inside
the engine); a request whose client goes away is aborted in the engine.
"""

from __future__ import annotations

import threading
import time
import warnings

import pytest

from tests.vllm.conftest import VLLM_DTYPE

pytest.importorskip("vllm.sampling_params")
openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.vllm, pytest.mark.model]

Q = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
SUM = [{"role": "user", "content": "What is 7 + 5? Answer with a number."}]


@pytest.fixture(scope="module")
def served():
    from formtax.backends import load_backend
    from formtax.serve.app import ServeConfig, ServerThread, create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = load_backend("vllm", None, dtype=VLLM_DTYPE, enforce_eager=True, async_engine=True)
    assert backend.concurrent
    app = create_app(backend, ServeConfig(max_batch=8, timeout_s=60.0, temperature=0.0))
    try:
        with ServerThread(app) as srv:
            yield srv.url, backend
    finally:
        backend.llm.shutdown()


def client(url: str, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=timeout)


def test_a_short_request_joins_a_running_long_one_with_other_sampling(served):
    url, _ = served
    done: dict[str, float] = {}

    used: dict[str, int] = {}

    def ask(name: str, **kw) -> None:
        try:
            r = client(url).chat.completions.create(model="default", **kw)
        except Exception as e:  # noqa: BLE001 - reported below
            done[name + " failed"] = e  # type: ignore[assignment]
            raise
        assert r.choices[0].message.content
        done[name] = time.monotonic()
        used[name] = r.usage.completion_tokens

    long = threading.Thread(target=ask, args=("long",), kwargs={"messages": Q, "max_tokens": 160, "temperature": 1.0,
                                                                "seed": 3})
    long.start()
    time.sleep(0.5)
    ask("short", messages=SUM, max_tokens=24, temperature=0.0,
        extra_body={"formtax": {"strategy": "constrained", "answer": "{int}"}})
    long.join()
    assert "long" in used, done
    assert used["long"] >= 100, used  # long enough to be running when the short one came
    # an equal-key batcher would have run the short request (other strategy and sampling) after the long one
    assert done["short"] < done["long"]


def test_tokens_stream_from_the_engine_for_free_and_live_rows(served):
    url, _ = served
    c = client(url)
    for extra in ({}, {"formtax": {"strategy": "inwriting", "answer": "The answer is: {int}"}}):
        whole = c.chat.completions.create(model="default", messages=SUM, max_tokens=40, temperature=0.0, extra_body=extra)
        pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="default", messages=SUM, max_tokens=40, temperature=0.0, extra_body=extra, stream=True) if ch.choices]
        assert sum(1 for p in pieces if p) > 3, pieces  # token by token, not one piece at the end
        assert "".join(pieces) == whole.choices[0].message.content


def test_a_request_whose_client_went_away_is_aborted_in_the_engine(served):
    url, backend = served
    before = backend.llm.aborted
    with pytest.raises(openai.APITimeoutError):  # the client gives up after 1 s and closes the connection
        client(url, timeout=1.0).chat.completions.create(model="default", messages=Q, max_tokens=3000,
                                                         temperature=1.0, seed=1)
    processor = backend.llm.engine.output_processor
    deadline = time.monotonic() + 10
    while processor.get_num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processor.get_num_unfinished_requests() == 0  # aborted, not decoding on to its 3000 tokens
    assert backend.llm.aborted == before + 1


def test_stop_ends_a_free_row_in_the_engine_streamed_and_not(served):
    """``stop`` on a free row through vLLM's async engine (each request in its own thread, its stop strings in its
    controls): vLLM's own stop ends the row, finish ``stop-sequence``, the content cut before the stop string
    (three characters from the middle of the text), streamed and not, with fewer tokens than without it."""
    url, _ = served
    c = client(url)
    extra = {"formtax": {"strategy": "free"}}
    whole = c.chat.completions.create(model="default", messages=Q, max_tokens=48, temperature=0.0, extra_body=extra)
    text = whole.choices[0].message.content or ""
    assert len(text) > 20, text
    stop = [text[len(text) // 2: len(text) // 2 + 3], "never-in-this-text"]
    cut = text[: text.index(stop[0])]
    r = c.chat.completions.create(model="default", messages=Q, max_tokens=48, temperature=0.0, stop=stop,
                                  extra_body=extra)
    ext = (r.choices[0].model_extra or {})["formtax"]
    assert (r.choices[0].message.content, r.choices[0].finish_reason, ext["finish_reason"]) == (
        cut, "stop", "stop-sequence")
    assert r.usage.completion_tokens < whole.usage.completion_tokens
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="default", messages=Q, max_tokens=48, temperature=0.0, stop=stop, extra_body=extra, stream=True)
        if ch.choices]
    assert "".join(pieces) == cut
