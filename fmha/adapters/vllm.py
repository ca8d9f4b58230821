"""vLLM's Triton `unified_attention` (the paged, ragged attention of its Triton backend), as a
contract-v2 kernel: `vllm-unified`.

`pip install vllm`; until then the kernel is listed as unavailable with that reason and every
test of it is a skip.

What the adapter translates (read from vLLM's `v1/attention/ops/triton_unified_attention.py`):
- the call is fmha's paged call with other names: q packed (total_q, Hq, D) with
  `cu_seqlens_q` (a batch of T rows each becomes B * T packed rows), `seqused_k` = kv_lens,
  `block_table`, the cache (num_blocks, block_size, Hkv, D) as fmha's; it writes `out`, which
  the caller allocates;
- the window: `window_size = (w - 1, 0)` (keys left of the current one; (-1, -1) for none);
- the sink: `sinks`, one float32 logit per query head, joins the denominator as fmha's does.

Limits declared: causal calls only (it asserts `causal`), each request with at least as many
keys as query rows (its queries are the last of their request's keys), bf16 and fp16, no LSE
(it returns none).

Checked on the CPU tier against a stand-in that follows the source above
(tests/test_adapters_paged.py). The named case `zero-query-request` encodes the bug a
hand-written probe found in it (a ragged decode batch with a request of no query rows before its
decodes gave those decodes wrong rows); `python -m fmha.ci.verify --fmha-kernel vllm-unified
--fmha-device cuda` runs it. Where it has run: BENCHMARKS.md, "Other libraries through their adapters".
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from fmha.adapters.conventions import keys_left_of_current, packed_queries
from fmha.adapters.libraries import availability_of, written_to
from fmha.contract import Capabilities, KernelEntry, check_attention_args, plain_scalars

INSTALL = "vLLM is not installed: pip install vllm (`pip install '<fmha clone>[vllm]'` brings it)"
MODULES = ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention")

CAPABILITIES = Capabilities(
    dtypes=(torch.bfloat16, torch.float16), devices=("cuda",),
    features=frozenset({"causal", "window", "sink", "gqa", "shared_kv", "out"}), requires=frozenset({"causal"}),
    split_head_dim_v=False, q_len_at_most_kv_len=True, sources=frozenset({"paged", "ragged"}),
    notes={"lse": "unified_attention returns no LSE", "requires": "it asserts causal",
           "dense": "it reads a paged cache", "sparse": "no index-sparse call", "dtype": "the serving dtypes",
           "split_head_dim_v": "one head size", "q_len_at_most_kv_len": "a request's queries are its last keys"},
)


def _library():
    for name in MODULES:
        if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None:
            return importlib.import_module(name)
    raise ImportError(INSTALL)


def unified_with(capabilities: Capabilities, library=_library):
    """The contract's paged call over `library().unified_attention` (vLLM's, or a stand-in)."""

    def vllm_unified(q, k_cache, v_cache, *, block_table, kv_lens, cu_seqlens_q=None, scale=None, causal=False,
                     window=None, sink=None, out=None):
        p = check_attention_args(q, k_cache, v_cache, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                 block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                                 capabilities=capabilities)
        scale, causal, window = plain_scalars(scale, causal, window)
        packed, starts = packed_queries(q, cu_seqlens_q)
        o = torch.empty(*packed.shape[:2], p.head_dim_v, dtype=q.dtype, device=q.device)
        window_size = (keys_left_of_current(window), -1 if window is None else 0)
        library().unified_attention(  # softcap 0, no q/k/v descales
            packed, k_cache, v_cache, o, starts, p.q_len, kv_lens, p.kv_len,
            scale if scale is not None else p.head_dim ** -0.5, True, window_size, block_table, 0.0, None, None, None,
            sinks=sink)
        return written_to(out, o if p.ragged else o.unflatten(0, (p.batch, p.q_len))), None

    return vllm_unified


availability = availability_of("vllm", INSTALL)


ENTRIES = [
    KernelEntry(name="vllm-unified", fn=unified_with(CAPABILITIES), capabilities=CAPABILITIES,
                availability=availability, default_devices=(),
                description="vLLM's Triton unified_attention over a paged KV cache, packed queries (vllm)"),
]
