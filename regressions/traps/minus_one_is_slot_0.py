"""minus-one-is-slot-0: an index of -1 (no key) read as physical slot 0: an unsigned index, or a
clamp before the mask. Slot 0 is a real key of some request (or poison), so the row attends a
key it was never given."""

from fmha.regressions.paged_cases import SHIPPED, SPARSE, TWO_SCOPES
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="minus-one-is-slot-0", seed_logs=(),
    source=SHIPPED,
    symptom="rows with invalid indices attend slot 0's key: wrong output, or NaN where slot 0 is unwritten",
    root_cause="the gather clamps or casts the index before masking -1",
    cases=(reproducer(SPARSE, topk_lens=(6, 3), invalid=0.25, seed=5, why="a quarter of the indices -1, FP8 cache"),
           reproducer(TWO_SCOPES,
                      topk_lens=(6, 0), extra_topk_lens=(4, 2), invalid=0.5, seed=6, why="half the indices of both scopes -1")),
)

MUTANTS = proving(TRAP.id)
