"""FlashInfer's paged-KV attention (`flashinfer-python`), as contract-v2 kernels:
`flashinfer-decode` (BatchDecodeWithPagedKVCacheWrapper) and `flashinfer-prefill`
(BatchPrefillWithPagedKVCacheWrapper, ragged queries too).

`pip install flashinfer-python` (it JIT-builds its kernels with nvcc on first use); until then
both kernels are listed as unavailable with that reason and every test of them is a skip.

What the adapter translates (read from FlashInfer 0.7's `decode.py` and `prefill.py`):
- the page table: fmha's block table and kv lengths become FlashInfer's CSR page table
  (indptr, indices, last_page_len): `conventions.csr_page_table`; the cache is its NHD
  layout, (num_pages, page_size, Hkv, D), which is fmha's, passed as (k_cache, v_cache);
- the window: `window_left` counts the keys left of the current one (w - 1);
- its LSE is base 2 and laid out (rows, Hq): `conventions.lse_from_base2`, then fmha's
  (B, Hq, T), or (Hq, total_q) for packed queries;
- queries: decode takes (B, Hq, D), one row a request; prefill takes packed rows with
  `qo_indptr`, which is fmha's `cu_seqlens_q` (a batch of T rows each becomes B * T packed).

Limits declared (a call outside them is a NotSupportedError naming each): bf16 and fp16, head
dims 64, 128, 256, Dv = D, no sink (the FA2/FA3 paths it uses on Hopper have none), a request
with query rows has at least one key (its page table's last_page_len is 1 to page_size).

What they did through the suite on an H200: BENCHMARKS.md, "Other libraries through their adapters".
"""

from __future__ import annotations

import functools
import importlib

import torch

from fmha.adapters.conventions import csr_page_table, keys_left_of_current, lse_from_base2, packed_queries
from fmha.adapters.libraries import availability_of, written_to
from fmha.contract import Capabilities, KernelEntry, check_attention_args, plain_scalars

INSTALL = ("FlashInfer is not installed: pip install flashinfer-python (JIT-builds its kernels with nvcc on first "
           "use; `pip install '<fmha clone>[flashinfer]'` brings it)")
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's examples allocate 128 MB

_NOTES = {"dense": "FlashInfer's wrappers read a paged cache", "sink": "its FA2/FA3 paths on Hopper take no sink",
          "dtype": "fp16 and bf16 kernels only", "head_dim": "its prebuilt head dims",
          "split_head_dim_v": "Dv = D", "empty_rows": "a request with query rows has 1 to page_size keys on its "
                                                      "last page (last_page_len >= 1)",
          "sparse": "no index-sparse call"}
DECODE = Capabilities(
    head_dims=(64, 128, 256), dtypes=(torch.bfloat16, torch.float16), devices=("cuda",), max_q_len=1,
    features=frozenset({"causal", "window", "lse", "gqa", "shared_kv", "out"}), split_head_dim_v=False,
    empty_rows=False, sources=frozenset({"paged"}),
    notes={**_NOTES, "max_q_len": "one query row a request (decode)", "ragged": "decode: one row a request"},
)
PREFILL = Capabilities(
    head_dims=(64, 128, 256), dtypes=(torch.bfloat16, torch.float16), devices=("cuda",),
    features=frozenset({"causal", "window", "lse", "gqa", "shared_kv", "out"}), split_head_dim_v=False,
    empty_rows=False, sources=frozenset({"paged", "ragged"}), notes=_NOTES,
)


@functools.cache
def _workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def decode_with(capabilities: Capabilities, library=lambda: importlib.import_module("flashinfer")):
    """The contract's paged decode call over `library()` (FlashInfer, or a stand-in with its API)."""

    def flashinfer_decode(q, k_cache, v_cache, *, block_table, kv_lens, cu_seqlens_q=None, scale=None, causal=False,
                          window=None, sink=None, out=None):
        p = check_attention_args(q, k_cache, v_cache, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                 block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                                 capabilities=capabilities)
        scale, causal, window = plain_scalars(scale, causal, window)
        wrapper = library().BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), "NHD", use_tensor_cores=True)
        wrapper.plan(*csr_page_table(block_table, kv_lens, p.block_size), p.heads_q, p.heads_kv, p.head_dim,
                     p.block_size, window_left=keys_left_of_current(window), q_data_type=q.dtype,
                     kv_data_type=k_cache.dtype, sm_scale=scale)
        o, lse = wrapper.run(q[:, 0], (k_cache, v_cache), return_lse=True)  # (B, Hq, D), (B, Hq)
        return written_to(out, o[:, None]), lse_from_base2(lse.float())[:, :, None]

    return flashinfer_decode


def prefill_with(capabilities: Capabilities, library=lambda: importlib.import_module("flashinfer")):
    """The contract's paged (and packed) prefill call over `library()`."""

    def flashinfer_prefill(q, k_cache, v_cache, *, block_table, kv_lens, cu_seqlens_q=None, scale=None,
                           causal=False, window=None, sink=None, out=None):
        p = check_attention_args(q, k_cache, v_cache, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                 block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                                 capabilities=capabilities)
        scale, causal, window = plain_scalars(scale, causal, window)
        packed, qo_indptr = packed_queries(q, cu_seqlens_q)
        wrapper = library().BatchPrefillWithPagedKVCacheWrapper(_workspace(q.device), "NHD")
        wrapper.plan(qo_indptr, *csr_page_table(block_table, kv_lens, p.block_size), p.heads_q, p.heads_kv,
                     p.head_dim, p.block_size, causal=causal, window_left=keys_left_of_current(window),
                     q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=scale)
        o, lse = wrapper.run(packed, (k_cache, v_cache), return_lse=True)  # (rows, Hq, D), (rows, Hq)
        lse = lse_from_base2(lse.float()).transpose(0, 1)  # (Hq, rows): fmha's packed layout
        if not p.ragged:
            o, lse = o.unflatten(0, (p.batch, p.q_len)), lse.unflatten(1, (p.batch, p.q_len)).transpose(0, 1)
        return written_to(out, o), lse.contiguous()

    return flashinfer_prefill


availability = availability_of("flashinfer", INSTALL)


ENTRIES = [
    KernelEntry(name="flashinfer-decode", fn=decode_with(DECODE), capabilities=DECODE, availability=availability,
                default_devices=(), description="FlashInfer's batch decode over a paged KV cache (flashinfer-python)"),
    KernelEntry(name="flashinfer-prefill", fn=prefill_with(PREFILL), capabilities=PREFILL, availability=availability,
                default_devices=(),
                description="FlashInfer's batch prefill over a paged KV cache, packed queries too (flashinfer-python)"),
]
