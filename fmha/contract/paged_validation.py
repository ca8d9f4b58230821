"""Validation of contract v2's key sources (docs/contract.md): paged caches, ragged queries,
index-sparse slots over one or two caches, quantized caches. `check_attention_args` hands a
call here when it names a block table or indices; the messages follow the same rule: the
argument, what was expected, what came in.
"""

from __future__ import annotations

import torch

from fmha.contract.cache_layouts import LAYOUTS
from fmha.contract.errors import fail
from fmha.contract.problem import CACHE_LAYOUTS, DTYPE_NAMES, Problem


def _is_int32(name: str, t, shape: tuple, layout: str, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(f"{name}: expected an int32 tensor {layout}, got {type(t).__qualname__}")
    if t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device:
        fail(f"{name}: expected int32 {layout} = {shape} on {device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    if t.numel() and t.stride(-1) != 1:  # the kernels step through the last dim one element at a time
        fail(f"{name}: expected a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    return t


def _readable(t: torch.Tensor) -> bool:
    """Values can be checked: reading them synchronizes, which a CUDA graph capture forbids."""
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _in_range(name: str, t: torch.Tensor, low: int, high: int, what: str) -> None:
    """Every value in [low, high]."""
    if not t.numel() or not _readable(t):
        return
    bad = (t < low) | (t > high)
    if bool(bad.any()):
        where = tuple(torch.nonzero(bad)[0].tolist())
        fail(f"{name}: expected {what} in [{low}, {high}], got {int(t[bad][0])} at {where} "
              f"({int(bad.sum())} of {t.numel()} values out of range)")


def _cache(name: str, cache, q: torch.Tensor, layout: str | None):
    """A cache's (num_blocks, block_size, Hkv, D): of q's dtype, or bytes in `layout`."""
    shape = "(num_blocks, block_size, Hkv, D)"
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
        got = f"rank {cache.dim()}" if isinstance(cache, torch.Tensor) else type(cache).__qualname__
        fail(f"{name}: expected a rank-4 tensor {shape}, got {got}")
    if cache.device != q.device:
        fail(f"{name}: expected q's device {q.device}, got {cache.device}")
    if cache.numel() and cache.stride(-1) != 1:
        fail(f"{name}: expected a contiguous last dim (stride 1), got strides {tuple(cache.stride())}")
    if layout is None:
        if cache.dtype != q.dtype:
            fail(f"{name}: expected q's dtype {q.dtype}, got {cache.dtype}")
        return tuple(cache.shape)
    if layout not in CACHE_LAYOUTS:
        fail(f"{name}: cache_layout expected one of {', '.join(CACHE_LAYOUTS)}, got {layout!r}")
    spec = LAYOUTS[layout]
    if cache.dtype != torch.uint8 or cache.shape[2] != 1 or cache.shape[3] != spec.token_bytes:
        fail(f"{name}: a {layout} cache is uint8 (num_blocks, block_size, 1, {spec.token_bytes}), "
              f"got {cache.dtype} {tuple(cache.shape)}")
    if cache.shape[0] > 1 and (cache.stride(0) < cache.shape[1] * spec.token_bytes
                               or cache.stride(0) % spec.page_alignment):
        fail(f"{name}: a {layout} page of {cache.shape[1]} tokens takes {spec.page_bytes(cache.shape[1])} bytes "
             f"(padded to a multiple of {spec.page_alignment}), so the block stride is a multiple of "
             f"{spec.page_alignment} of at least that; got {cache.stride(0)}")
    if cache.shape[1] > 1 and cache.stride(1) != spec.token_bytes:  # kernels read a page as one run of bytes
        fail(f"{name}: a {layout} page's tokens are packed, {spec.token_bytes} bytes apart (the page is one "
             f"format: fmha.contract.cache_layouts), so the token stride is {spec.token_bytes}; got {cache.stride(1)}")
    if q.dtype != torch.bfloat16 or q.shape[-1] != spec.head_dim:
        fail(f"q: a {layout} cache is read by bf16 queries of head dim {spec.head_dim}, got "
              f"{DTYPE_NAMES.get(q.dtype, q.dtype)} head dim {q.shape[-1]}")
    return cache.shape[0], cache.shape[1], 1, spec.head_dim


def check_paged_args(q, k, v, *, causal, window, block_table, kv_lens, cu_seqlens_q, indices, topk_len,
                      extra_k_cache, extra_indices, extra_topk_len, cache_layout, extra_cache_layout) -> dict:
    """The v2 part of a call: returns the Problem fields it sets (batch, lengths, heads, dims,
    source, ...) for `check_attention_args` to finish."""
    if block_table is not None and indices is not None:
        fail("block_table, indices: a call reads a paged cache through block_table or cache slots through "
              "indices, not both")
    if not isinstance(q, torch.Tensor):
        fail(f"q: expected a torch.Tensor, got {type(q).__qualname__}")
    paged = block_table is not None
    if not paged and (kv_lens is not None or cu_seqlens_q is not None):
        fail("kv_lens, cu_seqlens_q: they describe a paged call and come with block_table")
    if paged and any(a is not None for a in (topk_len, extra_k_cache, extra_indices, extra_topk_len)):
        fail("topk_len, extra_*: they describe an index-sparse call and come with indices")
    if cache_layout is not None and v is not k:
        fail(f"v: a {cache_layout} cache holds K = V: pass the same tensor as k and v")
    num_blocks, block_size, Hkv, D = _cache("k", k, q, cache_layout)
    Dv = D if v is k else _cache("v", v, q, None)[3]
    if v is not k and tuple(v.shape[:3]) != (num_blocks, block_size, Hkv):
        fail(f"v: expected k's (num_blocks, block_size, Hkv) = {(num_blocks, block_size, Hkv)}, got {tuple(v.shape[:3])}")
    ragged = cu_seqlens_q is not None
    q_rank, q_layout = (3, "(total_q, Hq, D)") if ragged else (4, "(B, T, Hq, D)")
    if q.dim() != q_rank:
        fail(f"q: expected rank {q_rank} {q_layout}, got rank {q.dim()} {tuple(q.shape)}")
    Hq = q.shape[-2]
    if q.shape[-1] != D:
        fail(f"k: expected head dim D={q.shape[-1]} (q's), got {D}")
    if Hkv == 0 or Hq % Hkv:
        fail(f"q, k: expected Hq % Hkv == 0, got Hq={Hq}, Hkv={Hkv}")
    fields = dict(heads_q=Hq, heads_kv=Hkv, head_dim=D, head_dim_v=Dv, block_size=block_size,
                  cache_layout=cache_layout)
    if paged:
        fields |= _paged(q, block_table, kv_lens, cu_seqlens_q, num_blocks, block_size)
        return fields | _paged_requests(q, kv_lens, cu_seqlens_q, causal or window is not None)
    if causal or window is not None:
        fail("causal, window: the indices alone decide an index-sparse row's keys; pass causal=False, window=None")
    if q.dim() != 4:
        fail(f"q: expected rank 4 (B, T, Hq, D) with indices, got rank {q.dim()}")
    B, T = q.shape[:2]
    topk = _sparse("indices", "topk_len", indices, topk_len, B, T, num_blocks * block_size, q.device)
    fields |= dict(source="sparse", batch=B, q_len=T, kv_len=topk)
    if extra_k_cache is None:
        if extra_indices is not None or extra_topk_len is not None or extra_cache_layout is not None:
            fail("extra_indices, extra_topk_len, extra_cache_layout: a second scope needs extra_k_cache")
        return fields | _sparse_rows([(indices, topk_len)])
    if extra_indices is None:
        fail("extra_indices: expected (B, T, extra_topk) int32 slots of extra_k_cache, got None")
    if v is not k:
        fail("v: a second scope is K = V (extra_k_cache is its values too); pass k as v as well")
    blocks2, block_size2, Hkv2, D2 = _cache("extra_k_cache", extra_k_cache, q, extra_cache_layout)
    if (Hkv2, D2) != (Hkv, D):
        fail(f"extra_k_cache: expected k's (Hkv, D) = {(Hkv, D)}, got {(Hkv2, D2)}")
    extra_topk = _sparse("extra_indices", "extra_topk_len", extra_indices, extra_topk_len, B, T,
                         blocks2 * block_size2, q.device)
    return fields | dict(extra_topk=extra_topk, extra_block_size=block_size2, extra_cache_layout=extra_cache_layout
                         ) | _sparse_rows([(indices, topk_len), (extra_indices, extra_topk_len)])


def _paged_requests(q, kv_lens, cu_seqlens_q, masked: bool) -> dict:
    """fmha.contract.PER_REQUEST of a paged call, from its lengths (None where they cannot be
    read: under a CUDA graph capture)."""
    if not (_readable(kv_lens) and (cu_seqlens_q is None or _readable(cu_seqlens_q))):
        return {}
    keys = kv_lens.tolist()
    rows = [q.shape[1]] * len(keys) if cu_seqlens_q is None else torch.diff(cu_seqlens_q).tolist()
    pairs = list(zip(rows, keys))
    return dict(empty_query_requests=cu_seqlens_q is not None and 0 in rows,
                q_len_over_kv_len=any(r > k for r, k in pairs),
                rows_without_keys=any(r and (k == 0 or (masked and r > k)) for r, k in pairs))


def _sparse_rows(scopes) -> dict:
    """Whether some query row reads no key: every index -1 or past topk_len, in every scope."""
    if not all(_readable(indices) for indices, _ in scopes):
        return {}
    sees_a_key = None
    for indices, topk_len in scopes:
        read = indices != -1
        if topk_len is not None:
            read &= torch.arange(indices.shape[-1], device=indices.device) < topk_len.view(-1, 1, 1)
        row = read.any(-1)
        sees_a_key = row if sees_a_key is None else sees_a_key | row
    return dict(rows_without_keys=not bool(sees_a_key.all()))


def _paged(q, block_table, kv_lens, cu_seqlens_q, num_blocks, block_size) -> dict:
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        fail("block_table: expected an int32 tensor (B, max_blocks)")
    B, max_blocks = block_table.shape
    _is_int32("block_table", block_table, (B, max_blocks), "(B, max_blocks)", q.device)
    _is_int32("kv_lens", kv_lens, (B,), "(B,)", q.device)
    _in_range("kv_lens", kv_lens, 0, max_blocks * block_size, "lengths (block_table holds max_blocks x block_size)")
    if _readable(block_table) and B:
        pages = -(-kv_lens.long() // block_size)
        used = torch.arange(max_blocks, device=q.device)[None, :] < pages[:, None]
        _in_range("block_table", block_table[used], 0, num_blocks - 1, "page numbers of the blocks kv_lens uses")
    if cu_seqlens_q is None:
        if q.shape[0] != B:
            fail(f"q: expected batch B={B} (block_table's rows), got {q.shape[0]}")
        q_len = q.shape[1]
    else:
        _is_int32("cu_seqlens_q", cu_seqlens_q, (B + 1,), "(B + 1,)", q.device)
        if _readable(cu_seqlens_q):
            bounds = cu_seqlens_q.tolist()
            if bounds[0] != 0 or bounds[-1] != q.shape[0] or any(b < a for a, b in zip(bounds, bounds[1:])):
                fail(f"cu_seqlens_q: expected 0, then non-decreasing, ending at total_q={q.shape[0]}, "
                      f"got {bounds[:8]}{' ...' if len(bounds) > 8 else ''}")
            q_len = max((b - a for a, b in zip(bounds, bounds[1:])), default=0)
        else:
            q_len = q.shape[0]
    kv_len = int(kv_lens.max()) if B and _readable(kv_lens) else max_blocks * block_size
    return dict(source="paged", ragged=cu_seqlens_q is not None, batch=B, q_len=q_len, kv_len=kv_len)


def _sparse(name: str, len_name: str, indices, topk_len, B: int, T: int, slots: int, device) -> int:
    if not isinstance(indices, torch.Tensor) or indices.dim() != 3:
        fail(f"{name}: expected an int32 tensor (B, T, topk)")
    topk = indices.shape[2]
    _is_int32(name, indices, (B, T, topk), "(B, T, topk)", device)
    _in_range(name, indices, -1, slots - 1, "cache slots (block * block_size + offset) or -1")
    if topk_len is not None:
        _is_int32(len_name, topk_len, (B,), "(B,)", device)
        _in_range(len_name, topk_len, 0, topk, "index counts")
    return topk


def output_shape(problem: Problem, total_q: int | None = None) -> tuple:
    """o's shape for `problem`: (B, T, Hq, Dv), or (total_q, Hq, Dv) for ragged queries."""
    if problem.ragged:
        return (total_q, problem.heads_q, problem.head_dim_v)
    return (problem.batch, problem.q_len, problem.heads_q, problem.head_dim_v)
