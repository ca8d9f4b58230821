"""One run of the nightly gate judged against the float64 oracle: the gate's rule (`why_below`),
a skip with the kernel's reasons, and `judged`, which runs in the gate's child process
(fmha.ci.gate_child) or, for a kernel object of a test, in the caller's."""

from __future__ import annotations

from fmha.ci.run_record import RunRecord, raised
from fmha.contract import NotSupportedError
from fmha.oracles.check import judge_run
from fmha.oracles.kernel_call import run_kernel
from fmha.oracles.sample import Sample

GATE = 0.999998


def why_below(metrics: dict, gate: float = GATE) -> str:
    """Why a run that returned an answer is not at the gate ("" when it is): the gate's rule.
    NaN, inf and unwritten elements are left out of the cosine (so that one of them does not
    read as a precision loss): they fail the run apart, or an output of NaN alone would pass."""
    why = [f"{metrics[k]} {what} output elements" for k, what in (("nonfinite", "NaN or inf"),
                                                                   ("unwritten", "unwritten")) if metrics.get(k)]
    if metrics["cos"] is None or not metrics["cos"] >= gate:
        cos = metrics["cos"]
        why.append(f"cos {cos:.7f}, {gate - cos:.2e} below the gate (worst row {metrics['worst_row_cos']:.7f})"
                   if cos is not None else "no cosine (no finite element)")
    return "; ".join(why)


def skipped(kernel, problem, record: RunRecord, device: str) -> RunRecord | None:
    """The run's skip with the kernel's reasons, where its capabilities do not admit the call."""
    reasons = kernel.not_supported_reasons(problem, device)
    return record.replace(outcome="skipped", message="; ".join(reasons)) if reasons else None


def judged(kernel, problem, record: RunRecord, device: str) -> RunRecord:
    """One run its kernel's capabilities admit (`skipped` is None), against the float64 oracle, in
    this process: passed, failed (why_below), raised, or skipped on a NotSupportedError."""
    sample = Sample(problem=problem, distribution=record.where["distribution"], seed=record.where["seed"])
    try:
        m = judge_run(run_kernel(kernel, sample.inputs(device))).metrics
    except NotSupportedError as e:
        return record.replace(outcome="skipped", message=f"raised NotSupportedError: {e}")
    except Exception as e:  # noqa: BLE001 -- a kernel that fails costs its run, not the gate
        return raised(record.kernel, record.part, record.what, e, dtype=record.dtype, where=record.where)
    metrics = dict(cos=m.cos, worst_row_cos=m.worst_row_cos, error_ratio=m.error_ratio, lse_err=m.lse_max_err,
                   nonfinite=m.nonfinite, unwritten=m.unwritten)
    why = why_below(metrics)
    return record.replace(outcome="failed" if why else "passed", message=why, metrics=metrics)
