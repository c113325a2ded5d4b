"""The hf backend's in-place KV cache (backends/hf.py ``GrowingLayer``) gives the very logits transformers' own
``DynamicCache`` gives: through prefill, steps past the buffer's spare columns (it grows), finished rows leaving
the batch (``keep``) and a row cropped back (the suffix strategies' rewind). A tiny randomly initialised Llama, so
the comparison is bitwise and runs in a second."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from formtax.backends import hf
from formtax.backends.hf import GROW_COLUMNS, GrowingLayer, HFBatch, growing_cache


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).eval()


def _decode(model: LlamaForCausalLM, steps: int) -> list[torch.Tensor]:
    """Greedy steps over four left-padded rows with a keep and a crop on the way; every step's logits."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (7, 3, 12, 5)]
    b = HFBatch(model, prompts, pad_id=0, device=torch.device("cpu"))
    out = [b.prefill()]
    live = list(range(4))
    for s in range(steps):
        if s == 40:  # rows 1 and 3 finish
            b.keep([0, 2])
            live = [0, 2]
            out[-1] = out[-1][[0, 2]]
        if s == 60:  # row 0 goes back to its first 10 generated tokens, and row 1 to its prompt less its last token
            b.crop(0, 10)
            b.crop(1, -1)
        out.append(b.step(out[-1].argmax(-1).tolist()))
    assert len(live) == out[-1].shape[0]
    return out


def test_the_growing_cache_gives_dynamic_caches_logits_bit_for_bit(tiny, monkeypatch) -> None:
    steps = GROW_COLUMNS + 40  # past the spare columns of the prefill: the buffer grows once at least
    ours = _decode(tiny, steps)
    monkeypatch.setattr(hf, "growing_cache", lambda config: DynamicCache(config=config))
    theirs = _decode(tiny, steps)
    assert len(ours) == len(theirs) == steps + 1
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.equal(a, b), f"step {k} differs by {float((a - b).abs().max())}"


def test_the_layer_appends_in_place_and_views_its_filled_part() -> None:
    layer = GrowingLayer()
    k = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    keys, values = layer.update(k, -k)
    assert torch.equal(keys, k) and torch.equal(values, -k) and layer.get_seq_length() == 4
    buf = layer._kbuf
    for t in range(GROW_COLUMNS):  # fills the spare columns without a new buffer
        keys, _ = layer.update(k[:, :, :1] + t, -k[:, :, :1])
    assert layer._kbuf is buf and layer.get_seq_length() == 4 + GROW_COLUMNS
    keys, _ = layer.update(k[:, :, :1], -k[:, :, :1])  # one past: it grows, keeping what it held
    assert layer._kbuf is not buf and torch.equal(keys[:, :, :4], k) and keys.shape[-2] == 5 + GROW_COLUMNS
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys[0, :, :4], k[1]) and layer.keys.shape[0] == 1
    layer.crop(-3)
    assert layer.get_seq_length() == 2 + GROW_COLUMNS and layer.keys.shape[-2] == 2 + GROW_COLUMNS


def test_sliding_window_layers_keep_transformers_own() -> None:
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=4)
    kinds = [type(layer) for layer in growing_cache(cfg).layers]
    assert DynamicSlidingWindowLayer in kinds and GrowingLayer in kinds and DynamicLayer not in kinds


def test_a_row_joining_a_running_batch_gets_the_logits_it_would_get_alone(tiny) -> None:
    """Continuous batching (``HFBatch.join``): rows prefilled on their own and joined mid-decode, left-padded to the
    wider batch, get their solo logits (to float noise: the padded attention sums in another order), and the rows
    already running are not disturbed."""
    g = torch.Generator().manual_seed(2)
    first = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (6, 9)]
    late = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (4, 15)]

    def solo(prompt: list[int], steps: int) -> list[torch.Tensor]:
        b = HFBatch(tiny, [prompt], pad_id=0, device=torch.device("cpu"))
        out = [b.prefill()]
        for _ in range(steps):
            out.append(b.step(out[-1].argmax(-1).tolist()))
        return out

    b = HFBatch(tiny, first, pad_id=0, device=torch.device("cpu"))
    logits = b.prefill()
    rows: dict[int, list[torch.Tensor]] = {0: [logits[0:1]], 1: [logits[1:2]]}
    for _ in range(5):
        logits = b.step(logits.argmax(-1).tolist())
        for k in range(2):
            rows[k].append(logits[k:k + 1])
    assert b.joinable
    # join after five steps: the late rows' prefill logits follow the running rows'
    other = HFBatch(tiny, late, pad_id=0, device=torch.device("cpu"))
    fresh = other.prefill()
    b.join(other)
    logits = torch.cat([logits, fresh])
    rows[2], rows[3] = [fresh[0:1]], [fresh[1:2]]
    for _ in range(8):
        logits = b.step(logits.argmax(-1).tolist())
        for k in range(4):
            rows[k].append(logits[k:k + 1])
    for k, prompt in enumerate(first + late):
        want = solo(prompt, len(rows[k]) - 1)
        for step, (a, w) in enumerate(zip(rows[k], want, strict=True)):
            assert torch.allclose(a, w, atol=1e-4), (k, step, float((a - w).abs().max()))
            assert int(a.argmax()) == int(w.argmax())


def _continuous(model: LlamaForCausalLM) -> tuple[dict[str, list[torch.Tensor]], list[int]]:
    """Rows leave, join and crop mid-decode; each row's logits by name, and the cache buffer's address per step."""
    g = torch.Generator().manual_seed(3)
    prompt = {name: torch.randint(1, 97, (n,), generator=g).tolist()
              for name, n in zip("abcdefg", (7, 3, 12, 5, 9, 4, 14), strict=True)}
    live = list("abcd")
    b = HFBatch(model, [prompt[r] for r in live], pad_id=0, device=torch.device("cpu"))
    logits = b.prefill()
    rows: dict[str, list[torch.Tensor]] = {r: [logits[k]] for k, r in enumerate(live)}
    addresses = []
    for s in range(24):
        if s == 5:  # b and d finish
            keep = [k for k, r in enumerate(live) if r not in "bd"]
            b.keep(keep)
            logits, live = logits[keep], [live[k] for k in keep]
        if s in (8, 16):  # two rows join at 8 (into b's and d's slots), one at 16 (into c's)
            new = list("ef") if s == 8 else ["g"]
            other = HFBatch(model, [prompt[r] for r in new], pad_id=0, device=torch.device("cpu"))
            fresh = other.prefill()
            b.join(other)
            logits, live = torch.cat([logits, fresh]), live + new
            for k, r in enumerate(new):
                rows[r] = [fresh[k]]
        if s == 12:  # a goes back to its first 4 generated tokens; c finishes
            b.crop(live.index("a"), 4)
            keep = [k for k, r in enumerate(live) if r != "c"]
            b.keep(keep)
            logits, live = logits[keep], [live[k] for k in keep]
        logits = b.step(logits.argmax(-1).tolist())
        for k, r in enumerate(live):
            rows[r].append(logits[k])
        addresses.append(b.cache.layers[0]._kbuf.data_ptr())
    return rows, addresses


def test_rows_leave_and_join_through_slots_with_the_logits_of_compacting_at_once(tiny, monkeypatch) -> None:
    """Finished rows stay as dead slots until compaction (``COMPACT_AT``), and joining rows take dead slots: every
    live row's logits equal those of compacting at every leave (the copy-per-leave behaviour, ``COMPACT_AT = 0``),
    to float noise (the dead rows change the batch's shape, not a live row's arithmetic), with the same argmax."""
    monkeypatch.setattr(hf, "COMPACT_AT", 0.0)
    ref, ref_addresses = _continuous(tiny)
    monkeypatch.setattr(hf, "COMPACT_AT", 1.0)  # never before every row is dead: leaves and joins copy nothing
    got, addresses = _continuous(tiny)
    assert ref.keys() == got.keys()
    for r in ref:
        assert len(ref[r]) == len(got[r])
        for step, (a, w) in enumerate(zip(got[r], ref[r], strict=True)):
            assert torch.allclose(a, w, atol=1e-5), (r, step, float((a - w).abs().max()))
            assert int(a.argmax()) == int(w.argmax())
    assert len(set(ref_addresses)) > 1  # compacting copies the cache at each leave and join
    assert len(set(addresses)) == 1  # lazily, the leaves and the joins into dead slots copy nothing
