"""DeepSeek's FlashMLA, SM90 sparse decode (DeepSeek-V4's `flash_mla.flash_mla_with_kvcache`
with indices), as a contract-v2 kernel: `flashmla`.

FlashMLA has no wheel: build it from source (deepseek-ai/FlashMLA; its SM90 decode kernels
alone build in about 90 s on a 16-core H200 machine), then `import flash_mla` must work. Until
then the kernel is listed as unavailable with that reason and every test of it is a skip.

What the adapter translates (read from FlashMLA's `flash_mla_interface.py` and
`csrc/api/sparse_decode.h`):
- the call is the contract's: q (B, T, Hq, 512) bf16; the `dsv4-fp8` cache is FlashMLA's own
  MODEL1 layout, byte for byte, as a uint8 (num_blocks, block_size, 1, 584) tensor; indices
  (B, T, top-k) int32 physical slots with -1 for no key; `topk_len` (B,) int32; a second
  scope with its own cache, indices and lengths; the sink one float32 logit per query head;
- its LSE leaves the sink out (it scales the output by exp(lse) / (exp(lse) + exp(sink))
  instead) and is +inf for a row with no key: `conventions.lse_from_sink_excluded`;
- its limits, declared as capabilities (a call outside them is a NotSupportedError naming
  each; the named cases are re-laid inside them): Hq 64 or 128, one KV head, head dim 512
  for K and V (K = V), FP8 caches in both scopes (no bf16 or FP4 sparse decode), each
  scope's top-k a multiple of 64; bf16 q and o.

FlashMLA checks that a page's token rows are contiguous, not that pages are 16-byte aligned:
a cache with its pages packed together (off the layout, which pads them to 576 bytes; one of
fmha's laws built one) faults with a misaligned address. The contract's validation refuses
such a cache by name before any kernel sees it.

What it did through the suite on an H200: BENCHMARKS.md, "Other libraries through their adapters".
"""

from __future__ import annotations

import importlib

import torch

from fmha.adapters.conventions import lse_from_sink_excluded
from fmha.adapters.libraries import availability_of, written_to
from fmha.contract import Capabilities, KernelEntry, check_attention_args, plain_scalars

INSTALL = ("FlashMLA is not installed (no wheel): build deepseek-ai/FlashMLA from source on a Hopper machine "
           "with nvcc, so that `import flash_mla` works")

CAPABILITIES = Capabilities(
    head_dims=(512,), dtypes=(torch.bfloat16,), devices=("cuda",), heads_q=(64, 128),
    features=frozenset({"sink", "lse", "gqa", "shared_kv", "out"}), requires=frozenset({"shared_kv"}),
    split_head_dim_v=False, sources=frozenset({"sparse", "two_scopes"}), topk_multiple_of=64,
    cache_layouts=frozenset({"dsv4-fp8"}), unquantized_caches=False,
    notes={"dense": "FlashMLA's sparse decode reads keys through indices only",
           "paged": "FlashMLA's sparse decode reads keys through indices only",
           "causal": "the indices alone decide which keys a row sees", "window": "the indices decide",
           "split_head_dim_v": "K = V, head dim 512", "heads_q": "its sparse decode has kernels for Hq 64 and 128",
           "topk_multiple_of": "it reads each scope's indices in blocks of 64",
           "cache_layout": "FP8 caches only, in both scopes (no bf16 or FP4 sparse decode)"},
)


def sparse_decode_with(capabilities: Capabilities, library=lambda: importlib.import_module("flash_mla")):
    """The contract call over `library()` (FlashMLA, or a stand-in with its API)."""

    def flashmla(q, k_cache, v_cache, *, indices, topk_len=None, extra_k_cache=None, extra_indices=None,
                 extra_topk_len=None, cache_layout=None, extra_cache_layout=None, scale=None, causal=False,
                 window=None, sink=None, out=None):
        check_attention_args(q, k_cache, v_cache, scale=scale, causal=causal, window=window, sink=sink, out=out,
                             indices=indices, topk_len=topk_len, extra_k_cache=extra_k_cache,
                             extra_indices=extra_indices, extra_topk_len=extra_topk_len, cache_layout=cache_layout,
                             extra_cache_layout=extra_cache_layout, capabilities=capabilities)
        scale = plain_scalars(scale, causal, window)[0]
        flash_mla = library()
        schedule, _ = flash_mla.get_mla_metadata()
        o, lse = flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, None, 512, schedule, None, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
            indices=indices, attn_sink=sink, extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices,
            topk_length=topk_len, extra_topk_length=extra_topk_len)
        return written_to(out, o), lse_from_sink_excluded(lse, sink)

    return flashmla


def _sm90() -> str | None:
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        return f"FlashMLA's sparse decode built here is for SM90 (Hopper); this GPU is SM{''.join(map(str, capability))}"
    return None


availability = availability_of("flash_mla", INSTALL, _sm90)


ENTRIES = [
    KernelEntry(name="flashmla", fn=sparse_decode_with(CAPABILITIES), capabilities=CAPABILITIES,
                availability=availability, default_devices=(),
                description="DeepSeek's FlashMLA sparse decode (SM90, FP8 caches, Hq 64/128), built from source"),
]
