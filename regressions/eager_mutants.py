"""Mutants the dense laws are proven on (`Law.mutant`, tests/test_law_mutants.py): a plain
float32 eager attention with one realistic mistake switched on (it makes both promises, bitwise
determinism and batch invariance, as its correct twin keeps them), a D5 merge that takes
max(lse) for logsumexp, and kernels that remember answers by their inputs' addresses. Each is
a `Mutant` of fmha.regressions.mutants, run like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:no-scale
"""

from __future__ import annotations

import itertools
import math

import torch

from fmha.contract import Capabilities, KernelEntry, MergeEntry, check_merge_args
from fmha.kernels.torch_merge import merge as correct_merge
from fmha.oracles.reference_kernel import ENTRY as REFERENCE
from fmha.regressions.mutation import Mutant

# bug (the mutant's name) -> what it does wrong
BUGS = {
    "no-scale": "missing 1/sqrt(D)",
    "nan-leak": "0 * NaN from keys nobody sees",
    "positional-bias": "a positional bias left on",
    "logits-from-v": "logits read from V (K = V assumed)",
    "head-modulo": "query head h -> KV head h % Hkv",
    "prescale-k-in-place": "k scaled in place",
    "batch-max": "softmax max over the whole batch",
    "random-key-order": "reduction order changes per call",
    "top-left": "top-left causal alignment",
    "sink-added-not-exp": "sink added, not exp(sink)",
    "window-capped": "window capped at 256 keys",
    "skip-far-tiles": "a full tile of 64 keys whose max logit is 4 below the running max skipped",
}
SKIP_TILE, SKIP_GAP = 64, 4.0  # skip-far-tiles: a "skip softmax" threshold tuned on activations without a sink
_calls = itertools.count()


def eager(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, bug=None):
    """A plain float32 attention, one batch row at a time (so rows do not depend on the batch
    size); `bug` switches on one realistic mistake."""
    if bug == "batch-max" or q.shape[0] == 1:
        return _eager(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out, bug=bug)
    rows = [_eager(q[b:b + 1], k[b:b + 1], v[b:b + 1] if v is not k else k[b:b + 1], scale=scale, causal=causal,
                   window=window, sink=sink, bug=bug) for b in range(q.shape[0])]
    o, lse = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def _eager(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, bug=None):
    B, T, H, D = q.shape
    S, group = k.shape[1], H // k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    if bug == "prescale-k-in-place" and 0 not in k.stride():  # saves a multiply per logit, and scales v too
        k.mul_(scale)                                           # when k is v (a broadcast k cannot be written)
        scale = 1.0
    position = torch.arange(S)
    if bug == "random-key-order":  # like an atomics-based reduction: the order alternates per call
        position = torch.arange(S) if next(_calls) % 2 else torch.arange(S).flip(0)
        k, v = k[:, position], v[:, position]
    head = torch.arange(H) % k.shape[2] if bug == "head-modulo" else torch.arange(H) // group
    keys = (v if bug == "logits-from-v" else k).float()[:, :, head]  # "K = V", assumed
    values = v.float()[:, :, head]
    s = torch.einsum("bthd,bshd->bhts", q.float(), keys) * (1.0 if bug == "no-scale" else scale)
    if bug == "positional-bias":  # an ALiBi slope left on
        s = s + 0.05 * position.float()
    row = torch.arange(T)[:, None] + (0 if bug == "top-left" else S - T)
    col = position[None, :]
    visible = torch.ones(T, S, dtype=torch.bool)
    if causal or window is not None:
        visible &= col <= row
    if window is not None:
        visible &= col > row - (min(window, 256) if bug == "window-capped" else window)
    if bug != "nan-leak":  # keys nobody sees are dropped, not multiplied by a zero weight
        values = torch.where(visible.any(0)[None, :, None, None], values, 0.0)
    s = s.masked_fill(~visible, -math.inf)
    if bug == "skip-far-tiles":  # FA-style pass over key tiles, skipping those it thinks weigh nothing
        s = _far_tiles_skipped(s)
    m = s.amax(dim=(0, -1) if bug == "batch-max" else -1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.view(1, -1, 1, 1))
    m = m.nan_to_num(neginf=0.0)
    e = torch.exp(s - m)
    denominator = e.sum(-1, keepdim=True)
    if sink is not None:
        sink_term = sink.view(1, -1, 1, 1) if bug == "sink-added-not-exp" else torch.exp(sink.view(1, -1, 1, 1) - m)
        denominator = denominator + sink_term
    p = e / torch.where(denominator == 0, 1.0, denominator)
    o = torch.einsum("bhts,bshd->bthd", p, values).to(q.dtype)
    lse = torch.where(denominator == 0, -math.inf, m + torch.log(denominator)).squeeze(-1)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


PROMISING = Capabilities(promises=frozenset({"bitwise_deterministic", "batch_invariant"}))


def _far_tiles_skipped(s: torch.Tensor) -> torch.Tensor:
    """s with every full key tile whose max is SKIP_GAP below the max of the tiles before it set to
    -inf: what rows with a sink token and many keys of small weights lose."""
    s = s.clone()
    running = s[..., :SKIP_TILE].amax(-1)
    for start in range(SKIP_TILE, s.shape[-1] - SKIP_TILE + 1, SKIP_TILE):
        tile = s[..., start:start + SKIP_TILE]
        top = tile.amax(-1)
        tile.masked_fill_((top < running - SKIP_GAP)[..., None], -math.inf)
        running = torch.maximum(running, top)
    return s


def eager_kernel(bug: str | None, capabilities: Capabilities = PROMISING) -> KernelEntry:
    """The eager kernel with `bug` (None: the correct one) as a plug-in that makes both promises."""
    return KernelEntry(name=f"eager-{bug or 'correct'}",
                       fn=lambda *a, **kw: eager(*a, bug=bug, **kw), capabilities=capabilities,
                       default_devices=(), description=BUGS.get(bug, "the correct eager kernel"))


def max_instead_of_logsumexp(parts, sink=None):
    """A D5 merge that takes L = max(lse_i) instead of log(sum exp(lse_i))."""
    check_merge_args(parts, sink)
    lses = torch.stack([lse for _, lse in parts])
    top = lses.amax(0)
    o = sum(torch.exp(lse - top).transpose(1, 2)[..., None] * o.float() for o, lse in parts)
    return o.to(parts[0][0].dtype), top


def cached_by_address(name: str, fn, capabilities: Capabilities, addresses: bool = True) -> KernelEntry:
    """`fn` remembering its answers by its inputs' addresses and shapes, or by their shapes alone
    (as a plan or result cache keyed too coarsely does): a second call on the same buffers, or of
    the same shapes, returns the first answer."""
    answers = {}

    def kernel(q, k, v, *, out=None, **kwargs):
        tensors = (q, k, v, *(t for t in kwargs.values() if isinstance(t, torch.Tensor)))
        key = tuple((t.data_ptr() if addresses else 0, tuple(t.shape)) for t in tensors)
        if key not in answers:
            o, lse = fn(q, k, v, **kwargs)
            answers[key] = (o.clone(), None if lse is None else lse.clone())
        o, lse = answers[key]
        if out is not None:
            o = out.copy_(o)
        return o, lse

    return KernelEntry(name=name, fn=kernel, capabilities=capabilities, default_devices=(),
                       description="answers remembered by the inputs' addresses and shapes")


CORRECT = eager_kernel(None)
CORRECT_MERGE = MergeEntry("torch-merge", correct_merge)

EAGER_MUTANTS = (
    *(Mutant(bug, "", what, lambda bug=bug: eager_kernel(bug), twin=lambda: CORRECT)
      for bug, what in BUGS.items()),
    Mutant("max-merge", "", "merge takes max(lse), not logsumexp",
           lambda: MergeEntry("max-merge", max_instead_of_logsumexp), twin=lambda: CORRECT_MERGE),
    Mutant("cached-by-address", "", "answers remembered by the inputs' addresses and shapes",
           lambda: cached_by_address("cached-by-address", eager, PROMISING), twin=lambda: CORRECT),
    Mutant("cached-by-shape", "", "answers remembered by the inputs' shapes: a second call of the same shapes gets "
           "the first call's answer", lambda: cached_by_address("cached-by-shape", eager, PROMISING, addresses=False),
           twin=lambda: CORRECT),
    Mutant("paged-cached-by-address", "", "a paged call's answers remembered by the inputs' addresses and shapes",
           lambda: cached_by_address("paged-cached-by-address", REFERENCE.fn, REFERENCE.capabilities),
           twin=lambda: REFERENCE),
)
