"""The comparison policy passes the correctly rounded answer and fails each kind of wrong one
with a message that says what, where and how much."""

import math

import pytest
import torch

from fmha.contract import Problem
from fmha.oracles import dense_reference
from fmha.oracles.oracle import Dense, oracle_over
from fmha.oracles.kernel_call import POISON_BITS, poisoned, still_poisoned
from fmha.oracles import run_seed
from fmha.oracles.run_seed import FIXED  # the hand-picked examples below: their bytes, in any run
from fmha.oracles.sample import Sample
from fmha.oracles.metrics import measure
from fmha.oracles.verdict import TOLERANCES, judge, two_sided

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _oracle(problem, distribution="normal", seed=0, run_seed=None):
    x = Sample(problem=problem, distribution=distribution, seed=seed, run_seed=run_seed).inputs()
    o, lse = dense_reference.attention(x.q, x.k, x.v, causal=problem.causal, window=problem.window, sink=x.sink)
    return x, o, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_rounded_oracle_passes(dtype):
    problem = Problem(batch=2, q_len=8, kv_len=64, heads_q=4, heads_kv=2, head_dim=64, dtype=dtype, causal=True, sink=True)
    _, o, lse = _oracle(problem)
    verdict = judge(measure(o.to(dtype), o, lse.float(), lse))
    assert verdict.passed, verdict.message()
    assert verdict.metrics.error_ratio == pytest.approx(1.0)


def test_normalize_twice_fails_on_magnitude_though_cosine_is_one():
    problem = Problem(batch=1, q_len=4, kv_len=128, heads_q=2, heads_kv=2, head_dim=64, causal=True)
    _, o, lse = _oracle(problem, "constant_scores")
    row_sum = 128  # uniform P: every visible key weighs 1/row_sum; dividing again shrinks o
    verdict = judge(measure((o / row_sum).to(problem.dtype), o, lse.float(), lse))
    assert verdict.metrics.cos > 0.999998  # as good as the correct answer rounded to bf16
    assert not verdict.passed
    message = verdict.message()
    assert "magnitude: |o|/|oracle| = 0.0078" in message
    assert "normalised twice" in message


def test_one_bad_row_fails_with_its_location():
    problem = Problem(batch=2, q_len=16, kv_len=64, heads_q=4, heads_kv=4, head_dim=64)
    _, o, lse = _oracle(problem, run_seed=FIXED)  # values where one row permuted keeps the global cosine > 0.99
    bad = o.clone()
    bad[1, 5, 2] = bad[1, 5, 2].flip(-1)  # one row of 128 permuted
    verdict = judge(measure(bad.to(problem.dtype), o))
    assert verdict.metrics.cos > 0.99  # the global cosine hides it...
    assert "worst row: error at (b,t,h)=(1, 5, 2)" in verdict.message()  # ...the row check does not


def test_base2_lse_fails_and_is_named():
    problem = Problem(batch=1, q_len=4, kv_len=32, heads_q=2, heads_kv=2, head_dim=64)
    _, o, lse = _oracle(problem)
    verdict = judge(measure(o.to(problem.dtype), o, (lse / math.log(2)).float(), lse))
    assert not verdict.passed
    assert "base-2 LSE" in verdict.message()


def test_missing_minus_infinity_in_lse_of_an_empty_row_fails():
    problem = Problem(batch=1, q_len=6, kv_len=4, heads_q=2, heads_kv=2, head_dim=64, causal=True)
    _, o, lse = _oracle(problem)
    wrong = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # CPU flash's 0
    verdict = judge(measure(o.to(problem.dtype), o, wrong.float(), lse))
    assert "lse: 4 row(s) where exactly one of kernel and oracle is -inf" in verdict.message()


def test_nan_in_the_output_fails_with_count_and_place():
    problem = Problem(batch=1, q_len=4, kv_len=32, heads_q=2, heads_kv=2, head_dim=64)
    _, o, _ = _oracle(problem)
    bad = o.to(problem.dtype)
    bad[0, 3, 1, 7] = float("nan")
    assert "non-finite: 1 NaN/Inf element(s) where the oracle is finite, first at (b,t,h,d)=(0, 3, 1, 7)" in judge(measure(bad, o)).message()


def test_agreement_figures_leave_non_finite_elements_out_and_say_so():
    """A row of NaNs is its own failure; the figures beside it are the other elements', said
    to be: averaged in as zeros they read as a precision bug (cosine 0.98 from one NaN row)."""
    problem = Problem(batch=1, q_len=4, kv_len=32, heads_q=2, heads_kv=2, head_dim=64)
    _, o, _ = _oracle(problem)
    bad = o.to(problem.dtype)
    bad[0, 3, 1, :] = float("nan")
    verdict = judge(measure(bad, o))
    assert verdict.failures == [verdict.failures[0]] and verdict.failures[0].startswith("non-finite: 64"), verdict.failures
    assert verdict.metrics.cos > 0.99999 and verdict.metrics.error_ratio < 3, verdict.message()
    assert "metrics over the 448 other elements (64 NaN/Inf left out): cos 0.99999" in verdict.message()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_poison_survives_copies_and_is_told_apart_from_computed_nan(dtype):
    out = poisoned((2, 3), dtype, "cpu")
    assert torch.isnan(out).all() and still_poisoned(out.clone()).all()
    computed_nan = torch.zeros(2, 3, dtype=dtype) / 0  # 0/0 yields the canonical NaN
    assert torch.isnan(computed_nan).all() and not still_poisoned(computed_nan).any()
    out[0, 1] = 1.0
    assert still_poisoned(out).sum() == 5
    assert POISON_BITS[dtype]


def test_unwritten_rows_are_reported():
    problem = Problem(batch=1, q_len=4, kv_len=32, heads_q=2, heads_kv=2, head_dim=64)
    _, o, _ = _oracle(problem)
    out = poisoned(o.shape, problem.dtype, "cpu")
    out[:, :3] = o[:, :3].to(problem.dtype)  # the last query row never stored
    message = judge(measure(out, o, unwritten=still_poisoned(out))).message()
    assert "unwritten: 128 element(s) of out= still hold the NaN poison, in 2 row(s) (b,t,h) (0, 3, 0), (0, 3, 1)" in message


def test_precision_loss_beyond_the_dtype_floor_fails():
    """bf16 P in an fp32 problem: cosine ~1 - 1e-6, far above fp32's floor."""
    problem = Problem(batch=1, q_len=8, kv_len=128, heads_q=2, heads_kv=2, head_dim=64, dtype=torch.float32)
    x, o, lse = _oracle(problem)
    s = dense_reference.logits(x.q, x.k)
    p = torch.softmax(s, -1).to(torch.bfloat16).double()
    coarse = torch.einsum("bhts,bshd->bthd", p, x.v.double())
    verdict = judge(measure(coarse.float(), o))
    assert not verdict.passed and "fp32 rounding floor" in verdict.message()


def _one_ulp_off(o: torch.Tensor) -> torch.Tensor:
    """Every element rounded to bf16, then moved one ulp, alternately up and down."""
    rounded = o.to(torch.bfloat16)
    bits = rounded.view(torch.int16).clone()
    bits[..., 0::2] += 1
    bits[..., 1::2] -= 1
    return bits.view(torch.bfloat16)


def test_the_rms_checks_widen_for_a_tiny_output_only():
    """Every element one ulp off: for one 16-element row the RMS statistics are too noisy to
    call that a failure (the per-element checks still bound it); over 2048 elements it is
    a kernel systematically worse than rounding, and fails."""
    tiny = Problem(batch=1, q_len=1, kv_len=10, heads_q=1, heads_kv=1, head_dim=16)
    _, o, lse = _oracle(tiny, run_seed=FIXED)  # values whose one-ulp error is past 3x the RMS floor
    verdict = judge(measure(_one_ulp_off(o), o))
    assert verdict.passed, verdict.message()
    assert verdict.metrics.error_ratio > 3  # would fail without the widening

    large = Problem(batch=1, q_len=8, kv_len=64, heads_q=4, heads_kv=1, head_dim=64)
    _, o, lse = _oracle(large)
    verdict = judge(measure(_one_ulp_off(o), o))
    assert not verdict.passed and "rounding floor" in verdict.message(), verdict.message()


def _ulps_apart(o: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 `o` with every element moved k ulps, alternately up and down."""
    bits = o.float().view(torch.int32).clone()
    bits[..., 0::2] += k
    bits[..., 1::2] -= k
    return bits.view(torch.float32)


def test_two_kernel_outputs_get_both_allowances():
    """Two fp32 outputs 4 ulps either side of one answer are 8 ulps apart: beyond what one
    output may be from an exact reference, within what two rounded outputs may be from each
    other (two_sided); 12 ulps apart is beyond both."""
    problem = Problem(batch=1, q_len=8, kv_len=64, heads_q=4, heads_kv=1, head_dim=64, dtype=torch.float32)
    _, o, _ = _oracle(problem)
    reference_o = o.float().double()
    one_sided, both = TOLERANCES[torch.float32], two_sided(TOLERANCES[torch.float32])
    eight = measure(_ulps_apart(o, 8), reference_o)
    assert not judge(eight, one_sided).passed
    assert judge(eight, both).passed, judge(eight, both).message()
    twelve = measure(_ulps_apart(o, 12), reference_o)
    assert not judge(twelve, both).passed


def test_a_row_of_subnormal_outputs_is_measured_at_the_smallest_normal():
    """fp16 outputs near 3e-6 are subnormal: rounding them costs up to half of 2^-24, far more
    than half an ulp of their size (a sink that takes almost all the weight does this). A
    correctly rounded row of them passes (each element counts at least at the smallest
    normal); the same row 16 subnormal steps off fails."""
    g = torch.Generator().manual_seed(0)
    O = torch.randn(1, 4, 1, 432, dtype=torch.float64, generator=g) * 0.1
    O[0, 3] *= 3e-5
    rounded = O.to(torch.float16)
    verdict = judge(measure(rounded, O))
    assert verdict.passed, verdict.message()
    off = rounded.clone()
    off[0, 3] = (rounded[0, 3].view(torch.int16) + 16).view(torch.float16)
    verdict = judge(measure(off, O))
    assert not verdict.passed and "worst row: error at (b,t,h)=(0, 3, 0)" in verdict.message(), verdict.message()


def test_subnormal_results_flushed_to_zero_pass_and_normal_ones_fail():
    """A bf16 row a sink drowns (exact values near 1e-39, below the smallest normal 1.2e-38)
    comes back as zeros from a GPU kernel, which flushes subnormals: that passes. Zeroing a
    row of normal values, or a subnormal row returned 16 steps off, still fails."""
    bf16 = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    O = torch.randn(1, 4, 1, 512, dtype=torch.float64, generator=g)
    O[0, 3] *= 1e-39
    rounded = O.to(bf16)
    flushed = rounded.clone()
    flushed[0, 3] = 0
    verdict = judge(measure(flushed, O))
    assert verdict.passed, verdict.message()
    off = rounded.clone()
    off[0, 3] = (rounded[0, 3].view(torch.int16) + 16).view(bf16)
    assert not judge(measure(off, O)).passed
    normal_zeroed = rounded.clone()
    normal_zeroed[0, 2, 0, :8] = 0
    verdict = judge(measure(normal_zeroed, O))
    assert not verdict.passed and "(0, 2, 0" in verdict.message(), verdict.message()


def test_an_output_near_float64s_least_value_returned_exactly_passes():
    """A sink that takes all but 1e-160 of every row's weight (large logits): the oracle's output,
    near 1e-160, is flushed by any kernel, and is returned as it is by a float64 one. Its elements'
    products underflow float64 where their norms do not: the cosine was 0 for an exact answer."""
    g = torch.Generator().manual_seed(0)
    O = torch.randn(1, 1, 15, 304, dtype=torch.float64, generator=g) * 1e-160
    for returned in (O.to(torch.bfloat16), torch.zeros_like(O, dtype=torch.bfloat16)):
        verdict = judge(measure(returned, O))
        assert verdict.passed and verdict.metrics.cos == pytest.approx(1.0, abs=1e-12), verdict.message()
    wrong = torch.randn(1, 1, 15, 304, dtype=torch.float64, generator=g).to(torch.bfloat16)
    assert not judge(measure(wrong, O)).passed


def test_parts_rounded_then_merged_are_allowed_the_rounding_of_the_parts():
    """Attention over two key ranges, each rounded to bf16 as a kernel returns it, then merged
    (the split-and-merge law). Where the parts cancel (iota_v: parts near -0.6 and +1.4 merge
    to about 0.1) rounding them costs 8.5x the floor of rounding |o| alone: the exact parts,
    rounded, failed that floor; with the procedure's own error in the floor (perfect_o) they
    pass, and a part weighted twice (its lse off by ln 2) still fails."""
    bf16 = torch.bfloat16
    problem = Problem(batch=1, q_len=1, kv_len=17, heads_q=1, heads_kv=1, head_dim=16, dtype=bf16)
    x = Sample(problem=problem, distribution="iota_v", seed=31, run_seed=FIXED).inputs()
    parts = [dense_reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi]) for lo, hi in ((0, 13), (13, 17))]
    rounded = [(o.to(bf16), lse) for o, lse in parts]
    O = dense_reference.attention(x.q, x.k, x.v)[0]
    A = oracle_over(x.q, [Dense(x.k, x.v)]).o_abs
    perfect = dense_reference.merge(rounded)[0]
    merged = perfect.to(bf16)  # what a merge kernel returns
    assert not judge(measure(merged, O, oracle_abs=A)).passed
    verdict = judge(measure(merged, O, oracle_abs=A, perfect_o=perfect))
    assert verdict.passed, verdict.message()
    (o1, lse1), second = rounded
    doubled = dense_reference.merge([(o1, lse1 + math.log(2)), second])[0].to(bf16)
    verdict = judge(measure(doubled, O, oracle_abs=A, perfect_o=perfect))
    assert not verdict.passed and "cosine" in verdict.message(), verdict.message()


def test_weights_flushed_below_fp32s_smallest_normal_are_allowed_what_they_cost():
    """A sink that takes all but ~2^-130 of a row's weight: a kernel computing the weights in
    fp32 flushes them to zero (GPUs run flush-to-zero), and the row's bf16 outputs, near
    2^-125, come out 55 units of roundoff off (an H200 measured exactly this on fmha; emulated
    here). The oracle's underflow allows it; a 1% error still fails."""
    sample = Sample(problem=Problem(batch=160, q_len=15, kv_len=1, heads_q=1, heads_kv=1, head_dim=32, sink=True,
                                    shared_kv=True), scale=1.0, distribution="peaky", run_seed=FIXED)
    x = sample.inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)], **x.kwargs())
    weights = torch.exp(dense_reference.logits(x.q, x.k, 1.0) - oracle.lse[..., None])
    flushed = torch.where(weights < torch.finfo(torch.float32).tiny, 0.0, weights)
    o = torch.einsum("bhts,bshd->bthd", flushed, x.v.double()).to(torch.bfloat16)
    scales = dict(logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs)
    assert not judge(measure(o, oracle.o, **scales)).passed  # without the allowance
    verdict = judge(measure(o, oracle.o, **scales, underflow=oracle.underflow))
    assert verdict.passed, verdict.message()
    off = judge(measure((o.double() * 1.01).to(torch.bfloat16), oracle.o, **scales, underflow=oracle.underflow))
    assert not off.passed and "magnitude" in off.message(), off.message()


def test_an_fp32_output_whose_terms_cancel_is_allowed_what_summing_them_costs():
    """V a ramp centred on 0, averaged almost evenly (iota_v, a small scale): each fp32 output is
    a small sum of large terms. Summed in fp32 they cost about 2^-24 of the terms, which SDPA's
    math kernel measured at 110x the rounding of the result alone (CPU and H200); the oracle
    over |v| allows it, and an error 2^-18 of the terms still fails."""
    problem = Problem(batch=2, q_len=4, kv_len=390, heads_q=8, heads_kv=1, head_dim=144, dtype=torch.float32)
    x = Sample(problem=problem, scale=0.04167, distribution="iota_v").inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)], scale=0.04167)
    o = torch.nn.functional.scaled_dot_product_attention(
        x.q.transpose(1, 2), x.k.transpose(1, 2), x.v.transpose(1, 2), scale=0.04167, enable_gqa=True).transpose(1, 2)
    assert not judge(measure(o, oracle.o, logit_rms=oracle.logit_rms)).passed  # the result's rounding alone
    verdict = judge(measure(o, oracle.o, logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs))
    assert verdict.passed, verdict.message()
    noise = torch.randn(o.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * oracle.o_abs
    off = judge(measure((oracle.o + 2.0**-18 * noise).float(), oracle.o, logit_rms=oracle.logit_rms,
                        oracle_abs=oracle.o_abs))
    assert not off.passed and "error" in off.message(), off.message()


def _weights_rounded(x, weight_dtype) -> torch.Tensor:
    """FlashAttention's arithmetic: logits in fp32, each row's weights exp(s - max) rounded to
    `weight_dtype` before P.V, the sum of the unrounded ones dividing after."""
    s = dense_reference.logits(x.q, x.k, x.sample.scale).float()
    e = torch.exp(s - s.amax(-1, keepdim=True))
    values = x.v.float().repeat_interleave(x.problem.group, 2)
    o = torch.einsum("bhts,bshd->bthd", e.to(weight_dtype).float(), values)
    return (o / e.sum(-1).transpose(1, 2)[..., None]).to(x.q.dtype)


@pytest.mark.parametrize("dtype, seed", [(torch.float16, 266), (torch.float16, 291), (torch.bfloat16, 176)])
def test_weights_rounded_to_the_dtype_before_p_v_are_allowed_what_they_cost(dtype, seed):
    """Named case cores-mn-layout averages a ramp V to near 0: weights rounded to the input's
    dtype (FlashAttention's convention, and fmha's fp16 kernel) measured 3.3x to 8.8x the output's
    rounding alone at 5% of run seeds (fmha on an H200: 3.32x). The oracle's o_squares allows
    that; weights rounded to fp8 (e4m3) still fail."""
    case = Sample(problem=Problem(batch=1, q_len=1, kv_len=64, heads_q=4, heads_kv=1, head_dim=64, dtype=dtype),
                  distribution="iota_v")  # the named case's sample
    x = case.replace(run_seed=run_seed.for_kernel(seed, "fmha")).inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)], scale=x.sample.scale)
    scales = dict(logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs)
    o = _weights_rounded(x, dtype)
    assert not judge(measure(o, oracle.o, **scales)).passed  # against the output's rounding alone
    verdict = judge(measure(o, oracle.o, **scales, oracle_squares=oracle.o_squares))
    assert verdict.passed, verdict.message()
    coarse = judge(measure(_weights_rounded(x, torch.float8_e4m3fn), oracle.o, **scales, oracle_squares=oracle.o_squares))
    assert not coarse.passed, coarse.message()


def test_lse_allows_what_fp32_logits_cost_and_no_more():
    """Logits near 0.5 summed from terms near 1e4 (large_logits, fp16): fp32 rounding of the
    sum puts the lse ~2e-4 off in any kernel (CPU, fmha and SDPA flash alike);
    the oracle's logit_magnitude allows that, and a base-2 lse still fails."""
    problem = Problem(batch=33, q_len=16, kv_len=1, heads_q=28, heads_kv=4, head_dim=32, dtype=torch.float16)
    x = Sample(problem=problem, distribution="large_logits", run_seed=FIXED).inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)])
    fp32_logits = (torch.einsum("bthd,bshd->bhts", x.q.float(), x.k.float().repeat_interleave(7, 2))
                   * 32 ** -0.5).squeeze(-1)
    o = oracle.o.to(torch.float16)
    assert not judge(measure(o, oracle.o, fp32_logits, oracle.lse)).passed
    assert judge(measure(o, oracle.o, fp32_logits, oracle.lse, logit_magnitude=oracle.logit_magnitude)).passed
    base2 = judge(measure(o, oracle.o, fp32_logits / math.log(2), oracle.lse, logit_magnitude=oracle.logit_magnitude))
    assert not base2.passed and "lse" in base2.message()


def test_cosine_allowance_widens_with_the_logit_conditioning():
    """fp32 outputs with |s| ~ 1e4 (scale 1.0, large_logits): fp32 logits alone cost 1 - cos
    ~ 1e-9, above the fp32 threshold; the allowance widens with floor / output floor, as the
    per-element one does, and an output 10% off still fails."""
    problem = Problem(batch=3, q_len=85, kv_len=50, heads_q=1, heads_kv=1, head_dim=48, dtype=torch.float32)
    x = Sample(problem=problem, scale=1.0, distribution="large_logits", seed=41, run_seed=FIXED).inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)], scale=1.0)
    s = torch.einsum("bthd,bshd->bhts", x.q, x.k)  # fp32 logits, as a correct kernel has them
    weights = torch.softmax(s.double().float().double(), dim=-1)
    o = torch.einsum("bhts,bshd->bthd", weights, x.v.double()).float()
    verdict = judge(measure(o, oracle.o, logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs))
    assert verdict.passed, verdict.message()
    assert verdict.metrics.cos < TOLERANCES[torch.float32].min_cos  # the fixed threshold alone would fail it
    off = judge(measure(o * 1.1, oracle.o, logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs))
    assert not off.passed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_output_with_no_rows_passes(dtype):
    """A ragged request with no query rows: nothing to compare, nothing wrong (it once raised
    inside argmax)."""
    o = torch.zeros(1, 0, 4, 64, dtype=torch.float64)
    verdict = judge(measure(o.to(dtype), o, torch.zeros(1, 4, 0), torch.zeros(1, 4, 0, dtype=torch.float64)))
    assert verdict.passed, verdict.message()


def test_identical_terms_summed_in_fp32_pass_and_a_dropped_key_still_fails():
    """Every key and value one stride-0 row (a legal cache): an fp32 kernel adds the same term
    N times and every addition rounds alike (an H100 measured 65 to 75 units over 470 to 693
    keys). Summed one key at a time, 700 to 840 times the output's rounding, it passes; the same
    output missing one key of 693 fails."""
    keys, dim = 693, 16
    v = torch.randn(dim, generator=torch.Generator().manual_seed(0)).float()
    total = torch.zeros(dim)
    for _ in range(keys):
        total = total + v
    O = v.double().view(1, 1, 1, dim)  # the mean of 693 copies of v
    scales = dict(oracle_abs=O.abs(), oracle_squares=O.abs() / keys**0.5)
    verdict = judge(measure((total / keys).view(1, 1, 1, dim), O, **scales))
    assert verdict.passed, verdict.message()
    dropped = ((total - v) / keys).view(1, 1, 1, dim)
    assert not judge(measure(dropped, O, **scales)).passed


def test_a_row_of_logits_near_minus_a_million_is_allowed_its_own_fp32_rounding():
    """bf16, D = 112, every logit near -1e6 (negative_logits) and a row's top two keys 0.07 apart:
    q.k in fp32 errs by about sqrt(D) units of 2^-24 of 1e6, so the top weights move by tens of
    percent in any fp32 kernel. fmha (and SDPA flash on an H100) measured 8.8 units of 8 on one row
    of 2400 against the call's logit RMS alone; the row's own logit magnitude, counted as the LSE's
    allowance counts it, holds it. A row of o = 0 (a sentinel that dropped it) still fails."""
    from fmha import dispatch
    from fmha.contract import KernelEntry
    from fmha.oracles.check import check_sample, oracle_of

    sample = Sample(problem=Problem(batch=160, q_len=15, kv_len=61, heads_q=1, heads_kv=1, head_dim=112),
                    distribution="negative_logits", k_storage="zero:B", seed=1, run_seed=46106094253060303)
    fmha = KernelEntry(name="fmha", fn=dispatch.attention, capabilities=dispatch.CAPABILITIES)
    verdict = check_sample(fmha, sample, "cpu")
    assert verdict.passed, verdict.message()
    oracle = oracle_of(sample.inputs())
    dropped = oracle.o.to(torch.bfloat16)
    dropped[159, 12] = 0
    assert not judge(measure(dropped, oracle.o, None, None, None, oracle.logit_rms, oracle.o_abs,
                             logit_magnitude=oracle.logit_magnitude, oracle_squares=oracle.o_squares)).passed


def test_an_element_of_a_row_whose_logits_cancel_is_allowed_what_the_rows_logits_cost():
    """fp32, hd448, a row's q.k terms near 430 cancelling to logits near 2 (upper_half_energy, keys
    sharing memory, permuted as the key-permutation law permutes them): fmha interpreted on the CPU
    and SDPA's math kernel on an H100 erred by 374 and 403 ulp on one element, against 329 allowed
    at the call's conditioning. An element's error counts past what its row's logits cost it: it
    passes; that element 2% off still fails."""
    from fmha import dispatch
    from fmha.oracles.check import oracle_of

    sample = Sample(problem=Problem(batch=1, q_len=4, kv_len=183, heads_q=2, heads_kv=1, head_dim=448,
                                    dtype=torch.float32, shared_kv=True),
                    scale=1.0, distribution="upper_half_energy", seed=178, k_storage="order:B.Hkv.S+overlap:S",
                    run_seed=40693906205165240)
    x = sample.inputs()
    keys = x.k[:, torch.randperm(sample.problem.kv_len, generator=torch.Generator().manual_seed(sample.values_seed))]
    o, lse = dispatch.attention(x.q, keys, keys, scale=1.0)
    oracle = oracle_of(x)
    scales = dict(logit_magnitude=oracle.logit_magnitude, oracle_squares=oracle.o_squares)
    metrics = measure(o, oracle.o, lse, oracle.lse, None, oracle.logit_rms, oracle.o_abs, **scales)
    assert judge(metrics).passed, judge(metrics).message()
    off = o.clone()
    off[0, 0, 0, 400] *= 1.02  # the element that erred most
    assert not judge(measure(off, oracle.o, lse, oracle.lse, None, oracle.logit_rms, oracle.o_abs, **scales)).passed


def test_products_flushed_below_fp32s_smallest_normal_are_allowed_what_they_cost():
    """Outputs near 1.2e-38 summed from products p v of about 6e-39 with normal weights (V zero
    but for a few elements, its lower half laid over the upper by overlap:S): fp32 flush to zero
    drops the products, and CPU flash SDPA and the Gluon kernel on an H100 returned 0 and 16.8
    ulp there (the pinned sample of the sequence law). Every product and weight below fp32's
    smallest normal flushed, as those kernels do: it passes; 1% off still fails."""
    sample = Sample(problem=Problem(batch=2, q_len=3, kv_len=726, heads_q=15, heads_kv=3, head_dim=512, window=96),
                    seed=1, scale=0.75, distribution="upper_half_energy", k_storage="step:B+overlap:S+alias:v",
                    hazards=("invisible-keys",), run_seed=31942818214221186)
    x = sample.inputs()
    oracle = oracle_over(x.q, [Dense(x.k, x.v)], **x.kwargs())
    tiny = torch.finfo(torch.float32).tiny
    visible = dense_reference.visibility_mask(x.q.shape[1], x.k.shape[1], False, x.kwargs()["window"])
    weights = torch.exp(dense_reference.logits(x.q, x.k, x.kwargs()["scale"]).masked_fill(~visible, float("-inf"))
                        - oracle.lse[..., None])
    weights = torch.where(weights < tiny, 0.0, weights)
    group = x.q.shape[2] // x.k.shape[2]
    values = torch.nan_to_num(x.v.double(), nan=0.0, posinf=0.0, neginf=0.0)  # poison where no row reads
    products = weights[..., None] * values.repeat_interleave(group, 2).permute(0, 2, 1, 3)[:, :, None]
    o = torch.where(products.abs() < tiny, 0.0, products).sum(-2).transpose(1, 2).to(torch.bfloat16)
    scales = dict(logit_rms=oracle.logit_rms, oracle_abs=oracle.o_abs, logit_magnitude=oracle.logit_magnitude,
                  oracle_squares=oracle.o_squares)
    verdict = judge(measure(o, oracle.o, **scales, underflow=oracle.underflow))
    assert verdict.passed, verdict.message()
    off = judge(measure((o.double() * 1.01).to(torch.bfloat16), oracle.o, **scales, underflow=oracle.underflow))
    assert not off.passed, off.message()
