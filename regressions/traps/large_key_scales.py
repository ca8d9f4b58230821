"""large-key-scales: keys dequantized with large ue8m0 tile scales give logits ~1e9 apart,
and a kernel whose softmax leaves float32's range returns NaN where the answer is finite."""

from fmha.regressions.paged_cases import SPARSE
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="large-key-scales", seed_logs=(),
    source=("DeepSeek's FlashMLA (SM90 sparse decode, 9241ae3) on an H200: NaN outputs from key scales of 2^32, "
            "found by the v2 draws' cache_exponent (fmha.adapters.flashmla's docs)"),
    symptom="NaN rows where the float64 oracle is finite, once a cache's tile scales reach 2^20 to 2^32",
    root_cause="exponentials or their sum outside float32's range (e.g. exp of a logit without the row max "
               "subtracted first)",
    cases=(reproducer(SPARSE, cache_exponent=32, seed=1, why="every key scaled by 2^32: logits about 1e9 apart"),),
)

MUTANTS = proving(TRAP.id)
