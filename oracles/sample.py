"""One sample: everything that decides one call of a kernel (PyTorch OpInfo's SampleInput).

A `Sample` is a problem plus the scale, the input distribution, the seed and the storage of
each of q, k and v. It is plain data (frozen, hashable, printed as a line to paste into
`@example(sample=...)` or a trap), and `sample.inputs(device)` makes its tensors, the same
bits on every machine: values are drawn in float32 from one CPU generator, seeded by the sample's
seed and the run's (fmha.oracles.run_seed: new values on every run, the same structure), shaped
by the distribution, cast to the problem's dtype and laid out in the sample's storage.

Storages (each of q, k, v on its own; with K is V, v is k):
- contiguous: a dense tensor;
- strided: a view with a gap between heads (the gap holds NaN);
- sliced: the first T (q) or S (k, v) rows of a longer buffer whose tail holds NaN;
- expanded: every head is head 0, broadcast with stride 0 (values change accordingly).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field

import torch

from fmha.oracles import paged_inputs, run_seed
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.oracles.hazards import HAZARDS, applicable, invisible_keys, present, tally
from fmha.oracles.inputs import Inputs
from fmha.contract.problem import Problem, repr_fields

STORAGES = ("contiguous", "strided", "sliced", "expanded")
SLICE_TAIL = 67  # rows past the view in a sliced buffer: not a multiple of any tile


@dataclass(frozen=True, kw_only=True)
class Sample:
    problem: Problem
    scale: float | None = None  # None: the contract's default, head_dim ** -0.5
    distribution: str = "normal"
    seed: int = 0
    q_storage: str = "contiguous"
    k_storage: str = "contiguous"
    v_storage: str = "contiguous"  # with K is V, always k_storage
    # Contract v2 (paged or sparse problems; fmha.oracles.paged_inputs lays them out). None: every
    # request at the problem's maxima, and no topk_len argument.
    kv_lens: tuple[int, ...] | None = None  # paged: each request's keys, at most problem.kv_len
    q_lens: tuple[int, ...] | None = None  # ragged: each request's query rows, at most problem.q_len
    topk_lens: tuple[int, ...] | None = None  # sparse: the topk_len argument
    extra_topk_lens: tuple[int, ...] | None = None  # the second scope's
    invalid: float = 0.0  # sparse: the share of indices that are -1
    shared_pages: bool = False  # paged: requests share request 0's first page (its keys too)
    repeats: float = 0.0  # sparse: the share of a row's indices that repeat another of its indices
    last_slot: bool = False  # sparse: a key in the cache's last slot (the last page's last offset)
    cache_exponent: int = 0  # quantized caches: keys scaled by 2^e (ue8m0 scales toward an end)
    outliers: bool = False  # quantized caches: one element a tile 2^10 larger (subnormal codes beside it)
    # Contract v2: the layout hazards laid in (fmha.oracles.hazards.LAYOUT_HAZARDS: poison in unread
    # keys, strided tables, caches and queries, runs of -1, every code of a format); a hostile draw
    # names every one that applies.
    hazards: tuple[str, ...] = ()
    name: str = field(default="", compare=False)  # what about this sample matters (trap cases)
    # The run seed its values are drawn under (fmha.oracles.run_seed); None: the current run's. A
    # failure pins it (`pinned`), so the pin gives the same bytes in any run.
    run_seed: int | None = None

    def __post_init__(self):
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: expected one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}")
        for which in ("q", "k", "v"):
            storage = getattr(self, f"{which}_storage")
            if storage not in STORAGES:
                raise ValueError(f"{which}_storage: expected one of {', '.join(STORAGES)}, got {storage!r}")
        if self.problem.shared_kv:
            object.__setattr__(self, "v_storage", self.k_storage)
        p = self.problem
        for name, upper, applies in (("kv_lens", p.kv_len, p.source == "paged"), ("q_lens", p.q_len, p.ragged),
                                     ("topk_lens", p.kv_len, p.source == "sparse"),
                                     ("extra_topk_lens", p.extra_topk, p.extra_topk is not None)):
            lengths = getattr(self, name)
            if lengths is None:
                continue
            if not applies:
                raise ValueError(f"{name}: not a {p.source}{' ragged' if p.ragged else ''} problem's")
            if len(lengths) != p.batch or not all(0 <= n <= upper for n in lengths):
                raise ValueError(f"{name}: expected {p.batch} lengths in [0, {upper}], got {lengths}")
            object.__setattr__(self, name, tuple(int(n) for n in lengths))
        if (self.repeats or self.last_slot) and p.source != "sparse":
            raise ValueError("repeats, last_slot: they lay out index-sparse samples")
        if (self.cache_exponent or self.outliers) and not p.cache_layouts:
            raise ValueError("cache_exponent, outliers: they shape quantized caches")
        unknown = [name for name in self.hazards if name not in HAZARDS or HAZARDS[name].kind != "layout"]
        if unknown:
            raise ValueError(f"hazards: {unknown} are not layout hazards; those are "
                             f"{', '.join(h for h, r in HAZARDS.items() if r.kind == 'layout')}")
        object.__setattr__(self, "hazards", tuple(sorted(set(self.hazards))))
        if p.source != "dense":  # what each request holds decides what the kernel must support
            object.__setattr__(self, "problem", p.replace(**paged_inputs.request_facts(self)))
        # a hazard this problem has no room for (no window, one page, one head) is not laid in
        kept = set(applicable(self.problem, kinds=("layout",)))
        object.__setattr__(self, "hazards", tuple(h for h in self.hazards if h in kept))

    @property
    def storages(self) -> dict[str, str]:
        return {"q": self.q_storage, "k": self.k_storage, "v": self.v_storage}

    @property
    def id(self) -> str:
        """The problem's id, the distribution, and what differs from the defaults:
        ``hd64-T1-S128-mqa-h4-bf16-constant_scores-seed3-scale0.3-k.sliced``."""
        parts = [self.problem.id, self.distribution]
        if self.seed:
            parts.append(f"seed{self.seed}")
        if self.scale is not None:
            parts.append(f"scale{self.scale:.4g}")
        parts += [f"{which}.{storage}" for which, storage in self.storages.items()
                  if storage != "contiguous" and not (which == "v" and self.problem.shared_kv)]
        for name in ("kv_lens", "q_lens", "topk_lens", "extra_topk_lens"):
            lengths = getattr(self, name)
            if lengths is not None:  # a batch of hundreds reads as its first lengths and a digest
                shown = ".".join(map(str, lengths[:6]))
                parts.append(f"{name}{shown}" + (f"..{zlib.crc32(repr(lengths).encode()):08x}" if len(lengths) > 6 else ""))
        if self.invalid:
            parts.append(f"invalid{self.invalid:.3g}")
        if self.repeats:
            parts.append(f"repeats{self.repeats:.3g}")
        if self.cache_exponent:
            parts.append(f"cache2^{self.cache_exponent}")
        parts += [flag for flag in ("shared_pages", "last_slot", "outliers") if getattr(self, flag)]
        if self.hazards:
            parts.append("hazards:" + "+".join(self.hazards))
        return "-".join(parts)

    @property
    def values_seed(self) -> int:
        """The seed of every generator its values come from."""
        return run_seed.values_seed(self.seed, run_seed.current() if self.run_seed is None else self.run_seed)

    def pinned(self) -> Sample:
        """This sample with the current run's seed written in: the same bytes in any run."""
        return self if self.run_seed is not None else dataclasses.replace(self, run_seed=run_seed.current())

    def hazards_carried(self, device="cpu") -> tuple[str, ...]:
        """The hazards of the table the sample's inputs carry (counted from their bytes)."""
        return present(self.inputs(device))

    def replace(self, **changes) -> Sample:
        """A copy with `changes`; Problem fields (causal=..., dtype=...) change the problem."""
        problem_fields = {f.name for f in dataclasses.fields(Problem)}
        problem_changes = {k: changes.pop(k) for k in list(changes) if k in problem_fields}
        if problem_changes:
            changes["problem"] = changes.get("problem", self.problem).replace(**problem_changes)
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return f"Sample({repr_fields(self, name='')})"

    def request_lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A paged sample's (query rows, keys) of each request."""
        p = self.problem
        q_lens = (self.q_lens if p.ragged else None) or (p.q_len,) * p.batch
        return q_lens, self.kv_lens or (p.kv_len,) * p.batch

    def inputs(self, device="cpu", tail_fill: float = float("nan")) -> Inputs:
        """The sample's tensors on `device`; `tail_fill` is what sliced and strided storage
        hides outside the view, and what fills every cache slot no key occupies."""
        p = self.problem
        g = torch.Generator().manual_seed(self.values_seed)
        q, k, v, sink = self.draw(g)
        if p.source != "dense":
            made = paged_inputs.inputs(self, g, q, k, v, None if sink is None else sink.to(device), device, tail_fill)
        else:
            cast = dict(dtype=p.dtype, device=device)
            if "invisible-keys" in self.hazards:  # the keys left of every row's window: poison
                hidden = invisible_keys(p.q_len, p.kv_len, p.window)
                k[:, :hidden] = tail_fill
                v[:, :hidden] = tail_fill
            q = lay_out(q.to(**cast), self.q_storage, tail_fill)
            k = lay_out(k.to(**cast), self.k_storage, tail_fill)
            v = k if p.shared_kv else lay_out(v.to(**cast), self.v_storage, tail_fill)
            made = Inputs(self, q, k, v, None if sink is None else sink.to(device))
        tally(made)
        return made

    def draw(self, g: torch.Generator, kv_len: int | None = None):
        """float32 q (B, T, Hq, D), k (B, S, Hkv, D), v and the sink, shaped by the
        distribution; `kv_len` instead of the problem's S (a second scope's keys)."""
        p = self.problem
        S = p.kv_len if kv_len is None else kv_len
        q = torch.randn(p.batch, p.q_len, p.heads_q, p.head_dim, generator=g)
        k = torch.randn(p.batch, S, p.heads_kv, p.head_dim, generator=g)
        v = k if p.shared_kv else torch.randn(p.batch, S, p.heads_kv, p.head_dim_v, generator=g)
        q, k, v = DISTRIBUTIONS[self.distribution](g, q, k, v)
        if p.shared_kv:
            v = k  # a distribution that reshapes one of them reshapes both
        elif self.distribution == "large_v" and p.dtype == torch.float16:
            v = v / 3  # stay inside fp16's range (max 65504)
        sink = torch.rand(p.heads_q, generator=g) * 5 - 2 if p.sink else None
        return q, k, v, sink


def lay_out(t: torch.Tensor, storage: str, fill: float = float("nan"), hidden: int = 0) -> torch.Tensor:
    """`t` (B, L, H, D) in `storage`. For sliced, `hidden` leading rows hold `fill` too (keys
    no query row can see, in the leak law)."""
    B, L, H, D = t.shape
    if storage == "contiguous":
        return t
    if storage == "strided":
        wide = torch.full((B, L, 2 * H, D), fill, dtype=t.dtype, device=t.device)
        wide[:, :, ::2] = t
        return wide[:, :, ::2]
    if storage == "sliced":
        long = torch.full((B, L + SLICE_TAIL, H, D), fill, dtype=t.dtype, device=t.device)
        long[:, hidden:L] = t[:, hidden:]
        return long[:, :L]
    if storage == "expanded":
        return t[:, :, :1].expand(B, L, H, D)
    raise ValueError(f"storage: expected one of {', '.join(STORAGES)}, got {storage!r}")
