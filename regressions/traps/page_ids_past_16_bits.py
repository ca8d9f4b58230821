"""page-ids-past-16-bits: page ids held in 16 bits (a uint16 table, or a slot's page computed in
16 bits): a cache of more than 2^16 pages reads page p - 2^16 for a page p past them. Every cache
the draws made before the size records held a few hundred pages at most; a serving engine's holds
hundreds of thousands."""

from fmha.regressions.paged_cases import PAGED
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="page-ids-past-16-bits", seed_logs=(),
    source="the size records' integer widths (fmha.contract.ranges: a cache's pages past 2^16)",
    symptom="wrong keys (poison: NaN) for requests whose pages have ids of 2^16 and more; smaller caches pass",
    root_cause="page ids narrowed to 16 bits",
    cases=(reproducer(PAGED.replace(block_size=1, kv_len=3), kv_lens=(3, 2, 1), num_blocks=2**16 + 1, seed=1,
                      why="a cache of 2^16 + 1 pages, the call's own the last ids"),),
)

MUTANTS = proving(TRAP.id)
