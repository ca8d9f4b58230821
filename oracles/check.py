"""Run one kernel on one problem and judge it against the float64 oracle.

The output buffer is poisoned with a NaN carrying a payload no arithmetic produces, so an
element the kernel never wrote is told apart from a NaN it computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fmha.capabilities import KernelEntry
from fmha.problem import Problem
from oracles import reference
from oracles.diagnose import explain
from oracles.inputs import Inputs, make_inputs
from oracles.metrics import measure
from oracles.verdict import Tolerance, Verdict, judge

# Quiet NaNs with a payload: a NaN a kernel computes (0/0, inf - inf) is the canonical one.
POISON_BITS = {torch.bfloat16: 0x7FD5, torch.float16: 0x7E55, torch.float32: 0x7FC05A5A}
INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _signed(bits: int, dtype: torch.dtype) -> int:
    width = 16 if INT_VIEW[dtype] == torch.int16 else 32
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    bits = torch.full(shape, _signed(POISON_BITS[dtype], dtype), dtype=INT_VIEW[dtype], device=device)
    return bits.view(dtype)


def still_poisoned(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_VIEW[t.dtype]) == _signed(POISON_BITS[t.dtype], t.dtype)


@dataclass
class Run:
    problem: Problem
    inputs: Inputs
    o: torch.Tensor
    lse: torch.Tensor | None
    unwritten: torch.Tensor | None


def run_kernel(kernel: KernelEntry, problem: Problem, inputs: Inputs, use_out: bool | None = None) -> Run:
    """Call the kernel per the contract; pass a poisoned out= when it supports out."""
    if use_out is None:
        use_out = "out" in kernel.capabilities_on(inputs.q.device.type).features
    kwargs = inputs.kwargs(problem)
    out = None
    if use_out:
        B, T, H, Dv = problem.batch, problem.q_len, problem.heads_q, problem.head_dim_v
        out = poisoned((B, T, H, Dv), problem.dtype, inputs.q.device)
        kwargs["out"] = out
    o, lse = kernel(inputs.q, inputs.k, inputs.v, **kwargs)
    if out is not None and o.data_ptr() != out.data_ptr():
        raise AssertionError(f"{kernel.name}: out= was given but the returned o is a different tensor")
    unwritten = still_poisoned(o) if out is not None else None
    return Run(problem, inputs, o, lse, unwritten)


def visible_logit_rms(problem: Problem, x: Inputs) -> float:
    scores = reference.logits(x.q, x.k, x.scale)
    visible = reference.visibility_mask(problem.q_len, problem.kv_len, problem.causal, problem.window, x.q.device)
    visible_scores = scores.masked_select(visible)
    return float(visible_scores.square().mean().sqrt()) if visible_scores.numel() else 0.0


def oracle_of(run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 (o, lse) the run is judged against."""
    x = run.inputs
    return reference.attention(x.q, x.k, x.v, **x.kwargs(run.problem))


def judge_run(run: Run, tolerance: Tolerance | None = None, oracle=None) -> Verdict:
    """`oracle`: oracle_of(run), when the caller needs it too (computed here otherwise)."""
    x = run.inputs
    kwargs = x.kwargs(run.problem)
    oracle_o, oracle_lse = oracle if oracle is not None else oracle_of(run)
    oracle_abs = reference.magnitudes(x.q, x.k, x.v, **kwargs)
    metrics = measure(run.o, oracle_o, run.lse, oracle_lse, run.unwritten, visible_logit_rms(run.problem, x), oracle_abs)
    verdict = judge(metrics, tolerance)
    if not verdict.passed:
        verdict.hints += explain(run.problem, x, run.o, oracle_o, verdict.metrics.floor)
    return verdict


def check_kernel(
    kernel: KernelEntry, problem: Problem, distribution: str = "normal", seed: int = 0, device="cpu"
) -> Verdict:
    """Inputs, kernel, oracle, verdict: the unit every agreement test is made of."""
    inputs = make_inputs(problem, distribution, seed, device)
    return judge_run(run_kernel(kernel, problem, inputs))
