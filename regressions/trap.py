"""What a named regression case is: the trap (a bug a kernel team actually shipped, from the
seed logs), the samples that expose it, and the symptom checks that see it.

Every case runs the foundation's verdict (fmha.oracles.verdict) on the kernel's output; a
trap may add symptom checks for what the verdict's tolerances are too loose to see (a
rounding bias of half an ulp is inside every per-element bound but is still a bug).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from fmha.contract import KernelEntry
from fmha.contract.ranges import PAGE_SLOTS_AFFORDABLE, cache_affordable
from fmha.oracles.check import judge_run, oracle_of, verdict_of
from fmha.oracles.kernel_call import run_kernel
from fmha.oracles.sample import Sample
from fmha.properties.strategies import round_up
from fmha.contract import Problem

# A symptom check: (kernel output, float64 oracle output, problem) -> failure text or None.
Symptom = Callable[[torch.Tensor, torch.Tensor, Problem], "str | None"]


@dataclass(frozen=True)
class Trap:
    id: str  # kebab-case, e.g. "normalize-twice"
    seed_logs: tuple[str, ...]  # the seed logs it comes from, e.g. ("002",); () when `source` says where
    symptom: str  # what a user sees
    root_cause: str  # what was wrong in the kernel
    cases: tuple[Sample, ...]  # each with its name: what about these inputs exposes the trap
    source: str = "docs/contract.md trap table"  # or where in the seeds it was found
    symptoms: tuple[Symptom, ...] = ()  # checks beyond the verdict

    @property
    def origin(self) -> str:
        """Where the trap comes from, for messages: ``seed 002`` or its source."""
        return f"seed {', '.join(self.seed_logs)}" if self.seed_logs else self.source

    def __post_init__(self):
        for name in ("id", "symptom", "root_cause"):
            if not getattr(self, name).strip():
                raise ValueError(f"Trap.{name} is mandatory")
        if not self.cases:
            raise ValueError(f"trap {self.id!r}: needs at least one case")
        if not self.seed_logs and self.source == Trap.source:
            raise ValueError(f"trap {self.id!r}: name the seed logs it comes from, or its source (where the bug was seen)")


def reproducer(problem: Problem, distribution: str = "normal", why: str = "", **sample_fields) -> Sample:
    """A trap case: `problem` with its inputs (distribution, seed, scale, storages), named by `why`."""
    return Sample(problem=problem, distribution=distribution, name=why, **sample_fields)


def check_case(kernel: KernelEntry, case: Sample, device: str, symptoms: tuple[Symptom, ...] = ()) -> list[str]:
    """Run `kernel` on the case; return what failed (empty: the kernel passes)."""
    run = run_kernel(kernel, case.inputs(device))
    oracle = oracle_of(run.inputs)
    # Before the verdict: a failing one reruns the kernel, which empties the oracle's answers.
    # Unwritten elements still hold the NaN poison: symptom checks skip non-finite values.
    seen = [f for check in symptoms if (f := check(run.o, oracle.o, case.problem))]
    verdict = judge_run(run, oracle=oracle, kernel=kernel)
    failures = verdict.failures + seen
    if not failures:
        return []
    return failures + [f"likely cause: {hint}" for hint in verdict.hints] + [verdict.metrics_line()]


def fails_like(kernel: KernelEntry, mutants, case: Sample, device: str) -> bool | None:
    """Whether `kernel` fails `case` the way one of `mutants` (kernels with the trap's bug) does:
    the same elements non-finite, and its error (o, and lse where both return one) pointing the
    same way as the mutant's and of about its size. None without a mutant to compare with."""
    if not mutants:
        return None
    run = run_kernel(kernel, case.inputs(device))
    others = []
    for mutant in mutants:
        try:
            others.append(run_kernel(mutant, case.inputs(device)))
        except Exception:  # noqa: BLE001 -- a mutant that raises here has no output to compare
            continue
    oracle = oracle_of(run.inputs)  # after the last call: the judge empties answers before each call
    return any(_same_error(run, other, oracle) for other in others)


def _same_error(run, other, oracle) -> bool:
    errors = []
    for mine, theirs, exact in ((run.o, other.o, oracle.o), (run.lse, other.lse, oracle.lse)):
        if mine is None or theirs is None:
            continue
        bad = ~torch.isfinite(mine)
        if not torch.equal(bad, ~torch.isfinite(theirs)):
            return False
        exact = exact.to(mine.device).double()
        scale = exact[torch.isfinite(exact)].abs().mean().clamp(min=1e-30) if exact.numel() else 1.0
        keep = ~bad & torch.isfinite(exact)
        errors.append((((mine.double() - exact) / scale)[keep], ((theirs.double() - exact) / scale)[keep]))
    mine, theirs = (torch.cat([e[i] for e in errors]) if errors else torch.zeros(0) for i in (0, 1))
    size, their_size = mine.norm(), theirs.norm()
    if size < 1e-2 or their_size < 1e-2:  # no finite error past rounding: the non-finite pattern decides
        return bool(size < 1e-2 and their_size < 1e-2)
    return bool(torch.dot(mine, theirs) / (size * their_size) >= 0.9 and 0.5 <= size / their_size <= 2)


def laid_out_for(kernel: KernelEntry, case: Sample, device: str, mutants=()) -> tuple[Sample | None, str]:
    """`case` as `kernel` can run it, or (None, why not).

    A case the kernel cannot run is re-laid inside its capabilities: a dense case causal for a
    causal-only kernel, square for one that needs T = S, in whole tiles, within its lengths,
    without a feature it lacks (a window, a sink, K = V); a paged or sparse case in its block
    sizes, with each request's pages, full and partial, kept; each top-k padded to its step,
    the rows still reading the keys they read; a quantized cache it reads for one it does not;
    either kind with Dv = D, a head dim it has, Hkv = Hq, a query head count it has, its most
    query rows. The first layout on which one of the trap's `mutants` (kernels with the bug the
    case exists for) still fails keeps the case's point. Where none does, the point cannot be
    expressed for this kernel, and that is the skip."""
    reasons = kernel.not_supported_reasons(case.problem, device)
    if not reasons:
        return case, ""
    caps = kernel.capabilities_on(device)
    if (kernel.availability(device) or not case.problem.sources <= caps.sources
            or (case.problem.cache_layouts and not caps.cache_layouts)):
        return None, "; ".join(reasons)  # what it reads, the kernel does not: nothing to re-lay
    tried = [c for c in _layouts(case, caps) if not kernel.not_supported_reasons(c.problem, device)]
    if not tried:
        return None, "; ".join(reasons)
    # a case's cache of num_blocks pages, re-laid in larger pages, may hold more slots than a run affords
    cheap = [c for c in tried if c.num_blocks is None or cache_affordable(c.num_blocks, c.problem.block_size)]
    if not cheap:
        return None, (f"{'; '.join(reasons)}; in its block sizes the case's cache of {case.num_blocks} pages is past "
                      f"{PAGE_SLOTS_AFFORDABLE} slots (the GPU scale tier's)")
    tried = cheap
    for candidate in tried:
        if not mutants or any(_fails(mutant, candidate, device) for mutant in mutants):
            return candidate, ""
    return None, (f"{'; '.join(reasons)}; re-laid within the kernel's capabilities ({len(tried)} layout(s): "
                  f"{', '.join(c.problem.id for c in tried[:3])}{' ...' if len(tried) > 3 else ''}) the case no longer "
                  "catches its bug, so its point cannot be expressed here")


def _fails(mutant: KernelEntry, case: Sample, device: str) -> bool:
    """Whether the mutant fails the layout: the verdict alone (its likely causes rerun the kernel,
    and a layout is chosen many times a run)."""
    try:
        return not verdict_of(run_kernel(mutant, case.inputs(device))).passed
    except Exception:  # noqa: BLE001 -- a mutant that raises on the layout is caught by it
        return True


def _layouts(case: Sample, caps) -> list[Sample]:
    """Candidate layouts of a paged or sparse case inside `caps`, the smallest change first."""
    p = case.problem
    dims = caps.head_dims_for(p.dtype)
    head_dims = [p.head_dim] if dims is None or p.head_dim in dims or p.cache_layouts else sorted(
        dims, key=lambda d: abs(d - p.head_dim))[:2]  # a quantized cache's head dim is its layout's
    block_sizes = [p.block_size] if caps.block_sizes is None or p.block_size in caps.block_sizes else list(caps.block_sizes)
    extra_sizes = [p.extra_block_size] if (p.extra_block_size is None or caps.block_sizes is None
                                           or p.extra_block_size in caps.block_sizes) else list(caps.block_sizes)
    heads = [p.heads_q] if caps.heads_q is None or p.heads_q in caps.heads_q else sorted(
        caps.heads_q, key=lambda h: abs(h - p.heads_q))[:1]
    caches = [_cache_layouts(p, caps)] if p.cache_layouts else [{}]
    candidates = []
    for head_dim, block_size, extra_size, heads_q, cache, dense in itertools.product(
            head_dims, block_sizes, extra_sizes, heads, caches, _dense_layouts(p, caps)):
        changes = dict(head_dim=head_dim, block_size=block_size, extra_block_size=extra_size, **cache, **dense)
        if not caps.split_head_dim_v or p.shared_kv:
            changes["head_dim_v"] = head_dim
        elif dims is not None and p.head_dim_v not in dims:
            changes["head_dim_v"] = head_dim
        if heads_q != p.heads_q:  # the same grouping where it divides, else one KV head (MQA)
            changes |= dict(heads_q=heads_q, heads_kv=1 if p.heads_kv == 1 or heads_q % p.group else heads_q // p.group)
        if "gqa" not in caps.features:
            changes["heads_kv"] = heads_q
        if caps.max_q_len is not None and p.q_len > caps.max_q_len and not p.ragged:  # a decode kernel: its rows
            changes["q_len"] = caps.max_q_len
        if p.source == "paged" and block_size != p.block_size:  # each request's pages, full and partial, kept
            changes |= dict(kv_lens=tuple(_same_pages(n, p.block_size, block_size) for n in case.kv_lens)
                            if case.kv_lens else None, kv_len=_same_pages(p.kv_len, p.block_size, block_size))
        for topk in _padded_topks(case, caps.topk_multiple_of):
            try:
                candidates.append(case.replace(**changes, **topk))
            except ValueError:  # a layout the contract has no call for
                continue
    return candidates


def _dense_layouts(p, caps) -> list[dict]:
    """A dense case's mask, features and lengths inside `caps`: causal for a causal-only kernel;
    without a window, a sink or K = V it lacks; T and S within its maxima and in whole tiles; for
    one that needs T = S, square at its keys first, then at its rows."""
    if p.source != "dense":
        return [{}]
    features = dict(causal=p.causal or "causal" in caps.requires)
    if p.window is not None and "window" not in caps.features:
        features["window"] = None
    features |= {name: False for name in ("sink", "shared_kv") if getattr(p, name) and name not in caps.features}
    shapes = [(p.kv_len, p.kv_len), (p.q_len, p.q_len)] if caps.q_len_equals_kv_len else [(p.q_len, p.kv_len)]
    layouts = []
    for T, S in shapes:
        T, S = round_up(T, caps.q_len_multiple_of), round_up(S, caps.kv_len_multiple_of)
        if caps.q_len_equals_kv_len:
            T = S = round_up(max(T, S), math.lcm(caps.q_len_multiple_of, caps.kv_len_multiple_of))
        T, S = min(T, caps.max_q_len or T), min(S, caps.max_kv_len or S)
        if (layout := dict(features, q_len=T, kv_len=S)) not in layouts:
            layouts.append(layout)
    return layouts


def _cache_layouts(p, caps) -> dict:
    """A quantized cache the kernel does not read becomes one it does (the first of its layouts)."""
    return {name: layout if layout is None or layout in caps.cache_layouts else sorted(caps.cache_layouts)[0]
            for name, layout in (("cache_layout", p.cache_layout), ("extra_cache_layout", p.extra_cache_layout))}


def _padded_topks(case: Sample, multiple: int) -> list[dict]:
    """A sparse case's top-k (of each scope) padded up to `multiple`: first with topk_len
    saying each row reads the keys it read (the padding unread), then padded and all read."""
    p = case.problem
    if p.source != "sparse" or multiple == 1 or not (p.kv_len % multiple or (p.extra_topk or 0) % multiple):
        return [{}]
    padded = dict(kv_len=round_up(p.kv_len, multiple),
                  extra_topk=round_up(p.extra_topk, multiple) if p.extra_topk else None)
    unread = dict(topk_lens=case.topk_lens or (p.kv_len,) * p.batch)
    if p.extra_topk:
        unread["extra_topk_lens"] = case.extra_topk_lens or (p.extra_topk,) * p.batch
    return [padded | unread, padded]


def _same_pages(keys: int, old: int, new: int) -> int:
    """Keys that fill as many pages of `new` as `keys` fill of `old`, the last one partial if it was."""
    full, rest = divmod(keys, old)
    return full * new + (max(1, rest * new // old) if rest else 0)
