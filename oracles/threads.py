"""torch's CPU threads for a process of the suite: its share of the cores the machine leaves it.

torch starts one OpenMP thread per core. Where other processes keep the cores busy (xdist's other
workers, a CI runner's other jobs), a thread that waits for a core spins: a single-kernel pytest
run on a 2-core machine whose cores another run kept busy took 221 s with torch's two threads and
20 s with one (BENCHMARKS.md, "The suite's own speed"). FMHA_CPU_THREADS overrides the share.
"""

from __future__ import annotations

import os

import torch

OVERRIDE = "FMHA_CPU_THREADS"


def share_cores(workers: int | None = None) -> int:
    """Set torch's CPU threads, and its subprocesses' (OMP_NUM_THREADS), to this process's share of
    the cores, and return it: the cores divided among `workers` processes of one run (xdist's, which
    are the load themselves), or, for a process on its own, the cores the load average leaves idle;
    at least one."""
    cores = os.cpu_count() or 1
    if os.environ.get(OVERRIDE):
        threads = int(os.environ[OVERRIDE])
    elif workers:
        threads = cores // workers
    else:
        threads = int(cores - os.getloadavg()[0]) if hasattr(os, "getloadavg") else cores
    threads = max(1, min(cores, threads))
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads
