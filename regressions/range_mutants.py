"""Mutants on the sizes a caller may choose (fmha.contract.ranges): the float64 reference with one
size handled wrong past a point the draws never reached while they drew head dims in multiples of
16 and up to 64 query heads; the draws from the size records reach them
(docs/kill-matrix.md has their rows). Run one like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:head-dim-tail-dropped
"""

from __future__ import annotations

import functools

import torch

from fmha.oracles.reference_kernel import ENTRY as REFERENCE_ENTRY
from fmha.oracles.reference_kernel import reference
from fmha.regressions.mutation import Mutant
from fmha.regressions.shipped_mutants import _entry, through


def _head_dim_tail_dropped(args):
    """q.k summed in steps of 16 head-dim columns, the last partial step left out."""
    q = args["q"]
    tail = q.shape[-1] % 16
    if tail and q.dtype != torch.uint8:
        q = q.clone()
        q[..., q.shape[-1] - tail:] = 0
        args["q"] = q
    return args


def _value_dim_tail_unwritten(q, k, v, **kwargs):
    """o written in steps of 16 columns: the last partial step left at 0."""
    o, lse = reference(q, k, v, **kwargs)
    tail = o.shape[-1] % 16
    if tail:
        o[..., o.shape[-1] - tail:] = 0
    return o, lse


def _group_past_16_wraps(args):
    """A KV head serves at most 16 query heads (one 16-row tile): past that, query head h reads KV
    head h // 16."""
    q, k, v = args["q"], args["k"], args["v"]
    group = q.shape[-2] // k.shape[-2]
    if group > 16 and k.dtype != torch.uint8 and k.dim() == 4 and args.get("block_table") is None \
            and args.get("indices") is None:
        heads = (torch.arange(q.shape[-2]) // 16).clamp(max=k.shape[-2] - 1).to(k.device)
        args["k"] = k.index_select(-2, heads)
        args["v"] = k if v is k else v.index_select(-2, heads)
    return args


def _heads_past_255_wrap(args):
    """Query head indices held in 8 bits: head h >= 256 computes head h % 256's query (its KV head and
    its output place right)."""
    q = args["q"]
    if q.shape[-2] > 256:
        args["q"] = q.index_select(-2, (torch.arange(q.shape[-2]) % 256).to(q.device))
    return args


def _range(name: str, bug: str, fn) -> Mutant:
    return Mutant(name, "", bug, functools.partial(_entry, name, fn), twin=lambda: REFERENCE_ENTRY)


RANGE_MUTANTS = (
    _range("head-dim-tail-dropped", "q.k summed over head-dim columns in steps of 16: a head dim that is not a "
           "multiple of 16 (40, 72) loses its last columns", through(_head_dim_tail_dropped)),
    _range("value-dim-tail-unwritten", "o written in steps of 16 columns: a value head dim that is not a multiple "
           "of 16 leaves its last columns 0", _value_dim_tail_unwritten),
    _range("group-past-16-wraps", "a KV head serves at most 16 query heads (one 16-row tile): in groups past 16, "
           "query head h reads KV head h // 16", through(_group_past_16_wraps)),
    _range("heads-past-255-wrap", "query head indices in 8 bits: with more than 256 query heads, head h computes "
           "with head h % 256's query", through(_heads_past_255_wrap)),
)
