"""rope-read-as-fp8: the 64 bf16 rope dims' bytes decoded as FP8 like the 448 quantized dims."""

from fmha.regressions.paged_cases import SHIPPED, SPARSE, TWO_SCOPES
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="rope-read-as-fp8", seed_logs=(),
    source=SHIPPED,
    symptom="the last 64 key dims are garbage; scores are wrong by the rope part's share",
    root_cause="one decoder for all 512 dims of a token",
    cases=(reproducer(SPARSE, topk_lens=(6, 3), seed=5, why="FP8 cache"),
           reproducer(TWO_SCOPES,
                      topk_lens=(6, 2), extra_topk_lens=(4, 4), seed=6, why="FP8 main cache, FP4 second cache")),
)

MUTANTS = proving(TRAP.id)
