"""How a GPU job fits the card it runs on: how many xdist workers share one GPU, how much of its
memory each worker's allocator may hold, and how large the draws may be, all from the free memory
`torch.cuda.mem_get_info()` reports when the session starts (an 80 GB H100, a 139 GB H200, a
24 GB card alike).

The draw budgets (fmha.properties.strategies) were sized where they were measured: a worker's
share of an H200 with sixteen workers (0.7 of 139.8 GiB over 16, 6.1 GiB), at which a budget of
2^27 elements still passed and 2^26 was taken. A smaller share scales them down in proportion
(never up: larger draws were never measured). At the H200's budgets on an 80 GB H100 (3.5 GiB a
worker) the SDPA backends' laws ran out of memory with tens of GB free on the card.
"""

from __future__ import annotations

import dataclasses

GIB = 2**30
# What the workers' allocators hold together, of the memory free at the start; the rest is
# their CUDA contexts, compiled modules and the driver's stacks.
ALLOCATORS_FRACTION = 0.7
# A worker's memory outside its allocator (context, modules, stacks): 16 workers at 7.97 GB
# allocated showed 143 GB in use on an H200. The contexts must fit beside the allocators.
CONTEXT_BYTES = 1 * GIB
CONTEXTS_FRACTION = 0.25
# The least share a worker is given: fewer workers rather than less. The suite's fixed-size cases
# (the named cases, the pinned samples) ran in 3.4 GiB (an 80 GB H100's sixteen workers); below
# 2 GiB nothing has run.
MIN_SHARE_BYTES = 2 * GIB
# The share the draw budgets were measured at (above).
CALIBRATED_SHARE_BYTES = int(0.7 * 139.8 * GIB / 16)


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    workers_per_gpu: int
    share_bytes: int  # what one worker's allocator may hold
    total_bytes: int  # the card's memory, which torch's per-process fraction is of

    @property
    def fraction(self) -> float:
        """For torch.cuda.set_per_process_memory_fraction."""
        return self.share_bytes / self.total_bytes

    @property
    def budget_scale(self) -> float:
        """The draws' budgets relative to those measured (at most 1)."""
        return min(1.0, self.share_bytes / CALIBRATED_SHARE_BYTES)

    def describe(self) -> str:
        return (f"{self.workers_per_gpu} worker(s) a GPU, {self.share_bytes / GIB:.1f} GiB each of "
                f"{self.total_bytes / GIB:.1f} GiB, draw budgets x{self.budget_scale:.2f}")


def most_workers(free_bytes: int, cores_per_gpu: int) -> int:
    """The workers one GPU with `free_bytes` free can hold: at most one a core, each with at least
    MIN_SHARE_BYTES of allocator and its context beside it; at least one."""
    by_share = int(ALLOCATORS_FRACTION * free_bytes // MIN_SHARE_BYTES)
    by_contexts = int(CONTEXTS_FRACTION * free_bytes // CONTEXT_BYTES)
    return max(1, min(cores_per_gpu, by_share, by_contexts))


def plan(free_bytes: int, total_bytes: int, workers_per_gpu: int) -> GpuPlan:
    """The share of each of `workers_per_gpu` workers on a GPU with `free_bytes` free."""
    share = int(ALLOCATORS_FRACTION * free_bytes / max(1, workers_per_gpu))
    return GpuPlan(workers_per_gpu, share, total_bytes)
