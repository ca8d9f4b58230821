"""The contract's metamorphic laws over dense keys (contract v1), one function each, each a
`Law` record (fmha.properties.law_record): what it draws and needs, the promise that makes it
bitwise, its test and the mutant it is proven on. Those over paged and sparse caches are in
paged_laws.py.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fmha.contract import KernelEntry
from fmha.oracles import production, dense_reference
from fmha.oracles.check import judge_run, oracle_of
from fmha.oracles.kernel_call import bitwise_difference, outputs, run_kernel
from fmha.oracles.inputs import Inputs
from fmha.oracles.sample import Sample, sliced_with_poison
from fmha.properties.law_record import assert_agrees, assert_bitwise, assert_same, law, unsigned_zeros, variant


def _call(kernel: KernelEntry, x: Inputs, q=None, k=None, v=None, **changes):
    """The kernel on x (or on the q, k, v given instead), with the sample's scale, mask, sink."""
    return kernel(x.q if q is None else q, x.k if k is None else k, x.v if v is None else v, **x.kwargs(**changes))


# -- the laws -------------------------------------------------------------------------------

@law(test="test_agrees_with_the_oracle", mutant="no-scale", covering="family")
def agrees_with_oracle(kernel, sample: Sample, device):
    """A random call agrees with the float64 oracle under the verdict."""
    run = run_kernel(kernel, sample.inputs(device))
    verdict = judge_run(run, kernel=kernel)
    assert verdict.passed, verdict.message(f"{kernel.name} {sample.id}")


@law(test="test_calls_in_sequence_agree_with_the_oracle", mutant="cached-by-shape", covering="sequence")
def calls_in_sequence_agree(kernel, sample: Sample, device):
    """Calls in sequence each agree with the oracle: one with a request more, then the drawn
    one, then the same shapes with new values (a kernel whose plan, scratch or metadata from
    one call leaks into the next fails)."""
    larger = variant(kernel, one_request_more(sample), device, seed=sample.seed + 2)
    for what, drawn in (("a call with one request more", larger), ("the call after it", sample),
                        ("the same shapes again, new values", sample.replace(seed=sample.seed + 1))):
        run = run_kernel(kernel, drawn.inputs(device))
        verdict = judge_run(run, kernel=kernel)
        assert verdict.passed, verdict.message(f"{kernel.name} {drawn.id}: {what}")
        del run


@law(test="test_a_call_late_in_a_long_process_gives_the_same_answer", mutant="breaks-after-many-calls")
def late_in_a_long_process(kernel, sample: Sample, device):
    """A call made again after the process has made thousands (at least 2^12 in CI,
    2^17 in the nightly: the profile's count, plus a part drawn per run) gives the same answer: a
    plan cache evicted, a counter wrapping or a buffer recycled after many calls fails."""
    x = sample.inputs(device)
    first = run_kernel(kernel, x)
    calls = production.REPLAYS.soak + sample.values_seed % (production.REPLAYS.soak // 4)
    made = production.soak(kernel, x, calls)
    with production.replaying_in():  # the soak is this law's context: a replay of the first call would be its 2^12th
        for what, run in (("its first call", first),
                          (f"the call again after {made} more calls ({calls} soaked in all)", run_kernel(kernel, x))):
            verdict = judge_run(run)  # one line for both: a kernel already worn out fails here as one worn by the soak
            assert verdict.passed, verdict.message(f"{kernel.name} {sample.id}: {what}")


def one_request_more(sample: Sample) -> Sample:
    """The sample with its first request twice, at the end: a batch of one more."""
    lengths = {name: (getattr(sample, name) + getattr(sample, name)[:1]) for name in
               ("kv_lens", "q_lens", "topk_lens", "extra_topk_lens") if getattr(sample, name)}
    return sample.replace(batch=sample.problem.batch + 1, **lengths)


@law(test="test_invisible_keys_and_storage_past_s_do_not_leak", mutant="nan-leak",
     exact_under="bitwise_deterministic")
def invisible_keys_do_not_leak(kernel, sample: Sample, device):
    """Keys older than every row's window, and storage past S, filled with NaN or 1e30,
    leave the output unchanged."""
    p = sample.problem
    x = sample.inputs(device)
    result = _call(kernel, x)
    hidden = max(0, p.kv_len - p.q_len - p.window + 1) if p.window is not None else 0
    for poison in (float("nan"), min(1e30, torch.finfo(x.k.dtype).max)):
        # Views into a longer buffer whose tail (past S) holds the poison.
        k = sliced_with_poison(x.k, poison, hidden)
        v = k if p.shared_kv else sliced_with_poison(x.v, poison, hidden)
        assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x, k=k, v=v), result,
                    f"{kernel.name} {sample.id}: the {hidden} hidden keys and the storage past S = {poison}", x)


def _masked_only(what: str):
    """The reason a law that calls without a mask cannot be stated for a causal-only kernel."""
    def unstatable(caps) -> str | None:
        if "causal" in caps.requires:
            return f"declares causal calls only (requires causal): no call without a mask to {what}"
        return None
    return unstatable


@law(test="test_permuting_keys_and_values_together_changes_nothing", mutant="positional-bias",
     unstatable=_masked_only("permute the keys of"))
def key_permutation_invariant(kernel, sample: Sample, device):
    """Without a mask, permuting keys and values together changes nothing but rounding."""
    sample = variant(kernel, sample, device, causal=False, window=None)
    p = sample.problem
    x = sample.inputs(device)
    perm = torch.randperm(p.kv_len, generator=torch.Generator().manual_seed(sample.values_seed)).to(device)
    k = x.k[:, perm]
    v = k if p.shared_kv else x.v[:, perm]
    o, lse = _call(kernel, x, k=k, v=v)
    oracle = oracle_of(x)
    assert_agrees(o, oracle.o, f"{kernel.name} {sample.id}: keys permuted", lse, oracle.lse, oracle)


@law(test="test_output_is_linear_in_v", mutant="logits-from-v", exact_under="bitwise_deterministic")
def linear_in_v(kernel, sample: Sample, device):
    """o(2^e v) = 2^e o(v); o(v1 + v2) = o(v1) + o(v2) when v1 and v2 live in disjoint
    columns. Both are exact in floating point: bitwise for a bitwise-deterministic kernel."""
    sample = variant(kernel, sample, device, shared_kv=False)
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
    assert_bitwise(unsigned_zeros(o1 + o2), unsigned_zeros(o_base),
                   f"{what}: o(v1) + o(v2) vs o(v1 + v2), disjoint columns")


@law(test="test_gqa_equals_mha_with_repeated_kv_heads", mutant="head-modulo", needs=("gqa",))
def gqa_equals_mha_with_repeated_kv(kernel, sample: Sample, device):
    """GQA equals MHA with each KV head repeated for its group of query heads."""
    p = sample.problem
    x = sample.inputs(device)
    o, lse = _call(kernel, x)
    k = x.k.repeat_interleave(p.group, dim=2)
    v = k if p.shared_kv else x.v.repeat_interleave(p.group, dim=2)
    o_mha, lse_mha = _call(kernel, x, k=k, v=v)
    assert_agrees(o, o_mha, f"{kernel.name} {sample.id}: GQA vs MHA with repeated KV heads", lse, lse_mha,
                  oracle_of(x))


@law(test="test_k_is_v_equals_separate_copies", mutant="prescale-k-in-place", needs=("shared_kv",),
     exact_under="bitwise_deterministic")
def k_is_v_equals_copies(kernel, sample: Sample, device):
    """Passing one tensor as k and v equals passing k and a copy of it."""
    sample = variant(kernel, sample, device, shared_kv=True, head_dim_v=sample.problem.head_dim)
    x = sample.inputs(device)
    assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x, v=x.k), _call(kernel, x, v=x.k.clone()),
                f"{kernel.name} {sample.id}: k is v vs a copy of k as v", x)


@law(test="test_a_batch_row_alone_equals_the_row_in_the_batch", mutant="batch-max",
     exact_under="batch_invariant")
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


@law(test="test_two_runs_give_the_same_answer", mutant="random-key-order", exact_under="bitwise_deterministic")
def deterministic(kernel, sample: Sample, device):
    """A second run of the same call gives the same answer."""
    x = sample.inputs(device)
    assert_same(kernel, device, "bitwise_deterministic", _call(kernel, x), _call(kernel, x),
                f"{kernel.name} {sample.id}: second run vs first", x)


@law(test="test_decode_row_equals_the_last_prefill_row", mutant="top-left")
def decode_row_equals_last_prefill_row(kernel, sample: Sample, device):
    """A decode call (the last query row alone) equals the last row of the prefill call."""
    x = sample.inputs(device)
    o, lse = _call(kernel, x)
    o_decode, lse_decode = _call(kernel, x, q=x.q[:, -1:])
    assert_agrees(o_decode, o[:, -1:], f"{kernel.name} {sample.id}: decode row vs last prefill row",
                  lse_decode, None if lse is None else lse[..., -1:], oracle_of(x.with_tensors(q=x.q[:, -1:])))


@law(test="test_keys_split_anywhere_and_merged_equal_all_keys", mutant="max-merge",
     operands="kernel+merge", needs=("lse", "sink"), unstatable=_masked_only("split the keys of"))
def split_keys_merge_to_the_whole(kernel, merge, sample: Sample, device):
    """Attention over keys split anywhere (an empty part included) and merged with the sink
    equals attention over all keys with the sink."""
    sample = variant(kernel, sample, device, causal=False, window=None)
    p = sample.problem
    x = sample.inputs(device)
    scale = sample.scale
    cut = sample.seed % (p.kv_len + 1)
    halves = [(x.k[:, lo:hi], x.k[:, lo:hi] if p.shared_kv else x.v[:, lo:hi]) for lo, hi in ((0, cut), (cut, p.kv_len))]
    B, T, H = p.batch, p.q_len, p.heads_q
    empty = (torch.zeros(B, T, H, p.head_dim_v, dtype=p.dtype, device=device), torch.full((B, H, T), -math.inf, device=device))
    # An empty part as a kernel over no keys reports it. Every kernel call comes before any
    # float64 answer exists: nothing a kernel could find in the process gives it the answer.
    parts = [outputs(kernel, x, kernel(x.q, k, v, scale=scale)) if k.shape[1] else empty for k, v in halves]
    o, lse = merge(parts, sink=x.sink)
    perfect_parts = []  # what an error-free kernel returns for each part
    for (k, v), part in zip(halves, parts):
        if k.shape[1]:
            exact_o, exact_lse = dense_reference.attention(x.q, k, v, scale=scale)
            part = (exact_o.to(p.dtype), exact_lse)
        perfect_parts.append(part)
    oracle = oracle_of(x)
    # Two roundings (the parts, then the merge), each relative to the parts' magnitudes, which
    # can cancel in the merge (H200 and CPU, bf16 iota_v, parts near -2 and +1 merged to 0.03:
    # 9.4 ulp of |o|, 0.3 ulp of the parts). Per element and per row the scale is the oracle
    # over |v|; the RMS floor adds what rounding the exact parts costs (one 16-element row,
    # parts near -0.6 and +1.4: a perfect kernel measured 8.5x the floor of |o| alone).
    perfect_o = dense_reference.merge(perfect_parts, sink=x.sink)[0]
    assert_agrees(o, oracle.o, f"{kernel.name}+{merge.name} {sample.id}: keys split at {cut}, merged",
                  lse, oracle.lse, oracle, perfect_o=perfect_o)


@law(test="test_merge_is_commutative_associative_and_idempotent_up_to_ln2", mutant="max-merge",
     draws="merge", operands="merge")
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
        o, lse = dense_reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi], scale=sample.scale)
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
        return dense_reference.merge([(o.abs(), lse) for o, lse in merged])[0]

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


@law(test="test_sink_minus_infinity_equals_no_sink", mutant="sink-added-not-exp", needs=("sink",))
def minus_infinity_sink_is_no_sink(kernel, sample: Sample, device):
    """A sink of -inf equals no sink."""
    sample = variant(kernel, sample, device, sink=True)
    p = sample.problem
    x = sample.inputs(device)
    o_none, lse_none = _call(kernel, x, sink=None)
    o_inf, lse_inf = _call(kernel, x, sink=torch.full((p.heads_q,), -math.inf, device=device))
    assert_agrees(o_inf, o_none, f"{kernel.name} {sample.id}: sink = -inf vs no sink", lse_inf, lse_none,
                  oracle_of(x.with_tensors(sink=None)))


@law(test="test_window_at_least_s_equals_causal", mutant="window-capped", needs=("window", "causal"))
def window_at_least_s_is_causal(kernel, sample: Sample, device):
    """A window of S keys or more equals causal."""
    sample = variant(kernel, sample, device, window=None, causal=True)
    p = sample.problem
    x = sample.inputs(device)
    o_causal, lse_causal = _call(kernel, x)
    windowed = {window: _call(kernel, x, window=window) for window in (p.kv_len, p.kv_len + 1, 2 * p.kv_len + 300)}
    oracle = oracle_of(x)
    for window, (o_w, lse_w) in windowed.items():
        assert_agrees(o_w, o_causal, f"{kernel.name} {sample.id}: window={window} vs causal", lse_w, lse_causal,
                      oracle)


@law(test="test_the_same_buffers_refilled_give_the_new_answer", mutant="cached-by-address")
def refilled_buffers_give_the_new_answer(kernel, sample: Sample, device):
    """The same tensors, refilled in place with another draw's values, give that draw's answer:
    a kernel that caches its results (or a plan, a descriptor) by address or by shape fails."""
    sample = sample.writable()
    x = sample.inputs(device)
    first = run_kernel(kernel, x)
    refilled = refill(x, sample.replace(seed=sample.seed + 1).inputs(device))
    second = run_kernel(kernel, refilled)
    verdict = judge_run(second, kernel=kernel)
    if not verdict.passed and bitwise_difference(first.o, second.o) is None:
        raise AssertionError(f"{kernel.name} {sample.id}: buffers refilled in place with new values gave the first "
                             "call's answer, bit for bit: a result cached by address or by shape")
    assert verdict.passed, verdict.message(f"{kernel.name} {sample.id}: the same buffers refilled with new values")


def refill(x: Inputs, y: Inputs) -> Inputs:
    """x's tensors (the same storage) holding y's values: y's call made on x's buffers."""
    tensors = {name: getattr(x, name) for name in ("q", "k", "v", "sink")}
    for name, t in tensors.items():
        if t is not None and not (name == "v" and x.v is x.k):
            t.copy_(getattr(y, name))
    for name, t in x.source_args.items():
        if isinstance(t, torch.Tensor):
            t.copy_(y.source_args[name])
    return dataclasses.replace(y, **tensors, source_args=x.source_args)
