"""Contract v2 end to end on the CPU: samples (paged, ragged, index-sparse, two scopes,
quantized caches) through a kernel and the verdict. The reference kernel and the
gather-then-SDPA adapter pass; throwaway kernels with the bugs paged and sparse kernels have
shipped (a block table read with one request's row, the last partial page read whole, -1 read
as slot 0, topk_len ignored, a request with no keys giving NaN, the sink counted once per
scope, an FP8 scale applied to the wrong tile, the bf16 rope dims read as FP8) fail."""

import pytest
import torch

from fmha.adapters.paged import reference
from fmha.capabilities import KernelEntry
from fmha.oracles import quantization
from fmha.oracles.check import check_sample
from fmha.oracles.reference import merge
from fmha.oracles.sample import Sample
from fmha.problem import Problem
from fmha.registry import KERNELS

PAGED = Problem(batch=3, q_len=2, kv_len=9, heads_q=4, heads_kv=2, head_dim=16, head_dim_v=8, causal=True,
                source="paged", block_size=4)
SPARSE = Problem(batch=2, q_len=2, kv_len=6, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True, sink=True,
                 source="sparse", block_size=5, cache_layout="dsv4-fp8")
TWO_SCOPES = SPARSE.replace(extra_topk=4, extra_block_size=2, extra_cache_layout="dsv4-fp4")

SAMPLES = {
    "paged": Sample(problem=PAGED, kv_lens=(9, 0, 5), shared_pages=True, seed=1),
    "paged-window": Sample(problem=PAGED.replace(window=3, dtype=torch.float16), kv_lens=(6, 9, 1), seed=2),
    "ragged": Sample(problem=PAGED.replace(ragged=True), kv_lens=(9, 3, 5), q_lens=(2, 0, 1), seed=3),
    "paged-block1": Sample(problem=PAGED.replace(block_size=1, dtype=torch.float32), kv_lens=(2, 9, 4), seed=4),
    "sparse": Sample(problem=SPARSE, topk_lens=(6, 3), invalid=0.25, seed=5),
    "two-scopes": Sample(problem=TWO_SCOPES, topk_lens=(6, 0), extra_topk_lens=(4, 2), invalid=0.2, seed=6),
}


def _entry(fn, like="reference"):
    return KernelEntry(name=fn.__name__, fn=fn, capabilities=KERNELS[like].capabilities)


@pytest.mark.parametrize("name", SAMPLES)
def test_the_reference_kernel_passes(name):
    verdict = check_sample(KERNELS["reference"], SAMPLES[name])
    assert verdict.passed, verdict.message(name)


@pytest.mark.parametrize("name", [n for n in SAMPLES if SAMPLES[n].problem.source == "paged"])
def test_gathering_the_pages_then_sdpa_passes(name):
    verdict = check_sample(KERNELS["sdpa-paged"], SAMPLES[name])
    assert verdict.passed, verdict.message(name)


# -- kernels with the bugs ------------------------------------------------------------------

def one_table_row(q, k, v, *, block_table, **kw):
    return reference(q, k, v, block_table=block_table[:1].expand_as(block_table).contiguous(), **kw)


def whole_last_page(q, k, v, *, block_table, kv_lens, **kw):
    block_size = k.shape[1]
    pages = -(-kv_lens // block_size)
    return reference(q, k, v, block_table=block_table, kv_lens=(pages * block_size).to(torch.int32), **kw)


def no_keys_nan(q, k, v, *, kv_lens, **kw):
    o, lse = reference(q, k, v, kv_lens=kv_lens, **kw)
    o[kv_lens == 0] = float("nan")  # 0 / 0: the row sum of a request with no keys
    return o, lse


def minus_one_is_slot_0(q, k, v, *, indices, extra_indices=None, **kw):
    extra = {} if extra_indices is None else dict(extra_indices=extra_indices.clamp(min=0))
    return reference(q, k, v, indices=indices.clamp(min=0), **extra, **kw)


def topk_len_ignored(q, k, v, *, topk_len=None, extra_topk_len=None, **kw):
    return reference(q, k, v, **kw)


def sink_per_scope(q, k, v, *, sink, extra_k_cache, extra_indices, extra_topk_len=None, extra_cache_layout=None,
                   out=None, **kw):
    """Each scope's attention with the sink, merged: the sink joins the denominator twice."""
    main = reference(q, k, v, sink=sink, **kw)
    extra = reference(q, extra_k_cache, extra_k_cache, sink=sink, indices=extra_indices, topk_len=extra_topk_len,
                      cache_layout=extra_cache_layout, scale=kw.get("scale"))
    o, lse = merge([main, extra])
    return out.copy_(o), lse.float()


def _decoded_as(k, layout, wrong):
    """The cache decoded with one mistake, as a bf16 cache (every value is a bf16 value)."""
    spec = quantization.LAYOUTS[layout]
    num_blocks, block_size = k.shape[:2]
    pages = k.as_strided((num_blocks, block_size * spec.token_bytes), (k.stride(0), 1)).clone()
    data = pages[:, :block_size * spec.data_bytes].view(num_blocks, block_size, spec.data_bytes)
    scales = pages[:, block_size * spec.data_bytes:].view(num_blocks, block_size, spec.scale_bytes)
    if wrong == "scale tile":
        scales[..., [0, 1]] = scales[..., [1, 0]].clone()
        return quantization.dequantize(pages, spec, block_size).to(torch.bfloat16)
    values = quantization.dequantize(pages, spec, block_size)
    rope_as_fp8 = quantization.decode(data[..., -spec.rope_dims:].long(), quantization.E4M3)  # the first 64 bytes
    values[:, :, 0, spec.quantized_dims:] = rope_as_fp8
    return values.to(torch.bfloat16)


def fp8_scale_of_the_next_tile(q, k, v, *, cache_layout, **kw):
    cache = _decoded_as(k, cache_layout, "scale tile")
    return reference(q, cache, cache, **kw)


def rope_read_as_fp8(q, k, v, *, cache_layout, **kw):
    cache = _decoded_as(k, cache_layout, "rope")
    return reference(q, cache, cache, **kw)


BUGS = [
    (one_table_row, "paged"), (one_table_row, "ragged"), (whole_last_page, "paged"), (whole_last_page, "ragged"),
    (no_keys_nan, "paged"), (minus_one_is_slot_0, "sparse"), (minus_one_is_slot_0, "two-scopes"),
    (topk_len_ignored, "sparse"), (topk_len_ignored, "two-scopes"), (sink_per_scope, "two-scopes"),
    (fp8_scale_of_the_next_tile, "sparse"), (rope_read_as_fp8, "sparse"),
]


@pytest.mark.parametrize("bug, name", BUGS, ids=[f"{bug.__name__}-{name}" for bug, name in BUGS])
def test_a_kernel_with_a_shipped_bug_fails_the_verdict(bug, name):
    verdict = check_sample(_entry(bug), SAMPLES[name])
    assert not verdict.passed, f"{bug.__name__} passed {name}: {verdict.message()}"
