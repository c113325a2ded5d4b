"""Converting a GGUF keeps its tokenizer's BOS/EOS convention (transformers' GGUF reader drops Gemma's BOS in some
releases, and the converted folder is shared by every environment that loads it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from formtax.backends import model_files
from formtax.backends.model_files import (
    _special_tokens_added,
    gguf_special_token_flags,
    honour_special_token_flags,
)


def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2, "a": 3, "b": 4}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


@pytest.mark.parametrize(("add_bos", "add_eos"), [(True, False), (False, False), (True, True), (False, True)])
def test_the_tokenizer_adds_exactly_what_the_gguf_says_and_keeps_it_when_saved(
        tmp_path: Path, add_bos: bool, add_eos: bool) -> None:
    tok = _tokenizer()
    assert _special_tokens_added(tok) == (False, False)
    honour_special_token_flags(tok, add_bos, add_eos)
    expected = [0] * add_bos + [3, 4] + [1] * add_eos
    assert tok.encode("a b") == expected
    assert tok.encode("a b", add_special_tokens=False) == [3, 4]
    tok.save_pretrained(tmp_path)
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert again.encode("a b") == expected and _special_tokens_added(again) == (add_bos, add_eos)
    honour_special_token_flags(again, False, False)  # and back: a flag the GGUF does not set is removed
    assert again.encode("a b") == [3, 4]


def test_the_flags_are_read_from_the_gguf_metadata(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_special_token_flags(path) == (True, False)
    bare = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(bare), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_special_token_flags(bare) == (False, False)  # absent flags: the tokenizer adds nothing


def test_a_folder_converted_by_older_code_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    key = model_files._quick_key(f)
    monkeypatch.setattr(model_files, "CONVERSION_VERSION", model_files.CONVERSION_VERSION + 1)
    assert model_files._quick_key(f) != key
