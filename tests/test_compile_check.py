"""fmha.kernels.compile_check: the kernels compiled for sm_90 on a machine without a GPU, and their
tiles checked against Hopper's shared memory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fmha.kernels import build, cuda_sparse

# Compiles for sm_90 with no GPU: the CPU tier's evidence that the GPU-only code builds. A GPU
# runner compiles every kernel it runs anyway (the nightly runs these there too).
pytestmark = pytest.mark.cpu_tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def _over_the_limit(setup: str) -> tuple[list[str], str]:
    """compile_check for hd512 bf16 after `setup` (code that enlarges a tile): it must exit 1;
    the lines it reports over the limit, and its output."""
    run = _run(f"import sys; from fmha.kernels.compile_check import main\n{setup}\nsys.exit(main(['512', '--dtype', 'bf16']))")
    assert run.returncode == 1, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "OVER THE LIMIT" in line], run.stdout


@pytest.mark.timeout(600)
@pytest.mark.starts_first  # a child process compiling for sm_90: 6-22 s on an H200
def test_the_dsv4_tiles_and_the_v2_kernel_compile_for_hopper_and_fit_shared_memory():
    run = _run("import sys; from fmha.kernels.compile_check import main; sys.exit(main(['512', '--dtype', 'bf16', '--sources']))")
    assert run.returncode == 0, run.stdout + run.stderr
    # K and V apart, and K is V, each by the Triton kernel and by the Gluon one; contract v2's
    # Triton kernel on DSV4 sparse decode and a ragged paged prefill, its Gluon one on the first.
    assert run.stdout.count("shared") == 7 and run.stdout.count("Gluon") == 3, run.stdout
    triton_and_gluon = [line for line in run.stdout.splitlines() if line.startswith("v2 ") and ", CUDA" not in line]
    assert len(triton_and_gluon) == 3 and "v2 DSV4 sparse decode, FP8 + FP4 scopes, Gluon" in run.stdout, run.stdout
    # and the CUDA kernel's two instances, where nvcc is installed
    cuda = [line for line in run.stdout.splitlines() if line.startswith("v2 DSV4 sparse decode, CUDA")]
    assert len(cuda) == (2 if build.nvcc() else 1) and "SPILLS" not in run.stdout, run.stdout


def _check_patched_cuda_kernel(tmp_path, old: str, new: str) -> subprocess.CompletedProcess:
    """compile_check's CUDA lines for the kernel's source with `old` replaced by `new`."""
    if build.nvcc() is None:
        pytest.skip("no nvcc: the CUDA kernel is compiled only where nvcc is installed")
    source = Path(cuda_sparse.SOURCE).read_text()
    assert source.count(old) == 1, f"the kernel no longer has {old!r}"
    patched = tmp_path / "sparse_decode.cu"
    patched.write_text(source.replace(old, new))
    return _run(f"import sys; from fmha.kernels.compile_check import _check_cuda_sparse\n"
                f"sys.exit(_check_cuda_sparse({str(patched)!r}))")


def test_a_cuda_kernel_that_spills_is_reported(tmp_path):
    # The producer's 128 threads held to 24 registers each: a key's bytes no longer fit.
    run = _check_patched_cuda_kernel(tmp_path, "REGS_PRODUCER = 144,", "REGS_PRODUCER = 24,")
    assert run.returncode == 2 and run.stdout.count("SPILLS") == 2, run.stdout + run.stderr


def test_a_cuda_kernel_over_the_shared_memory_limit_does_not_compile(tmp_path):
    run = _check_patched_cuda_kernel(tmp_path, "constexpr int STAGES = 2;", "constexpr int STAGES = 3;")
    assert run.returncode == 1 and "does not compile" in run.stdout and "227 KiB" in run.stdout, run.stdout + run.stderr


@pytest.mark.timeout(600)
@pytest.mark.starts_first  # a child process compiling for sm_90: 6-22 s on an H200
def test_a_tile_too_large_for_shared_memory_is_reported():
    # Without the host's shrinking, four stages of the K-is-V hd512 tile need ~290 KB.
    over, stdout = _over_the_limit("from fmha.kernels import triton_dense as ta\n"
                                   "ta.SHARED_MEMORY_BYTES = 10**9; ta.SHARED_KV_TILES[512] = (128, 32, 256, 8, 4)")
    assert len(over) == 1 and "K is V: tiles (128, 32, 256, 256, 8, 4)" in over[0], stdout


@pytest.mark.timeout(600)
@pytest.mark.starts_first  # a child process compiling for sm_90: 6-22 s on an H200
def test_a_gluon_ring_too_large_for_shared_memory_is_reported():
    # A third 64-key stage of K is V adds 64 KiB to the 225 KiB the Gluon kernel uses.
    over, stdout = _over_the_limit("from fmha.kernels import gluon_dense as ga\nga.STAGES_K_IS_V = (3, 3)")
    assert len(over) == 1 and over[0].startswith("D=512 bf16 K is V, Gluon"), stdout


@pytest.mark.timeout(600)
@pytest.mark.starts_first  # a child process compiling for sm_90: 6-22 s on an H200
def test_fp32_tiles_keep_their_dots_in_registers():
    # The driver reserves each thread's stack for every thread a GPU can hold, per process and
    # for good: hd256 fp32 spilled 19 KB a thread before FP32_TILES, 5 GB of local memory each
    # process held outside PyTorch's allocator (the nightly profile ran an H200 out of memory).
    run = _run("import sys; from fmha.kernels.compile_check import main; sys.exit(main(['256', '--dtype', 'fp32']))")
    assert run.returncode == 0, run.stdout + run.stderr
    stacks = [int(line.rsplit("stack ", 1)[1].split()[0]) for line in run.stdout.splitlines() if "stack" in line]
    assert len(stacks) == 2 and max(stacks) <= 256, run.stdout
