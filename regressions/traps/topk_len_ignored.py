"""topk-len-ignored: every index read, past the request's topk_len too: the slots past it are stale
indices of an earlier step."""

from fmha.regressions.paged_cases import SHIPPED, SPARSE, TWO_SCOPES
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="topk-len-ignored", seed_logs=(),
    source=SHIPPED,
    symptom="requests with topk_len < top-k attend keys past their length",
    root_cause="the loop runs to top-k instead of the request's topk_len",
    cases=(reproducer(SPARSE, topk_lens=(6, 3), seed=5, why="the second request reads 3 of 6"),
           reproducer(TWO_SCOPES,
                      topk_lens=(6, 6), extra_topk_lens=(4, 1), seed=6, why="only the second scope is cut short")),
)

MUTANTS = proving(TRAP.id)
