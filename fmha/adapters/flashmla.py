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
- its limits, refused with a NotSupportedError naming each: Hq 64 or 128, one KV head, head
  dim 512 for K and V (K = V), FP8 caches in both scopes (no bf16 or FP4 sparse decode), a
  main top-k that is a multiple of 64; bf16 q and o.

On an H200 with FlashMLA 9241ae3 built (2026-12-03, `pytest -n 8 regressions/test_traps.py
properties/test_laws.py --fmha-kernel flashmla --fmha-device cuda`): 12 passed, 150 skipped, 9
failed. The skips: the named sparse cases are drawn with Hq 8 and top-k under 64, which it
refuses (they are not yet re-laid within its limits). The failures are one draw, keys scaled by
2^96 (ue8m0 scales toward the top of their range): 17408 NaN outputs where the oracle is
finite; and two laws whose draws left the CUDA context unusable (an illegal memory access, not
yet reduced to a reproducer).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch

from fmha.adapters.conventions import lse_from_sink_excluded
from fmha.contract import Capabilities, KernelEntry, NotSupportedError, check_attention_args

HEADS_Q = (64, 128)
TOPK_MULTIPLE = 64
INSTALL = ("FlashMLA is not installed (no wheel): build deepseek-ai/FlashMLA from source on a Hopper machine "
           "with nvcc, so that `import flash_mla` works")

CAPABILITIES = Capabilities(
    head_dims=(512,), dtypes=(torch.bfloat16,), devices=("cuda",),
    features=frozenset({"sink", "lse", "gqa", "shared_kv", "out"}), requires=frozenset({"shared_kv"}),
    split_head_dim_v=False, sources=frozenset({"sparse", "two_scopes"}), cache_layouts=frozenset({"dsv4-fp8"}),
    notes={"dense": "FlashMLA's sparse decode reads keys through indices only",
           "paged": "FlashMLA's sparse decode reads keys through indices only",
           "causal": "the indices alone decide which keys a row sees", "window": "the indices decide",
           "split_head_dim_v": "K = V, head dim 512", "cache_layout": "FP8 caches only, in both scopes"},
)


def refusals(q: torch.Tensor, indices: torch.Tensor, cache_layout, extra_k_cache, extra_cache_layout) -> list[str]:
    """FlashMLA's limits the contract's capabilities cannot say (they refuse FP4 caches), each
    with its reason."""
    found = []
    if q.shape[-2] not in HEADS_Q:
        found.append(f"Hq={q.shape[-2]}: FlashMLA's sparse decode has kernels for Hq 64 and 128 only")
    if indices.shape[-1] % TOPK_MULTIPLE:
        found.append(f"top-k {indices.shape[-1]}: FlashMLA's main scope reads indices in blocks of {TOPK_MULTIPLE}")
    if cache_layout is None or (extra_k_cache is not None and extra_cache_layout is None):
        found.append("a bf16 cache: FlashMLA's sparse decode reads dsv4-fp8 caches only")
    return found


def sparse_decode_with(capabilities: Capabilities, library=lambda: importlib.import_module("flash_mla")):
    """The contract call over `library()` (FlashMLA, or a stand-in with its API)."""

    def flashmla(q, k_cache, v_cache, *, indices, topk_len=None, extra_k_cache=None, extra_indices=None,
                 extra_topk_len=None, cache_layout=None, extra_cache_layout=None, scale=None, causal=False,
                 window=None, sink=None, out=None):
        check_attention_args(q, k_cache, v_cache, scale=scale, causal=causal, window=window, sink=sink, out=out,
                             indices=indices, topk_len=topk_len, extra_k_cache=extra_k_cache,
                             extra_indices=extra_indices, extra_topk_len=extra_topk_len, cache_layout=cache_layout,
                             extra_cache_layout=extra_cache_layout, capabilities=capabilities)
        refused = refusals(q, indices, cache_layout, extra_k_cache, extra_cache_layout)
        if refused:
            raise NotSupportedError("; ".join(refused))
        flash_mla = library()
        schedule, _ = flash_mla.get_mla_metadata()
        o, lse = flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, None, 512, schedule, None, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
            indices=indices, attn_sink=sink, extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices,
            topk_length=topk_len, extra_topk_length=extra_topk_len)
        lse = lse_from_sink_excluded(lse, sink)
        if out is not None:
            out.copy_(o)
            o = out
        return o, lse

    return flashmla


@functools.cache
def availability(device) -> str | None:
    if importlib.util.find_spec("flash_mla") is None:
        return INSTALL
    if getattr(device, "type", device) != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"FlashMLA's sparse decode built here is for SM90 (Hopper); this GPU is SM{''.join(map(str, torch.cuda.get_device_capability()))}"
    return None


ENTRIES = [
    KernelEntry(name="flashmla", fn=sparse_decode_with(CAPABILITIES), capabilities=CAPABILITIES,
                availability=availability, default_devices=(),
                description="DeepSeek's FlashMLA sparse decode (SM90, FP8 caches, Hq 64/128), built from source"),
]
