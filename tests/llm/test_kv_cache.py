"""The decoding KV cache with preallocated room, and inverse-CDF sampling, against the plain
paths they replace (a growing ``DynamicCache``; the categorical distribution itself)."""

from __future__ import annotations

import torch

from tdrl.llm import tokenize_prompts
from tdrl.llm.generation import cache_of, sample_inverse_cdf, unique_prompts
from tdrl.llm.kv_cache import preallocate_cache

PROMPTS = ["Q: 1+2=", "Q: 13+4=", "Q: 5+15="]


def _decode(model, cache, ids, mask, inv, steps):
    """Feed ``steps`` fixed tokens through ``cache`` (prefilled on the distinct prompts); the
    last-position logits of every step and the data pointer of layer 0's keys."""
    n = inv.shape[0]
    attn = torch.cat([mask[inv], torch.ones(n, steps, dtype=mask.dtype)], dim=1)
    pos = mask[inv].cumsum(-1)[:, -1:]  # the next position of each row
    logits, ptrs = [], []
    for t in range(steps):
        tok = torch.full((n, 1), 3 + t) + torch.arange(n)[:, None] % 4
        out = model(input_ids=tok, attention_mask=attn[:, : ids.shape[1] + t + 1], position_ids=pos + t,
                    use_cache=True, past_key_values=cache)
        cache = cache_of(out)
        logits.append(out.logits[:, -1])
        ptrs.append(cache.layers[0].keys.data_ptr())
    return torch.stack(logits, 1), ptrs


@torch.no_grad()
def test_preallocated_cache_decodes_like_the_growing_cache(tiny):
    _, model, tok = tiny
    model.eval()
    ids, mask = tokenize_prompts(tok, PROMPTS)  # left padding differs by prompt
    ids, mask = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    u_ids, u_mask, inv = unique_prompts(ids, mask)
    u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
    outs = []
    for prealloc in (False, True):
        cache = cache_of(model(input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, use_cache=True))
        if prealloc:
            assert preallocate_cache(cache, room=3, rows=inv)
            assert type(cache.layers[0]).__name__ == "PreallocatedLayer"
        else:
            cache.batch_select_indices(inv)
        outs.append(_decode(model, cache, u_ids, u_mask, inv, steps=5))  # 2 steps past the room: it grows
    (plain, _), (fast, ptrs) = outs
    assert plain.shape == (9, 5, model.config.vocab_size)
    torch.testing.assert_close(fast, plain, rtol=1e-6, atol=1e-6)
    # within the room the keys are views of one buffer; past it the buffer is replaced once
    assert ptrs[0] == ptrs[1] == ptrs[2] and ptrs[3] != ptrs[2] and ptrs[3] == ptrs[4]


def test_preallocate_cache_leaves_other_caches_alone(tiny):
    _, model, tok = tiny
    assert not preallocate_cache(None, 4)
    assert not preallocate_cache(((torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)),), 4)  # legacy tuples
    ids, mask = tokenize_prompts(tok, PROMPTS[:1])
    with torch.no_grad():
        cache = cache_of(model(input_ids=ids, attention_mask=mask, use_cache=True))
    cache.layers[0].__class__ = type("OtherLayer", (type(cache.layers[0]),), {})  # e.g. a sliding-window layer
    before = cache.layers[0].keys
    assert not preallocate_cache(cache, 4) and cache.layers[0].keys is before


def test_sample_inverse_cdf_draws_the_distribution():
    torch.manual_seed(0)
    n = 20000
    # unnormalised rows; zero-probability tokens first, inside and last (as top-k / top-p leave them)
    probs = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0], [2.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5, 1.0]])
    draws = torch.stack([sample_inverse_cdf(probs) for _ in range(n)], 1)
    assert draws.dtype == torch.int64 and draws.shape == (3, n)
    p = probs / probs.sum(-1, keepdim=True)
    freq = torch.stack([torch.bincount(d, minlength=5) for d in draws]).double() / n
    sigma = (p * (1 - p) / n).sqrt().double()
    assert ((freq - p.double()).abs() <= 4.5 * sigma + 1e-9).all(), freq
    assert (freq[p == 0] == 0).all()  # a filtered token is never drawn
