"""slots-as-powers-of-two: slot arithmetic by shift and mask (j >> log2(block_size), j &
(block_size - 1)): right for powers of two only. DSV4's tests draw block sizes 5, 53, 61, 69."""

from fmha.regressions.paged_cases import PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="slots-as-powers-of-two", seed_logs=(),
    source="a paged-kernel bug class the contract-v2 laws exist for (properties/paged_laws.py)",
    symptom="wrong keys for block sizes that are not powers of two; 1, 2, 16, 64 pass",
    root_cause="page and offset computed with bit operations",
    cases=(reproducer(PAGED.replace(block_size=5), kv_lens=(9, 7, 3), seed=7, why="block size 5"),
           reproducer(PAGED.replace(block_size=3, kv_len=8), kv_lens=(8, 8, 2), seed=2, why="block size 3")),
)

MUTANTS = proving(TRAP.id)
