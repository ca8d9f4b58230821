"""Hypothesis strategies over the attention contract, drawn inside a kernel's capabilities.

`samples(caps, device)` draws a `Sample` (fmha.oracles.sample): a problem plus the scale,
the input distribution, the seed and the storage of each of q, k and v, every dimension
drawn on its own: dtype, head dims (Dv != D too), batch (1-8, sometimes far larger), group
sizes with several KV heads, sequence lengths at tile edges, causal, window, sink, K is V,
scale, each tensor argument's storage form from its record (fmha.contract.arguments) and the
scalars' forms (a window with causal=False, numpy scalars: fmha.contract.relations). What a
kernel declares it cannot do is never drawn: its head dims per dtype, the features it requires (causal-only), its shape relations (T = S, lengths
a multiple of a tile) shape the draw, and `not_supported_reasons` filters what is left. A
budget per call keeps the CPU tier, which interprets kernels, fast: the sizes drawn are cut
(queries and batch in turn, then keys) until a call fits it.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from fmha.contract import Capabilities
from fmha.contract.arguments import storage_freedoms
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.oracles.hazards import hostile
from fmha.oracles.sample import OTHER_ARGUMENTS, SCALAR_FORMS, Sample
from fmha.oracles.storage import record
from fmha.contract import Problem

# Sequence lengths at tile sizes +- 1 (16 to 1024), drawn on purpose next to uniform ones.
TILE_EDGES = sorted({n + d for n in (16, 32, 64, 128, 256, 512, 1024) for d in (-1, 0, 1)})
GROUP_SIZES = (1, 2, 3, 4, 5, 7, 8, 16)
# Batches where real kernels switch schedules (vLLM: 160), drawn now and then.
LARGE_BATCHES = (16, 33, 64, 160)
# Long contexts: where unnormalised fp16 accumulators overflow with large |V|.
LONG_KV_LENS = (2048, 3000, 4096)
DEFAULT_HEAD_DIMS = tuple(range(16, 513, 16))

# Budget per call, per device. Work: B * Hq * T * S * (D + Dv), what the oracle and an
# eager kernel pay. Logits: B * Hq * T * S, the float64 oracle's memory (a few tensors of 8
# bytes each; on an H200 with 16 workers, 2^24 keeps each worker near 1 GB: larger draws ran
# it out of memory). Tiles: what the Triton interpreter pays, about 6 ms per 32
# rows x 64 keys x 256 head-dim columns whatever else is drawn (CPU), counted for
# the MHA layout because the GQA law runs that too; at 64 of them a call, the laws of fmha's
# interpreted kernels took 200 of the CPU tier's 2-core seconds, at 32 they took 90; 48 keeps
# multi-tile draws common (the GPU tier draws the larger calls). Keys: B * Hq * S * (D + Dv), the float64
# K and V the oracle repeats for every query head (at 2^27, 1 GB each; decode draws of
# 160 x 15 heads x 4096 keys x 800 dims wanted 31 GB and ran an H200 out). Rows:
# B * Hq * T * (D + Dv), the float64 Q and O (the work budget bounds it on the CPU; on a GPU
# few keys let 160 x 64 heads x 300 queries x 1024 dims through: 12 GB of float64 Q, and the
# nightly profile's draws filled every worker's 8 GB share). At 2^27 each a
# law's runs and oracles still passed a worker's 6.1 GB share (0.7 of an H200 over 16): 2^26 for
# keys. Rows 2^25: a law that compares two outputs measures them in float64 a dozen times over (33
# x 150 queries x 24 heads, head dims 32 and 416, 2^25.7 rows, held 6.0 GB and ran out).
# Those are CUDA's budgets at that share; a GPU job on a card with less memory a worker scales
# the memory budgets down (fit_cuda_budgets, from fmha.ci.gpu_sizing).
WORK_BUDGET = {"cpu": 4e7, "cuda": 4e10}
LOGIT_BUDGET = {"cpu": 2**22, "cuda": 2**24}
TILE_BUDGET = {"cpu": 48, "cuda": 1e9}
KEY_BUDGET = {"cpu": 4e7, "cuda": 2**26}
ROW_BUDGET = {"cpu": 4e7, "cuda": 2**25}
MEASURED_ON_CUDA = tuple((budget, budget["cuda"]) for budget in (LOGIT_BUDGET, KEY_BUDGET, ROW_BUDGET))


def fit_cuda_budgets(scale: float) -> None:
    """The CUDA memory budgets (logits, keys, rows) at `scale` (<= 1) of those measured; set
    once per process, before any draw."""
    for budget, measured in MEASURED_ON_CUDA:
        budget["cuda"] = int(measured * min(1.0, scale))


def call_cost(device: str, batch, heads_q, q_len, kv_len, head_dim, head_dim_v) -> float:
    """A call's cost as a fraction of the device's budget (over 1: too much)."""
    logits = batch * heads_q * q_len * kv_len
    work = logits * (head_dim + head_dim_v)
    keys = batch * heads_q * kv_len * (head_dim + head_dim_v)
    rows = batch * heads_q * q_len * (head_dim + head_dim_v)
    tiles = batch * heads_q * -(-q_len // 32) * -(-kv_len // 64) * -(-head_dim // 256) * -(-head_dim_v // 256)
    return max(work / WORK_BUDGET[device], logits / LOGIT_BUDGET[device], tiles / TILE_BUDGET[device],
               keys / KEY_BUDGET[device], rows / ROW_BUDGET[device])


def _length(upper: int):
    """1..upper, or a tile edge (clamped to upper). The meaning of each choice never depends
    on other draws, so hypothesis can shrink every size on its own."""
    return st.one_of(st.integers(1, upper), st.sampled_from(TILE_EDGES).map(lambda n: min(n, upper)))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _round_down(n: float, multiple: int) -> int:
    """n rounded down to a multiple, and at least one multiple."""
    n = int(n)
    return max(multiple, n - n % multiple)


@st.composite
def problems(draw, caps: Capabilities, device: str = "cpu", max_q_len: int = 300, max_kv_len: int = 1100,
             long_context: bool = False) -> Problem:
    """A problem inside `caps`. With `long_context`, fp16 (where declared) over thousands of keys."""
    features, requires = caps.features, caps.requires
    dtypes = [d for d in caps.dtypes if caps.head_dims_for(d) != ()]
    dtype = draw(st.sampled_from(dtypes))
    if long_context and torch.float16 in dtypes:
        dtype = torch.float16
    head_dims = [d for d in (caps.head_dims_for(dtype) or DEFAULT_HEAD_DIMS) if d <= 512]
    head_dim = draw(st.sampled_from(head_dims))
    shared_kv = "shared_kv" in requires or ("shared_kv" in features and draw(st.booleans()))
    # Rare choices are the largest value of a range: hypothesis shrinks toward the smallest.
    other_dv = caps.split_head_dim_v and not shared_kv and draw(st.integers(0, 3)) == 3
    head_dim_v = draw(st.sampled_from(head_dims)) if other_dv else head_dim
    needs_groups = "gqa" in requires
    group = draw(st.sampled_from(GROUP_SIZES[1:] if needs_groups else GROUP_SIZES)) if "gqa" in features else 1
    heads_kv = draw(st.integers(1, 4))
    batch = draw(st.one_of(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.sampled_from(LARGE_BATCHES)))
    kv_upper = min(max_kv_len, caps.max_kv_len or max_kv_len)
    # Both drawn either way, so that turning long_context off while shrinking keeps the rest.
    kv_len, long_kv_len = draw(_length(kv_upper)), draw(st.sampled_from(LONG_KV_LENS))
    if long_context:
        kv_len = min(long_kv_len, caps.max_kv_len or long_kv_len)
    q_len = draw(_length(min(max_q_len, caps.max_q_len or max_q_len)))
    causal = "causal" in requires or ("causal" in features and draw(st.booleans()))
    windowed = causal and "window" in features and ("window" in requires or draw(st.booleans()))
    window = draw(st.integers(1, kv_len + 1)) if windowed else None
    sink = "sink" in requires or ("sink" in features and draw(st.booleans()))

    # The kernel's shape relations, then the budget: fewer queries or a smaller batch, then
    # fewer keys.
    heads_q = heads_kv * group
    if caps.heads_q is not None:  # a kernel built for some query head counts: one of them, grouped as it allows
        heads_q = draw(st.sampled_from(caps.heads_q))
        kv_heads = [h for h in range(1, heads_q + 1) if heads_q % h == 0 and h <= 4 and (
            h < heads_q if needs_groups else "gqa" in features or h == heads_q)]
        heads_kv = draw(st.sampled_from(kv_heads or [heads_q]))
    q_step, kv_step = caps.q_len_multiple_of, caps.kv_len_multiple_of
    kv_len = round_up(kv_len, kv_step)
    q_len = kv_len if caps.q_len_equals_kv_len else round_up(q_len, q_step)

    def over(b, t, s):
        return call_cost(device, b, heads_q, t, s, head_dim, head_dim_v) > 1

    # Queries and batch halve in turn, the larger first: cutting queries alone to one row left
    # the laws that need several (decode vs prefill, causal alignment) few draws to see them.
    while over(batch, q_len, kv_len):
        fewer_queries = not caps.q_len_equals_kv_len and q_len > q_step
        if fewer_queries and (batch == 1 or q_len >= batch):
            q_len = _round_down(q_len // 2, q_step)
        elif batch > 1:
            batch //= 2
        else:
            break
    while kv_len > kv_step and over(batch, q_len, kv_len):
        kv_len = _round_down(kv_len // 2, math.lcm(q_step, kv_step) if caps.q_len_equals_kv_len else kv_step)
        q_len = kv_len if caps.q_len_equals_kv_len else q_len
    if (caps.q_len_at_most_kv_len or (causal and not caps.empty_rows)) and not caps.q_len_equals_kv_len:
        q_len = min(q_len, kv_len)
    return Problem(
        batch=batch, q_len=q_len, kv_len=kv_len, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
        head_dim_v=head_dim_v, dtype=dtype, causal=causal, window=window, sink=sink, shared_kv=shared_kv,
    )


def scalar_forms():
    """How a call passes its scalars (Sample.scalars: fmha.contract.relations), up to two forms at
    once; none (Python's bool, int and float) is where shrinking goes."""
    return st.lists(st.sampled_from(SCALAR_FORMS), max_size=2, unique=True).map(tuple)


def scales(head_dim: int):
    """None (the contract's default, D**-0.5) a quarter of the time, else a scale a caller
    might pass: any in [1/64, 1], 1, or half the default."""
    return st.one_of(st.none(), st.floats(1 / 64, 1.0, width=32), st.just(1.0), st.just(head_dim**-0.5 / 2))


@st.composite
def samples(draw, caps: Capabilities, device: str = "cpu", distributions=tuple(DISTRIBUTIONS), **limits) -> Sample:
    """A sample inside `caps`, hostile (the keys left of every row's window hold NaN); one in
    eight is a long fp16 context with large |V| where the kernel declares fp16 (and the
    distributions include large_v)."""
    long_context = "large_v" in distributions and torch.float16 in caps.dtypes and draw(st.integers(0, 7)) == 7
    problem = draw(problems(caps, device, long_context=long_context, **limits)
                   .filter(lambda p: not caps.not_supported_reasons(p, device)))
    scale, distribution = draw(scales(problem.head_dim)), draw(st.sampled_from(distributions))
    sample = Sample(problem=problem, scale=scale, distribution="large_v" if long_context else distribution,
                    seed=draw(st.integers(0, 2**16)), scalars=draw(scalar_forms()))
    return hostile(sample.replace(**draw(storages(sample))), caps)


def storage_form(argument, aliases: bool = True):
    """A storage form of `argument`'s record (fmha.contract.arguments): another memory order
    now and then, up to two more freedoms; "" (packed) is where shrinking goes. A step along a
    dim at stride 0 may be drawn: it steps over nothing (fmha.oracles.storage.lay_out)."""
    free = storage_freedoms(argument)
    orders = [f for f in free if f.startswith("order:")]
    shared = [f for f in free if f.startswith("alias:")] if aliases else []
    others = [f for f in free if not f.startswith(("order:", "alias:"))]
    chosen = st.lists(st.sampled_from(others), max_size=2, unique=True) if others else st.just([])
    order = st.one_of(st.just([]), st.sampled_from(orders).map(lambda f: [f])) if orders else st.just([])
    # a shared buffer every other draw where the argument may have one (a fused projection's q, k, v)
    alias = st.sampled_from([[], *([f] for f in shared)]) if shared else st.just([])
    return st.tuples(order, chosen, alias).map(lambda parts: "+".join(parts[0] + parts[1] + parts[2]))


@st.composite
def storages(draw, sample: Sample) -> dict:
    """Sample fields laying each tensor argument of `sample`'s call out on its own."""
    fields, others = {}, []
    for name in ("q", "k", "v", *OTHER_ARGUMENTS):
        if not sample.takes(name):
            continue
        spec = draw(storage_form(record(name, sample.problem), aliases=not sample.problem.shared_kv))
        if name in ("q", "k", "v"):
            fields[f"{name}_storage"] = spec or "contiguous"
        elif spec:
            others.append((name, spec))
    return fields | {"storage": tuple(others)}
