"""Mutants only the GPU scale tier reaches (fmha.properties.scale): fmha's paged and index-sparse
Triton kernel (fmha.kernels.triton_paged) with one bug past a size no CPU run affords, as
kernels that serve long contexts and large caches have shipped them. The CPU tier passes each
(its calls stay below the size); `pytest properties/test_scale.py --fmha-scale` on a GPU catches
each (BENCHMARKS.md has both runs). Run one like any kernel:

    pytest properties/test_scale.py --fmha-scale --fmha-device cuda --fmha-kernel mutant:split-count-saturates
"""

from __future__ import annotations

from fmha.regressions.mutation import Mutant, patched_paged_kernel

# A cache's page offset in elements, computed in 32 bits: with the call's pages past 2^31 elements
# into the cache the offset wraps and the load reads before the cache (an illegal address).
_INT64_OFFSETS = ((" + page[:, None].to(tl.int64) * stride_kb + offset", " + page[:, None] * stride_kb + offset"),
                  ("page_base = K + page[:, None].to(tl.int64) * stride_kb", "page_base = K + page[:, None] * stride_kb"))
# The splits of a paged call capped at 64 (a fixed-size partials buffer): on a GPU, past 64 x 1024
# keys the rest are never read.
_SPLITS_CAPPED = (("return per_split, max(1, triton.cdiv(capacity, per_split))",
                   "return per_split, min(64, max(1, triton.cdiv(capacity, per_split)))"),)
# The reduction of the partials in groups of 48, the last partial group left out: past 48 splits
# (48 x 1024 keys on a GPU) a tail of keys is lost.
_TAIL_DROPPED = (("batched[1](target), batched[1](target_lse), sink)",
                  "batched[1](target[:max(48, n_splits // 48 * 48)]), "
                  "batched[1](target_lse[:max(48, n_splits // 48 * 48)]), sink)"),)
# A page id held in 20 bits (a slot packed as page << 12 | offset in 32 bits): page 2^20 reads page 0.
_PAGE_20_BITS = (("page = slot // block_size\n", "page = (slot // block_size) & 0xFFFFF\n"),
                 ("page = tl.load(BT + b * stride_btb + j // block_size, mask=key_ok, other=0)\n",
                  "page = tl.load(BT + b * stride_btb + j // block_size, mask=key_ok, other=0) & 0xFFFFF\n"))


def _scale(name: str, bug: str, patches) -> Mutant:
    return Mutant(name, "", bug, lambda: patched_paged_kernel(name, *patches), tier="scale")


SCALE_MUTANTS = (
    _scale("element-offsets-in-32-bits", "a cache's element offsets computed in 32 bits: a page past 2^31 elements "
           "into the cache wraps and reads before it", _INT64_OFFSETS),
    _scale("split-count-saturates", "a paged call's splits capped at 64: on a GPU, keys past 64 x 1024 never read",
           _SPLITS_CAPPED),
    _scale("split-tail-dropped", "the partials reduced in groups of 48, the last group left out: on a GPU, past 48 x "
           "1024 keys a tail of them lost", _TAIL_DROPPED),
    _scale("page-ids-in-20-bits", "a page id held in 20 bits: page 2^20 and past read page id mod 2^20",
           _PAGE_20_BITS),
)
