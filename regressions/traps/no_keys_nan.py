"""no-keys-nan: a request with no keys (kv length 0) divides 0 by 0; the contract says o = 0 and
lse = -inf (or the sink)."""

from fmha.regressions.paged_cases import SHIPPED, PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="no-keys-nan", seed_logs=(),
    source=SHIPPED,
    symptom="NaN rows for requests with an empty cache",
    root_cause="the epilogue divides by a row sum of 0",
    cases=(reproducer(PAGED, kv_lens=(9, 0, 5), shared_pages=True, seed=1, why="the second request has no keys"),
           reproducer(PAGED.replace(ragged=True),
                      kv_lens=(0, 3, 5), q_lens=(2, 1, 1), seed=4, why="packed queries of an empty request")),
)

MUTANTS = proving(TRAP.id)
