"""fp8-scale-wrong-tile: each 64-dim FP8 tile multiplied by the next tile's power-of-two scale.
Tiles drawn with equal magnitudes share a scale and hide it; the sample layout gives tiles
magnitudes 2^(i % 5 - 2)."""

from fmha.regressions.paged_cases import SHIPPED, SPARSE
from fmha.regressions.paged_mutants import proving
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="fp8-scale-wrong-tile", seed_logs=(),
    source=SHIPPED,
    symptom="keys decoded with the wrong power of two per 64 dims: scores off by factors of 2",
    root_cause="the scale index is the tile index plus one",
    cases=(reproducer(SPARSE, topk_lens=(6, 3), seed=5, why="FP8 cache, 7 tiles of different magnitudes"),
           reproducer(SPARSE.replace(source="paged", q_len=1, kv_len=7, block_size=3, sink=False),
                      kv_lens=(7, 4), seed=2, why="a paged FP8 cache")),
)

MUTANTS = proving(TRAP.id)
