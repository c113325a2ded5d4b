"""Sampling settings: the filters equal transformers' warpers, act on the constrained distribution, and bad
values are one clear error before anything loads."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import formtax
from formtax.backends.fake import FakeBackend, random_logits
from formtax.cli.main import main
from formtax.decoding.sampling import Sampling, from_generation_config
from formtax.errors import ConfigError

Q = "What is 2 + 3?"


def _hf(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    x = logits[None].clone()
    ids = torch.zeros((1, 1), dtype=torch.long)
    if s.temperature > 0:
        x = TemperatureLogitsWarper(s.temperature)(ids, x)
    if s.top_k > 0:
        x = TopKLogitsWarper(s.top_k)(ids, x)
    if s.top_p < 1.0:
        x = TopPLogitsWarper(s.top_p)(ids, x)
    if s.min_p > 0.0:
        x = MinPLogitsWarper(s.min_p)(ids, x)
    return x[0]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.floats(0.2, 3.0), top_k=st.integers(0, 40),
       top_p=st.floats(0.05, 1.0), min_p=st.floats(0.0, 0.5), masked=st.booleans())
def test_warp_keeps_exactly_the_tokens_transformers_keeps(seed, temperature, top_k, top_p, min_p, masked):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, generator=g) * 3
    if masked:  # a constraint's mask first, as a logits processor before the warpers
        logits[torch.rand(64, generator=g) < 0.6] = float("-inf")
        logits[0] = 1.0
    s = Sampling(temperature, top_p, top_k, min_p)
    ours, ref = s.warp(logits), _hf(logits, s)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    kept = ~torch.isinf(ours)
    assert torch.allclose(ours[kept], ref[kept], atol=1e-5)


def test_top_k_one_is_greedy_and_filters_never_break_the_constraint():
    fake = FakeBackend(random_logits(seed=4))
    greedy = formtax.generate(fake, Q, "constrained", "The answer is: {int}", max_tokens=40)
    top1 = formtax.generate(fake, Q, "constrained", "The answer is: {int}", max_tokens=40, temperature=1.3,
                            top_k=1, seed=5)
    assert top1.text == greedy.text
    for seed in range(8):
        r = formtax.generate(fake, Q, "constrained", "The answer is: {int}", max_tokens=40, temperature=1.5,
                             top_p=0.6, top_k=8, min_p=0.02, seed=seed)
        assert r.parse_ok and re.fullmatch(r"The answer is: -?(0|[1-9][0-9]*)", r.answer_text or r.text), r.text


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"top_k": -1}, "top_k must be an integer >= 0"),
    ({"min_p": 1.0}, "min_p must be in"),
])
def test_bad_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Sampling(**kwargs)
    with pytest.raises(ConfigError, match=message):
        formtax.generate(FakeBackend(random_logits(seed=1)), Q, "free", None, max_tokens=4, **kwargs)


def test_cli_refuses_bad_sampling_before_loading(capsys, tmp_path):
    assert main(["generate", "--temperature", "-1", "hi"]) == 2
    assert "temperature must be a finite number >= 0" in capsys.readouterr().err
    assert main(["run", "--task", "arith", "--strategies", "free", "--top-p", "1.5", "--out", str(tmp_path)]) == 2
    assert "top_p must be in" in capsys.readouterr().err


def test_model_defaults_follow_the_generation_config():
    from transformers import GenerationConfig

    assert from_generation_config(GenerationConfig()) == Sampling()  # no do_sample: greedy
    cfg = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.95, top_k=20, min_p=0.0)
    assert from_generation_config(cfg) == Sampling(0.6, 0.95, 20, 0.0)  # e.g. Qwen3's published defaults
    with pytest.raises(ConfigError, match="generation defaults"):
        formtax.generate(FakeBackend(random_logits(seed=1)), Q, "free", None, max_tokens=4, model_defaults=True)
