"""The sizes a caller chooses, as data: one record per size of a dense call (fmha.contract.arguments
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

Values past what a CPU run affords (``GPU_SCALE``) belong to the GPU scale tier.
"""

from __future__ import annotations

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


SIZES: dict[str, Size] = {s.symbol: s for s in (
    Size("B", "requests in the batch", INT32_MAX, affordable=64),
    Size("T", "query rows a request", INT32_MAX, affordable=1100),
    Size("S", "keys a request", INT32_MAX, affordable=4096),
    Size("Hq", "query heads", INT32_MAX, models=(128,)),
    Size("Hkv", "KV heads", INT32_MAX, affordable=64),
    Size("group", "query heads a KV head reads for (Hq / Hkv)", INT32_MAX, models=(6, 12, 64), affordable=64),
    Size("D", "head dim of q and k", 512, models=(40, 72, 80, 96, 112)),
    Size("Dv", "head dim of v", 512, models=(40, 72, 80, 96, 112)),
)}


def values(size: Size, allowed: tuple[int, ...] | None = None) -> dict[str, int]:
    """label -> value of each freedom of `size` within `allowed` (the declared values, sorted), or
    within 1..hi where the kernel declares none."""
    if allowed is not None:
        allowed = tuple(sorted(allowed))
        if not allowed:  # a dtype the kernel declares no head dim for
            return {}
        ends = {"min": allowed[0], "max": allowed[-1]}
        if len(allowed) > 1:
            ends |= {"min+1": allowed[1], "max-1": allowed[-2]}
        inside = set(allowed).__contains__
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
    """symbol -> the size a dense problem has."""
    return dict(B=problem.batch, T=problem.q_len, S=problem.kv_len, Hq=problem.heads_q, Hkv=problem.heads_kv,
                group=problem.heads_q // problem.heads_kv, D=problem.head_dim, Dv=problem.head_dim_v)


def allowed_by(caps, symbol: str) -> tuple[int, ...] | None:
    """The values of `symbol` a kernel of `caps` declares, or None (the contract's whole range)."""
    if symbol in ("D", "Dv"):
        sets = [caps.head_dims_for(d) for d in caps.dtypes]
        if any(s is None for s in sets):
            return None
        return tuple(sorted({n for s in sets for n in s if n <= SIZES[symbol].hi}))
    if symbol == "Hq" and caps.heads_q is not None:
        return tuple(sorted(caps.heads_q))
    if symbol == "group" and "gqa" not in caps.features:
        return (1,)
    largest = {"T": caps.max_q_len, "S": caps.max_kv_len}.get(symbol)
    return tuple(range(1, largest + 1)) if largest is not None else None


def freedoms(caps=None) -> list[tuple[str, str, int]]:
    """(symbol, label, value) of every size's freedoms (narrowed by `caps`' declaration if given)."""
    return [(s.symbol, label, n) for s in SIZES.values()
            for label, n in values(s, allowed_by(caps, s.symbol) if caps is not None else None).items()]
