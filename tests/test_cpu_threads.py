"""A process of the suite takes its share of the cores (fmha.oracles.threads): on a machine whose
cores another run keeps busy, torch's default of a thread per core made a single-kernel run 11
times slower (BENCHMARKS.md)."""

import os

import pytest
import torch

from fmha.oracles import threads


@pytest.fixture
def kept_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv(threads.OVERRIDE, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # restored after
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    yield monkeypatch
    torch.set_num_threads(before)


@pytest.mark.parametrize("workers, load, expected", [(None, 0.0, 8), (None, 6.5, 1), (None, 20.0, 1), (None, 3.0, 5),
                                                     (4, 20.0, 2), (16, 0.0, 1)])
def test_a_process_takes_its_share_of_the_cores_the_load_leaves(kept_threads, workers, load, expected):
    """Alone: the cores the load average leaves idle; one of xdist's workers: the cores over the
    workers (they are the load); at least one thread; its subprocesses as many."""
    kept_threads.setattr(os, "getloadavg", lambda: (load, load, load))
    assert threads.share_cores(workers) == expected
    assert torch.get_num_threads() == expected and os.environ["OMP_NUM_THREADS"] == str(expected)


def test_fmha_cpu_threads_overrides_the_share(kept_threads):
    kept_threads.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    kept_threads.setenv(threads.OVERRIDE, "3")
    assert threads.share_cores() == 3 and torch.get_num_threads() == 3
