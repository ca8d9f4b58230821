"""The attention and merge contract (DESIGN.md, "The attention contract") as typed Python.

    o, lse = attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    q: (B, T, Hq, D)   k: (B, S, Hkv, D)   v: (B, S, Hkv, Dv)    last dim contiguous

    o, lse = merge(parts, sink=None)      parts = [(o_i, lse_i), ...]

Every kernel calls `check_attention_args` (or `check_merge_args`) first, so bad input is
refused with a message naming the argument, what was expected and what came in, before
any kernel code runs.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from fmha.problem import DTYPE_NAMES, Problem

DTYPES = tuple(DTYPE_NAMES)


class ContractError(ValueError):
    """The arguments break the attention contract."""


class NotSupportedError(ContractError):
    """The arguments are valid, but this kernel does not implement that part of the contract."""


class AttentionKernel(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        causal: bool = False,
        window: int | None = None,
        sink: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class MergeKernel(Protocol):
    def __call__(
        self, parts: Sequence[tuple[torch.Tensor, torch.Tensor]], sink: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _fail(message: str):
    raise ContractError(message)


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, {DTYPE_NAMES.get(t.dtype, t.dtype)} on {t.device}"


def _check_tensor(name: str, t, rank: int, layout: str):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name}: expected a torch.Tensor {layout}, got {type(t).__name__}")
    if t.dim() != rank:
        _fail(f"{name}: expected rank {rank} {layout}, got rank {t.dim()} ({_describe(t)})")
    if t.dtype not in DTYPES:
        _fail(f"{name}: expected dtype bf16, fp16 or fp32, got {t.dtype}")
    if t.numel() and t.stride(-1) != 1:
        _fail(f"{name}: expected a contiguous last dim (stride 1), got strides {tuple(t.stride())}")


def check_attention_args(
    q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, capabilities=None
) -> Problem:
    """Validate one attention call; return the Problem it describes.

    With `capabilities` (a `fmha.capabilities.Capabilities`), a valid call the kernel does not
    implement raises NotSupportedError carrying the kernel's reasons.
    """
    _check_tensor("q", q, 4, "(B, T, Hq, D)")
    _check_tensor("k", k, 4, "(B, S, Hkv, D)")
    _check_tensor("v", v, 4, "(B, S, Hkv, Dv)")
    B, T, Hq, D = q.shape
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _fail(f"k, v: expected q's dtype {q.dtype}, got k {k.dtype} and v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        _fail(f"k, v: expected q's device {q.device}, got k on {k.device} and v on {v.device}")
    if k.shape[0] != B or v.shape[0] != B:
        _fail(f"k, v: expected batch B={B} (q's), got k {k.shape[0]} and v {v.shape[0]}")
    S, Hkv = k.shape[1], k.shape[2]
    if v.shape[1] != S:
        _fail(f"v: expected S={S} keys (k's dim 1), got {v.shape[1]}")
    if v.shape[2] != Hkv:
        _fail(f"v: expected Hkv={Hkv} heads (k's dim 2), got {v.shape[2]}")
    if k.shape[3] != D:
        _fail(f"k: expected head dim D={D} (q's dim 3), got {k.shape[3]}")
    if Hkv == 0 or Hq % Hkv:
        _fail(f"q, k: expected Hq % Hkv == 0, got Hq={Hq}, Hkv={Hkv}")
    if scale is not None and not isinstance(scale, (int, float)):
        _fail(f"scale: expected a float or None, got {type(scale).__name__}")
    if not isinstance(causal, bool):
        _fail(f"causal: expected a bool, got {type(causal).__name__}")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int):
            _fail(f"window: expected an int >= 1 or None, got {type(window).__name__} {window!r}")
        if window < 1:
            _fail(f"window: expected an int >= 1 or None, got {window}")
    if sink is not None:
        if not isinstance(sink, torch.Tensor):
            _fail(f"sink: expected a float32 tensor of shape ({Hq},), got {type(sink).__name__}")
        if tuple(sink.shape) != (Hq,):
            _fail(f"sink: expected shape ({Hq},) (one logit per query head), got {tuple(sink.shape)}")
        if sink.dtype != torch.float32:
            _fail(f"sink: expected dtype float32, got {sink.dtype}")
        if sink.device != q.device:
            _fail(f"sink: expected q's device {q.device}, got {sink.device}")
    Dv = v.shape[3]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(f"out: expected a tensor of shape {(B, T, Hq, Dv)}, got {type(out).__name__}")
        if tuple(out.shape) != (B, T, Hq, Dv):
            _fail(f"out: expected shape {(B, T, Hq, Dv)} (B, T, Hq, Dv), got {tuple(out.shape)}")
        if out.dtype != q.dtype:
            _fail(f"out: expected q's dtype {q.dtype}, got {out.dtype}")
        if out.device != q.device:
            _fail(f"out: expected q's device {q.device}, got {out.device}")
        if out.numel() and out.stride(-1) != 1:
            _fail(f"out: expected a contiguous last dim (stride 1), got strides {tuple(out.stride())}")
    problem = Problem(
        batch=B, q_len=T, kv_len=S, heads_q=Hq, heads_kv=Hkv, head_dim=D, head_dim_v=Dv,
        dtype=q.dtype, causal=causal or window is not None, window=window,
        sink=sink is not None, shared_kv=k is v,
    )
    if capabilities is not None:
        needs = ("out",) if out is not None else ()
        reasons = capabilities.not_supported_reasons(problem, q.device.type, needs=needs)
        if reasons:
            raise NotSupportedError("; ".join(reasons))
    return problem


def check_merge_args(parts, sink=None) -> tuple[int, int, int, int]:
    """Validate a D5 merge call; return (B, T, H, Dv)."""
    if not isinstance(parts, (list, tuple)) or not parts:
        _fail(f"parts: expected a non-empty list of (o, lse) pairs, got {parts!r:.80}")
    o0 = parts[0][0] if isinstance(parts[0], (list, tuple)) and len(parts[0]) == 2 else None
    if not isinstance(o0, torch.Tensor) or o0.dim() != 4:
        _fail("parts[0]: expected a pair (o (B, T, H, Dv), lse (B, H, T) float32)")
    B, T, H, Dv = o0.shape
    for i, part in enumerate(parts):
        if not isinstance(part, (list, tuple)) or len(part) != 2:
            _fail(f"parts[{i}]: expected a pair (o, lse), got {type(part).__name__}")
        o, lse = part
        _check_tensor(f"parts[{i}].o", o, 4, "(B, T, H, Dv)")
        if tuple(o.shape) != (B, T, H, Dv) or o.dtype != o0.dtype or o.device != o0.device:
            _fail(f"parts[{i}].o: expected parts[0].o's {_describe(o0)}, got {_describe(o)}")
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, T):
            got = _describe(lse) if isinstance(lse, torch.Tensor) else type(lse).__name__
            _fail(f"parts[{i}].lse: expected shape {(B, H, T)} (B, H, T), got {got}")
        if lse.dtype != torch.float32 or lse.device != o0.device:
            _fail(f"parts[{i}].lse: expected float32 on {o0.device}, got {lse.dtype} on {lse.device}")
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (H,):
            got = tuple(sink.shape) if isinstance(sink, torch.Tensor) else type(sink).__name__
            _fail(f"sink: expected a float32 tensor of shape ({H},), got {got}")
        if sink.dtype != torch.float32 or sink.device != o0.device:
            _fail(f"sink: expected float32 on {o0.device}, got {sink.dtype} on {sink.device}")
    return B, T, H, Dv
