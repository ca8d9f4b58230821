"""Counterexamples found by the property suite, pinned so every run tries them first
(hypothesis @example). Each was the shrunk output of a failing law; see regressions/ledger.py
for the kernels that still fail them."""

import torch

from fmha.problem import Problem
from properties.strategies import Case

PINNED = {
    # SDPA math and CPU flash: 0 * NaN from a key no row can see (2026-11-29).
    "invisible_keys_do_not_leak": [
        Case(Problem(1, 1, 2, 1, 1, 16, dtype=torch.bfloat16, causal=True, window=1)),
    ],
    # SDPA math: a batch row's bits depend on the batch size (2026-11-29).
    "batch_rows_independent": [
        Case(Problem(3, 1, 993, 14, 2, 32, dtype=torch.bfloat16), seed=1),
    ],
    # fmha triton: sink = -inf on rows with nothing visible gave NaN (exp2(-inf - -inf)),
    # fixed 2026-11-29.
    "minus_infinity_sink_is_no_sink": [
        Case(Problem(2, 300, 16, 4, 2, 160, dtype=torch.bfloat16, causal=True, sink=True), "peaky", 718, "strided"),
    ],
    # Found on an H200 by random draws, 2026-11-29; the fixes were in the checks, not the
    # kernel. linear_in_v: an fp16 output just below the smallest normal rounded up to it,
    # and passed the "normal outputs only" filter.
    "linear_in_v": [
        Case(Problem(3, 31, 1, 6, 2, 112, dtype=torch.float16, sink=True), "peaky"),
        # A sink that drowns rows: o(v) = -0 where o(v1) + o(v2) = +0 (H200 nightly profile,
        # the Gluon and the Triton kernel alike, 2026-11-30; zeros now compare by value).
        Case(Problem(1, 44, 64, 1, 1, 512, dtype=torch.bfloat16, causal=True, window=1, sink=True),
             "large_logits", 484),
    ],
    # The same case against the oracle: exact values near 1e-39, below bf16's smallest normal,
    # returned as 0 by kernels that flush subnormals (oracles/metrics.py now counts that exact).
    "agrees_with_oracle": [
        Case(Problem(1, 44, 64, 1, 1, 512, dtype=torch.bfloat16, causal=True, window=1, sink=True),
             "large_logits", 484),
    ],
    # A merged output compared with another merged output: both round, the allowance is
    # two-sided (oracles.verdict.two_sided).
    "merge_algebra": [
        Case(Problem(1, 138, 96, 1, 1, 16, dtype=torch.bfloat16), "iota_v"),
        # Parts that cancel: measured against |o| instead of the parts' magnitudes (H200
        # nightly profile, both merges, 2026-11-30; the CPU fails the same way).
        Case(Problem(1, 11, 487, 1, 1, 16, dtype=torch.bfloat16), "iota_v"),
    ],
    # A sink that takes most of the weight leaves fp16 outputs partly subnormal: the row
    # floor counts each element at least at the smallest normal.
    "split_keys_merge_to_the_whole": [
        Case(Problem(2, 15, 1, 1, 1, 432, dtype=torch.float16, sink=True), "peaky"),
        # Parts that cancel in the merge: measured against |o| instead of the parts' scale.
        Case(Problem(1, 187, 21, 1, 1, 16, dtype=torch.bfloat16), "iota_v", 1),
        # The same in one 16-element row, where the RMS floor (of |o| alone) failed even the
        # exact parts rounded: it now adds their rounding (H200 random draw, 2026-11-30).
        Case(Problem(1, 1, 17, 1, 1, 16, dtype=torch.bfloat16), "iota_v", 31),
    ],
    # The same cancellation, keys permuted (H200 and CPU alike).
    "key_permutation_invariant": [
        Case(Problem(1, 30, 168, 1, 1, 16, dtype=torch.float16), "iota_v"),
    ],
}
