"""Error metrics of a kernel's output against the float64 oracle (docs/contract.md, "Comparing
with the oracle"). Each metric says how much and, where it is a worst case, where.

Rows are the Dv-vectors o[b, t, h]; locations are reported as (b, t, h) or (b, t, h, d) for
o and (b, h, t) for lse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}


@dataclass
class Metrics:
    dtype: torch.dtype
    cos: float
    worst_row_cos: float
    worst_row_cos_at: tuple
    rel_l2: float
    # |round_dtype(O) - O| / |O|: rounding the exact answer, with what the procedure (measure's
    # perfect_o) and weights rounded to the dtype (measure's oracle_squares) cost
    output_floor: float
    floor: float  # output_floor combined with fp32 logit rounding: a perfect kernel's error
    error_ratio: float  # rel_l2 / floor
    magnitude: float  # |o| / |O|
    # max over rows of |o_r - O_r| / |A_r|, A = attention over |v|: the row's error relative
    # to the magnitudes it averages (cancellation in o_r is not the kernel's fault), in units
    # of the per-element floor (dtype unit roundoff combined with fp32 logit rounding).
    worst_row_err: float
    worst_row_err_at: tuple
    max_ulp: float  # worst element error in output-dtype ulps
    max_ulp_at: tuple
    nonfinite: int  # NaN/Inf where the oracle is finite (unwritten elements excluded)
    nonfinite_at: tuple | None
    unwritten: int  # elements of out= that still hold the poison
    unwritten_rows: list = field(default_factory=list)
    # max |lse - L| / max(1, |L|), beyond what fp32 logits cost (measure's logit_magnitude);
    # None: no lse returned
    lse_max_err: float | None = None
    lse_max_err_at: tuple | None = None
    lse_inf_mismatch: int = 0  # -inf in one of kernel/oracle but not the other
    lse_scale: float | None = None  # least-squares slope of kernel lse against oracle lse
    elements: int = 0  # output elements measured: the sample the RMS statistics come from
    # floor with the procedure's inherent error (measure's perfect_o, oracle_squares) / floor
    # without it: the cosine allowance, calibrated without, widens by its square
    procedure_widening: float = 1.0

    def summary(self) -> str:
        line = (
            f"cos {self.cos:.7f}, worst row cos {self.worst_row_cos:.7f} at (b,t,h)={self.worst_row_cos_at}, "
            f"rel-L2 {self.rel_l2:.3g} = {self.error_ratio:.2f}x floor {self.floor:.3g}, "
            f"|o|/|O| {self.magnitude:.6f}, max {self.max_ulp:.4g} ulp at {self.max_ulp_at}"
        )
        if self.lse_max_err is not None:
            line += f", lse err {self.lse_max_err:.3g}"
        return line


def _unravel(index: int, shape) -> tuple:
    coords = []
    for size in reversed(shape):
        coords.append(index % size)
        index //= size
    return tuple(reversed(coords))


def _argmax(x: torch.Tensor, empty: float = 0.0) -> tuple[float, tuple | None]:
    """The largest element and where it is; `empty` and None for an output with no elements
    (a ragged request with no query rows)."""
    if x.numel() == 0:
        return empty, None
    flat = x.reshape(-1)
    i = int(torch.argmax(flat))
    return float(flat[i]), _unravel(i, x.shape)


def ulp(reference: torch.Tensor, dtype: torch.dtype, magnitude_floor: torch.Tensor) -> torch.Tensor:
    """Spacing of `dtype` at each |reference|, never below the spacing at `magnitude_floor`
    (so elements near zero, where cancellation is normal, are not measured in tiny ulps)."""
    m = torch.maximum(reference.abs(), magnitude_floor)
    m = torch.clamp(m, min=torch.finfo(dtype).tiny)
    _, exponent = torch.frexp(m)
    return torch.ldexp(torch.ones_like(m), exponent - 1 - MANTISSA_BITS[dtype])


def measure(
    o: torch.Tensor,
    oracle_o: torch.Tensor,
    lse: torch.Tensor | None = None,
    oracle_lse: torch.Tensor | None = None,
    unwritten: torch.Tensor | None = None,
    logit_rms: float = 0.0,
    oracle_abs: torch.Tensor | None = None,
    perfect_o: torch.Tensor | None = None,
    logit_magnitude: torch.Tensor | None = None,
    underflow: torch.Tensor | None = None,
    oracle_squares: torch.Tensor | None = None,
) -> Metrics:
    """Compare kernel output `o` (B, T, H, Dv) and `lse` (B, H, T) with the float64 oracle.

    `unwritten` is a bool mask of elements of out= still holding the poison, or None.
    `logit_rms` (RMS of the visible logits) sets the error a perfect kernel makes by holding
    logits in float32: about 2**-24 * |s| relative, which dominates for fp32 outputs when
    |s| is large. `oracle_abs` is the oracle over |v| (the scale of the terms each output
    element sums, and of the error summing them in fp32 makes); without it |O| is used.
    `perfect_o` is what a kernel without error of its own returns through the caller's
    procedure (say, parts rounded to the output dtype, then merged): its distance from the
    oracle is inherent to the procedure and joins the floor.
    `logit_magnitude` (B, H, T) bounds each row's logits before cancellation (the oracle's):
    a logit summed in fp32 is off by up to about 2^-24 of it, and so is the lse. `underflow`
    (the oracle's, like o): what an fp32 kernel loses where softmax weights or their products
    with v fall below fp32's smallest normal and flush to zero, 2^-126 of the visible
    max(|v|, 1); an element's error counts past it. `oracle_squares` (the oracle's
    o_squares): what rounding the weights to the output's dtype before P.V costs, of which the
    floor takes the part the terms' cancellation adds.
    """
    dtype = o.dtype
    O = oracle_o.double()
    x = o.double()
    unwritten = torch.zeros_like(x, dtype=torch.bool) if unwritten is None else unwritten
    nonfinite_mask = ~torch.isfinite(x) & ~unwritten
    bad = nonfinite_mask | unwritten
    # Agreement figures are over the rest: bad elements are counted (and reported) apart,
    # never averaged in as zeros (a cosine of 0.98 "from" 64 NaNs reads as a precision bug).
    if bad.any():
        x = torch.where(bad, torch.zeros_like(x), x)
        O = torch.where(bad, torch.zeros_like(O), O)
    # GPU kernels flush subnormal results to zero (Triton's exp2 and fp32 arithmetic run
    # flush-to-zero): an exact value below the dtype's smallest normal returned as 0 counts as
    # exact (H200, bf16, a sink taking all but 1e-40 of the weight: every kernel returned 0,
    # 14.7 subnormal steps from the oracle).
    below = torch.full_like(O, torch.finfo(dtype).tiny)
    if underflow is not None:
        below = torch.maximum(below, underflow.double())
    flushed = (x == 0) & ~bad & (O.abs() < below)
    x = torch.where(flushed, O, x)

    # Norms and the dot over the values scaled to their largest: the squares of values near
    # float64's least underflow (a sink that takes all but 1e-160 of every row's weight).
    diff = x - O
    scale = (float(torch.maximum(O.abs().max(), x.abs().max())) if O.numel() else 0.0) or 1.0  # 1: all zero
    xs, Os = x / scale, O / scale
    ref_scaled, out_scaled = float(Os.norm()), float(xs.norm())
    ref_norm, out_norm, err_norm = scale * ref_scaled, scale * out_scaled, scale * float((xs - Os).norm())
    if ref_norm > 0:
        cos = float((xs * Os).sum()) / max(ref_scaled * out_scaled, 1e-300)
        rel_l2 = err_norm / ref_norm
        magnitude = out_norm / ref_norm
        output_floor = float((O.to(dtype).double() - O).norm()) / ref_norm
    else:  # every row empty: the right answer is exactly zero
        cos = 1.0 if out_norm == 0 else 0.0
        rel_l2 = 0.0 if out_norm == 0 else math.inf
        magnitude = 1.0 if out_norm == 0 else math.inf
        output_floor = 0.0
    # A floor of exactly 0 (an exactly representable oracle) would make any error infinite.
    output_floor = max(output_floor, 2.0 ** -(MANTISSA_BITS[dtype] + 4))
    inherent = []
    if perfect_o is not None and ref_norm > 0:
        inherent.append(float((perfect_o.double() - O).norm()) / ref_norm)
    # FlashAttention's kernels round each weight p_j to the input's dtype before P.V: off by up
    # to 2^-(mantissa + 1) of itself, at random, which costs sqrt(sum p^2 v^2 / 3) times that.
    # Where the terms do not cancel that is about |o| times it, like the output's own rounding,
    # and the calibrated thresholds hold it (correct fused kernels measured at 1.2-2x the floor);
    # where they cancel it is far more (fp16 and bf16, a ramp V averaged to near 0, named case
    # cores-mn-layout: 3.3x to 8.8x the output's rounding at 5% of the run seeds). The floor
    # takes the excess over |o|.
    if oracle_squares is not None and ref_norm > 0:
        squares = float(torch.where(bad, 0.0, oracle_squares.double()).norm())
        inherent.append(2.0 ** -(MANTISSA_BITS[dtype] + 1) * max(squares - ref_norm, 0.0) / (3**0.5 * ref_norm))
    procedure_widening = math.hypot(output_floor, *inherent) / output_floor
    output_floor *= procedure_widening
    # Each output element is a sum of p * v: summed in fp32 it is off by about 2^-24 of the
    # terms' sum, which outweighs the output's own rounding where they cancel (fp32, a ramp V
    # averaged to about 0: SDPA's math kernel measured 110x the output rounding alone), times
    # the square root of the terms' effective count, sum p|v| / sqrt(sum p^2 v^2) squared: the
    # rounding of each addition adds up, at random, or all alike where the terms are (every key
    # and value one stride-0 row: fmha and SDPA's math kernel on an H100, 470 to 693 keys, 65 to
    # 75 units of fp32 rounding on a row against 64 allowed, where one unit a sum was counted).
    summed_abs = None
    if oracle_abs is not None:
        summed_abs = oracle_abs.double()
        if oracle_squares is not None:
            squares = oracle_squares.double()
            summed_abs = torch.where(squares > 0, summed_abs.square() / squares.clamp(min=1e-300), summed_abs)
        summed_abs = torch.where(bad, 0.0, summed_abs)
    summed = 2.0**-24 * float(summed_abs.norm()) / ref_norm if summed_abs is not None and ref_norm > 0 else 0.0
    floor = math.hypot(output_floor, 2.0**-24 * logit_rms, summed)
    error_ratio = rel_l2 / floor

    row_ref = O.norm(dim=-1)
    row_out = x.norm(dim=-1)
    row_dot = (x * O).sum(dim=-1)
    # A row below the dtype's smallest normal (nothing visible, or a sink that takes all the
    # weight) is right when the output row is that small too.
    tiny = torch.finfo(dtype).tiny
    empty_row = row_ref < tiny
    row_cos = torch.where(
        empty_row,
        (row_out < tiny).double(),
        row_dot / torch.clamp(row_ref * row_out, min=1e-300),
    )
    worst_cos, worst_cos_at = _argmax(-row_cos, empty=-1.0)
    A = O.abs() if oracle_abs is None else oracle_abs.double()
    if underflow is not None:  # weights flushed in fp32 cost up to this much, whatever the dtype
        A = torch.maximum(A, underflow.double())
    # Below the dtype's smallest normal, values round with the spacing at the smallest normal
    # in any kernel: each element counts at least that much (H200, fp16 with a sink that took
    # most of the weight: a row of partly subnormal outputs, every element within 0.5 ulp,
    # measured 11.5 units against the bare row norm).
    row_scale = A.clamp(min=torch.finfo(dtype).tiny).norm(dim=-1)
    row_err = diff.norm(dim=-1)
    unit = math.hypot(2.0 ** -(MANTISSA_BITS[dtype] + 1), 2.0**-24 * logit_rms)
    if logit_magnitude is not None:
        # A row's own logits held in fp32, as the LSE's allowance counts them: the call's RMS is one
        # unit of 2^-24 of all of them, and a row's q.k of D fp32 terms errs by several units of its
        # own magnitude (bf16, D = 112, logits near -1e6 whose top two are 0.07 apart: fmha and SDPA
        # flash at 8.8 units of 8 on one row of 2400, against the RMS alone).
        unit = torch.sqrt(unit**2 + (LOGIT_ROUNDING * logit_magnitude.double().transpose(-1, -2)) ** 2)
    if summed_abs is not None:  # the rounding of the row's sums, by the terms' count (above)
        sums = summed_abs.norm(dim=-1) / row_scale
        unit = torch.sqrt(unit**2 + (2.0**-24 * sums) ** 2)
    row_units = row_err / row_scale / unit
    worst_row_err, worst_row_err_at = _argmax(row_units)

    # What flushing could take from an element is its own, not a number of ulps of it; so is what
    # its row's logits held in fp32 cost it: a weight moved by the logit's error d moves the
    # element by up to 2 d of the magnitudes it averages (a row's q.k terms near 430 cancelling to
    # logits near 2, fp32: fmha interpreted on the CPU and SDPA's math kernel on an H100 at 374 and
    # 403 ulp on one element, against 329 allowed at the call's conditioning).
    excess = diff.abs() if underflow is None else (diff.abs() - underflow.double()).clamp(min=0.0)
    if logit_magnitude is not None:
        moved = 2 * LOGIT_ROUNDING * logit_magnitude.double().transpose(-1, -2)[..., None] * A
        excess = (excess - moved).clamp(min=0.0)
    ulps = excess / ulp(A, dtype, (row_scale / max(O.shape[-1], 1) ** 0.5)[..., None])
    max_ulp, max_ulp_at = _argmax(ulps)

    nonfinite = int(nonfinite_mask.sum())
    nonfinite_at = _unravel(int(torch.nonzero(nonfinite_mask.reshape(-1))[0]), x.shape) if nonfinite else None
    unwritten_rows = [tuple(r) for r in torch.nonzero(unwritten.any(dim=-1)).tolist()]

    metrics = Metrics(
        dtype=dtype, cos=cos, worst_row_cos=-worst_cos, worst_row_cos_at=worst_cos_at,
        rel_l2=rel_l2, output_floor=output_floor, floor=floor, error_ratio=error_ratio, magnitude=magnitude,
        procedure_widening=procedure_widening,
        worst_row_err=worst_row_err, worst_row_err_at=worst_row_err_at,
        max_ulp=max_ulp, max_ulp_at=max_ulp_at, nonfinite=nonfinite, nonfinite_at=nonfinite_at,
        unwritten=int(unwritten.sum()), unwritten_rows=unwritten_rows, elements=x.numel(),
    )
    if lse is not None and oracle_lse is not None:
        _measure_lse(metrics, lse.double(), oracle_lse.double(), logit_magnitude)
    return metrics


# fp32 logits: a dot product of D terms summed in fp32 is off by a few units of 2^-24 of the
# terms' magnitude (CPU, fp16 large_logits, logits near 0.5 from terms near 1e4: lse off by
# 2.2e-4 in fmha and SDPA flash alike).
LOGIT_ROUNDING = 4 * 2.0**-24


def _measure_lse(metrics: Metrics, lse: torch.Tensor, ref: torch.Tensor, logit_magnitude=None) -> None:
    ref_inf = torch.isneginf(ref)
    lse_inf = torch.isneginf(lse)
    metrics.lse_inf_mismatch = int((ref_inf != lse_inf).sum())
    both = ~ref_inf & ~lse_inf
    gap = (lse - ref).abs()
    if logit_magnitude is not None:
        gap = torch.clamp(gap - LOGIT_ROUNDING * logit_magnitude.double(), min=0.0)
    err = torch.where(both, gap / torch.clamp(ref.abs(), min=1.0), torch.zeros_like(ref))
    err = torch.where(torch.isnan(lse), math.inf, err)
    metrics.lse_max_err, metrics.lse_max_err_at = _argmax(err) if err.numel() else (0.0, ())
    finite = both & torch.isfinite(lse)
    denominator = float((ref[finite] ** 2).sum())
    if denominator > 0:
        metrics.lse_scale = float((lse[finite] * ref[finite]).sum()) / denominator
