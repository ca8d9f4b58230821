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
}
