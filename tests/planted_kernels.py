"""A kernel author's first hour: plain-torch kernels as a person writes them, two correct with
narrow declarations and six each with one bug people ship. tests/test_install.py copies this
file into a user's directory and runs fmha on each from the installed wheel; the bug's own
cause must lead the failure, and the correct kernels must pass."""

import math

import torch

from fmha.contract import Capabilities


def _attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, interleaved_heads=False,
               max_before_mask=False, mask_unread_values=True, lse_dtype=torch.float32, lse=True):
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    heads = torch.arange(H, device=q.device)
    heads = heads % Hkv if interleaved_heads else heads // (H // Hkv)
    keys, values = k.float()[:, :, heads], v.float()[:, :, heads]
    position = torch.arange(T, device=q.device)[:, None] + S - T
    key = torch.arange(S, device=q.device)[None, :]
    visible = torch.ones(T, S, dtype=torch.bool, device=q.device)
    if causal or window:
        visible &= key <= position
    if window:
        visible &= key > position - window
    if mask_unread_values:  # keys no row sees may hold anything, NaN too: never multiply them
        values = values.masked_fill(~visible.any(0)[None, :, None, None], 0.0)
    raw = torch.einsum("bthd,bshd->bhts", q.float(), keys) * (D**-0.5 if scale is None else float(scale))
    s = raw.masked_fill(~visible, -math.inf)
    if sink is not None:
        column = sink.float().view(1, H, 1, 1).expand(B, H, T, 1)
        raw, s = torch.cat([raw, column], -1), torch.cat([s, column], -1)
    scores = (raw if max_before_mask else s).nan_to_num(nan=-math.inf)
    m = scores.amax(-1, keepdim=True).nan_to_num(neginf=0.0) if S or sink is not None else s.new_zeros(B, H, T, 1)
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    o = torch.einsum("bhts,bshd->bthd", (e / z.clamp(min=1e-30))[..., :S], values).to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    return o, ((m + z.log()).squeeze(-1).to(lse_dtype) if lse else None)


def causal_only(q, k, v, **kwargs):
    return _attention(q, k, v, **kwargs)


def gqa_interleaved(q, k, v, **kwargs):
    return _attention(q, k, v, interleaved_heads=True, **kwargs)


def max_before_mask(q, k, v, **kwargs):
    return _attention(q, k, v, max_before_mask=True, **kwargs)


def window_nan(q, k, v, **kwargs):
    return _attention(q, k, v, mask_unread_values=False, **kwargs)


def lse_bf16(q, k, v, **kwargs):
    return _attention(q, k, v, lse_dtype=torch.bfloat16, **kwargs)


def lse_none(q, k, v, **kwargs):
    return _attention(q, k, v, lse=False, **kwargs)


causal_only.capabilities = Capabilities(requires=frozenset({"causal"}))
gqa_interleaved.capabilities = max_before_mask.capabilities = window_nan.capabilities = Capabilities()
lse_bf16.capabilities = lse_none.capabilities = Capabilities()


def decode(q, k_cache, v_cache, *, block_table, kv_lens, scale=None, causal=False, window=None, sink=None, out=None,
           full_last_page_empty=False):
    """One query row a request over pages of 16 keys."""
    B, _, H, D = q.shape
    page = k_cache.shape[1]
    outputs, lses = [], []
    for b in range(B):
        n = int(kv_lens[b])
        read = n - page if full_last_page_empty and n and n % page == 0 else n
        j = torch.arange(read, device=q.device)
        slots = block_table[b].long()[j // page] * page + j % page
        keys = k_cache.flatten(0, 1)[slots]
        values = v_cache.flatten(0, 1)[slots]
        o, lse = _attention(q[b:b + 1], keys[None], values[None], scale=scale, causal=causal, window=window,
                            sink=sink)
        outputs.append(o)
        lses.append(lse)
    o = torch.cat(outputs)
    if out is not None:
        out.copy_(o)
        o = out
    return o, torch.cat(lses)


def full_last_page_empty(q, k_cache, v_cache, **kwargs):
    return decode(q, k_cache, v_cache, full_last_page_empty=True, **kwargs)


decode.capabilities = full_last_page_empty.capabilities = Capabilities(
    sources=frozenset({"paged"}), max_q_len=1, block_sizes=(16,))
