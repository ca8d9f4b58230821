"""GPU runners: one GPU per xdist worker, and a CUDA error that poisons the context costs
the test that caused it, not every test after it. Each test gives its cached memory back.

- Pinning: under `pytest -n auto` worker gwN runs on GPU N mod (number of GPUs); the GPU
  index is recorded on every test report (a JUnit XML property).
- Sizing (fmha.ci.gpu_sizing): from the memory free when the session starts, `-n auto` starts
  no more workers than the GPUs hold (one a core at most), the workers on one GPU share 70% of
  it evenly (`torch.cuda.set_per_process_memory_fraction`), and a share smaller than the one the
  draw budgets were measured at scales them down. The header says the plan.
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

from fmha.ci import gpu_sizing
from fmha.ci.compile_stats import CompileStats
from fmha.properties.run_settings import DEVICE
from fmha.regressions import selection

POISONED_SECTION = "fmha: CUDA context"
WORKER_EXIT_CODE = 3
GPU = pytest.StashKey[int | None]()  # the GPU this process's tests run on (None: not pinned)
# Without a cap on each worker's allocator its cache grew to its largest draw: under the nightly
# profile 16 workers held 8.5 GB each, the GPU ran out and 51 tests failed. At the cap the
# allocator gives its cache back and retries before it raises.
PLAN = pytest.StashKey[gpu_sizing.GpuPlan]()
SHARE_INPUT = "fmha_gpu_share_bytes"  # the controller's plan, as each worker gets it
_BUDGETS_FITTED: list = []  # the plan this process's draw budgets were fitted to
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
    if config.stash[DEVICE] != "cuda":
        return
    stats = CompileStats()
    stats.install()
    config.pluginmanager.register(stats, "fmha-compile-stats")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:  # the controller, or a session without xdist
        config.stash[PLAN] = _plan(_workers(config))
    else:
        config.stash[GPU] = int(workerinput["workerid"].removeprefix("gw")) % torch.cuda.device_count()
        torch.cuda.set_device(config.stash[GPU])
        sharing = -(-int(workerinput["workercount"]) // torch.cuda.device_count())
        total = torch.cuda.get_device_properties(config.stash[GPU]).total_memory
        config.stash[PLAN] = gpu_sizing.GpuPlan(sharing, int(workerinput[SHARE_INPUT]), total)
        torch.cuda.set_per_process_memory_fraction(min(1.0, config.stash[PLAN].fraction))
    if not _BUDGETS_FITTED:  # once a process: a session run inside a test's (pytester) keeps its draws
        from fmha.properties import strategies  # hypothesis's: a session that draws has it

        strategies.fit_cuda_budgets(config.stash[PLAN].budget_scale)
        _BUDGETS_FITTED.append(config.stash[PLAN])


def _free_memory() -> tuple[int, int]:
    """(free, total) bytes of the GPU with the least free memory."""
    return min(torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count()))


def _workers(config) -> int:
    """xdist workers this session starts (0 without xdist)."""
    return int(getattr(config.option, "numprocesses", 0) or 0)


def _plan(workers: int) -> gpu_sizing.GpuPlan:
    free, total = _free_memory()
    return gpu_sizing.plan(free, total, -(-max(1, workers) // torch.cuda.device_count()))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` on a CUDA session: xdist's count (a core a worker), fewer where the GPUs'
    free memory holds fewer workers (fmha.ci.gpu_sizing)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # the user's count, as xdist reads it
    try:
        if selection.device(config.getoption("--fmha-device")) != "cuda":
            return None
    except ValueError:
        return None  # a usage error, raised with its message at configure
    cores = _cores(config)
    free, _ = _free_memory()
    gpus = torch.cuda.device_count()
    return min(cores, gpu_sizing.most_workers(free, -(-cores // gpus)) * gpus)


def _cores(config) -> int:
    """What xdist's own `-n auto` counts: physical cores (logical with `-n logical`) where psutil
    is installed, else the cores this process may run on."""
    try:
        import psutil

        count = psutil.cpu_count(logical=config.option.numprocesses == "logical")
    except ImportError:
        count = None
    return count or len(os.sched_getaffinity(0))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    plan = node.config.stash.get(PLAN, None)
    if plan is not None:
        node.workerinput[SHARE_INPUT] = plan.share_bytes


def pytest_report_header(config):
    plan = config.stash.get(PLAN, None)
    if plan is not None:
        return f"fmha: GPU memory plan: {plan.describe()} (fmha.ci.gpu_sizing)"


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
    # at teardown too: an error a kernel left behind asynchronously surfaces when the memory is given back
    if call.when not in ("call", "teardown") or not report.failed or item.config.stash[DEVICE] != "cuda":
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
