"""The per-test verdict: metrics against one table of thresholds keyed by dtype.

The thresholds come from measurements of correct kernels (oracles/CALIBRATION.md says which
kernels, shapes and seeds); they are not the nightly gate (cosine >= 0.999998, ci/), which is
stricter than most fused kernels in use today. Every verdict checks magnitude as well as
direction: cosine alone is blind to a kernel that divides by the row sum twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from fmha.contract import DTYPE_NAMES
from fmha.oracles.metrics import Metrics


@dataclass(frozen=True)
class Tolerance:
    min_cos: float
    max_error_ratio: float  # rel-L2 (and | |o|/|O| - 1 |) over the floor
    max_worst_row_err: float  # the worst row's error over the magnitudes it sums, in floor units
    max_ulp: float  # worst element, in output ulps at the row's scale, per unit of conditioning
    max_lse_err: float  # |lse - L| / max(1, |L|)


# Calibration: oracles/CALIBRATION.md (measured with `python -m fmha.ci.verify --calibrate`).
TOLERANCES: Mapping[torch.dtype, Tolerance] = MappingProxyType({
    torch.bfloat16: Tolerance(min_cos=0.99999, max_error_ratio=3.0, max_worst_row_err=8, max_ulp=8, max_lse_err=2e-4),
    torch.float16: Tolerance(min_cos=0.9999998, max_error_ratio=3.0, max_worst_row_err=8, max_ulp=8, max_lse_err=2e-4),
    torch.float32: Tolerance(min_cos=0.999999999, max_error_ratio=64.0, max_worst_row_err=64, max_ulp=64, max_lse_err=5e-5),
})  # read-only: a kernel under test must not loosen it (fmha.oracles.guard checks it besides)


@dataclass
class Verdict:
    metrics: Metrics
    failures: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def message(self, where: str = "") -> str:
        head = f"{where}: " if where else ""
        if self.passed:
            return f"{head}pass ({self.metrics.summary()})"
        lines = [f"{head}{len(self.failures)} check(s) failed"]
        lines += [f"  - {f}" for f in self.failures]
        lines += [f"  likely cause: {h}" for h in self.hints]
        lines.append(f"  {self.metrics_line()}")
        return "\n".join(lines)

    def metrics_line(self) -> str:
        """How much, beside what failed: the metrics, over the finite written elements."""
        m = self.metrics
        left_out = ", ".join(part for part in (f"{m.nonfinite} NaN/Inf" if m.nonfinite else "",
                                               f"{m.unwritten} unwritten" if m.unwritten else "") if part)
        over = f" over the {m.elements - m.nonfinite - m.unwritten} other elements ({left_out} left out)" if left_out else ""
        return f"metrics{over}: {m.summary()}"


# The RMS checks (cosine, error ratio, magnitude) compare sample statistics with a floor
# measured on the same sample. Below this many output elements one element off by an ulp
# moves them past thresholds calibrated on larger outputs (CPU SDPA flash, one 16-element
# row: 3.24x the floor with its worst element 1.2 ulp off), so their allowance
# widens by sqrt(SMALL_SAMPLE / n); the per-element and per-row checks do not widen.
SMALL_SAMPLE = 64


def two_sided(t: Tolerance) -> Tolerance:
    """The allowance for comparing two kernel outputs, each with its own rounding: errors add,
    so every bound doubles (RMS ones would grow by sqrt 2 if independent; the two sides often
    share most of their arithmetic, so take the worst case) and the cosine deficit, quadratic
    in the error, grows 4x."""
    return Tolerance(min_cos=1 - 4 * (1 - t.min_cos), max_error_ratio=2 * t.max_error_ratio,
                     max_worst_row_err=2 * t.max_worst_row_err, max_ulp=2 * t.max_ulp,
                     max_lse_err=2 * t.max_lse_err)


def small_sample_factor(elements: int) -> float:
    return max(1.0, math.sqrt(SMALL_SAMPLE / max(elements, 1)))


def judge(metrics: Metrics, tolerance: Tolerance | None = None) -> Verdict:
    """Check every metric against the dtype's tolerance; failures say what, where, how much."""
    t = tolerance or TOLERANCES[metrics.dtype]
    m = metrics
    widen = small_sample_factor(m.elements)
    # Logits held in fp32 cost 2^-24 of their size: where that dominates the floor (fp32
    # outputs, |s| ~ 1e4: CPU SDPA flash, 1 - cos = 1.2e-9 at 0.12x the floor), the
    # cosine allowance widens with it, as the per-element one does.
    conditioning = m.floor / m.output_floor
    min_cos = 1 - (1 - t.min_cos) * (widen * m.procedure_widening * conditioning) ** 2
    max_error_ratio = t.max_error_ratio * widen
    # An error the error-ratio check allows costs up to half its square in cosine: never demand
    # more (SDPA flash on a named case, every element within 0.38 ulp, rel-L2 2.67x the floor,
    # failed the cosine alone at 1 - cos = 1.34e-5 against 1.32e-5).
    min_cos = min(min_cos, 1 - (max_error_ratio * m.floor) ** 2 / 2)
    v = Verdict(metrics)
    fail = v.failures.append
    dtype = DTYPE_NAMES[m.dtype]
    if m.unwritten:
        rows = ", ".join(map(str, m.unwritten_rows[:4])) + (" ..." if len(m.unwritten_rows) > 4 else "")
        fail(f"unwritten: {m.unwritten} element(s) of out= still hold the NaN poison, "
             f"in {len(m.unwritten_rows)} row(s) (b,t,h) {rows}")
    if m.nonfinite:
        fail(f"non-finite: {m.nonfinite} NaN/Inf element(s) where the oracle is finite, first at (b,t,h,d)={m.nonfinite_at}")
    small = f" (widened for {m.elements} elements)" if widen > 1 else ""
    if not m.cos >= min_cos:
        fail(f"cosine: {m.cos:.7f} < {min_cos:.7g} ({dtype}){small}")
    if not abs(m.magnitude - 1) <= max_error_ratio * m.floor:
        fail(f"magnitude: |o|/|oracle| = {m.magnitude:.6g}, allowed 1 ± {max_error_ratio * m.floor:.3g}{small}")
    if not m.error_ratio <= max_error_ratio:
        fail(f"error: rel-L2 {m.rel_l2:.3g} is {m.error_ratio:.3g}x the {dtype} rounding floor "
             f"{m.floor:.3g}, allowed {max_error_ratio:.3g}x{small}")
    if not m.worst_row_err <= t.max_worst_row_err:
        fail(f"worst row: error at (b,t,h)={m.worst_row_err_at} is {m.worst_row_err:.3g} units of "
             f"{dtype} roundoff relative to the row's scale, allowed {t.max_worst_row_err}")
    allowed_ulp = t.max_ulp * conditioning
    if not m.max_ulp <= allowed_ulp:
        fail(f"worst element: {m.max_ulp:.3g} {dtype} ulp at (b,t,h,d)={m.max_ulp_at}, allowed {allowed_ulp:.3g}")
    if m.lse_inf_mismatch:
        fail(f"lse: {m.lse_inf_mismatch} row(s) where exactly one of kernel and oracle is -inf "
             "(a row with no visible key has lse -inf, or the sink)")
    if m.lse_max_err is not None:
        if not m.lse_max_err <= t.max_lse_err:
            fail(f"lse: error {m.lse_max_err:.4g} at (b,h,t)={m.lse_max_err_at} "
                 f"(|Δ| / max(1, |lse|)), allowed {t.max_lse_err}")
    if v.failures:
        v.hints = _hints(m)
    return v


def _hints(m: Metrics) -> list[str]:
    """Name the bug when the metrics have its signature."""
    hints = []
    if m.worst_row_cos > 0.999 and m.magnitude < 0.9 and m.unwritten == 0:
        hints.append(f"every row points the right way but is too short (|o|/|O| = {m.magnitude:.4g}): "
                     "normalised twice (P already divided by the row sum, then divided again)?")
    if m.lse_scale is not None and abs(m.lse_scale - 1 / math.log(2)) < 0.01:
        hints.append(f"lse = {m.lse_scale:.4f} x oracle = oracle / ln 2: base-2 LSE (FlashInfer's); the contract wants the natural log "
                     "(fmha.adapters.conventions.lse_from_base2 translates it)")
    if m.unwritten:
        hints.append("the kernel skips part of out= (a tail row, a lane or a tile never stored)")
    return hints
