"""Run one kernel on one sample and judge it against the float64 oracle: one call of the
kernel (fmha.oracles.kernel_call), one oracle pass, one verdict with its likely causes."""

from __future__ import annotations

from fmha.contract import KernelEntry
from fmha.oracles import guard, production
from fmha.oracles.diagnose import explain, nondeterminism, rerun_hints
from fmha.oracles.inputs import Inputs
from fmha.oracles.kernel_call import Run, run_kernel
from fmha.oracles.metrics import measure
from fmha.oracles.oracle import Dense, Oracle, oracle_over
from fmha.oracles.sample import Sample
from fmha.oracles.verdict import Tolerance, Verdict, judge


def oracle_of(inputs: Inputs) -> Oracle:
    """The float64 answer `inputs` are judged against (for ragged queries shaped as one
    request of total_q rows, as `as_batch` shapes the kernel's)."""
    call = inputs.kwargs()
    keys = inputs.oracle_sources or [Dense(inputs.k, inputs.v)]
    return oracle_over(inputs.q, keys, cu_seqlens_q=call.get("cu_seqlens_q"), scale=call["scale"],
                       causal=call["causal"], window=call["window"], sink=call["sink"])


def as_batch(run: Run) -> tuple:
    """(o, lse, unwritten) in the (B, T, H, D) / (B, H, T) shapes the metrics read: ragged
    outputs (total_q, ...) become one request of total_q rows."""
    if not run.inputs.problem.ragged:
        return run.o, run.lse, run.unwritten
    add = lambda t: None if t is None else t[None]  # noqa: E731
    return add(run.o), add(run.lse), add(run.unwritten)


def verdict_of(run: Run, oracle: Oracle | None = None, tolerance: Tolerance | None = None) -> Verdict:
    """The metrics' verdict on `run`, without hints (`oracle`: oracle_of(run.inputs) when the
    caller has it)."""
    oracle = oracle if oracle is not None else oracle_of(run.inputs)
    o, lse, unwritten = as_batch(run)
    metrics = measure(o, oracle.o, lse, oracle.lse, unwritten, oracle.logit_rms, oracle.o_abs,
                      logit_magnitude=oracle.logit_magnitude, underflow=oracle.underflow,
                      oracle_squares=oracle.o_squares)
    return judge(metrics, tolerance)


def judge_run(run: Run, oracle: Oracle | None = None, kernel: KernelEntry | None = None,
              tolerance: Tolerance | None = None) -> Verdict:
    """The verdict on `run` (`oracle`: oracle_of(run.inputs), when the caller has it). On a
    failure the hints name the likely bug; with `kernel` they may rerun it on simpler inputs
    to find what the failure depends on."""
    oracle = oracle if oracle is not None else oracle_of(run.inputs)
    with guard.plain_torch():  # a mode a kernel left behind answers none of the judge's arithmetic
        verdict = verdict_of(run, oracle, tolerance)
    if verdict.passed and kernel is not None:
        production.replay(kernel, run, judge_run)
    elif not verdict.passed:
        hints = explain(run, oracle, verdict)  # first: reruns of the kernel empty the oracle's answers
        if kernel is not None:
            passes = lambda inputs: judge_run(run_kernel(kernel, inputs)).passed  # noqa: E731
            hints = nondeterminism(kernel, run) or hints + rerun_hints(passes, run, verdict)
        verdict.hints = hints + verdict.hints  # evidence from the call leads; guesses from the metrics follow
    return verdict


def check_sample(kernel: KernelEntry, sample: Sample, device="cpu") -> Verdict:
    """Inputs, kernel, oracle, verdict: the unit every agreement test is made of."""
    return judge_run(run_kernel(kernel, sample.inputs(device)), kernel=kernel)
