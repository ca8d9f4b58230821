"""GPU runners: one GPU per xdist worker, and a CUDA error that poisons the context costs
the test that caused it, not every test after it. Each test gives its cached memory back.

- Pinning: under `pytest -n auto` worker gwN runs on GPU N mod (number of GPUs); the GPU
  index is recorded on every test report (a JUnit XML property). The workers on one GPU
  share 70% of its memory evenly (`torch.cuda.set_per_process_memory_fraction`).
- Poisoned context: after a failed test on CUDA the plugin synchronizes and runs a tiny op.
  If that raises (an illegal memory access leaves the context unusable for the rest of the
  process), the failure gets a section saying so, and the worker exits once the test's
  reports are sent: xdist reports the test as having crashed its worker and starts a fresh
  one, so later tests run in a clean context. Without xdist the session stops with the
  reason instead of failing every later test for a fault that is not theirs.
- Compiles: the terminal summary says how many Triton kernels the session compiled and the
  seconds it spent (fmha.ci.compile_stats).
- Hangs: a kernel that never returns blocks inside a CUDA call where no signal reaches
  Python; run GPU jobs with `--timeout N --timeout-method thread`, which ends the worker
  process and lets xdist replace it the same way.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback

import pytest
import torch

from fmha.ci.compile_stats import CompileStats
from fmha.properties.run_settings import DEVICE

POISONED_SECTION = "fmha: CUDA context"
WORKER_EXIT_CODE = 3
GPU = pytest.StashKey[int | None]()  # the GPU this process's tests run on (None: not pinned)
# What the workers on one GPU may hold together in PyTorch's allocator, split evenly; the rest
# is their CUDA contexts and compiled modules (about 1 GB a worker: at 16 x 7.97 GB allocated
# an H200 showed 143 GB in use). Without a cap each worker's cache grew to its
# largest draw: under the nightly profile 16 workers held 8.5 GB each, the GPU ran out and 51
# tests failed. At the cap the allocator gives its cache back and retries before it raises.
GPU_MEMORY_SHARE = 0.7
POISONED = pytest.StashKey[str]()  # on a test item: the error its failure left the context with


def cuda_context_error() -> str | None:
    """None when the current CUDA context still works, else the error it raises."""
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # at its memory cap a live worker's probe would run out
        torch.ones(1, device="cuda").add_(1).cpu()
    except Exception as e:  # noqa: BLE001 -- any error here means the context is unusable
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return None


@pytest.hookimpl(trylast=True)  # after fmha.ci.plugin has chosen the device
def pytest_configure(config):
    config.stash[GPU] = None
    config.pluginmanager.register(CrashReasons(), "fmha-crash-reasons")
    if config.stash[DEVICE] == "cuda":
        stats = CompileStats()
        stats.install()
        config.pluginmanager.register(stats, "fmha-compile-stats")
    workerinput = getattr(config, "workerinput", None)
    if config.stash[DEVICE] == "cuda" and workerinput is not None:
        config.stash[GPU] = int(workerinput["workerid"].removeprefix("gw")) % torch.cuda.device_count()
        torch.cuda.set_device(config.stash[GPU])
        sharing = -(-int(workerinput["workercount"]) // torch.cuda.device_count())
        torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE / sharing)


def pytest_runtest_setup(item):
    if item.config.stash[GPU] is not None:
        item.user_properties.append(("gpu", item.config.stash[GPU]))


def pytest_runtest_teardown(item):
    """Give the memory a test cached back: many workers share one GPU, and each would keep
    its own peak otherwise (16 workers on an H200 ran out at 7 GB each)."""
    if item.config.stash[DEVICE] == "cuda" and torch.cuda.is_initialized() and POISONED not in item.stash:
        torch.cuda.empty_cache()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed or item.config.stash[DEVICE] != "cuda":
        return
    # The failure's traceback holds its tensors (an out-of-memory error would otherwise look
    # like a dead context to the probe): the report is written, let them go first.
    if call.excinfo is not None:
        traceback.clear_frames(call.excinfo.tb)
    gc.collect()
    error = cuda_context_error()
    if error:
        in_worker = hasattr(item.config, "workerinput")
        then = ("this xdist worker exits after reporting it and a fresh worker runs the remaining tests"
                if in_worker else "the session stops: later tests cannot run in this process (use pytest -n)")
        report.sections.append((POISONED_SECTION, f"this test left the CUDA context unusable ({error}); {then}"))
        item.stash[POISONED] = error


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield  # every report of the item has been sent by now
    error = item.stash.get(POISONED, None)
    if not error:
        return
    if hasattr(item.config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(WORKER_EXIT_CODE)
    item.session.shouldstop = f"CUDA context poisoned by {item.nodeid}: {error}"


class CrashReasons:
    """On the xdist controller: say why a worker went down after a test poisoned its context."""

    def __init__(self):
        self.poisoned_by: set[str] = set()

    def pytest_runtest_logreport(self, report):
        if any(title == POISONED_SECTION for title, _ in report.sections):
            self.poisoned_by.add(report.nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        if crashitem in self.poisoned_by:
            report.longrepr = (f"{report.longrepr}: the worker exited on purpose after this test poisoned the "
                               "CUDA context (its failure is reported above); a fresh worker took over")
