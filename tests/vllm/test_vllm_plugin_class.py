"""Issues 55 point 6 and 57: formtax's logits processor class as vLLM loads it, without an engine: it refuses
asynchronous scheduling at load naming the flag; rows removed before they finish (aborted, or preempted and
added again) are parked, bounded, and a preempted row comes back to its state; ``validate_params`` finds the
tokenizer and the client's own request in its caller's frames, as vLLM's InputProcessor and OpenAI layer hold them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.v1.sample.logits_processor")
pytestmark = [pytest.mark.vllm, pytest.mark.model]

XARGS = {"formtax_strategy": "constrained", "formtax_answer": "The answer is: {int}"}


@pytest.fixture(scope="module")
def model_path():
    from formtax.backends.model_files import resolve_model

    return resolve_model(None).path


def config(path, async_scheduling=False):
    return SimpleNamespace(model_config=SimpleNamespace(tokenizer=path, model=path, max_model_len=4096),
                           scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
                           speculative_config=None)


def params(xargs=XARGS, max_tokens=32):
    return SimpleNamespace(extra_args=dict(xargs), max_tokens=max_tokens, seed=0, temperature=0.0, top_p=1.0,
                           top_k=0, min_p=0.0, structured_outputs=None, allowed_token_ids=None, bad_words=None,
                           stop=None, stop_token_ids=None, min_tokens=0, ignore_eos=False)


def test_asynchronous_scheduling_is_refused_at_load_naming_the_flag(model_path):
    from formtax.backends.vllm.plugin import plugin_class

    with pytest.raises(RuntimeError, match="--no-async-scheduling"):
        plugin_class()(config(model_path, async_scheduling=True), "cpu", False)


def test_unfinished_removed_rows_are_parked_bounded_and_come_back(model_path, monkeypatch):
    from vllm.v1.sample.logits_processor import BatchUpdate

    from formtax.backends.vllm import plugin as vllm_plugin
    from formtax.backends.vllm.plugin import plugin_class

    monkeypatch.setattr(vllm_plugin, "PARKED_MAX", 3)
    proc = plugin_class()(config(model_path), "cpu", False)
    ps = [params() for _ in range(5)]
    proc.update_state(BatchUpdate(5, [], [(k, p, [1, 2, 3], []) for k, p in enumerate(ps)], []))
    rows = {k: proc.by_index[k][0] for k in range(5)}
    proc.update_state(BatchUpdate(0, list(range(5)), [], []))  # all removed unfinished (aborted or preempted)
    assert len(proc.parked) == 3 and not proc.by_index  # the oldest two are forgotten
    proc.update_state(BatchUpdate(1, [], [(0, ps[4], [1, 2, 3], [])], []))  # preempted row 4 comes back
    assert proc.by_index[0][0] is rows[4] and len(proc.parked) == 2
    proc.update_state(BatchUpdate(1, [], [(1, params(), [1, 2, 3], [])], []))  # a new request: a new row
    assert proc.by_index[1][0] is not rows[4]
    rows[4].done = True
    proc.update_state(BatchUpdate(1, [0], [], []))  # a finished row is forgotten at once
    assert id(ps[4]) not in proc.parked


def test_validate_params_reads_the_tokenizer_and_the_clients_request(model_path):
    from formtax.backends.vllm.plugin import plugin_class

    cls = plugin_class()

    class InputProcessor:  # vLLM's: its model_config names the tokenizer
        model_config = SimpleNamespace(tokenizer=model_path)

        def check(self, p):
            return cls.validate_params(p)

    def serve(request, p):  # vLLM's OpenAI layer: the client's request in a caller's frame
        return InputProcessor().check(p)

    sent = SimpleNamespace(vllm_xargs=XARGS, max_tokens=32, max_completion_tokens=None)
    p = params()
    serve(sent, p)
    assert p.extra_args["formtax_witnesses"]  # the engine gets the witness found here
    with pytest.raises(ValueError, match="max_tokens"):
        serve(SimpleNamespace(vllm_xargs=XARGS, max_tokens=None, max_completion_tokens=None), params(max_tokens=3000))
    with pytest.raises(ValueError, match="fits in"):
        serve(sent, params({"formtax_answer": "regex:a{50}"}, max_tokens=8))
    # refused whichever way: no secret in this process, or (after a test that started an engine) a recipe that is
    # not sealed at all
    with pytest.raises(ValueError, match="replay|signature|FORMTAX_VLLM_SECRET|not a sealed recipe"):
        serve(sent, params({"formtax_recipe": "x:y:z", "formtax_row": "k", "formtax_report": "a"}))
