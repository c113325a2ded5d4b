"""A byte-level tokenizer built in memory: one token per byte plus a few specials.

It is a real ``PreTrainedTokenizerFast`` (so llguidance and every code path that handles Hugging Face tokenizers
treat it like any other), but needs no files: tests and the fake backend run in milliseconds with it.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

BYTE_SPECIALS = ("<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>")

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' if m['role'] in ['user', 'assistant'] else '' }}"
    "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@lru_cache(maxsize=1)
def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Token ids 0-255 are the bytes; 256 = EOS, 257 = PAD, 258/259 chat role markers."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for i, s in enumerate(BYTE_SPECIALS):
        vocab[s] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=BYTE_SPECIALS[0], pad_token=BYTE_SPECIALS[1],
        additional_special_tokens=list(BYTE_SPECIALS[2:]),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
