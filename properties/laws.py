"""Metamorphic laws of the attention contract, one function each.

Each law takes (kernel, case, device), runs the kernel on related inputs and raises
AssertionError saying what differed, where and by how much. Laws that hold exactly are
checked bitwise; the others within the verdict. `run_law` drives a law with hypothesis.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, example, given, note

from fmha.capabilities import KernelEntry
from oracles import reference
from oracles.check import INT_VIEW, judge_run, run_kernel, visible_logit_rms
from oracles.inputs import Inputs
from oracles.metrics import measure
from oracles.verdict import TOLERANCES, judge, two_sided
from properties.strategies import Case, build_inputs, sliced


def _call(kernel: KernelEntry, case: Case, x: Inputs, q=None, k=None, v=None, **changes):
    """The kernel on x (or on the q, k, v given instead), with the case's mask and sink."""
    kwargs = {**x.kwargs(case.problem), **changes}
    return kernel(x.q if q is None else q, x.k if k is None else k, x.v if v is None else v, **kwargs)


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


def assert_agrees(o: torch.Tensor, reference_o: torch.Tensor, what: str, lse=None, reference_lse=None, logit_rms=0.0,
                  oracle_abs=None, perfect_o=None) -> None:
    """Within the verdict against `reference_o`: a float64 oracle, or another kernel output,
    whose own rounding then adds to the allowance (two_sided). `logit_rms` of the inputs sets
    the fp32 logit-rounding part of the floor; `oracle_abs`, the oracle over |v|, the scale of
    the terms each output sums (without it |reference_o|, too strict where they cancel);
    `perfect_o`, an error-free kernel's result through the law's procedure (metrics.measure)."""
    reference_lse = None if reference_lse is None else reference_lse.double()
    tolerance = TOLERANCES[o.dtype]
    if reference_o.dtype != torch.float64:
        tolerance = two_sided(tolerance)
    verdict = judge(measure(o, reference_o.double(), lse, reference_lse, logit_rms=logit_rms, oracle_abs=oracle_abs,
                            perfect_o=perfect_o), tolerance)
    assert verdict.passed, verdict.message(what)


def _variant(kernel: KernelEntry, case: Case, device, **changes) -> Case:
    """The case with a changed problem; a variant the kernel does not support is rejected."""
    p = case.problem.replace(**changes)
    assume(not kernel.not_supported_reasons(p, device))
    return Case(p, case.distribution, case.seed, case.storage)


# -- the laws -------------------------------------------------------------------------------

def agrees_with_oracle(kernel, case: Case, device):
    run = run_kernel(kernel, case.problem, build_inputs(case, device))
    verdict = judge_run(run)
    assert verdict.passed, verdict.message(f"{kernel.name} {case.id}")


def invisible_keys_do_not_leak(kernel, case: Case, device):
    """Keys older than every row's window, and storage past S, filled with NaN or 1e30,
    leave the output bitwise unchanged."""
    p = case.problem
    x = build_inputs(case, device)
    o, lse = _call(kernel, case, x)
    hidden = max(0, p.kv_len - p.q_len - p.window + 1) if p.window is not None else 0
    for poison in (float("nan"), min(1e30, torch.finfo(x.k.dtype).max)):
        # Views into a longer buffer whose tail (past S) holds the poison.
        k = sliced(x.k, poison, hidden)
        v = k if p.shared_kv else sliced(x.v, poison, hidden)
        o2, lse2 = _call(kernel, case, x, k=k, v=v)
        assert_bitwise(o2, o, f"{kernel.name} {case.id}: o with the {hidden} hidden keys and the storage past S = {poison}")
        if lse is not None:
            assert_bitwise(lse2, lse, f"{kernel.name} {case.id}: lse with hidden keys = {poison}")


def key_permutation_invariant(kernel, case: Case, device):
    """Without a mask, permuting keys and values together changes nothing but rounding."""
    case = _variant(kernel, case, device, causal=False, window=None)
    p = case.problem
    x = build_inputs(case, device)
    perm = torch.randperm(p.kv_len, generator=torch.Generator().manual_seed(case.seed)).to(device)
    k = x.k[:, perm]
    v = k if p.shared_kv else x.v[:, perm]
    o, lse = _call(kernel, case, x, k=k, v=v)
    oracle_o, oracle_lse = reference.attention(x.q, x.k, x.v, scale=x.scale, sink=x.sink)
    oracle_abs = reference.magnitudes(x.q, x.k, x.v, scale=x.scale, sink=x.sink)
    assert_agrees(o, oracle_o, f"{kernel.name} {case.id}: keys permuted", lse, oracle_lse, visible_logit_rms(p, x),
                  oracle_abs)


def linear_in_v(kernel, case: Case, device):
    """o(2^e v) = 2^e o(v) bitwise; o(v1 + v2) = o(v1) + o(v2) bitwise when v1 and v2 live in
    disjoint columns (both are exact in floating point)."""
    case = _variant(kernel, case, device, shared_kv=False)
    p = case.problem
    x = build_inputs(case, device)
    scale = 2.0 ** (4 if x.v.dtype == torch.float16 else 12)
    limit = torch.finfo(x.v.dtype).max / scale
    v_safe = x.v.clamp(-limit, limit)  # so that v * scale stays finite
    o_base, _ = _call(kernel, case, x, v=v_safe)
    o_scaled, _ = _call(kernel, case, x, v=v_safe * scale)
    # Outputs below the dtype's normal range were rounded coarsely before scaling: skip those,
    # and the smallest normal itself, which a value just below it also rounds to (H200,
    # fp16: 2^-14 - 2^-25 became 2^-14 while 16 times it stayed exact).
    normal = o_base.abs() > torch.finfo(o_base.dtype).tiny
    assert_bitwise(torch.where(normal, o_scaled, 0), torch.where(normal, o_base * scale, 0),
                   f"{kernel.name} {case.id}: o(v * {scale:g}) vs o(v) * {scale:g}")
    half = p.head_dim_v // 2
    v1, v2 = v_safe.clone(), v_safe.clone()
    v1[..., half:] = 0
    v2[..., :half] = 0
    o1, _ = _call(kernel, case, x, v=v1)
    o2, _ = _call(kernel, case, x, v=v2)
    # Zeros compare by value: where a sink drowns a row, o(v) is acc * 0 with acc's sign, and
    # the zero of the other half makes o(v1) + o(v2) = -0 + +0 = +0 (H200, every kernel).
    assert_bitwise(_unsigned_zeros(o1 + o2), _unsigned_zeros(o_base),
                   f"{kernel.name} {case.id}: o(v1) + o(v2) vs o(v1 + v2), disjoint columns")


def _unsigned_zeros(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t == 0, torch.zeros_like(t), t)


def gqa_equals_mha_with_repeated_kv(kernel, case: Case, device):
    p = case.problem
    x = build_inputs(case, device)
    o, lse = _call(kernel, case, x)
    k = x.k.repeat_interleave(p.group, dim=2)
    v = k if p.shared_kv else x.v.repeat_interleave(p.group, dim=2)
    o_mha, lse_mha = _call(kernel, case, x, k=k, v=v)
    assert_agrees(o, o_mha, f"{kernel.name} {case.id}: GQA vs MHA with repeated KV heads", lse, lse_mha,
                  visible_logit_rms(p, x))


def k_is_v_equals_copies(kernel, case: Case, device):
    case = _variant(kernel, case, device, shared_kv=True)
    x = build_inputs(case, device)
    o_copy, _ = _call(kernel, case, x, v=x.k.clone())
    o_same, _ = _call(kernel, case, x, v=x.k)
    assert_bitwise(o_same, o_copy, f"{kernel.name} {case.id}: k is v vs a copy of k as v")


def batch_rows_independent(kernel, case: Case, device):
    """Each batch row computed alone equals the same row inside the batch, bitwise."""
    x = build_inputs(case, device)
    o, lse = _call(kernel, case, x)
    for b in range(case.problem.batch):
        k = x.k[b:b + 1]
        o_b, _ = _call(kernel, case, x, q=x.q[b:b + 1], k=k, v=k if case.problem.shared_kv else x.v[b:b + 1])
        assert_bitwise(o_b, o[b:b + 1], f"{kernel.name} {case.id}: batch row {b} alone vs in the batch")


def deterministic(kernel, case: Case, device):
    x = build_inputs(case, device)
    o1, lse1 = _call(kernel, case, x)
    o2, lse2 = _call(kernel, case, x)
    assert_bitwise(o2, o1, f"{kernel.name} {case.id}: second run")
    if lse1 is not None:
        assert_bitwise(lse2, lse1, f"{kernel.name} {case.id}: lse, second run")


def decode_row_equals_last_prefill_row(kernel, case: Case, device):
    p = case.problem
    x = build_inputs(case, device)
    o, lse = _call(kernel, case, x)
    o_decode, lse_decode = _call(kernel, case, x, q=x.q[:, -1:])
    assert_agrees(o_decode, o[:, -1:], f"{kernel.name} {case.id}: decode row vs last prefill row",
                  lse_decode, None if lse is None else lse[..., -1:], visible_logit_rms(p, x))


def split_keys_merge_to_the_whole(kernel, merge, case: Case, device):
    """Attention over keys split anywhere (an empty part included) and merged with the sink
    equals attention over all keys with the sink."""
    case = _variant(kernel, case, device, causal=False, window=None)
    p = case.problem
    x = build_inputs(case, device)
    cut = case.seed % (p.kv_len + 1)
    parts, perfect_parts = [], []
    for lo, hi in ((0, cut), (cut, p.kv_len)):
        k = x.k[:, lo:hi]
        v = k if p.shared_kv else x.v[:, lo:hi]
        if hi > lo:
            parts.append(kernel(x.q, k, v, scale=x.scale))
            exact_o, exact_lse = reference.attention(x.q, k, v, scale=x.scale)
            perfect_parts.append((exact_o.to(p.dtype), exact_lse))
        else:  # an empty part, as a kernel over no keys reports it
            B, T, H = p.batch, p.q_len, p.heads_q
            parts.append((torch.zeros(B, T, H, p.head_dim_v, dtype=p.dtype, device=device),
                          torch.full((B, H, T), -math.inf, device=device)))
            perfect_parts.append(parts[-1])
    o, lse = merge(parts, sink=x.sink)
    oracle_o, oracle_lse = reference.attention(x.q, x.k, x.v, scale=x.scale, sink=x.sink)
    # Two roundings (the parts, then the merge), each relative to the parts' magnitudes, which
    # can cancel in the merge (H200 and CPU, bf16 iota_v, parts near -2 and +1 merged to 0.03:
    # 9.4 ulp of |o|, 0.3 ulp of the parts). Per element and per row the scale is the oracle
    # over |v|; the RMS floor adds what rounding the exact parts costs (one 16-element row,
    # parts near -0.6 and +1.4: a perfect kernel measured 8.5x the floor of |o| alone).
    oracle_abs = reference.magnitudes(x.q, x.k, x.v, scale=x.scale, sink=x.sink)
    perfect_o = reference.merge(perfect_parts, sink=x.sink)[0]
    assert_agrees(o, oracle_o, f"{kernel.name}+{merge.name} {case.id}: keys split at {cut}, merged",
                  lse, oracle_lse, visible_logit_rms(p, x), oracle_abs, perfect_o)


def merge_algebra(merge, case: Case, device):
    """Merge is commutative and associative; a part merged with itself keeps o and raises
    lse by ln 2. Parts are the oracle's over thirds of the keys, rounded as kernels return."""
    # fp32 parts: the laws are about the merge, not about rounding intermediate results.
    p = case.problem.replace(causal=False, window=None, sink=False, dtype=torch.float32)
    x = build_inputs(Case(p, case.distribution, case.seed, case.storage), device)
    thirds = [0, p.kv_len // 3, 2 * p.kv_len // 3, p.kv_len]
    parts = []
    for lo, hi in zip(thirds, thirds[1:]):
        o, lse = reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi], scale=x.scale)
        parts.append((o.to(p.dtype), lse.float()))
    a, b, c = parts
    where = f"{merge.name} {case.id} (fp32 parts)"
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


def minus_infinity_sink_is_no_sink(kernel, case: Case, device):
    case = _variant(kernel, case, device, sink=True)
    p = case.problem
    x = build_inputs(case, device)
    o_none, lse_none = _call(kernel, case, x, sink=None)
    o_inf, lse_inf = _call(kernel, case, x, sink=torch.full((p.heads_q,), -math.inf, device=device))
    assert_agrees(o_inf, o_none, f"{kernel.name} {case.id}: sink = -inf vs no sink", lse_inf, lse_none,
                  visible_logit_rms(p, x))


def window_at_least_s_is_causal(kernel, case: Case, device):
    case = _variant(kernel, case, device, window=None, causal=True)
    p = case.problem
    x = build_inputs(case, device)
    o_causal, lse_causal = _call(kernel, case, x)
    for window in (p.kv_len, p.kv_len + 1, 2 * p.kv_len + 300):
        o_w, lse_w = _call(kernel, case, x, window=window)
        assert_agrees(o_w, o_causal, f"{kernel.name} {case.id}: window={window} vs causal", lse_w, lse_causal,
                      visible_logit_rms(p, x))


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


# -- driving a law with hypothesis -----------------------------------------------------------

def run_law(law, strategy, *operands, device: str, nodeid: str = "", kernel_name: str = "", settings=None,
            pinned=()) -> None:
    """Run `law(*operands, case, device)` on the `pinned` cases, then on cases from
    `strategy`; a failure prints the shrunk case, a command that reruns it and the @example
    line that pins it."""

    @given(case=strategy)
    def check(case):
        note(f"reproduce: pytest '{nodeid}' --fmha-kernel {kernel_name} --fmha-device {device}\n"
             f"pin it: @example(case={case!r})")
        law(*operands, case, device)

    for case in pinned:
        check = example(case=case)(check)
    (settings(check) if settings is not None else check)()


def require(kernel: KernelEntry, device: str, *features: str) -> None:
    """Skip, with the kernel's reason, when a law needs what the kernel does not have."""
    caps = kernel.capabilities_on(device)
    missing = [f for f in features if f not in caps.features]
    unavailable = kernel.availability(device)
    if unavailable or device not in caps.devices:
        pytest.skip(f"{kernel.name}: {unavailable or f'no {device} kernel'}")
    if missing:
        pytest.skip(f"{kernel.name}: this law needs {', '.join(missing)} ("
                    + "; ".join(caps.notes.get(f, f"no {f} support") for f in missing) + ")")
