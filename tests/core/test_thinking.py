"""``--thinking on|off``: the chat template's enable_thinking switch, refused for a template without one."""

from __future__ import annotations

import json

import pytest

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.errors import ConfigError
from formtax.runner import RunConfig, run

# A Qwen3-style template (the relevant part): thinking off writes an empty think block after the assistant tag.
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def _thinking_backend() -> FakeBackend:
    fb = FakeBackend(random_logits(seed=2))
    fb.tokenizer.hf.chat_template = TEMPLATE
    return fb


def test_the_switch_reaches_the_template():
    fb = _thinking_backend()
    msgs = [{"role": "user", "content": "2+2?"}]
    default = fb.tokenizer.chat_prompt(msgs)
    fb.tokenizer.set_thinking(False)
    off = fb.tokenizer.chat_prompt(msgs)
    fb.tokenizer.set_thinking(True)
    on = fb.tokenizer.chat_prompt(msgs)
    assert "<think>\n\n</think>" in off and "<think>" not in on and on == default
    r = formtax.generate(fb, msgs, "free", None, max_tokens=4)
    assert r.tokens.prompt == len(fb.tokenizer.prompt_ids(msgs))


def test_a_template_without_the_switch_is_refused(tmp_path):
    fb = FakeBackend(random_logits(seed=2))
    fb.tokenizer.hf.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ConfigError, match="no thinking switch"):
        fb.tokenizer.set_thinking(False)
    cfg = RunConfig(task="arith", strategies=["free"], backend="fake", limit=2, max_tokens=4, thinking="off")
    with pytest.raises(ConfigError, match="no thinking switch"):
        run(cfg, tmp_path / "r", backend=fb)


def test_a_run_with_thinking_off_records_the_prompt_it_sent(tmp_path):
    cfg = RunConfig(task="arith", strategies=["free"], backend="fake", limit=2, max_tokens=4, thinking="off")
    run(cfg, tmp_path / "r", backend=_thinking_backend())
    recs = [json.loads(line) for line in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    assert recs and all("<think>\n\n</think>" in r["prompt"] for r in recs)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["config_identity"]["thinking"] == "off"
    with pytest.raises(ConfigError, match="on or off"):
        run(RunConfig(task="arith", strategies=["free"], backend="fake", limit=2, thinking="maybe"),
            tmp_path / "bad", backend=_thinking_backend())
