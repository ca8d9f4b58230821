"""second-scope-quantized-alone: a two-scope call whose second cache is quantized and whose first is
in q's dtype, decoded as if the first scope's layout (none) held for both: the second scope's tile
scales never applied. Every two-scope draw quantized the second scope only beside a quantized first
before each scope's layout was drawn on its own (fmha.contract.relations)."""

from fmha.regressions.paged_cases import SPARSE
from fmha.regressions.relation_mutants import RELATION_MUTANTS
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="second-scope-quantized-alone", seed_logs=(),
    source="the relation records: each scope's cache layout its own (fmha.contract.relations)",
    symptom="wrong rows wherever the second scope's keys carry weight; calls with both scopes quantized, or neither, pass",
    root_cause="the decode path (scales, codes) chosen from the first scope's layout for both scopes",
    cases=(reproducer(SPARSE.replace(cache_layout=None, extra_topk=4, extra_block_size=2, extra_cache_layout="dsv4-fp4"),
                      seed=3, why="an fp4 second scope beside a bf16 first"),),
)

MUTANTS = tuple(m for m in RELATION_MUTANTS if m.trap == TRAP.id)
