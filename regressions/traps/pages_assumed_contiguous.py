"""pages-assumed-contiguous: page i of a request read at block_table[b, 0] + i: right only while
the allocator hands out runs."""

from fmha.regressions.paged_cases import PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="pages-assumed-contiguous", seed_logs=(),
    source="a paged-kernel bug class the contract-v2 laws exist for (properties/paged_laws.py)",
    symptom="wrong keys once pages are shuffled, as a serving engine's allocator leaves them",
    root_cause="the block table's first entry and an offset instead of a lookup per page",
    cases=(reproducer(PAGED, kv_lens=(9, 9, 9), seed=1, why="shuffled pages, three full requests"),
           reproducer(PAGED.replace(block_size=1, kv_len=5),
                      kv_lens=(5, 2, 4), seed=3, why="block size 1: every key its own page")),
)

MUTANTS = proving(TRAP.id)
