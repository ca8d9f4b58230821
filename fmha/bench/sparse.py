"""DeepSeek-V4's sparse decode for `python -m fmha.bench --sparse`: shapes, inputs, floor, contenders.

A call: Hq query heads on one K = V head of dim 512, T query rows per request, each row's
top-k keys by index over two FP8 caches (dsv4-fp8 pages of 64 tokens: the window scope of 128
keys, then the compressed scope), a sink. Ours reads the FP8 bytes. The others gather first:
the gather reads a bf16 copy of the caches dequantized outside the timed region (a cost they
are spared: the comparison is generous to them), then runs a dense kernel on the gathered keys
(one request row per batch entry); SDPA and Flex have no sink term and are timed without it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fmha.contract.cache_layouts import CacheLayout
from fmha.oracles import quantization
from fmha.contract import Problem

WINDOW_TOPK = 128
BLOCK_SIZE = 64


def _problem(batch: int, q_len: int, extra_topk: int) -> Problem:
    return Problem(batch=batch, q_len=q_len, kv_len=WINDOW_TOPK, heads_q=128, heads_kv=1, head_dim=512, shared_kv=True,
                   sink=True, source="sparse", block_size=BLOCK_SIZE, cache_layout="dsv4-fp8", extra_topk=extra_topk,
                   extra_block_size=BLOCK_SIZE, extra_cache_layout="dsv4-fp8")


SHAPES = {f"DSV4 sparse decode B{b} Hq128 T{t} top-k 128+{k} FP8": _problem(b, t, k)
          for b in (64, 256) for k in (512, 1024) for t in (1, 2)}


def keys_per_row(p: Problem) -> int:
    return p.kv_len + p.extra_topk


def flops(p: Problem) -> float:
    return 2.0 * p.batch * p.q_len * p.heads_q * keys_per_row(p) * (p.head_dim + p.head_dim_v)


def bytes_moved(p: Problem) -> float:
    """The gathered keys (their bytes and scales), q and o in bf16, the fp32 LSE."""
    rows = p.batch * p.q_len
    layouts = quantization.LAYOUTS
    keys = p.kv_len * layouts[p.cache_layout].token_bytes + p.extra_topk * layouts[p.extra_cache_layout].token_bytes
    return rows * keys + rows * p.heads_q * (2 * (p.head_dim + p.head_dim_v) + 4)


def _scope(g, batch: int, q_len: int, topk: int, cache_tokens: int, spec: CacheLayout):
    """A cache of `cache_tokens` keys per request (quantized pages and their bf16 values) and
    each row's `topk` distinct slots in its own request's keys."""
    tokens = batch * cache_tokens
    values = torch.randn(tokens // BLOCK_SIZE, BLOCK_SIZE, 1, spec.head_dim, generator=g, device="cuda")
    pages = quantization.quantize(values.to(torch.bfloat16), spec)
    k_cache = pages[:, :BLOCK_SIZE * spec.token_bytes].view(-1, BLOCK_SIZE, 1, spec.token_bytes)
    dense = quantization.dequantize(pages, spec, BLOCK_SIZE).to(torch.bfloat16).view(tokens, spec.head_dim)
    pick = torch.rand(batch, q_len, cache_tokens, generator=g, device="cuda").argsort(-1)[..., :topk]
    indices = (pick + torch.arange(batch, device="cuda")[:, None, None] * cache_tokens).to(torch.int32)
    return k_cache, dense, indices


def inputs(p: Problem) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    layouts = quantization.LAYOUTS
    k_cache, window_keys, indices = _scope(g, p.batch, p.q_len, p.kv_len, p.kv_len, layouts[p.cache_layout])
    extra_cache, extra_keys, extra_indices = _scope(g, p.batch, p.q_len, p.extra_topk, 2 * p.extra_topk,
                                                    layouts[p.extra_cache_layout])
    q = torch.randn(p.batch, p.q_len, p.heads_q, p.head_dim, generator=g, device="cuda").to(torch.bfloat16)
    sink = torch.rand(p.heads_q, generator=g, device="cuda") * 5 - 2
    return dict(q=q, sink=sink, k_cache=k_cache, indices=indices, extra_k_cache=extra_cache,
                extra_indices=extra_indices, window_keys=window_keys, extra_keys=extra_keys)


def _ours(p: Problem, x: dict, implementation=None):
    from fmha import dispatch

    out = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=torch.bfloat16, device="cuda")
    return lambda: dispatch.attention(x["q"], x["k_cache"], x["k_cache"], indices=x["indices"], sink=x["sink"],
                                      extra_k_cache=x["extra_k_cache"], extra_indices=x["extra_indices"],
                                      cache_layout=p.cache_layout, extra_cache_layout=p.extra_cache_layout, out=out,
                                      implementation=implementation)


def _flashmla(p: Problem, x: dict):
    """DeepSeek's FlashMLA sparse decode as DSV4 calls it (its schedule made outside the timed
    region); where `flash_mla` is not importable the row says so. Build it with FlashMLA's
    sources on a Hopper machine (README, "Verify FlashMLA, FlashInfer or vLLM")."""
    import flash_mla

    schedule, _ = flash_mla.get_mla_metadata()
    return lambda: flash_mla.flash_mla_with_kvcache(
        x["q"], x["k_cache"], None, None, 512, schedule, None, is_fp8_kvcache=True, indices=x["indices"],
        attn_sink=x["sink"], extra_k_cache=x["extra_k_cache"], extra_indices_in_kvcache=x["extra_indices"])


def _gathered(p: Problem, x: dict) -> torch.Tensor:
    """Each row's keys of both scopes as one dense K = V (B * T, top-k, 1, 512)."""
    rows = p.batch * p.q_len
    window = x["window_keys"][x["indices"].view(rows, -1)]
    extra = x["extra_keys"][x["extra_indices"].view(rows, -1)]
    return torch.cat([window, extra], dim=1)[:, :, None, :]


def _gather_then_ours(p: Problem, x: dict):
    from fmha import dispatch

    q = x["q"].reshape(p.batch * p.q_len, 1, p.heads_q, p.head_dim)
    out = torch.empty_like(q)

    def run():
        keys = _gathered(p, x)
        return dispatch.attention(q, keys, keys, sink=x["sink"], out=out)
    return run


def _gather_then_sdpa(backend_name: str):
    def make(p: Problem, x: dict):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = x["q"].reshape(p.batch * p.q_len, 1, p.heads_q, p.head_dim).transpose(1, 2)
        backend = getattr(SDPBackend, backend_name)

        def run():
            keys = _gathered(p, x).transpose(1, 2).expand(-1, p.heads_q, -1, -1)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, keys, keys)
        return run
    return make


def _gather_then_flex(p: Problem, x: dict):
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    q = x["q"].reshape(p.batch * p.q_len, 1, p.heads_q, p.head_dim).transpose(1, 2)

    def run():
        keys = _gathered(p, x).transpose(1, 2)
        return compiled(q, keys, keys, enable_gqa=True)
    return run


CONTENDERS = {
    "fmha": _ours,  # fmha.attention: the Gluon sparse-decode kernel on Hopper
    "FlashMLA": _flashmla,
    "fmha, CUDA": lambda p, x: _ours(p, x, implementation="cuda-sparse"),  # fmha.kernels.cuda_sparse
    "fmha, Triton": lambda p, x: _ours(p, x, implementation="triton"),  # fmha.kernels.triton_paged
    "gather + fmha dense": _gather_then_ours,
    "gather + sdpa efficient": _gather_then_sdpa("EFFICIENT_ATTENTION"),
    "gather + sdpa cudnn": _gather_then_sdpa("CUDNN_ATTENTION"),
    "gather + sdpa math": _gather_then_sdpa("MATH"),
    "gather + flex": _gather_then_flex,
}
