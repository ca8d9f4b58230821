"""last-index-dropped: one index short per row: a loop bound of top-k - 1."""

from fmha.regressions.paged_cases import SPARSE
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="last-index-dropped", seed_logs=(),
    source="a paged-kernel bug class the contract-v2 laws exist for (properties/paged_laws.py)",
    symptom="every row misses its last listed key",
    root_cause="an off-by-one in the index loop",
    cases=(reproducer(SPARSE, seed=5, why="every index valid"),
           reproducer(SPARSE.replace(kv_len=1), seed=3, why="top-k 1: the row loses its only key")),
)

MUTANTS = proving(TRAP.id)
