"""What only a GPU runner executes, executed on the CPU: each kernel's availability, fmha.attention's
dispatch and the CUDA kernel's build-cache lookups on a faked Hopper device (capability 9.0, nvcc
present or absent, the build cached or not), and the GPU job's sizing on faked 24, 80 and 139 GB
cards. A name only those branches use (cuda_sparse's availability once called `nvcc()`, which it
never imported) fails here, not at every worker's collection on the GPU."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
import torch
from torch.utils import cpp_extension

from fmha import dispatch, registry
from fmha.ci import gpu_runner, gpu_sizing
from fmha.contract import Problem
from fmha.kernels import build as builds
from fmha.kernels import cuda_sparse, gluon_dense
from fmha.properties import strategies

GIB = 2**30
DSV4_SPARSE = Problem(batch=1, q_len=1, kv_len=64, heads_q=64, heads_kv=1, head_dim=512, shared_kv=True,
                      source="sparse", block_size=64, cache_layout="dsv4-fp8")
CUDA = torch.device("cuda")


def _clear_caches():
    for cached in (cuda_sparse._device_availability, cuda_sparse._own_entry, builds.toolchain,
                   gluon_dense.availability):
        cached.cache_clear()


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """`fake_gpu(capability=(9, 0), nvcc=True, built=False)`: this process sees one such CUDA
    device; nvcc, where present, is a script that prints nvcc 13.0's version; the build cache is
    empty, or holds cuda-sparse's finished entry."""
    assert not cuda_sparse._BUILD_FAILURE, "an earlier test left cuda-sparse's build failed in this process"

    def make(capability=(9, 0), nvcc=True, built=False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        home = tmp_path / "cuda"
        (home / "bin").mkdir(parents=True, exist_ok=True)
        if nvcc:
            script = home / "bin" / "nvcc"
            script.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"
                              "echo 'Build cuda_13.0.r13.0/compiler.36424714_0'\n")
            script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home) if nvcc else None)
        monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
        monkeypatch.setenv(builds.CACHE_ENV, str(tmp_path / "kernel-cache"))
        _clear_caches()
        if built:
            entry = builds.entry(cuda_sparse.kernel_build(), builds.toolchain())
            entry.mkdir(parents=True)
            (entry / builds.DONE).write_text("{}")

    yield make
    monkeypatch.undo()
    _clear_caches()


def test_on_hopper_with_nvcc_the_cuda_kernel_can_run(fake_gpu):
    fake_gpu()
    assert builds.nvcc() is not None and "13.0" in builds.toolchain()
    assert cuda_sparse.availability(CUDA) is None
    assert gluon_dense.availability(CUDA) is None


def test_without_nvcc_the_cuda_kernel_says_so(fake_gpu):
    fake_gpu(nvcc=False)
    assert builds.nvcc() is None and builds.toolchain() is None
    assert "no nvcc" in cuda_sparse.availability(CUDA)
    assert "no nvcc" in cuda_sparse.BUILT.availability(CUDA)
    assert not cuda_sparse.built()


def test_off_hopper_the_hopper_kernels_say_which_gpu_they_need(fake_gpu):
    fake_gpu(capability=(8, 0))
    assert "sm_80" in cuda_sparse.availability(CUDA)
    assert "sm_80" in gluon_dense.availability(CUDA)


@pytest.mark.parametrize("built", [True, False], ids=["built", "not-built"])
def test_dispatch_runs_the_cuda_kernel_first_where_it_is_built(fake_gpu, built):
    fake_gpu(built=built)
    assert cuda_sparse.built() is built
    reasons = dispatch.not_supported_reasons(DSV4_SPARSE, CUDA)
    if built:
        assert reasons["cuda-sparse"] == [] and dispatch.choose(DSV4_SPARSE, CUDA).name == "cuda-sparse"
    else:
        assert "not built on this machine" in " ".join(reasons["cuda-sparse"])
        assert dispatch.choose(DSV4_SPARSE, CUDA).name == "gluon-sparse"
    # Named, the CUDA kernel is asked whether it could run at all, not whether it is built yet.
    assert [e.name for e in dispatch.implementations("cuda")] == ["cuda-sparse"]
    assert dispatch.choose(DSV4_SPARSE, CUDA, dispatch.implementations("cuda")).name == "cuda-sparse"


@pytest.mark.parametrize("nvcc", [True, False], ids=["nvcc", "no-nvcc"])
def test_every_registered_kernel_answers_whether_it_runs_on_a_hopper_gpu(fake_gpu, nvcc):
    fake_gpu(nvcc=nvcc)
    for entry in registry.KERNELS.values():
        answer = entry.availability(CUDA)
        assert answer is None or isinstance(answer, str), f"{entry.name}: availability gave {answer!r}"
        entry.not_supported_reasons(DSV4_SPARSE, CUDA)
    for entry in registry.MERGES.values():
        entry.not_supported_reasons("cuda")


# -- the GPU job's sizing (fmha.ci.gpu_sizing, fmha.ci.gpu_runner) ----------------------------------

CARDS = {"24GB": 22.5 * GIB, "80GB": 79.2 * GIB, "139GB": 139.8 * GIB}


@pytest.mark.parametrize("card", CARDS, ids=list(CARDS))
def test_the_gpu_job_is_sized_to_the_card(card, monkeypatch):
    total = int(CARDS[card])
    free = total - 600 * 2**20
    workers = gpu_sizing.most_workers(free, cores_per_gpu=16)
    plan = gpu_sizing.plan(free, total, workers)
    # Every worker's context beside the allocators' shares fits the card, with room to spare.
    assert workers * (plan.share_bytes + gpu_sizing.CONTEXT_BYTES) < 0.96 * free, plan.describe()
    assert plan.share_bytes >= gpu_sizing.MIN_SHARE_BYTES, plan.describe()
    expected_workers = {"24GB": 5, "80GB": 16, "139GB": 16}[card]
    assert workers == expected_workers, plan.describe()
    # The draw budgets scale with the share, never above those measured on the H200 (a GPU
    # session has fitted them to its own card: the test's are put back after it, the same objects).
    for budget, _ in strategies.MEASURED_ON_CUDA:
        monkeypatch.setitem(budget, "cuda", budget["cuda"])
    strategies.fit_cuda_budgets(plan.budget_scale)
    for budget, measured in strategies.MEASURED_ON_CUDA:
        assert budget["cuda"] <= measured * min(1.0, plan.share_bytes / gpu_sizing.CALIBRATED_SHARE_BYTES)
        assert budget["cuda"] >= (0.98 if card == "139GB" else 0.4) * measured, plan.describe()


@pytest.mark.parametrize("card", CARDS, ids=list(CARDS))
def test_n_auto_starts_no_more_workers_than_the_gpu_holds(card, monkeypatch):
    total = int(CARDS[card])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - 2**29, total))
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(gpu_runner, "_cores", lambda config: 16)
    config = SimpleNamespace(getoption=lambda name: "cuda", option=SimpleNamespace(numprocesses="auto"))
    assert gpu_runner.pytest_xdist_auto_num_workers(config) == {"24GB": 5, "80GB": 16, "139GB": 16}[card]
    cpu = SimpleNamespace(getoption=lambda name: "cpu", option=SimpleNamespace(numprocesses="auto"))
    assert gpu_runner.pytest_xdist_auto_num_workers(cpu) is None  # xdist's own count


def test_the_users_worker_count_is_xdists(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    config = SimpleNamespace(getoption=lambda name: "cuda", option=SimpleNamespace(numprocesses="auto"))
    assert gpu_runner.pytest_xdist_auto_num_workers(config) is None
    assert os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"] == "3"
