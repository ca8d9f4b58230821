"""block-table-row-stride: the block table's row stride taken as 0: every request reads request 0's
pages. A batch of one passes."""

from fmha.regressions.paged_cases import SHIPPED, PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="block-table-row-stride", seed_logs=(),
    source=SHIPPED,
    symptom="every request of a batch gets the first request's keys",
    root_cause="the block table pointer does not advance by its row stride per request",
    cases=(reproducer(PAGED, kv_lens=(9, 6, 5), seed=1, why="three requests on different pages"),
           reproducer(PAGED.replace(ragged=True), kv_lens=(9, 3, 5), q_lens=(2, 2, 1), seed=3, why="packed queries")),
)

MUTANTS = proving(TRAP.id)
