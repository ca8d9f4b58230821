"""Metamorphic laws of the attention contract, one function each.

Each law takes (kernel, sample, device), runs the kernel on related inputs and raises
AssertionError saying what differed, where and by how much. Laws that hold exactly are
checked bitwise for a kernel that promises it (fmha.capabilities.PROMISES:
`bitwise_deterministic`, `batch_invariant`) and within the verdict for one that does not.
`run_law` drives a law with hypothesis.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, example, given, note, reject
from hypothesis.errors import FailedHealthCheck, Unsatisfiable

from fmha.capabilities import KernelEntry
from fmha.contract import NotSupportedError
from fmha.oracles import reference
from fmha.oracles.check import INT_VIEW, judge_run, oracle_of, run_kernel
from fmha.oracles.metrics import measure
from fmha.oracles.sample import Inputs, Sample, lay_out
from fmha.oracles.verdict import TOLERANCES, judge, two_sided


def _call(kernel: KernelEntry, x: Inputs, q=None, k=None, v=None, **changes):
    """The kernel on x (or on the q, k, v given instead), with the sample's scale, mask, sink."""
    return kernel(x.q if q is None else q, x.k if k is None else k, x.v if v is None else v, **x.kwargs(**changes))


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Same bits (NaN payloads included), else say how many and where the first one is."""
    assert a.shape == b.shape, f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}"
    bits_a = a.contiguous().view(INT_VIEW.get(a.dtype, a.dtype))
    bits_b = b.contiguous().view(INT_VIEW.get(b.dtype, b.dtype))
    differ = bits_a != bits_b
    if differ.any():
        first = tuple(torch.nonzero(differ)[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {differ.numel()} elements differ bitwise; "
                             f"first at {first}: {a[first].item()!r} vs {b[first].item()!r}")


def assert_agrees(o: torch.Tensor, reference_o: torch.Tensor, what: str, lse=None, reference_lse=None,
                  scales: reference.Oracle | None = None, oracle_abs=None, perfect_o=None, logit_rms=None) -> None:
    """Within the verdict against `reference_o`: a float64 oracle, or another kernel output,
    whose own rounding then adds to the allowance (two_sided). `scales`, the oracle of the
    inputs, sets the fp32 logit-rounding part of the floor and the scale of the terms each
    output sums, the oracle over |v| (without it |reference_o|, too strict where they cancel);
    `logit_rms` and `oracle_abs` give those two directly. `perfect_o`: an error-free kernel's
    result through the law's procedure (metrics.measure)."""
    reference_lse = None if reference_lse is None else reference_lse.double()
    tolerance = TOLERANCES[o.dtype]
    if reference_o.dtype != torch.float64:
        tolerance = two_sided(tolerance)
    if scales is not None:
        logit_rms = scales.logit_rms
        oracle_abs = scales.o_abs if oracle_abs is None else oracle_abs
    metrics = measure(o, reference_o.double(), lse, reference_lse, logit_rms=logit_rms or 0.0, oracle_abs=oracle_abs,
                      perfect_o=perfect_o, logit_magnitude=None if scales is None else scales.logit_magnitude,
                      underflow=None if scales is None else scales.underflow)
    verdict = judge(metrics, tolerance)
    assert verdict.passed, verdict.message(what)


def assert_same(kernel: KernelEntry, device: str, promise: str, a, b, what: str, x: Inputs) -> None:
    """`a` and `b` ((o, lse) of two calls that must agree): both finite, then bitwise where the
    kernel makes `promise`, else within the verdict of one kernel output against another.
    Finite first: unread storage is NaN poison, so two runs that both read it (or both divide
    0 by 0 for a row with no keys) would otherwise be "the same"."""
    (o_a, lse_a), (o_b, lse_b) = a, b
    for o, which in ((o_a, "first"), (o_b, "second")):
        bad = ~torch.isfinite(o)
        assert not bad.any(), (f"{what}: the {which} call's output has {int(bad.sum())} non-finite element(s), the "
                               f"first at {tuple(bad.nonzero()[0].tolist())}: unread NaN reached the output, or a row "
                               f"with no keys divided 0 by 0 (the contract: o = 0)")
    if kernel.promises(device, promise):
        assert_bitwise(o_a, o_b, f"{what} (promised {promise})")
        if lse_a is not None and lse_b is not None:
            assert_bitwise(lse_a, lse_b, f"{what}, lse (promised {promise})")
    else:
        oracle = oracle_of(x)
        assert_agrees(o_a, o_b, f"{what} (no {promise} promise: within the verdict)", lse_a, lse_b, oracle)


def _variant(kernel: KernelEntry, sample: Sample, device, **changes) -> Sample:
    """The sample with a changed problem; a variant the kernel does not support is rejected."""
    variant = sample.replace(**changes)
    assume(not kernel.not_supported_reasons(variant.problem, device))
    return variant


# -- the laws -------------------------------------------------------------------------------

def agrees_with_oracle(kernel, sample: Sample, device):
    run = run_kernel(kernel, sample.inputs(device))
    verdict = judge_run(run, kernel=kernel)
    assert verdict.passed, verdict.message(f"{kernel.name} {sample.id}")


def invisible_keys_do_not_leak(kernel, sample: Sample, device):
    """Keys older than every row's window, and storage past S, filled with NaN or 1e30,
    leave the output unchanged."""
    p = sample.problem
    x = sample.inputs(device)
    result = _call(kernel, x)
    hidden = max(0, p.kv_len - p.q_len - p.window + 1) if p.window is not None else 0
    for poison in (float("nan"), min(1e30, torch.finfo(x.k.dtype).max)):
        # Views into a longer buffer whose tail (past S) holds the poison.
        k = lay_out(x.k, "sliced", poison, hidden)
        v = k if p.shared_kv else lay_out(x.v, "sliced", poison, hidden)
        assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x, k=k, v=v), result,
                    f"{kernel.name} {sample.id}: the {hidden} hidden keys and the storage past S = {poison}", x)


def key_permutation_invariant(kernel, sample: Sample, device):
    """Without a mask, permuting keys and values together changes nothing but rounding."""
    sample = _variant(kernel, sample, device, causal=False, window=None)
    p = sample.problem
    x = sample.inputs(device)
    perm = torch.randperm(p.kv_len, generator=torch.Generator().manual_seed(sample.seed)).to(device)
    k = x.k[:, perm]
    v = k if p.shared_kv else x.v[:, perm]
    o, lse = _call(kernel, x, k=k, v=v)
    oracle = oracle_of(x)
    assert_agrees(o, oracle.o, f"{kernel.name} {sample.id}: keys permuted", lse, oracle.lse, oracle)


def linear_in_v(kernel, sample: Sample, device):
    """o(2^e v) = 2^e o(v); o(v1 + v2) = o(v1) + o(v2) when v1 and v2 live in disjoint
    columns. Both are exact in floating point: bitwise for a bitwise-deterministic kernel."""
    sample = _variant(kernel, sample, device, shared_kv=False)
    p = sample.problem
    x = sample.inputs(device)
    scale = 2.0 ** (4 if x.v.dtype == torch.float16 else 12)
    limit = torch.finfo(x.v.dtype).max / scale
    v_safe = x.v.clamp(-limit, limit)  # so that v * scale stays finite
    o_base, _ = _call(kernel, x, v=v_safe)
    o_scaled, _ = _call(kernel, x, v=v_safe * scale)
    half = p.head_dim_v // 2
    v1, v2 = v_safe.clone(), v_safe.clone()
    v1[..., half:] = 0
    v2[..., :half] = 0
    o1, _ = _call(kernel, x, v=v1)
    o2, _ = _call(kernel, x, v=v2)
    x = x.with_tensors(v=v_safe)
    what = f"{kernel.name} {sample.id}"
    if not kernel.promises(device, "bitwise_deterministic"):
        assert_same(kernel, device, "bitwise_deterministic", (o_scaled / scale, None), (o_base, None),
                    f"{what}: o(v * {scale:g}) / {scale:g} vs o(v)", x)
        assert_same(kernel, device, "bitwise_deterministic", ((o1.double() + o2.double()).to(o1.dtype), None),
                    (o_base, None), f"{what}: o(v1) + o(v2) vs o(v1 + v2), disjoint columns", x)
        return
    # Outputs below the dtype's normal range were rounded coarsely before scaling: skip those,
    # and the smallest normal itself, which a value just below it also rounds to (H200,
    # fp16: 2^-14 - 2^-25 became 2^-14 while 16 times it stayed exact).
    normal = o_base.abs() > torch.finfo(o_base.dtype).tiny
    assert_bitwise(torch.where(normal, o_scaled, 0), torch.where(normal, o_base * scale, 0),
                   f"{what}: o(v * {scale:g}) vs o(v) * {scale:g}")
    # Zeros compare by value: where a sink drowns a row, o(v) is acc * 0 with acc's sign, and
    # the zero of the other half makes o(v1) + o(v2) = -0 + +0 = +0 (H200, every kernel).
    assert_bitwise(_unsigned_zeros(o1 + o2), _unsigned_zeros(o_base),
                   f"{what}: o(v1) + o(v2) vs o(v1 + v2), disjoint columns")


def _unsigned_zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t == 0, torch.zeros_like(t), t)


def gqa_equals_mha_with_repeated_kv(kernel, sample: Sample, device):
    p = sample.problem
    x = sample.inputs(device)
    o, lse = _call(kernel, x)
    k = x.k.repeat_interleave(p.group, dim=2)
    v = k if p.shared_kv else x.v.repeat_interleave(p.group, dim=2)
    o_mha, lse_mha = _call(kernel, x, k=k, v=v)
    assert_agrees(o, o_mha, f"{kernel.name} {sample.id}: GQA vs MHA with repeated KV heads", lse, lse_mha,
                  oracle_of(x))


def k_is_v_equals_copies(kernel, sample: Sample, device):
    sample = _variant(kernel, sample, device, shared_kv=True, head_dim_v=sample.problem.head_dim)
    x = sample.inputs(device)
    assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x, v=x.k), _call(kernel, x, v=x.k.clone()),
                f"{kernel.name} {sample.id}: k is v vs a copy of k as v", x)


def batch_rows_independent(kernel, sample: Sample, device):
    """A batch row computed alone equals the same row inside the batch (the first, a middle
    and the last row: one call each)."""
    x = sample.inputs(device)
    o, lse = _call(kernel, x)
    batch = sample.problem.batch
    for b in sorted({0, batch // 2, batch - 1}):
        k = x.k[b:b + 1]
        row = _call(kernel, x, q=x.q[b:b + 1], k=k, v=k if sample.problem.shared_kv else x.v[b:b + 1])
        alone = x.with_tensors(q=x.q[b:b + 1], k=k, v=k if sample.problem.shared_kv else x.v[b:b + 1])
        assert_same(kernel, device, "batch_invariant", row, (o[b:b + 1], None if lse is None else lse[b:b + 1]),
                    f"{kernel.name} {sample.id}: batch row {b} alone vs in the batch", alone)


def deterministic(kernel, sample: Sample, device):
    x = sample.inputs(device)
    assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x), _call(kernel, x),
                f"{kernel.name} {sample.id}: second run vs first", x)


def decode_row_equals_last_prefill_row(kernel, sample: Sample, device):
    x = sample.inputs(device)
    o, lse = _call(kernel, x)
    o_decode, lse_decode = _call(kernel, x, q=x.q[:, -1:])
    assert_agrees(o_decode, o[:, -1:], f"{kernel.name} {sample.id}: decode row vs last prefill row",
                  lse_decode, None if lse is None else lse[..., -1:], oracle_of(x.with_tensors(q=x.q[:, -1:])))


def split_keys_merge_to_the_whole(kernel, merge, sample: Sample, device):
    """Attention over keys split anywhere (an empty part included) and merged with the sink
    equals attention over all keys with the sink."""
    sample = _variant(kernel, sample, device, causal=False, window=None)
    p = sample.problem
    x = sample.inputs(device)
    scale = sample.scale
    cut = sample.seed % (p.kv_len + 1)
    parts, perfect_parts = [], []
    for lo, hi in ((0, cut), (cut, p.kv_len)):
        k = x.k[:, lo:hi]
        v = k if p.shared_kv else x.v[:, lo:hi]
        if hi > lo:
            parts.append(kernel(x.q, k, v, scale=scale))
            exact_o, exact_lse = reference.attention(x.q, k, v, scale=scale)
            perfect_parts.append((exact_o.to(p.dtype), exact_lse))
        else:  # an empty part, as a kernel over no keys reports it
            B, T, H = p.batch, p.q_len, p.heads_q
            parts.append((torch.zeros(B, T, H, p.head_dim_v, dtype=p.dtype, device=device),
                          torch.full((B, H, T), -math.inf, device=device)))
            perfect_parts.append(parts[-1])
    o, lse = merge(parts, sink=x.sink)
    oracle = oracle_of(x)
    # Two roundings (the parts, then the merge), each relative to the parts' magnitudes, which
    # can cancel in the merge (H200 and CPU, bf16 iota_v, parts near -2 and +1 merged to 0.03:
    # 9.4 ulp of |o|, 0.3 ulp of the parts). Per element and per row the scale is the oracle
    # over |v|; the RMS floor adds what rounding the exact parts costs (one 16-element row,
    # parts near -0.6 and +1.4: a perfect kernel measured 8.5x the floor of |o| alone).
    perfect_o = reference.merge(perfect_parts, sink=x.sink)[0]
    assert_agrees(o, oracle.o, f"{kernel.name}+{merge.name} {sample.id}: keys split at {cut}, merged",
                  lse, oracle.lse, oracle, perfect_o=perfect_o)


def merge_algebra(merge, sample: Sample, device):
    """Merge is commutative and associative; a part merged with itself keeps o and raises
    lse by ln 2. Parts are the oracle's over thirds of the keys, rounded as kernels return."""
    # fp32 parts: the laws are about the merge, not about rounding intermediate results.
    sample = sample.replace(causal=False, window=None, sink=False, dtype=torch.float32)
    p = sample.problem
    x = sample.inputs(device)
    thirds = [0, p.kv_len // 3, 2 * p.kv_len // 3, p.kv_len]
    parts = []
    for lo, hi in zip(thirds, thirds[1:]):
        o, lse = reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi], scale=sample.scale)
        parts.append((o.to(p.dtype), lse.float()))
    a, b, c = parts
    where = f"{merge.name} {sample.id} (fp32 parts)"
    # The merge's weights are a softmax over the parts' lse: their fp32 rounding sets the floor.
    lses = torch.cat([lse.flatten() for _, lse in parts])
    lse_rms = float(lses[torch.isfinite(lses)].square().mean().sqrt()) if torch.isfinite(lses).any() else 0.0

    # Each merged element sums its parts' terms, which can cancel (iota_v: parts near -1.3,
    # 0.01 and +1.3): its rounding scales with the merge of the parts' magnitudes, not with
    # the result (CPU and H200, nightly profile: 157 units of |o| between (a b) c and a (b c)).
    def magnitudes(*merged):
        return reference.merge([(o.abs(), lse) for o, lse in merged])[0]

    assert_agrees(merge([b, a])[0], merge([a, b])[0], f"{where}: merge(b, a) vs merge(a, b)", logit_rms=lse_rms,
                  oracle_abs=magnitudes(a, b))
    assert_agrees(merge([merge([a, b]), c])[0], merge([a, merge([b, c])])[0], f"{where}: (a b) c vs a (b c)",
                  logit_rms=lse_rms, oracle_abs=magnitudes(a, b, c))
    o2, lse2 = merge([a, a])
    assert_agrees(o2, a[0], f"{where}: o of merge(a, a) vs a", logit_rms=lse_rms, oracle_abs=a[0].abs())
    finite = torch.isfinite(a[1])
    gap = (lse2 - a[1])[finite].double()
    tolerance = 4e-7 * (1 + (float(a[1][finite].abs().max()) if finite.any() else 0.0))
    assert bool(((gap - math.log(2)).abs() <= tolerance).all()), (
        f"{where}: lse of merge(a, a) - lse of a should be ln 2 = 0.6931472; "
        f"got {float(gap.min()):.7f}..{float(gap.max()):.7f}")


def minus_infinity_sink_is_no_sink(kernel, sample: Sample, device):
    sample = _variant(kernel, sample, device, sink=True)
    p = sample.problem
    x = sample.inputs(device)
    o_none, lse_none = _call(kernel, x, sink=None)
    o_inf, lse_inf = _call(kernel, x, sink=torch.full((p.heads_q,), -math.inf, device=device))
    assert_agrees(o_inf, o_none, f"{kernel.name} {sample.id}: sink = -inf vs no sink", lse_inf, lse_none,
                  oracle_of(x.with_tensors(sink=None)))


def window_at_least_s_is_causal(kernel, sample: Sample, device):
    sample = _variant(kernel, sample, device, window=None, causal=True)
    p = sample.problem
    x = sample.inputs(device)
    o_causal, lse_causal = _call(kernel, x)
    oracle = oracle_of(x)
    for window in (p.kv_len, p.kv_len + 1, 2 * p.kv_len + 300):
        o_w, lse_w = _call(kernel, x, window=window)
        assert_agrees(o_w, o_causal, f"{kernel.name} {sample.id}: window={window} vs causal", lse_w, lse_causal,
                      oracle)


# Every law that takes a kernel, with the contract features it needs from the kernel
# (test_laws.py has one test per law; the kill matrix runs them against every mutant).
KERNEL_LAWS = {
    agrees_with_oracle: (),
    invisible_keys_do_not_leak: (),
    key_permutation_invariant: (),
    linear_in_v: (),
    gqa_equals_mha_with_repeated_kv: ("gqa",),
    k_is_v_equals_copies: ("shared_kv",),
    batch_rows_independent: (),
    deterministic: (),
    decode_row_equals_last_prefill_row: (),
    minus_infinity_sink_is_no_sink: ("sink",),
    window_at_least_s_is_causal: ("window", "causal"),
    split_keys_merge_to_the_whole: ("lse", "sink"),  # also takes a merge
}


# The test in properties/test_laws.py that runs each law: known-failure records name it.
LAW_TESTS = {
    "agrees_with_oracle": "test_agrees_with_the_oracle",
    "invisible_keys_do_not_leak": "test_invisible_keys_and_storage_past_s_do_not_leak",
    "key_permutation_invariant": "test_permuting_keys_and_values_together_changes_nothing",
    "linear_in_v": "test_output_is_linear_in_v",
    "gqa_equals_mha_with_repeated_kv": "test_gqa_equals_mha_with_repeated_kv_heads",
    "k_is_v_equals_copies": "test_k_is_v_equals_separate_copies",
    "batch_rows_independent": "test_a_batch_row_alone_equals_the_row_in_the_batch",
    "deterministic": "test_two_runs_give_the_same_answer",
    "decode_row_equals_last_prefill_row": "test_decode_row_equals_the_last_prefill_row",
    "minus_infinity_sink_is_no_sink": "test_sink_minus_infinity_equals_no_sink",
    "window_at_least_s_is_causal": "test_window_at_least_s_equals_causal",
    "split_keys_merge_to_the_whole": "test_keys_split_anywhere_and_merged_equal_all_keys",
    "merge_algebra": "test_merge_is_commutative_associative_and_idempotent_up_to_ln2",
}


# -- driving a law with hypothesis -----------------------------------------------------------

def run_law(law, strategy, *operands, device: str, reproduce: str = "", settings=None, pinned=()) -> None:
    """Run `law(*operands, sample, device)` on the `pinned` samples, then on samples from
    `strategy`; a failure prints the shrunk sample, the `reproduce` command and the @example
    line that pins it. A call the kernel refuses with NotSupportedError rejects that sample;
    when every sample is refused, the test is skipped with the kernel's reasons."""
    refused = []

    @given(sample=strategy)
    def check(sample):
        note(f"reproduce: {reproduce}\npin it: @example(sample={sample!r})" if reproduce
             else f"pin it: @example(sample={sample!r})")
        try:
            law(*operands, sample, device)
        except NotSupportedError as e:
            refused.append(str(e))
            reject()

    for sample in pinned:
        check = example(sample=sample)(check)
    try:
        (settings(check) if settings is not None else check)()
    except (Unsatisfiable, FailedHealthCheck):
        if not refused:
            raise
        pytest.skip(f"the kernel refused the samples it was given (NotSupportedError): {refused[0]}")


def require(kernel: KernelEntry, device: str, *features: str) -> None:
    """Skip, with the kernel's reason, when a law needs what the kernel does not have."""
    caps = kernel.capabilities_on(device)
    missing = [f for f in features if f not in caps.features]
    unavailable = kernel.availability(device)
    if unavailable or device not in caps.devices:
        pytest.skip(f"{kernel.name}: {unavailable or f'no {device} kernel'}")
    if "dense" not in caps.sources:
        pytest.skip(f"{kernel.name}: these laws call with dense keys; the kernel declares "
                    f"{', '.join(sorted(caps.sources))} (Capabilities.sources)")
    if missing:
        pytest.skip(f"{kernel.name}: this law needs {', '.join(missing)} ("
                    + "; ".join(caps.notes.get(f, f"no {f} support") for f in missing) + ")")
