"""warp-collective-tmem (seed 001): tcgen05.ld/st are warp-collective; all 32 lanes must
execute them. The epilogue looped `for (col = lane; col < TMEM_O_COLS; col += 32)` with 16
columns, so lanes 16-31 skipped the collective: the kernel hung, or (the op guarded so that
it returns) half the output columns were never written.

Triton has no user-visible warp collectives, so the two mutants model the two outcomes: a
collective that waits for 32 lanes of which 16 arrive (a hang the framework must turn into a
failure in bounded time), and an epilogue store that leaves lanes 16-31's columns unwritten
(caught by the poisoned out=).
"""

import torch
import triton
import triton.language as tl

from fmha.contract import Problem
from fmha.dispatch import attention
from fmha.regressions.mutation import Mutant, patched_triton_kernel, wrapped_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="warp-collective-tmem", seed_logs=("001",),
    symptom="the kernel hangs, or half of each output row is never written",
    root_cause="a warp-collective TMEM load/store executed by 16 of 32 lanes (loop over 16 columns with a 32-lane stride)",
    cases=(reproducer(Problem(batch=1, q_len=4, kv_len=64, heads_q=2, heads_kv=2, head_dim=64),
                      why="one KV tile, every output column checked against poison"),
           reproducer(Problem(batch=1, q_len=1, kv_len=128, heads_q=8, heads_kv=1, head_dim=128, shared_kv=True),
                      why="decode, MQA with K = V")),
)


@triton.jit
def _collective_epilogue(arrivals, LANES_THAT_ARRIVE: tl.constexpr):
    """A warp-collective operation: it completes once all 32 lanes have executed it."""
    lane = tl.arange(0, 32)
    tl.atomic_add(arrivals + lane * 0, 1, mask=lane < LANES_THAT_ARRIVE)
    while tl.load(arrivals, volatile=True) < 32:
        pass


def _hanging(q, k, v, **kwargs):
    o, lse = attention(q, k, v, **kwargs)
    arrivals = torch.zeros(1, dtype=torch.int32, device=q.device)
    _collective_epilogue[(1,)](arrivals, LANES_THAT_ARRIVE=16)  # lanes 16-31 skipped it
    return o, lse


MUTANTS = (
    Mutant(
        "warp-collective-tmem-half-columns", TRAP.id,
        "the epilogue store writes only the columns of lanes 0-15 of each 32",
        lambda: patched_triton_kernel("warp-collective-tmem-half-columns", (
            'EVEN_DV=DV % tiles["BLOCK_DV"] == 0', "EVEN_DV=False"), (  # the masked store always
            "mask=row_ok[:, None] & (offs_dv < DV)[None, :])",
            "mask=row_ok[:, None] & (offs_dv < DV)[None, :] & ((offs_dv % 32) < 16)[None, :])",
        )),
    ),
    Mutant(
        "warp-collective-tmem-hang", TRAP.id,
        "a 32-lane collective in the epilogue that only 16 lanes execute: never completes",
        lambda: wrapped_kernel("warp-collective-tmem-hang", _hanging),
        isolate="hang",
    ),
)
