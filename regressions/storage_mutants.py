"""Mutants on the storage a caller may give a tensor argument (fmha.contract.arguments): the
float64 reference with one storage form read wrong, everything else right. Each passed every test
while the draws gave only the storage forms someone had listed (a packed, a head-strided, a
row-sliced and a head-broadcast q, k, v); the draws from the argument records reach them
(docs/kill-matrix.md has their rows). Run one like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:storage-offset-ignored
"""

from __future__ import annotations

import functools

import torch

from fmha.oracles.reference_kernel import ENTRY as REFERENCE_ENTRY
from fmha.regressions.mutation import Mutant
from fmha.regressions.shipped_mutants import _entry, through


def _offset_ignored(args):
    """q, k and v read from the start of their buffers (a data pointer taken from the storage,
    not the tensor)."""
    for name in ("q", "k", "v"):
        t = args[name]
        if t.storage_offset() and t.dtype != torch.uint8:
            args[name] = t.as_strided(t.shape, t.stride(), 0)
    return args


def _strides_in_memory_order(args):
    """q, k and v's non-last dims given their strides largest first, as if every tensor were laid
    out (B, T, H) outermost first: right for any step or slice, wrong for another order."""
    for name in ("q", "k", "v"):
        t = args[name]
        if t.dtype == torch.uint8 or t.dim() < 3:
            continue
        strides = sorted(t.stride()[:-1], reverse=True)
        args[name] = t.as_strided(t.shape, (*strides, t.stride(-1)), t.storage_offset())
    return args


def _sink_read_packed(args):
    """The sink read as Hq floats one after another from its first."""
    sink = args.get("sink")
    if sink is not None:
        args["sink"] = sink.as_strided(sink.shape, (1,), sink.storage_offset())
    return args


def _one_buffer_read_as_k_is_v(args):
    """K = V decided by the buffer: k and v views of one buffer (a packed KV projection) read as
    the same tensor, v taken to be k."""
    k, v = args["k"], args["v"]
    if v is not k and v.shape == k.shape and v.untyped_storage().data_ptr() == k.untyped_storage().data_ptr():
        args["v"] = k
    return args


def _index_rows_assumed_packed(args):
    """The indices (and the second scope's) read with a packed tensor's strides from their first element."""
    for name in ("indices", "extra_indices"):
        t = args.get(name)
        if t is not None:
            args[name] = t.as_strided(t.shape, torch.empty(t.shape, device="meta").stride(), t.storage_offset())
    return args


def _sink_read_packed_outside_bf16(args):
    """The sink read packed in fp16 and fp32 calls: a launcher specialised per dtype, one of whose
    variants passes the sink's pointer without its stride."""
    return _sink_read_packed(args) if args["q"].dtype != torch.bfloat16 else args


def _k_read_packed_when_v_is_k(args):
    """A dense or paged call's K = V path (one tensor for keys and values in q's dtype; index-sparse
    calls have their own) reads it as packed from its view's first element: right for a packed
    tensor, wrong for any other form."""
    k = args["k"]
    if args["v"] is k and k.dtype != torch.uint8 and args.get("indices") is None:
        args["k"] = args["v"] = k.as_strided(k.shape, torch.empty(k.shape, device="meta").stride(), k.storage_offset())
    return args


def _overlap_read_as_broadcast(args):
    """q, k and v's dims told broadcast by a stride under what the next dim inside spans packed, as
    a launcher that knows packed, strided and expanded views tells them: stride 0 is, and so is a
    dim whose elements share memory with the next one's (an unfolded window's chunks), read at
    stride 0: its first element for all."""
    shared = args["v"] is args["k"]
    for name in ("q", "k") if shared else ("q", "k", "v"):
        t = args[name]
        if t.dtype == torch.uint8:
            continue
        moving = sorted((d for d in range(t.dim() - 1) if t.shape[d] > 1 and t.stride(d) > 0), key=lambda d: -t.stride(d))
        strides = list(t.stride())
        for outer, inner in zip(moving, [*moving[1:], None]):
            if t.stride(outer) < (t.shape[-1] if inner is None else t.shape[inner] * t.stride(inner)):
                strides[outer] = 0
        args[name] = t.as_strided(t.shape, strides, t.storage_offset())
    if shared:  # K = V stays one tensor
        args["v"] = args["k"]
    return args


def _storage(name: str, bug: str, transform) -> Mutant:
    return Mutant(name, "", bug, functools.partial(_entry, name, through(transform)), twin=lambda: REFERENCE_ENTRY)


STORAGE_MUTANTS = (
    _storage("storage-offset-ignored", "q, k and v read from their buffers' first element: a view's storage "
             "offset ignored", _offset_ignored),
    _storage("strides-in-memory-order", "q, k and v's strides taken largest first: a head-major (or any other "
             "order of) q, k, v read as (B, T, H)", _strides_in_memory_order),
    _storage("sink-read-packed", "the sink read as packed floats: a strided or broadcast sink's heads read "
             "from the wrong places", _sink_read_packed),
    _storage("overlap-read-as-broadcast", "a dim of q, k or v whose elements share memory with the next one's "
             "(an unfolded window's chunks) taken for a broadcast one: its first element read for all",
             _overlap_read_as_broadcast),
    _storage("one-buffer-read-as-k-is-v", "k and v in one buffer (a packed KV projection) taken for K = V: v "
             "read from k", _one_buffer_read_as_k_is_v),
    # Bugs on a pair of freedoms, each of which alone it gets right (fmha.properties.covering_array)
    _storage("sink-read-packed-outside-bf16", "the sink read as packed floats in fp16 and fp32 calls: a strided or "
             "broadcast sink beside queries of those dtypes read from the wrong places", _sink_read_packed_outside_bf16),
    _storage("k-read-packed-when-v-is-k", "a dense or paged call's K = V tensor read as packed: a head-major, sliced "
             "or offset k that is also v read from the wrong places", _k_read_packed_when_v_is_k),
    _storage("index-rows-assumed-packed", "indices read with a packed tensor's strides: a strided, reordered "
             "or broadcast index tensor read at the wrong places", _index_rows_assumed_packed),
)
