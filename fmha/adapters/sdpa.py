"""PyTorch scaled_dot_product_attention backends, adapted to the fmha contract.

Translation notes:
- layout: the contract is (B, T, H, D); SDPA wants (B, H, T, D): transposed views.
- causal: SDPA's `is_causal` is top-left aligned; the contract is bottom-right. Masks are
  built here for the contract's positions (row i at S - T + i) and passed as `attn_mask`
  (CPU flash takes an additive float mask, the others a bool mask).
- GQA/MQA: KV heads are repeated to Hq heads (every backend accepts that).
- sink and LSE: only the CPU flash kernel returns an LSE; the sink is added afterwards from
  it, as a D5 merge with an empty part: o *= exp(lse - L), L = logaddexp(lse, sink).
- keys no row sees: every backend gives a masked key a weight of 0 and still multiplies its
  value, so a NaN in a key left of every row's window (which the contract lets hold anything)
  reaches the output (measured: Problem(batch=1, q_len=1, kv_len=2, heads_q=1, heads_kv=1,
  head_dim=16, window=1, bf16) gives o NaN in all 16 elements, torch 2.13 CPU math and flash,
  2026-11-29; the math, efficient and cuDNN backends and Flex the same on an H200, torch 2.11,
  2026-12-01). The adapters pass only the keys some row sees (`conventions.keys_some_row_sees`).
- storage: the CUDA backends take views whose storage offset and strides are multiples of 16
  bytes and whose elements are their own; the contract allows any strides. On an H100 (the
  device image's torch, 2026-12-07) flash, efficient and cuDNN faulted with "misaligned
  address" on draws whose v shared elements across its dims (the process's CUDA context
  lost), and efficient refused a key at an unaligned stride ("key is not correctly aligned").
  The adapters pass such views as contiguous copies (`_as_cuda_sdpa_takes`), so the suite
  judges the backends' arithmetic; calling them with such views directly crashes.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fmha.contract import Capabilities, KernelEntry
from fmha.contract import NotSupportedError, check_attention_args, plain_scalars
from fmha.contract.validation import overlaps_itself
from fmha.adapters.conventions import keys_some_row_sees
from fmha.kernels.torch_merge import add_sink

NO_LSE = "SDPA's public API returns no LSE"
NO_SINK = "SDPA has no sink term and returns no LSE to add one afterwards"
UP_TO_256 = tuple(range(8, 257, 8))  # multiples of 8
CUDNN_EXPANDED_Q = ("sdpa-cudnn: a q with stride-0 (expanded) heads and Dv != D is refused: cuDNN raised \"The stride "
                    "for the last dimension ... should be 1 for output_names::O\" and the same call again crashed the "
                    "process (an H200, torch 2.11)")


def _mask(q_len: int, kv_len: int, causal: bool, window: int | None, device) -> torch.Tensor | None:
    """Bool (T, S): True where query row i (at position S - T + i) may see key j."""
    if not causal:
        return None
    row = torch.arange(q_len, device=device).view(-1, 1) + (kv_len - q_len)
    col = torch.arange(kv_len, device=device).view(1, -1)
    visible = col <= row
    if window is not None:
        visible = visible & (col > row - window)
    return visible


def _as_cuda_sdpa_takes(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a packed copy where its offset or a stride (past the last dim) is not a multiple of
    16 bytes, or its elements share memory (a dim's stride under what the dims inside it span).
    Every stride counts, a dim of one element's too: efficient checks it ("key is not correctly
    aligned (strideM)" at one key, H100, 2026-12-07), and `contiguous()` keeps it."""
    if t.device.type != "cuda":
        return t
    return packed_if_cuda_sdpa_refuses(t)


def packed_if_cuda_sdpa_refuses(t: torch.Tensor) -> torch.Tensor:
    size = t.element_size()
    unaligned = t.storage_offset() * size % 16 or any(stride * size % 16 for stride in t.stride()[:-1])
    return t.clone(memory_format=torch.contiguous_format) if unaligned or overlaps_itself(t, broadcast=False) else t


def _heads_first(q, k, v):
    group = q.shape[2] // k.shape[2]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _public_sdpa(backend: SDPBackend, entry_name: str):
    def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        check_attention_args(
            q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
            capabilities=KERNELS_BY_NAME[entry_name].capabilities_on(q.device.type),
        )
        scale, causal, window = plain_scalars(scale, causal, window)
        k, v = keys_some_row_sees(k, v, q.shape[1], window)  # SDPA's masked keys' values still enter P.V
        q, k, v = (_as_cuda_sdpa_takes(t) for t in (q, k, v))
        if backend == SDPBackend.FLASH_ATTENTION and causal and window is None:
            # Imported here: torch.nn.attention.bias imports torch._dynamo (1-5 s in every process).
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(q.shape[1], k.shape[1])  # flash takes no tensor mask
        else:
            mask = _mask(q.shape[1], k.shape[1], causal, window, q.device)
        if backend == SDPBackend.CUDNN_ATTENTION and 0 in q.stride() and v.shape[-1] != q.shape[-1]:
            raise NotSupportedError(CUDNN_EXPANDED_Q)
        qh, kh, vh = _heads_first(q, k, v)
        # A backend refuses some shapes its documented limits allow (cuDNN: one key); PyTorch
        # then says why in warnings and raises "No available kernel": a refusal, not a bug.
        with sdpa_kernel(backend), warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
            except RuntimeError as e:
                if "No available kernel" not in str(e):
                    raise
                why = [str(w.message).split(" (Triggered internally")[0] for w in said]
                raise NotSupportedError(f"{entry_name}: PyTorch has no kernel for this call: "
                                        + ("; ".join(why) or str(e))) from None
        return o.transpose(1, 2), None

    attention.__name__ = f"sdpa_{backend.name.lower()}"
    return attention


def _cpu_flash(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
    check_attention_args(
        q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
        capabilities=KERNELS_BY_NAME["sdpa-flash"].capabilities_on("cpu"),
    )
    scale, causal, window = plain_scalars(scale, causal, window)
    k, v = keys_some_row_sees(k, v, q.shape[1], window)
    visible = _mask(q.shape[1], k.shape[1], causal, window, q.device)
    additive = None
    if visible is not None:
        additive = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, float("-inf"))
    qh, kh, vh = _heads_first(q, k, v)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qh, kh, vh, 0.0, False, attn_mask=additive, scale=scale
    )
    o = o.transpose(1, 2)
    return add_sink(o, lse, sink)


def _cuda_available(device: str) -> str | None:
    if device == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    return None


CPU_FLASH = Capabilities(
    devices=("cpu",),
    features=frozenset({"causal", "window", "sink", "lse", "gqa", "shared_kv"}),
    empty_rows=False,
    empty_query_requests=False,
    split_head_dim_v=False,
    notes={
        "head_dim_v": "the CPU flash kernel needs Q/K/V of one head size",
        "empty_query_requests": "CPU flash kills the process (SIGFPE) on a call with no query rows (measured, torch "
                                "2.13: q of shape (1, 0, 2, 64))",
        "empty_rows": "CPU flash returns lse = 0, not -inf, for a row with no visible key (measured, torch 2.13)",
        "out": "the adapter does not take out=",
    },
)

ENTRIES = [
    KernelEntry(
        name="sdpa-math",
        fn=_public_sdpa(SDPBackend.MATH, "sdpa-math"),
        capabilities=Capabilities(
            features=frozenset({"causal", "window", "gqa", "shared_kv"}),
            notes={"lse": NO_LSE, "sink": NO_SINK, "out": "the adapter does not take out="},
        ),
        description="torch SDPA, math backend (eager ops; upcasts bf16/fp16 to fp32 on CPU)",
    ),
    KernelEntry(
        name="sdpa-flash",
        fn=lambda *a, **kw: (_cpu_flash if a[0].device.type == "cpu" else _CUDA_FLASH)(*a, **kw),
        capabilities=Capabilities(
            head_dims=UP_TO_256, dtypes=(torch.bfloat16, torch.float16), split_head_dim_v=False,
            features=frozenset({"causal", "gqa", "shared_kv"}),
            notes={"lse": NO_LSE, "sink": NO_SINK, "head_dim": "FlashAttention-2 stops at 256",
                   "window": "flash takes no attn_mask (causal goes through causal_lower_right)",
                   "out": "the adapter does not take out="},
        ),
        device_capabilities={"cpu": CPU_FLASH},
        availability=_cuda_available,
        description="torch SDPA, flash backend (FlashAttention-2 on CUDA, the CPU flash kernel on CPU)",
    ),
    KernelEntry(
        name="sdpa-efficient",
        fn=_public_sdpa(SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient"),
        capabilities=Capabilities(
            devices=("cuda",),
            features=frozenset({"causal", "window", "gqa", "shared_kv"}),
            notes={"device": "mem-efficient has no CPU kernel", "lse": NO_LSE, "sink": NO_SINK,
                   "out": "the adapter does not take out="},
        ),
        availability=_cuda_available,
        description="torch SDPA, memory-efficient backend (xformers kernels)",
    ),
    KernelEntry(
        name="sdpa-cudnn",
        fn=_public_sdpa(SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"),
        capabilities=Capabilities(
            devices=("cuda",), head_dims=UP_TO_256, dtypes=(torch.bfloat16, torch.float16),
            features=frozenset({"causal", "window", "gqa", "shared_kv"}), empty_rows=False,
            notes={"device": "cuDNN attention is CUDA only", "lse": NO_LSE, "sink": NO_SINK,
                   "empty_rows": "cuDNN returns garbage (|o| up to 1e40) in rows with no visible key "
                                 "(measured on an H200, torch 2.11)",
                   "head_dim": "cuDNN SDPA stops at 256", "out": "the adapter does not take out="},
        ),
        availability=_cuda_available,
        description="torch SDPA, cuDNN backend",
    ),
]

_CUDA_FLASH = _public_sdpa(SDPBackend.FLASH_ATTENTION, "sdpa-flash")
KERNELS_BY_NAME = {e.name: e for e in ENTRIES}
