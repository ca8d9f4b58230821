"""invalid-index-counted: a -1 index masked to logit 0 instead of -inf: every invalid index adds
exp(0) to the denominator."""

from fmha.regressions.paged_cases import SPARSE
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="invalid-index-counted", seed_logs=(),
    source="a paged-kernel bug class the contract-v2 laws exist for (properties/paged_laws.py)",
    symptom="rows with invalid indices are scaled down; all-invalid rows are not empty",
    root_cause="the mask writes 0 where it should write -inf",
    cases=(reproducer(SPARSE, invalid=0.5, seed=5, why="half the indices -1"),
           reproducer(SPARSE.replace(sink=False), topk_lens=(6, 2), invalid=0.25, seed=9, why="no sink")),
)

MUTANTS = proving(TRAP.id)
