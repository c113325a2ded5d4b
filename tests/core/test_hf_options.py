"""Issue 49: the researcher's model arguments for transformers (lm-eval's ``--model_args``, inspect's ``-M``):
``--engine-opt revision=main`` used to say "backend 'hf' takes no options"."""

from __future__ import annotations

import pytest

import formtax
from formtax.backends import load_backend
from formtax.errors import ConfigError


def test_an_unknown_option_names_the_ones_it_takes():
    with pytest.raises(ConfigError, match="does not take colour .*revision, attn_implementation, trust_remote_code"):
        load_backend("hf", None, colour="red")
    with pytest.raises(ConfigError, match="trust_remote_code must be true or false"):
        load_backend("hf", None, trust_remote_code="maybe")


@pytest.mark.model
def test_revision_and_attention_reach_from_pretrained(default_model):
    m = formtax.load_model(revision="main", attn_implementation="eager", trust_remote_code="false")
    assert m.model.config._attn_implementation == "eager"
    q = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    assert formtax.generate(m, q, max_tokens=16).text == formtax.generate(default_model, q, max_tokens=16).text
