"""sink-per-scope: two scopes attended separately, each with the sink, then merged: the sink joins
the denominator twice."""

from fmha.regressions.paged_cases import SHIPPED, SPARSE, TWO_SCOPES
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="sink-per-scope", seed_logs=(),
    source=SHIPPED,
    symptom="with a sink and two caches, every weight is too small by the sink's second share",
    root_cause="the sink is added per scope instead of once to the one softmax over both",
    cases=(reproducer(TWO_SCOPES,
                      topk_lens=(6, 5), extra_topk_lens=(4, 2), seed=6, why="window scope FP8, compressed scope FP4"),
           reproducer(SPARSE.replace(extra_topk=3, extra_block_size=1, extra_cache_layout="dsv4-fp8"),
                      seed=8, why="both scopes FP8, block size 1")),
)

MUTANTS = proving(TRAP.id)
