"""Samples every run of a law tries first (hypothesis @example): counterexamples found by the
property suite (the shrunk output of a failing law; see regressions/ledger.py for the kernels
that still fail them), and samples a law needs on every run whatever its draws' values."""

import torch

from fmha.oracles.sample import Sample
from fmha.contract import Problem

# 128 fp8 keys at scale 2^96 with one code each, their logits tied: the unnormalised sum of p v
# passed fp32's range and the row came back NaN (gluon-sparse, cuda-sparse and the Triton paged
# kernel; found on an H100 by the index-reordering law; the trap tied-keys-overflow's case).
TIED_KEYS = Sample(problem=Problem(batch=1, q_len=1, kv_len=128, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True,
                                    sink=True, source='sparse', block_size=5, cache_layout='dsv4-fp8'),
                    distribution='negative_logits', seed=1, cache_exponent=96, outliers=True, run_seed=3)

PINNED = {
    # SDPA math and CPU flash: 0 * NaN from a key no row can see.
    "invisible_keys_do_not_leak": [
        Sample(problem=Problem(batch=1, q_len=1, kv_len=2, heads_q=1, heads_kv=1, head_dim=16, window=1)),
    ],
    # SDPA math: a batch row's bits depend on the batch size.
    "batch_rows_independent": [
        Sample(problem=Problem(batch=3, q_len=1, kv_len=993, heads_q=14, heads_kv=2, head_dim=32), seed=1),
    ],
    # fmha triton: sink = -inf on rows with nothing visible gave NaN (exp2(-inf - -inf))
    # before it was fixed.
    "minus_infinity_sink_is_no_sink": [
        Sample(problem=Problem(batch=2, q_len=300, kv_len=16, heads_q=4, heads_kv=2, head_dim=160, causal=True, sink=True),
               distribution='peaky', seed=718, q_storage='strided', k_storage='strided', v_storage='strided'),
    ],
    # Found on an H200 by random draws; the fixes were in the checks, not the
    # kernel. linear_in_v: an fp16 output just below the smallest normal rounded up to it,
    # and passed the "normal outputs only" filter.
    "linear_in_v": [
        Sample(problem=Problem(batch=3, q_len=31, kv_len=1, heads_q=6, heads_kv=2, head_dim=112, dtype=torch.float16, sink=True),
               distribution='peaky'),
        # A sink that drowns rows: o(v) = -0 where o(v1) + o(v2) = +0 (H200 nightly profile,
        # the Gluon and the Triton kernel alike; zeros now compare by value).
        Sample(problem=Problem(batch=1, q_len=44, kv_len=64, heads_q=1, heads_kv=1, head_dim=512, window=1, sink=True),
               distribution='large_logits', seed=484),
        # V at the edge of fp16's range over 2048 keys: a kernel holding the unnormalised sum
        # exp(s - m) v in fp16 overflows, scaled or not (llama.cpp's; the law's draws reach it
        # only when the dice give a long fp16 context).
        Sample(problem=Problem(batch=1, q_len=1, kv_len=2048, heads_q=1, heads_kv=1, head_dim=64, dtype=torch.float16),
               distribution='large_v'),
    ],
    # The same case against the oracle: exact values near 1e-39, below bf16's smallest normal,
    # returned as 0 by kernels that flush subnormals (oracles/metrics.py now counts that exact).
    "agrees_with_oracle": [
        # Logits near 0.5 summed from terms near 1e4 (large_logits with 28 heads, batch 33): fp32
        # rounding put the lse 2.2e-4 off in fmha and SDPA flash alike; the lse check now allows
        # what fp32 logits cost (oracles/metrics.py, LOGIT_ROUNDING; CPU).
        Sample(problem=Problem(batch=33, q_len=16, kv_len=1, heads_q=28, heads_kv=4, head_dim=32, dtype=torch.float16),
               distribution='large_logits'),
        # fp32 outputs at scale 1.0, |s| ~ 1e4: 1 - cos = 1.2e-9 at 0.12x the floor (SDPA flash); the
        # cosine allowance now widens with the logit conditioning (oracles/verdict.py).
        Sample(problem=Problem(batch=3, q_len=85, kv_len=50, heads_q=1, heads_kv=1, head_dim=48, dtype=torch.float32),
               scale=1.0, distribution='large_logits', seed=41),
        # A sink takes all but ~2^-130 of some rows' weight: fp32 weights flush to zero on a GPU
        # and outputs near 2^-125 come out 55 units off (H200, fmha); the oracle's
        # underflow now allows what that costs (oracles/dense_reference.py).
        Sample(problem=Problem(batch=160, q_len=15, kv_len=1, heads_q=1, heads_kv=1, head_dim=32, sink=True,
                               shared_kv=True), scale=1.0, distribution='peaky'),
        Sample(problem=Problem(batch=1, q_len=44, kv_len=64, heads_q=1, heads_kv=1, head_dim=512, window=1, sink=True),
               distribution='large_logits', seed=484),
    ],
    # A merged output compared with another merged output: both round, the allowance is
    # two-sided (oracles.verdict.two_sided).
    "merge_algebra": [
        Sample(problem=Problem(batch=1, q_len=138, kv_len=96, heads_q=1, heads_kv=1, head_dim=16),
               distribution='iota_v'),
        # Parts that cancel: measured against |o| instead of the parts' magnitudes (H200
        # nightly profile, both merges; the CPU fails the same way).
        Sample(problem=Problem(batch=1, q_len=11, kv_len=487, heads_q=1, heads_kv=1, head_dim=16),
               distribution='iota_v'),
    ],
    # A sink that takes most of the weight leaves fp16 outputs partly subnormal: the row
    # floor counts each element at least at the smallest normal.
    "split_keys_merge_to_the_whole": [
        Sample(problem=Problem(batch=2, q_len=15, kv_len=1, heads_q=1, heads_kv=1, head_dim=432, dtype=torch.float16, sink=True),
               distribution='peaky'),
        # Parts that cancel in the merge: measured against |o| instead of the parts' scale.
        Sample(problem=Problem(batch=1, q_len=187, kv_len=21, heads_q=1, heads_kv=1, head_dim=16),
               distribution='iota_v', seed=1),
        # The same in one 16-element row, where the RMS floor (of |o| alone) failed even the
        # exact parts rounded: it now adds their rounding (H200 random draw).
        Sample(problem=Problem(batch=1, q_len=1, kv_len=17, heads_q=1, heads_kv=1, head_dim=16),
               distribution='iota_v', seed=31),
    ],
    # Every key weighs about the same (flat) and the last row sees 2049 keys: a window capped below
    # that at any size (a tile count, a small integer) drops keys the law then sees missing. Drawn
    # values alone reached past a cap of 256 keys once in 80 draws, and a peaked draw hid it.
    "window_at_least_s_is_causal": [
        Sample(problem=Problem(batch=1, q_len=1, kv_len=2049, heads_q=1, heads_kv=1, head_dim=64, causal=True),
               distribution='flat'),
    ],
    # Keys of a quantized cache at scale 2^96 beside an outlier, every logit near -1e38: a
    # representable logit whose dot product (times 512^0.5) is not. cuda-sparse, gluon-sparse and
    # the Triton paged kernel summed the dot in fp32 before the scale, read -inf and returned the
    # row as empty (o = 0, lse = -inf); q is now scaled by a power of two first (triton_utils.q_unit).
    "sparse_calls_agree_with_the_oracle": [
        Sample(problem=Problem(batch=1, q_len=1, kv_len=1, heads_q=1, heads_kv=1, head_dim=512, shared_kv=True,
                               source='sparse', block_size=1, cache_layout='dsv4-fp8'),
               distribution='negative_logits', cache_exponent=96, outliers=True, run_seed=1),
        TIED_KEYS,
    ],
    # The same over two scopes, half the indices -1 (H200 random draw); and at scale 1 a logit of
    # 1.5e38 whose q.k partial sums pass fp32's range (1.3e39) where terms cancel: NaN rows
    # (H100 random draw) before q.k got room below the scale (triton_utils.QK_HEADROOM_LOG2).
    "two_scope_calls_agree_with_the_oracle": [
        Sample(problem=Problem(batch=1, q_len=1, kv_len=1, heads_q=1, heads_kv=1, head_dim=512, shared_kv=True,
                               source='sparse', block_size=1, cache_layout='dsv4-fp4', extra_topk=1, extra_block_size=1,
                               extra_cache_layout='dsv4-fp8'),
               scale=1.0, distribution='negative_logits', repeats=0.25, cache_exponent=96, outliers=True,
               hazards=('every-code',), run_seed=32460374592011983),
        Sample(problem=Problem(batch=1, q_len=1, kv_len=1, heads_q=1, heads_kv=1, head_dim=512, shared_kv=True,
                               source='sparse', block_size=1, cache_layout='dsv4-fp8', extra_topk=1, extra_block_size=1,
                               extra_cache_layout='dsv4-fp4'),
               distribution='negative_logits', invalid=0.5, repeats=0.25, cache_exponent=96, outliers=True,
               run_seed=130656416556592),
    ],
    "index_order_changes_nothing": [TIED_KEYS],
    # The same cancellation, keys permuted (H200 and CPU alike).
    "key_permutation_invariant": [
        Sample(problem=Problem(batch=160, q_len=15, kv_len=1, heads_q=1, heads_kv=1, head_dim=32, sink=True,
                               shared_kv=True), scale=1.0, distribution='peaky'),
        Sample(problem=Problem(batch=1, q_len=30, kv_len=168, heads_q=1, heads_kv=1, head_dim=16, dtype=torch.float16),
               distribution='iota_v'),
    ],
}
