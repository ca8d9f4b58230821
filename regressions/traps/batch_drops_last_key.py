"""batch-drops-last-key: the multi-request path stops one key short; a request run alone is right,
so single-request tests pass."""

from fmha.regressions.paged_cases import PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="batch-drops-last-key", seed_logs=(),
    source="a paged-kernel bug class the contract-v2 laws exist for (properties/paged_laws.py)",
    symptom="each request of a batch misses its last key",
    root_cause="the batched path's bound is kv_len - 1",
    cases=(reproducer(PAGED, kv_lens=(9, 6, 5), seed=1, why="three requests"),
           reproducer(PAGED.replace(ragged=True), kv_lens=(9, 3, 5), q_lens=(2, 2, 1), seed=3, why="packed queries")),
)

MUTANTS = proving(TRAP.id)
