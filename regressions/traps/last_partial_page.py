"""last-partial-page: a request's last, partial page read whole: the slots past its kv length
(another request's keys, or poison) count too."""

from fmha.regressions.paged_cases import SHIPPED, PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="last-partial-page", seed_logs=(),
    source=SHIPPED,
    symptom="requests whose kv length is not a multiple of the block size attend the rest of their last page",
    root_cause="the key loop's bound is the page count times the block size, not kv_len",
    cases=(reproducer(PAGED, kv_lens=(9, 7, 3), seed=7, why="every request ends inside a page"),
           reproducer(PAGED.replace(ragged=True),
                      kv_lens=(9, 3, 5), q_lens=(2, 0, 1), seed=3, why="packed queries, partial pages")),
)

MUTANTS = proving(TRAP.id)
