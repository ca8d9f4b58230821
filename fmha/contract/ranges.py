"""The sizes a caller chooses, as data: one record per size of a call (B, T, S, the heads, the head
dims; a paged or sparse call's block size, top-k and the page ids it reads; fmha.contract.arguments
has the tensors' storage), with the values of its range where kernels go wrong, so that the draws
(fmha.properties.strategies) reach them and the coverage audit (fmha.ci.coverage) names any they
do not.

A size's freedoms, within its range as the contract gives it or as a kernel's declaration narrows
it (a kernel of head dims 16 to 512 in steps of 16: its D's "min + 1" is 32):

- ``min``, ``min+1``, ``max-1``, ``max``: the ends of the range and their neighbours;
- ``2^k-1``, ``2^k``, ``2^k+1`` for k in 8, 16, 24, 31 inside the range: where a kernel that
  narrows the size (or an index it computes from it) to k bits wraps;
- ``=n``: a value real models use that tiles of powers of two do not fit (head dim 40 in
  diffusion UNets, 72 in SigLIP; a group of 6 or 12; 128 query heads).

Values past what a CPU run affords (`Size.affordable`) belong to the GPU scale tier
(fmha.properties.scale, `--fmha-scale`), up to what one card affords (`Size.scale`); past that,
no device's (a call of 2^31 requests or keys holds more than any card's memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTHS = (8, 16, 24, 31)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Size:
    symbol: str
    meaning: str
    hi: int  # the contract's largest (its smallest is 1)
    models: tuple[int, ...] = ()  # values real models use
    # Above this a call is the GPU scale tier's (the CPU tier's interpreter and oracle cannot afford it).
    affordable: int = 512
    sources: tuple[str, ...] = ("dense", "paged", "sparse")  # the calls that have it
    # Up to this the GPU scale tier draws it, the call's other sizes small: 2^24 + 1 rows, keys, slots
    # of a page or indices of a row in q's dtype fit a card beside the oracle's passes; requests and
    # heads are a Python loop or a program each, 2^16 + 1 of them minutes at most.
    scale: int = 2**24 + 1


SIZES: dict[str, Size] = {s.symbol: s for s in (
    Size("B", "requests in the batch", INT32_MAX, affordable=64, scale=2**16 + 1),
    Size("T", "query rows a request", INT32_MAX, affordable=1100),
    Size("S", "keys a request", INT32_MAX, affordable=4096),
    Size("Hq", "query heads", INT32_MAX, models=(128,), scale=2**16 + 1),
    Size("Hkv", "KV heads", INT32_MAX, affordable=64, scale=2**16 + 1),
    Size("group", "query heads a KV head reads for (Hq / Hkv)", INT32_MAX, models=(6, 12, 64), affordable=64,
         scale=2**16 + 1),
    Size("D", "head dim of q and k", 512, models=(40, 72, 80, 96, 112)),
    Size("Dv", "head dim of v", 512, models=(40, 72, 80, 96, 112)),
    # contract v2, read from the call: a page's keys and a sparse row's indices (either scope's), the
    # pages of a cache (either scope's; its page ids run to one less, the ids a kernel may narrow)
    Size("block_size", "keys a page holds", INT32_MAX, models=(16, 64), affordable=1024, sources=("paged", "sparse")),
    Size("topk", "indices a sparse row holds, a scope", INT32_MAX, models=(512, 2048), affordable=2048,
         sources=("sparse",)),
    Size("pages", "pages a cache holds (num_blocks)", INT32_MAX, affordable=2**16 + 1, sources=("paged", "sparse")),
)}


def values(size: Size, allowed: Sequence[int] | None = None) -> dict[str, int]:
    """label -> value of each freedom of `size` within `allowed` (the declared values: a range, or
    any others, sorted here), or within 1..hi where the kernel declares none."""
    if allowed is not None:
        allowed = allowed if isinstance(allowed, range) else tuple(sorted(allowed))
        if not allowed:  # a dtype the kernel declares no head dim for
            return {}
        ends = {"min": allowed[0], "max": allowed[-1]}
        if len(allowed) > 1:
            ends |= {"min+1": allowed[1], "max-1": allowed[-2]}
        inside = allowed.__contains__ if isinstance(allowed, range) else set(allowed).__contains__  # a range: O(1)
    else:
        ends = {"min": 1, "min+1": 2, "max-1": size.hi - 1, "max": size.hi}
        inside = lambda n: 1 <= n <= size.hi  # noqa: E731
    found = dict(ends)
    for k in WIDTHS:
        for label, n in ((f"2^{k}-1", 2**k - 1), (f"2^{k}", 2**k), (f"2^{k}+1", 2**k + 1)):
            if inside(n):
                found[label] = n
    found |= {f"={n}": n for n in size.models if inside(n)}
    return found


def of_problem(problem) -> dict[str, int]:
    """symbol -> the size a problem has (the sizes every call has)."""
    return dict(B=problem.batch, T=problem.q_len, S=problem.kv_len, Hq=problem.heads_q, Hkv=problem.heads_kv,
                group=problem.heads_q // problem.heads_kv, D=problem.head_dim, Dv=problem.head_dim_v)


def of_call(call: dict, problem) -> set[tuple[str, int]]:
    """(symbol, value) of every size the contract call `call` (its arguments by name) shows: the
    problem's, and a paged or sparse call's block sizes, top-k and pages (each scope's)."""
    found = set(of_problem(problem).items())
    if problem.source == "dense":
        return found
    found |= {("block_size", n) for n in (problem.block_size, problem.extra_block_size) if n}
    if problem.source == "sparse":
        found |= {("topk", n) for n in (problem.kv_len, problem.extra_topk) if n}
    found |= {("pages", int(cache.shape[0])) for cache in (call["k"], call.get("extra_k_cache")) if cache is not None}
    return found


def allowed_by(caps, symbol: str) -> Sequence[int] | None:
    """The values of `symbol` a kernel of `caps` declares, or None (the contract's whole range)."""
    if symbol == "block_size":
        return caps.block_sizes
    if symbol == "topk" and (caps.max_topk is not None or caps.topk_multiple_of > 1):
        step = caps.topk_multiple_of
        return tuple(range(step, (caps.max_topk or 4096 * step) + 1, step))
    if symbol in ("D", "Dv"):
        sets = [caps.head_dims_for(d) for d in caps.dtypes]
        if any(s is None for s in sets):
            return None
        return tuple(sorted({n for s in sets for n in s if n <= SIZES[symbol].hi}))
    if symbol == "Hq" and caps.heads_q is not None:
        return tuple(sorted(caps.heads_q))
    if symbol == "group" and "gqa" not in caps.features:
        return (1,)
    if symbol in ("T", "S"):  # up to the declared maximum, in the declared steps (T = S: both of both)
        step = {"T": caps.q_len_multiple_of, "S": caps.kv_len_multiple_of}[symbol]
        largest = {"T": caps.max_q_len, "S": caps.max_kv_len}[symbol]
        if caps.q_len_equals_kv_len:
            step = math.lcm(caps.q_len_multiple_of, caps.kv_len_multiple_of)
            largest = min((n for n in (caps.max_q_len, caps.max_kv_len) if n is not None), default=None)
        if step == 1 and largest is None:
            return None
        return range(step, (largest or SIZES[symbol].hi) + 1, step)
    return None


def freedoms(caps=None) -> list[tuple[str, str, int]]:
    """(symbol, label, value) of every size's freedoms (narrowed by `caps`' declaration if given)."""
    return [(s.symbol, label, n) for s in SIZES.values()
            for label, n in values(s, allowed_by(caps, s.symbol) if caps is not None else None).items()]


# A cache's slots a CPU run affords: 2^16 + 1 pages of one or two keys, 257 pages of up to 1024.
PAGE_SLOTS_AFFORDABLE = 2**18
# And the GPU scale tier: 2^24 + 1 pages of one key (of 64: 2^19).
PAGE_SLOTS_SCALE = 2**25


def cache_affordable(pages: int, block_size: int) -> bool:
    """Whether a CPU run affords a cache of `pages` pages of `block_size` keys."""
    return pages * block_size <= PAGE_SLOTS_AFFORDABLE


def affordable(symbol: str, value: int, caps) -> bool:
    """Whether a CPU run affords a call with `symbol` at `value` (else: the GPU scale tier's); a
    cache's pages count in the kernel's smallest block size."""
    return tier(symbol, value, caps) == "cpu"


def tier(symbol: str, value: int, caps) -> str:
    """Which tier draws `symbol` at `value` for a kernel of `caps`: "cpu" (every run), "scale" (the
    GPU scale tier) or "none" (past what one card affords); a cache's pages count in the kernel's
    smallest block size."""
    if symbol == "pages":
        slots = value * min(caps.block_sizes or (1,))
        return "cpu" if slots <= PAGE_SLOTS_AFFORDABLE else "scale" if slots <= PAGE_SLOTS_SCALE else "none"
    size = SIZES[symbol]
    return "cpu" if value <= size.affordable else "scale" if value <= size.scale else "none"


def applies(symbol: str, caps) -> bool:
    """Whether a kernel of `caps` makes calls that have the size `symbol`."""
    return bool(set(SIZES[symbol].sources) & set(caps.sources))


def markdown() -> str:
    """docs/contract.md's table of sizes, from the records: each size's freedoms over the
    contract's range (a kernel's declaration narrows them), and what a CPU run affords."""
    from fmha.tables import Table

    table = Table(["size", "meaning", "calls", "range", "its freedoms", "a CPU run affords", "the GPU scale tier"])
    for s in SIZES.values():
        found = values(s)
        widths = [k for k in WIDTHS if f"2^{k}" in found]
        models = ", ".join(label for label in found if label.startswith("="))
        freedoms = ["min, min+1, max-1, max", f"2^k-1, 2^k, 2^k+1 for k in {', '.join(map(str, widths))}",
                    *([f"models' {models}"] if models else [])]
        table.add(s.symbol, s.meaning, ", ".join(s.sources), "1 .. 2^31-1" if s.hi == INT32_MAX else f"1 .. {s.hi}",
                  "; ".join(freedoms), "a cache of 2^18 slots" if s.symbol == "pages" else f"up to {s.affordable}",
                  "a cache of 2^25 slots" if s.symbol == "pages" else _power(s.scale) if s.scale < s.hi else "")
    return table.markdown() + "\n"


def _power(n: int) -> str:
    """2^24 + 1 as such."""
    k = n.bit_length() - 1
    return f"up to 2^{k}" + (f" + {n - 2**k}" if n > 2**k else "")


if __name__ == "__main__":
    print(markdown(), end="")
