"""One sample: everything that decides one call of a kernel (PyTorch OpInfo's SampleInput).

A `Sample` is a problem plus the scale, the input distribution, the seed and the storage of
each of q, k and v. It is plain data (frozen, hashable, printed as a line to paste into
`@example(sample=...)` or a trap), and `sample.inputs(device)` makes its tensors, the same
bits on every machine: values are drawn in float32 from one CPU generator, seeded by the sample's
seed and the run's (fmha.oracles.run_seed: new values on every run, the same structure), shaped
by the distribution, cast to the problem's dtype and laid out in the sample's storage.

Storage (fmha.oracles.storage): each tensor argument on its own in any form its record allows
(fmha.contract.arguments: another memory order, a step along a dim, an offset, stride 0, two
arguments in one buffer), poison everywhere else in its buffer; q, k and v in `q_storage`,
`k_storage`, `v_storage` (with K is V, v is k), the others in `storage` by argument name. The
names q, k and v had before the records stand for forms: contiguous (""), strided (a step along
the heads), sliced (a step along the batch: the first rows of a longer buffer), expanded (stride 0
along the heads: every head is head 0).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from fmha.oracles import oracle, paged_inputs, run_seed, storage
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.oracles.hazards import HAZARDS, applicable, invisible_keys, present, tally
from fmha.oracles.inputs import Inputs
from fmha.contract.problem import Problem, repr_fields

SLICE_TAIL = 67  # rows past the view in a sliced buffer: not a multiple of any tile
# The call's tensor arguments a sample lays out beside q, k and v (`Sample.storage`).
OTHER_ARGUMENTS = ("sink", "out", "block_table", "kv_lens", "cu_seqlens_q", "indices", "topk_len", "extra_k_cache",
                   "extra_indices", "extra_topk_len")
# What the buffer around an integer argument's view holds: a page of poison for the table, no key
# for indices, an empty request for lengths (a kernel that reads it answers wrong).
# "causal=False": a window passed with causal=False (it implies causal); "numpy": scale, causal and
# window as numpy scalars (a scale float32 where it holds it exactly); "int scale": an integral scale
# as a Python int.
SCALAR_FORMS = ("causal=False", "numpy", "int scale")
INT_FILL = {"indices": -1, "extra_indices": -1, "kv_lens": 0, "topk_len": 0, "extra_topk_len": 0, "cu_seqlens_q": 0}


@dataclass(frozen=True, kw_only=True)
class Sample:
    problem: Problem
    scale: float | None = None  # None: the contract's default, head_dim ** -0.5
    distribution: str = "normal"
    seed: int = 0
    q_storage: str = "contiguous"
    k_storage: str = "contiguous"
    v_storage: str = "contiguous"  # with K is V, always k_storage
    # The other tensor arguments' storage forms, by name (OTHER_ARGUMENTS): (("sink", "step:Hq"), ...).
    storage: tuple[tuple[str, str], ...] = ()
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
    outliers: bool = False  # quantized caches: each tile's first element 2^14 (e2m1: 2^2) times the others (small codes beside it)
    # Paged and sparse caches in q's dtype: the (first scope's) cache holds this many pages, the call's
    # own the last of them (ids up to num_blocks - 1, the page ids a kernel may narrow), poison before.
    num_blocks: int | None = None
    # Contract v2: the layout hazards laid in (fmha.oracles.hazards.LAYOUT_HAZARDS: poison in unread
    # keys, strided tables, caches and queries, runs of -1, every code of a format); a hostile draw
    # names every one that applies.
    hazards: tuple[str, ...] = ()
    # How the call passes its scalars (SCALAR_FORMS; fmha.contract.relations): a form the call has
    # no room for (causal=False without a window) passes them as Python gives them.
    scalars: tuple[str, ...] = ()
    name: str = field(default="", compare=False)  # what about this sample matters (trap cases)
    # The run seed its values are drawn under (fmha.oracles.run_seed); None: the current run's. A
    # failure pins it (`pinned`), so the pin gives the same bytes in any run.
    run_seed: int | None = None

    def __post_init__(self):
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: expected one of {', '.join(DISTRIBUTIONS)}, got {self.distribution!r}")
        if self.problem.shared_kv:
            object.__setattr__(self, "v_storage", self.k_storage)
        p = self.problem
        object.__setattr__(self, "storage", tuple(sorted((str(n), str(f)) for n, f in self.storage if f)))
        unknown = [name for name, _ in self.storage if name not in OTHER_ARGUMENTS]
        if unknown:
            raise ValueError(f"storage: {unknown} are not tensor arguments beside q, k, v ({', '.join(OTHER_ARGUMENTS)})")
        for name, spec in self.storages.items():
            storage.forms(spec, storage.record(name, p))  # a form its record does not allow: ValueError
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
        if self.num_blocks is not None and (p.source == "dense" or p.cache_layout is not None):
            raise ValueError("num_blocks: the pages of a paged or sparse cache in q's dtype")
        unknown = [name for name in self.hazards if name not in HAZARDS or HAZARDS[name].kind != "layout"]
        if unknown:
            raise ValueError(f"hazards: {unknown} are not layout hazards; those are "
                             f"{', '.join(h for h, r in HAZARDS.items() if r.kind == 'layout')}")
        object.__setattr__(self, "hazards", tuple(sorted(set(self.hazards))))
        unknown = [form for form in self.scalars if form not in SCALAR_FORMS]
        if unknown:
            raise ValueError(f"scalars: {unknown} are not among {', '.join(SCALAR_FORMS)}")
        object.__setattr__(self, "scalars", tuple(sorted(set(self.scalars))))
        if p.source != "dense":  # what each request holds decides what the kernel must support
            object.__setattr__(self, "problem", p.replace(**paged_inputs.request_facts(self)))
        # a hazard this problem has no room for (no window, one page, one head), or this cache (one
        # page: no stride between pages to show), is not laid in
        kept = set(applicable(self.problem, kinds=("layout",))) - self._one_page_gives_up
        object.__setattr__(self, "hazards", tuple(h for h in self.hazards if h in kept))

    @property
    def storages(self) -> dict[str, str]:
        """Every tensor argument's storage form that is not packed, by argument name."""
        named = {"q": self.q_storage, "k": self.k_storage, "v": self.v_storage, **dict(self.storage)}
        return {name: spec for name, spec in named.items() if spec not in ("", "contiguous")
                and not (name == "v" and self.problem.shared_kv)}

    def takes(self, name: str) -> bool:
        """Whether this sample's call has the tensor argument `name` (q, k, v or OTHER_ARGUMENTS)."""
        p = self.problem
        return {"q": True, "k": True, "v": not p.shared_kv, "sink": p.sink, "out": True,
                "block_table": p.source == "paged", "kv_lens": p.source == "paged", "cu_seqlens_q": p.ragged,
                "indices": p.source == "sparse", "topk_len": self.topk_lens is not None,
                "extra_k_cache": p.extra_topk is not None, "extra_indices": p.extra_topk is not None,
                "extra_topk_len": self.extra_topk_lens is not None}[name]

    def scalar_arguments(self) -> dict:
        """scale, causal and window as the call passes them (`scalars`)."""
        p = self.problem
        scale, causal, window = self.scale, p.causal, p.window
        if "causal=False" in self.scalars and window is not None:
            causal = False
        if "int scale" in self.scalars and scale is not None and float(scale).is_integer():
            scale = int(scale)
        if "numpy" in self.scalars:
            causal, window = np.bool_(causal), None if window is None else np.int64(window)
            if isinstance(scale, float):
                scale = np.float32(scale) if float(np.float32(scale)) == scale else np.float64(scale)
        return dict(scale=scale, causal=causal, window=window)

    @property
    def _one_page_gives_up(self) -> frozenset[str]:
        return frozenset({"padded-pages"} if self.num_blocks == 1 else ())

    @property
    def given_up(self) -> frozenset[str]:
        """Layout hazards this sample's storage forms (`_GIVES_UP`) or its cache of one page leave
        no room for: the call has the form or the size, not the hazard (other draws have the hazard)."""
        forms = {name: set(storage.forms(spec, storage.record(name, self.problem)))
                 for name, spec in self.storages.items()}
        return self._one_page_gives_up | frozenset(
            h for h, (names, taken) in _GIVES_UP.items()
            if (h in self.hazards or HAZARDS[h].kind != "layout")  # a draw hazard is no sample's choice
            and any(set(taken) & forms.get(name, set()) for name in names))

    def without_forms(self, *kinds: str) -> Sample:
        """This sample with no storage form that starts with one of `kinds` ("zero:", "overlap:")."""
        def plain(spec: str) -> str:
            return "+".join(f for f in spec.split("+") if not f.startswith(kinds)) or "contiguous"
        return self.replace(q_storage=plain(self.q_storage), k_storage=plain(self.k_storage),
                            v_storage=plain(self.v_storage), storage=tuple((n, plain(f)) for n, f in self.storage))

    def writable(self) -> Sample:
        """This sample with no argument at stride 0 or with elements sharing memory (neither view
        can be written in place)."""
        return self.without_forms("zero:", "expanded", "overlap:")

    @property
    def id(self) -> str:
        """The problem's id, the distribution, and what differs from the defaults:
        ``hd64-T1-S128-mqa-h4-bf16-constant_scores-seed3-scale0.3-k.sliced``."""
        parts = [self.problem.id, self.distribution]
        if self.seed:
            parts.append(f"seed{self.seed}")
        if self.scale is not None:
            parts.append(f"scale{self.scale:.4g}")
        parts += [f"{which}.{spec}" for which, spec in self.storages.items()]
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
        if self.num_blocks is not None:
            parts.append(f"pages{self.num_blocks}")
        parts += [flag for flag in ("shared_pages", "last_slot", "outliers") if getattr(self, flag)]
        if self.hazards:
            parts.append("hazards:" + "+".join(self.hazards))
        parts += [f"scalars:{form.replace(' ', '_')}" for form in self.scalars]
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
        problem = changes.get("problem", self.problem)
        if (problem.source, problem.ragged, problem.cache_layouts) != (
                self.problem.source, self.problem.ragged, self.problem.cache_layouts):
            changes = _storage_kept(self, problem) | changes  # another call: a form its arguments cannot take goes
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return f"Sample({repr_fields(self, name='')})"

    def hazard_forms(self, name: str) -> set[str]:
        """The storage forms this sample's hazards give argument `name` (kept when it is laid out
        in a form of its own: a step along a dim beside the form's)."""
        return {form for hazard, (names, forms) in _HAZARD_FORMS.items()
                if name in names and hazard in self.hazards and hazard not in self.given_up for form in forms.split("+")}

    def laid_form(self, name: str) -> str:
        """Argument `name`'s whole storage form: its own (`storages`) and its hazards'."""
        own = self.storages.get(name, "")
        named = storage.forms(own, storage.record(name, self.problem)) if own else ()
        return "+".join(sorted({*named, *self.hazard_forms(name)}))

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
            k_cast = k.to(**cast)
            made = Inputs(self, q.to(**cast), k_cast, k_cast if v is k else v.to(**cast),
                          None if sink is None else sink.to(device))
        made = self._laid_out(made, tail_fill)
        tally(made)
        return made

    def _laid_out(self, x: Inputs, fill: float) -> Inputs:
        """`x` with each tensor argument in its storage form (K = V kept; two arguments in one
        buffer where a form says so); the oracle's sources read from what the kernel gets."""
        p = self.problem
        call = {"q": x.q, "k": x.k, "v": x.v, "sink": x.sink, **x.source_args}
        # a hazard's view kept when the argument is laid out again (a quantized cache's bytes are laid
        # out by fmha.oracles.paged_inputs)
        forms = {name: self.laid_form(name) if call.get(name) is not None and storage.record(name, p).name != "quantized cache"
                 else "+".join(storage.forms(spec, storage.record(name, p))) for name, spec in self.storages.items()}
        if not any(call.get(name) is not None for name in forms if name != "out"):
            return x
        laid = dict(call)
        for name, spec in forms.items():
            t = call.get(name)
            if t is None or name in ("out", "block_table") or (name == "v" and x.v is x.k):
                continue  # the block table's form is laid out with its pages (fmha.oracles.paged_inputs)
            argument = storage.record(name, p)
            own = "+".join(f for f in spec.split("+") if not f.startswith("alias:"))
            laid[name] = storage.lay_out(t, argument, own, _fill(name, t, fill))
        laid["v"] = laid["k"] if x.v is x.k else laid["v"]
        _share_buffers(laid, forms, p, fill)
        source_args = {name: laid[name] for name in x.source_args}
        # The oracle's sources hold the same values unless stride 0 or elements sharing memory
        # changed some it reads (q and the sink it takes from the call): only then read again.
        changed = any(kind in spec for name, spec in forms.items() if name not in ("q", "sink", "out")
                      for kind in ("zero:", "overlap:"))
        sources = oracle.from_call(laid["k"], laid["v"], **source_args) if changed and p.source != "dense" \
            else x.oracle_sources
        return Inputs(self, laid["q"], laid["k"], laid["v"], laid["sink"], source_args, sources)

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


# Layout hazards that are a storage form: an argument laid out again keeps them.
_HAZARD_FORMS = {h.name: h.form for h in HAZARDS.values() if h.form[0]}


# A hazard, and the storage forms of an argument that leave it no room: stride 0 along q's heads, or
# heads sharing memory (no gap between them); stride 0 along the keys (one key: none left to hold
# the poison no row may read); pages or slots at stride 0 or sharing memory (no gap between them,
# and a hidden slot's poison overwritten by a visible slot it shares memory with); block table rows
# at stride 0 or sharing memory (no row of its own to slice from a wider table).
# Every row of a request (or every request) reading one row's indices, or a row running into the
# next: what the other rows' indices carried (runs of -1, repeats, the last slot, every code among
# the keys read) is gone.
_GIVES_UP = {"strided-queries": (("q",), ("zero:Hq", "overlap:Hq")),
             "wide-block-table": (("block_table",), ("zero:B", "overlap:B")),
             "invisible-keys": (("k", "v"), ("zero:S", "zero:num_blocks", "zero:block_size", "overlap:num_blocks",
                                             "overlap:block_size")),
             "padded-pages": (("k", "v", "extra_k_cache"), ("zero:num_blocks", "zero:block_size", "overlap:num_blocks",
                                                            "overlap:block_size")),
             "odd-gqa-group": (("k",), ("zero:Hkv",)),  # with v's too: fmha.oracles.hazards._odd_group
             **{h: (("indices", "extra_indices"), ("zero:B", "zero:T", "overlap:B", "overlap:T")) for h in (  # either scope's
                 "invalid-runs", "every-code", "last-slot", "repeated-indices", "rows-without-keys",
                 "scales-at-both-ends")}}


def _storage_kept(sample: Sample, problem: Problem) -> dict:
    """`sample`'s storage fields for a call of `problem`: each form the argument's record there
    allows, packed where it does not (a cache's page order is no dense k's)."""
    def kept(name: str, spec: str) -> str:
        try:
            storage.forms(spec, storage.record(name, problem))
        except ValueError:
            return ""
        return spec
    return dict(q_storage=kept("q", sample.q_storage) or "contiguous",
                k_storage=kept("k", sample.k_storage) or "contiguous",
                v_storage=kept("v", sample.v_storage) or "contiguous",
                storage=tuple((name, kept(name, spec)) for name, spec in sample.storage))


def _fill(name: str, t: torch.Tensor, fill: float):
    """What the buffer around argument `name`'s view holds."""
    if t.dtype == torch.uint8:
        return 0xFF  # NaN scales and codes
    return INT_FILL.get(name, fill)


def _share_buffers(laid: dict, forms: dict, problem: Problem, fill: float) -> None:
    """Arguments a form puts in one buffer (`alias:`): k and v side by side in the last dim of
    one tensor (a packed KV buffer), q beside them where the shapes let one buffer hold all three."""
    k, v = laid["k"], laid["v"]
    together = []
    if "alias:k" in forms.get("q", "").split("+") and problem.source == "dense" and v is not k and (
            laid["q"].shape[:-1] == k.shape[:-1]):
        together = ["q", "k", "v"]
    elif any(a in forms.get("k", "").split("+") for a in ("alias:v", "alias:v cache")) and v is not k:
        together = ["k", "v"]
    if not together:
        return
    parts = [laid[name] for name in together]
    argument = storage.record(together[0], problem)
    own = "+".join(f for f in forms.get(together[0], "").split("+") if not f.startswith(("alias:", "zero:")))
    buffer = storage.lay_out(torch.cat([t.contiguous() for t in parts], -1), argument, own, fill)
    start = 0
    for name, t in zip(together, parts):
        laid[name] = buffer[..., start:start + t.shape[-1]]
        start += t.shape[-1]


def sliced_with_poison(t: torch.Tensor, fill: float, hidden: int = 0) -> torch.Tensor:
    """`t` (B, L, H, D) as the first L rows of a longer buffer whose tail holds `fill`, its
    `hidden` leading rows `fill` too (keys no query row can see, in the leak law)."""
    B, L, H, D = t.shape
    long = torch.full((B, L + SLICE_TAIL, H, D), fill, dtype=t.dtype, device=t.device)
    long[:, hidden:L] = t[:, hidden:]
    return long[:, :L]
