"""Storage by construction: a tensor argument laid out in any form its record allows
(fmha.contract.arguments), and the forms a tensor handed to a kernel shows, read back from its
strides and offsets.

A form is a "+"-joined list of freedoms of the argument's record ("order:Hq.B.T+step:T+offset");
"" is a packed tensor. Everything of the buffer outside the view holds poison, so a kernel that
reads through the wrong strides reads poison. `observed` measures a tensor as the kernel gets
it, never from the form asked for: the coverage audit (fmha.ci.coverage) counts those.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from fmha.contract import ranges, relations
from fmha.contract.arguments import ARGUMENTS, Argument, storage_freedoms
from fmha.contract.cache_layouts import LAYOUTS

# A view's start past its buffer's: 48 bytes keeps the 16-byte alignment vectorised loads and
# bulk copies need (a quantized cache: one page alignment, 576 bytes).
OFFSET_BYTES = 48
# q, k and v's names before the records (Sample.q_storage and pinned samples): their forms.
PRESETS = {"contiguous": "", "strided": "step:{H}", "sliced": "step:B", "expanded": "zero:{H}"}


def record(name: str, problem) -> Argument:
    """The record of the call's argument `name` in `problem`'s call."""
    ragged = problem.ragged
    quantized = {"k": problem.cache_layout, "v": problem.cache_layout, "extra_k_cache": problem.extra_cache_layout}
    if name in quantized and quantized[name]:
        return ARGUMENTS["quantized cache"]
    if name in ("q", "out"):
        return ARGUMENTS[f"{name} (ragged)" if ragged else name]
    if name in ("k", "v"):
        return ARGUMENTS[name if problem.source == "dense" else f"{name} cache"]
    if name == "extra_k_cache":
        return ARGUMENTS["k cache"]
    return ARGUMENTS[name]


def forms(spec: str, argument: Argument) -> tuple[str, ...]:
    """The freedoms of `spec` (a preset name or a "+"-joined list), each checked against the record."""
    if spec in PRESETS:
        spec = PRESETS[spec].format(H=argument.shape[-2] if len(argument.shape) > 1 else "")
    named = tuple(f for f in spec.split("+") if f)
    allowed = storage_freedoms(argument)
    unknown = [f for f in named if f not in allowed]
    if unknown:
        raise ValueError(f"storage of {argument.name}: {unknown} are not among its freedoms ({', '.join(allowed)})")
    return named


def lay_out(t: torch.Tensor, argument: Argument, spec: str, fill) -> torch.Tensor:
    """`t`'s values (along a `zero:` dim, one element's: `_drawn_along`) as a view in the form
    `spec`, in a buffer of `fill` elsewhere."""
    named = forms(spec, argument)
    if not named:
        return t
    if argument.fixed_format:
        return _page_format(t, named, fill)
    dims = argument.shape
    strided = [dims.index(d) for d in argument.strided_dims]
    order = strided
    steps, zeros, overlaps, offset = set(), set(), set(), False
    for form in named:
        kind, _, what = form.partition(":")
        if kind == "order":
            order = [dims.index(d) for d in what.split(".")]
        elif kind == "step":
            steps.add(dims.index(what))
        elif kind == "zero":
            zeros.add(dims.index(what))
        elif kind == "offset":
            offset = True
        elif kind == "overlap":
            overlaps.add(dims.index(what))
    source = t
    for d in sorted(zeros):
        source = _drawn_along(source, d, fill)
    memory = order + [d for d in range(t.dim()) if d not in order]  # outermost first; a contiguous last dim last
    if overlaps:
        return _overlapping(source.expand(t.shape), memory, steps, zeros, overlaps, offset, fill)
    # A dim at stride 0 keeps its extent in the buffer: the other dims' strides are what they
    # would be without it (a gap the size of the rest of it).
    extents = [t.shape[d] * (2 if d in steps and d not in zeros else 1) for d in memory]
    lead = OFFSET_BYTES // t.element_size() if offset else 0
    flat = _filled(lead + math.prod(extents), fill, t)
    buffer = flat[lead:].view(extents).permute([memory.index(d) for d in range(t.dim())])
    view = buffer[tuple(slice(0, 1) if d in zeros else slice(None, None, 2) if d in steps else slice(None)
                        for d in range(t.dim()))]
    view.copy_(source)
    return view.expand(t.shape) if zeros else view


def _overlapping(values: torch.Tensor, memory: list[int], steps: set, zeros: set, overlaps: set, offset: bool,
                 fill) -> torch.Tensor:
    """`values` laid out with the dims in `overlaps` at half the stride that would pack them, so
    each element shares memory with the next one's (an unfolded sliding window's chunks); the
    other forms as `lay_out` makes them. Elements that share memory hold one value: a drawn one
    where any of them had one (not `fill`, not NaN), so poison where no row may read never spreads
    to a value a row reads; the view's values are what the buffer then holds, and the oracle reads
    the view."""
    # innermost first: `packed` what the dims inside span at their strides, `span` what they reach
    # (more, inside an overlapped dim: a step's gap lies past it); an overlapped stride above the
    # inner dim's, so the order reads back
    strides, packed, span, inner = [0] * values.dim(), 1, 1, 0
    for d in reversed(memory):
        stride = 2 * span if d in steps and d not in zeros else max(inner + 1, packed // 2) if d in overlaps \
            else packed
        strides[d], inner = stride, stride
        packed, span = values.shape[d] * stride, span + (values.shape[d] - 1) * stride
    lead = OFFSET_BYTES // values.element_size() if offset else 0
    flat = _filled(lead + 1 + sum((n - 1) * stride for n, stride in zip(values.shape, strides)), fill, values)
    where = torch.tensor(lead, dtype=torch.int64)
    for d in range(values.dim()):
        shape = [1] * values.dim()
        shape[d] = values.shape[d]
        where = where + torch.arange(values.shape[d]).view(shape) * strides[d]
    where, written = where.flatten(), values.reshape(-1)
    # of the elements at one address the last drawn one is kept, else the last: the highest rank
    n, where = written.numel(), where.to(written.device)
    rank = _rank(written, fill, torch.arange(n, device=written.device))
    kept = torch.full((flat.numel(),), -1, dtype=torch.int64, device=written.device).scatter_reduce_(0, where, rank, "amax")
    held = (kept >= 0).nonzero().flatten()
    flat[held] = written[kept[held] % n]
    view = flat.as_strided(values.shape, strides, lead)
    for d in sorted(zeros):
        view = view.narrow(d, 0, 1)
    return view.expand(values.shape) if zeros else view


def _rank(values: torch.Tensor, fill, order: torch.Tensor) -> torch.Tensor:
    """Each element's rank among those sharing a place, the highest kept: every drawn value above
    all poison (not finite, or `fill`), then by `order` (position, 0 to n - 1)."""
    return (~_poison(values, fill)).to(torch.int64) * order.numel() + order


def _poison(values: torch.Tensor, fill) -> torch.Tensor:
    """Where `values` hold poison (not finite, or `fill`), not a drawn value."""
    poison = ~torch.isfinite(values)
    if not isinstance(fill, torch.Tensor):  # a 0-d fill is a NaN's payload: not finite already
        poison |= values == fill
    return poison


def _drawn_along(t: torch.Tensor, d: int, fill) -> torch.Tensor:
    """`t` narrowed to one element along dim `d` (for stride 0 there): at each position the last
    drawn one, else the last. Poison where no row may read never spreads to a value a row reads:
    every page of a cache one keeps each slot some request reads; the last key of a dense call is
    one every row sees."""
    along = [1] * t.dim()
    along[d] = t.shape[d]
    rank = _rank(t, fill, torch.arange(t.shape[d], device=t.device).view(along))
    return t.gather(d, rank.argmax(d, keepdim=True))


def _filled(n: int, fill, like: torch.Tensor) -> torch.Tensor:
    """n elements of `fill` (a number, or a 0-d tensor whose bits are kept: a NaN's payload)."""
    if isinstance(fill, torch.Tensor):
        return fill.to(like.device).expand(n).clone()
    return torch.full((n,), fill, dtype=like.dtype, device=like.device)


def _layout_of(cache: torch.Tensor):
    """The cache layout whose tokens are as many bytes as `cache`'s (their pages are alike)."""
    return next(spec for spec in LAYOUTS.values() if spec.token_bytes == cache.shape[-1])


def _page_format(cache: torch.Tensor, named, fill) -> torch.Tensor:
    """A quantized cache (num_blocks, block_size, 1, token_bytes) whose pages are spaced one page
    alignment apart more (`step:`), or which starts one alignment into its buffer (`offset`)."""
    alignment = _layout_of(cache).page_alignment
    num_blocks, block_size = cache.shape[:2]
    used = block_size * cache.shape[-1]
    page = -(-max(cache.stride(0), used) // alignment) * alignment
    page += alignment if any(f.startswith("step:") for f in named) else 0
    lead = alignment if "offset" in named else 0
    flat = _filled(lead + num_blocks * page, fill, cache)
    flat[lead:].view(num_blocks, page)[:, :used] = cache.as_strided((num_blocks, used), (cache.stride(0), 1))
    return flat.as_strided(cache.shape, (page, *cache.stride()[1:]), lead)


def observed(t: torch.Tensor, argument: Argument, size_one: bool = False) -> set[str]:
    """The freedoms of `argument`'s record that `t`, as handed to a kernel, shows (aliasing
    aside: that is between arguments, `aliased`). A dim of size 1 has a stride that reads nothing:
    not counted, unless `size_one` (a gap after it is still a gap in the buffer)."""
    found = set()
    if t.storage_offset() > 0:
        found.add("offset")
    dims = argument.shape
    if argument.fixed_format:
        if t.shape[0] > 1 and t.stride(0) > _layout_of(t).page_bytes(t.shape[1]):
            found.add(f"step:{dims[0]}")
        return found
    strided = [dims.index(d) for d in argument.strided_dims]
    real = [d for d in strided if t.shape[d] > 1 or (size_one and t.stride(d) > 0)]
    found |= {f"zero:{dims[d]}" for d in real if t.stride(d) == 0}
    moving = sorted((d for d in real if t.stride(d) > 0), key=lambda d: (-t.stride(d), d))
    if len(moving) == len(strided) and moving != strided:
        found.add(f"order:{'.'.join(dims[d] for d in moving)}")
    inner_size = t.shape[-1] if argument.contiguous_last else 1  # what the innermost dim's elements span packed
    # a dim at stride 0 may hold its extent in memory anywhere inside: a step is a gap past that too
    spread = math.prod(t.shape[d] for d in real if t.stride(d) == 0)
    for outer, inner in zip(moving, [*moving[1:], None]):
        packed = inner_size if inner is None else t.shape[inner] * t.stride(inner)
        if t.stride(outer) > packed * spread:
            found.add(f"step:{dims[outer]}")
        elif t.stride(outer) < packed:  # the inner dim's elements run into the next one's
            found.add(f"overlap:{dims[outer]}")
    return found & set(storage_freedoms(argument))


def aliased(tensors: dict[str, tuple[torch.Tensor, Argument]]) -> dict[str, set[str]]:
    """Per argument: `alias:<other>` for each argument its record may alias that is another view
    of the same buffer (not the same tensor: K = V is a call of its own)."""
    found = {name: set() for name in tensors}
    for name, (t, argument) in tensors.items():
        for other_name, (other, other_argument) in tensors.items():
            if other is t or other_argument.name not in argument.aliases:
                continue
            if t.untyped_storage().data_ptr() == other.untyped_storage().data_ptr():
                found[name].add(f"alias:{other_argument.name}")
    return found


# (record, freedom) -> how many calls made in this process handed a kernel a tensor showing it
# (fmha.oracles.kernel_call counts them; fmha.ci.coverage reports).
REACHED: Counter = Counter()
# (size's symbol, its value) -> how many such calls (fmha.contract.ranges; the audit labels them).
SIZES_SEEN: Counter = Counter()
# (relation, form) -> how many such calls (fmha.contract.relations.shown).
RELATIONS_SEEN: Counter = Counter()
__judge_state__ = ("REACHED", "SIZES_SEEN", "RELATIONS_SEEN")  # fmha.oracles.guard: not a part of what judges


def freedoms_of(call: dict, problem) -> set[tuple[str, str]]:
    """(record, freedom) for each freedom the tensor arguments of `call` (the contract call's
    arguments by name) show."""
    tensors = {name: (t, record(name, problem)) for name, t in call.items()
               if isinstance(t, torch.Tensor) and not (name == "v" and t is call.get("k"))}
    aliases = aliased(tensors)
    return {(argument.name, f) for name, (t, argument) in tensors.items() for f in observed(t, argument) | aliases[name]}


def measured(call: dict, problem) -> tuple[set, set, set]:
    """What the audit counts of one call: its storage freedoms, its sizes and its relations' forms."""
    return freedoms_of(call, problem), ranges.of_call(call, problem), relations.shown(call)


def tally(call: dict, problem) -> None:
    for counter, found in zip((REACHED, SIZES_SEEN, RELATIONS_SEEN), measured(call, problem)):
        counter.update(found)
