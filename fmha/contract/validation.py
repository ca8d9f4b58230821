"""The attention and merge contract (docs/contract.md) as typed Python.

    o, lse = attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    q: (B, T, Hq, D)   k: (B, S, Hkv, D)   v: (B, S, Hkv, Dv)    last dim contiguous

    o, lse = merge(parts, sink=None)      parts = [(o_i, lse_i), ...]

Every kernel calls `check_attention_args` (or `check_merge_args`) first, so bad input is
refused with a message naming the argument, what was expected and what came in, before
any kernel code runs. Python numbers and NumPy scalars are accepted alike. The contract is
forward-only: inputs that require grad are refused rather than answered without a grad_fn.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from fmha.contract.errors import NotSupportedError, fail
from fmha.contract.paged_validation import check_paged_args, output_shape
from fmha.contract.problem import DTYPE_NAMES, Problem

DTYPES = tuple(DTYPE_NAMES)


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, {DTYPE_NAMES.get(t.dtype, t.dtype)} on {t.device}"


def _check_tensor(name: str, t, rank: int, layout: str):
    if not isinstance(t, torch.Tensor):
        fail(f"{name}: expected a torch.Tensor {layout}, got {_type(t)}")
    if t.dim() != rank:
        fail(f"{name}: expected rank {rank} {layout}, got rank {t.dim()} ({_describe(t)})")
    if t.dtype not in DTYPES:
        fail(f"{name}: expected dtype bf16, fp16 or fp32, got {t.dtype}")
    if t.numel() and t.stride(-1) != 1:
        fail(f"{name}: expected a contiguous last dim (stride 1), got strides {tuple(t.stride())}")


def check_attention_args(
    q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None,
    block_table=None, kv_lens=None, cu_seqlens_q=None, indices=None, topk_len=None,
    extra_k_cache=None, extra_indices=None, extra_topk_len=None, cache_layout=None, extra_cache_layout=None,
    capabilities=None,
) -> Problem:
    """Validate one attention call; return the Problem it describes.

    Dense keys (contract v1) unless the call names a block table (paged) or indices
    (index-sparse); then k and v are caches (fmha.contract.paged_validation). With `capabilities` (a
    `fmha.contract.capabilities.Capabilities`), a valid call the kernel does not implement raises
    NotSupportedError carrying the kernel's reasons.
    """
    v2 = dict(block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, indices=indices,
              topk_len=topk_len, extra_k_cache=extra_k_cache, extra_indices=extra_indices,
              extra_topk_len=extra_topk_len, cache_layout=cache_layout, extra_cache_layout=extra_cache_layout)
    if any(value is not None for value in v2.values()):
        _check_tensor("q", q, q.dim() if isinstance(q, torch.Tensor) else 4, "(B, T, Hq, D)")
        fields = check_paged_args(q, k, v, causal=causal, window=window, **v2)
    else:
        fields = _dense_fields(q, k, v)
    _check_scalars(scale, causal, window)
    Hq = fields["heads_q"]
    if sink is not None:
        if not isinstance(sink, torch.Tensor):
            fail(f"sink: expected a float32 tensor of shape ({Hq},), got {_type(sink)}")
        if tuple(sink.shape) != (Hq,):
            fail(f"sink: expected shape ({Hq},) (one logit per query head), got {tuple(sink.shape)}")
        if sink.dtype != torch.float32:
            fail(f"sink: expected dtype float32, got {sink.dtype}")
        if sink.device != q.device:
            fail(f"sink: expected q's device {q.device}, got {sink.device}")
        _check_values("sink", sink, "finite logits, or -inf for no sink", "head")
    _check_forward_only(q=q, k=k, v=v, sink=sink)
    problem = Problem(
        **fields, dtype=q.dtype, causal=bool(causal) or window is not None,
        window=None if window is None else int(window), sink=sink is not None, shared_kv=k is v,
    )
    if out is not None:
        shape = output_shape(problem, total_q=q.shape[0])
        names = "(total_q, Hq, Dv)" if problem.ragged else "(B, T, Hq, Dv)"
        if not isinstance(out, torch.Tensor):
            fail(f"out: expected a tensor of shape {shape}, got {_type(out)}")
        if tuple(out.shape) != shape:
            fail(f"out: expected shape {shape} {names}, got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            fail(f"out: expected q's dtype {q.dtype}, got {out.dtype}")
        if out.device != q.device:
            fail(f"out: expected q's device {q.device}, got {out.device}")
        if out.numel() and out.stride(-1) != 1:
            fail(f"out: expected a contiguous last dim (stride 1), got strides {tuple(out.stride())}")
        if overlaps_itself(out):
            fail(f"out: expected each element its own memory (a kernel writes them all), got strides {tuple(out.stride())}")
        inputs = dict(q=q, k=k, v=v, sink=sink, extra_k_cache=extra_k_cache)
        shared = [name for name, t in inputs.items() if isinstance(t, torch.Tensor) and _share_memory(out, t)]
        if shared:
            fail(f"out: expected memory of its own, got memory {', '.join(shared)} also uses (the inputs are "
                 "read-only and read while out= is written)")
    if capabilities is not None:
        needs = ("out",) if out is not None else ()
        reasons = capabilities.not_supported_reasons(problem, q.device.type, needs=needs)
        if reasons:
            raise NotSupportedError("; ".join(reasons))
    return problem


def _dense_fields(q, k, v) -> dict:
    """Contract v1: q (B, T, Hq, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv)."""
    _check_tensor("q", q, 4, "(B, T, Hq, D)")
    _check_tensor("k", k, 4, "(B, S, Hkv, D)")
    _check_tensor("v", v, 4, "(B, S, Hkv, Dv)")
    B, T, Hq, D = q.shape
    if k.dtype != q.dtype or v.dtype != q.dtype:
        fail(f"k, v: expected q's dtype {q.dtype}, got k {k.dtype} and v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        fail(f"k, v: expected q's device {q.device}, got k on {k.device} and v on {v.device}")
    if k.shape[0] != B or v.shape[0] != B:
        fail(f"k, v: expected batch B={B} (q's), got k {k.shape[0]} and v {v.shape[0]}")
    S, Hkv = k.shape[1], k.shape[2]
    if v.shape[1] != S:
        fail(f"v: expected S={S} keys (k's dim 1), got {v.shape[1]}")
    if v.shape[2] != Hkv:
        fail(f"v: expected Hkv={Hkv} heads (k's dim 2), got {v.shape[2]}")
    if k.shape[3] != D:
        fail(f"k: expected head dim D={D} (q's dim 3), got {k.shape[3]}")
    if Hkv == 0 or Hq % Hkv:
        fail(f"q, k: expected Hq % Hkv == 0, got Hq={Hq}, Hkv={Hkv}")
    return dict(batch=B, q_len=T, kv_len=S, heads_q=Hq, heads_kv=Hkv, head_dim=D, head_dim_v=v.shape[3])


def check_merge_args(parts, sink=None) -> tuple[int, int, int, int]:
    """Validate a D5 merge call; return (B, T, H, Dv)."""
    if not isinstance(parts, (list, tuple)) or not parts:
        fail(f"parts: expected a non-empty list of (o, lse) pairs, got {parts!r:.80}")
    o0 = parts[0][0] if isinstance(parts[0], (list, tuple)) and len(parts[0]) == 2 else None
    if not isinstance(o0, torch.Tensor) or o0.dim() != 4:
        fail("parts[0]: expected a pair (o (B, T, H, Dv), lse (B, H, T) float32)")
    B, T, H, Dv = o0.shape
    for i, part in enumerate(parts):
        if not isinstance(part, (list, tuple)) or len(part) != 2:
            fail(f"parts[{i}]: expected a pair (o, lse), got {_type(part)}")
        o, lse = part
        _check_tensor(f"parts[{i}].o", o, 4, "(B, T, H, Dv)")
        if tuple(o.shape) != (B, T, H, Dv) or o.dtype != o0.dtype or o.device != o0.device:
            fail(f"parts[{i}].o: expected parts[0].o's {_describe(o0)}, got {_describe(o)}")
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, T):
            got = _describe(lse) if isinstance(lse, torch.Tensor) else _type(lse)
            fail(f"parts[{i}].lse: expected shape {(B, H, T)} (B, H, T), got {got}")
        if lse.dtype != torch.float32 or lse.device != o0.device:
            fail(f"parts[{i}].lse: expected float32 on {o0.device}, got {lse.dtype} on {lse.device}")
        _check_values(f"parts[{i}].lse", lse, "finite values, or -inf for an empty part", "(b, h, t)")
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (H,):
            got = tuple(sink.shape) if isinstance(sink, torch.Tensor) else _type(sink)
            fail(f"sink: expected a float32 tensor of shape ({H},), got {got}")
        if sink.dtype != torch.float32 or sink.device != o0.device:
            fail(f"sink: expected float32 on {o0.device}, got {sink.dtype} on {sink.device}")
        _check_values("sink", sink, "finite logits, or -inf for no sink", "head")
    _check_forward_only(**{f"parts[{i}].o": o for i, (o, _) in enumerate(parts)}, sink=sink)
    return B, T, H, Dv


def _type(x) -> str:
    """A value's type as a reader can tell it apart: bool, numpy.int64, torch.Tensor."""
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _is_bool(x) -> bool:
    return isinstance(x, (bool, np.bool_))


def _check_scalars(scale, causal, window) -> None:
    if scale is not None:
        if _is_bool(scale) or not isinstance(scale, numbers.Real):
            fail(f"scale: expected a positive finite float or None, got {_type(scale)} {scale!r}")
        if not (math.isfinite(scale) and scale > 0):
            fail(f"scale: expected a positive finite float or None, got {float(scale)!r}")
    if not _is_bool(causal):
        fail(f"causal: expected True or False, got {_type(causal)} {causal!r}")
    if window is not None:
        if _is_bool(window) or not isinstance(window, numbers.Integral):
            fail(f"window: expected an int >= 1 or None, got {_type(window)} {window!r}")
        if window < 1:
            fail(f"window: expected an int >= 1 or None, got {int(window)}")


def plain_scalars(scale, causal, window) -> tuple[float | None, bool, int | None]:
    """A valid call's scale, causal and window as the contract means them, in Python's types: a
    numpy scalar becomes a float, bool or int, and a window makes the call causal whatever causal
    says. An adapter hands these to its library, never the caller's own (a library may take
    causal=False beside a window for a two-sided window, or refuse a numpy float)."""
    return (None if scale is None else float(scale)), bool(causal) or window is not None, (
        None if window is None else int(window))


def overlaps_itself(t: torch.Tensor, broadcast: bool = True) -> bool:
    """Two of t's elements at one address (with `broadcast`, stride 0 included)."""
    span = 0  # what the dims inside span, from the innermost
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1 and (broadcast or s)):
        if stride <= span:  # stride 0 included
            return True
        span += (size - 1) * stride
    return False


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the bytes a and b span in one buffer meet (a conservative test: their extents)."""
    if not a.numel() or not b.numel() or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def extent(t):
        first = t.storage_offset() * t.element_size()
        return first, first + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()

    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 < b1 and b0 < a1


def _check_values(name: str, t: torch.Tensor, expected: str, index: str) -> None:
    """NaN and +inf are refused where the contract has no meaning for them. Reading the
    values synchronizes with the device, which a CUDA graph capture forbids: not checked then."""
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    bad = torch.isnan(t) | torch.isposinf(t)
    if bool(bad.any()):
        where = tuple(torch.nonzero(bad)[0].tolist())
        where = where[0] if len(where) == 1 else where
        fail(f"{name}: expected {expected}, got {t[bad][0].item()} at {index} {where} "
              f"({int(bad.sum())} of {t.numel()} values are NaN or +inf)")


def _check_forward_only(**tensors) -> None:
    if not torch.is_grad_enabled():
        return
    wants_grad = [name for name, t in tensors.items() if isinstance(t, torch.Tensor) and t.requires_grad]
    if wants_grad:
        fail(f"{', '.join(wants_grad)}: requires grad, but the attention contract is forward-only (no backward "
              "kernel); call it under torch.no_grad() or pass detached tensors")
