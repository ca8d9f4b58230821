"""The CUDA kernels' build cache (fmha.kernels.build), with a stand-in builder in place of nvcc:
keyed by everything that decides a build's bytes, built once by concurrent processes under its
lock, reused by a later process, rebuilt when a source or the toolchain changes, redone after a
build killed halfway; then the real command, kernel-only, where nvcc is installed; and
fmha.attention's order: the CUDA kernel first where it is built, skipped where it is not."""

import json
import subprocess
import sys
import textwrap

import pytest

from fmha import dispatch
from fmha.kernels import build, cuda_sparse

TOOLCHAIN = "nvcc 12.8; torch 2.11 (CUDA 12.8); Python 3.11"
KERNEL = build.Build("fmha_stand_in", "__global__ void k() {}", (("wgmma.cuh", "// header"),), ("-O3",))

# A process that asks the cache for KERNEL; its stand-in builder logs each build it runs.
ASKER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from fmha.kernels import build

    def stand_in(b, directory):
        with open(sys.argv[2], "a") as log:
            log.write(f"{os.getpid()}\\n")
        time.sleep(float(sys.argv[3]))  # long enough that the others arrive while it builds
        (directory / "kernel.so").write_text(b.source)

    kernel = build.Build("fmha_stand_in", "__global__ void k() {}", (("wgmma.cuh", "// header"),), ("-O3",))
    print(build.get(kernel, stand_in, sys.argv[4], Path(sys.argv[1])))
''')


def _ask(root, log, toolchain=TOOLCHAIN, seconds=0.0, processes=1) -> list[str]:
    """The directories `processes` concurrent processes got for KERNEL."""
    script = root.parent / "asker.py"
    script.write_text(ASKER)
    started = [subprocess.Popen([sys.executable, str(script), str(root), str(log), str(seconds), toolchain],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    outputs = [p.communicate(timeout=120) for p in started]
    assert all(p.returncode == 0 for p in started), [err for _, err in outputs]
    return [out.strip() for out, _ in outputs]


def _builds(log) -> int:
    return len(log.read_text().split()) if log.exists() else 0


def test_the_key_holds_every_source_flag_and_the_toolchain():
    key = KERNEL.key(TOOLCHAIN)
    changed = [build.Build("fmha_stand_in", KERNEL.source + " ", KERNEL.headers, KERNEL.flags),
               build.Build("fmha_stand_in", KERNEL.source, (("wgmma.cuh", "// header, edited"),), KERNEL.flags),
               build.Build("fmha_stand_in", KERNEL.source, KERNEL.headers, ("-O2",)),
               build.Build("fmha_other", KERNEL.source, KERNEL.headers, KERNEL.flags),
               build.kernel_only(KERNEL)]
    assert all(c.key(TOOLCHAIN) != key for c in changed)
    assert KERNEL.key(TOOLCHAIN.replace("torch 2.11", "torch 2.12")) != key
    assert build.Build("fmha_stand_in", KERNEL.source, KERNEL.headers, KERNEL.flags).key(TOOLCHAIN) == key


def test_concurrent_processes_build_once_and_a_later_process_reuses_it(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    got = _ask(root, log, seconds=1.0, processes=4)
    assert _builds(log) == 1 and len(set(got)) == 1, f"{_builds(log)} builds for 4 processes: {got}"
    entry = build.entry(KERNEL, TOOLCHAIN, root)
    assert got[0] == str(entry) and json.loads((entry / build.DONE).read_text())["toolchain"] == TOOLCHAIN
    assert build.is_built(KERNEL, TOOLCHAIN, root)
    assert _ask(root, log) == got[:1] and _builds(log) == 1  # a later process: no build


def test_a_changed_source_or_toolchain_builds_anew_beside_the_old(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    first = _ask(root, log)
    other = _ask(root, log, toolchain=TOOLCHAIN.replace("nvcc 12.8", "nvcc 12.9"))
    assert _builds(log) == 2 and other != first
    edited = build.Build(KERNEL.name, KERNEL.source + "// edited", KERNEL.headers, KERNEL.flags)
    built = []
    build.get(edited, lambda b, d: built.append(b), TOOLCHAIN, root)
    assert built == [edited] and build.is_built(KERNEL, TOOLCHAIN, root)


def test_a_build_killed_halfway_is_done_again(tmp_path):
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    entry = build.entry(KERNEL, TOOLCHAIN, root)
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_text("half written")  # no built.json: the build never finished
    assert not build.is_built(KERNEL, TOOLCHAIN, root)
    _ask(root, log)
    assert _builds(log) == 1 and (entry / "kernel.so").read_text() == KERNEL.source


def test_a_failed_build_is_its_line_and_the_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    good = build.Build("fmha_good", "ok")

    def builder(b, directory):
        if b is KERNEL:
            raise RuntimeError("nvcc: error: something")
        (directory / "kernel.so").write_text(b.source)

    lines = []
    assert build.build_all([KERNEL, good], builder, TOOLCHAIN, jobs=1, report=lines.append) == 1
    assert "FAILED: RuntimeError: nvcc: error: something" in lines[0] and "built in" in lines[1]
    assert build.build_all([good], builder, TOOLCHAIN, jobs=1, report=lines.append) == 0 and "up to date" in lines[2]


def test_without_nvcc_the_command_says_why_and_succeeds(monkeypatch, capsys):
    monkeypatch.setattr(build, "toolchain", lambda: None)
    assert build.main([]) == 0
    assert "no nvcc" in capsys.readouterr().err


def test_the_mutants_builds_come_from_the_entry_point():
    names = [b.name for b in build.builds(mutants=True)]
    assert names[0] == "fmha_cuda_sparse" and len(names) == 5 and all("mutant_cuda_sparse" in n for n in names[1:])


@pytest.mark.skipif(build.nvcc() is None, reason="no nvcc here (pip install nvidia-cuda-nvcc puts one on PATH)")
def test_the_kernel_alone_compiles_through_the_build_command(tmp_path):
    command = [sys.executable, "-m", "fmha.kernels.build", "--kernel-only", "--cache", str(tmp_path)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "fmha_cuda_sparse_kernel_only: built in" in first.stdout, first.stdout + first.stderr
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (entry / "kernel.o").stat().st_size and "Used" in (entry / "ptxas.txt").read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert "fmha_cuda_sparse_kernel_only: up to date" in again.stdout, again.stdout + again.stderr


def test_fmha_attention_runs_the_cuda_kernel_first_where_it_is_built(monkeypatch):
    assert dispatch.IMPLEMENTATIONS[0] is cuda_sparse.BUILT and dispatch.implementations("cuda") == (cuda_sparse.ENTRY,)
    monkeypatch.setattr(cuda_sparse, "availability", lambda device: None)  # as on a Hopper GPU with nvcc
    monkeypatch.setattr(cuda_sparse, "built", lambda: False)
    assert "python -m fmha.kernels.build" in cuda_sparse.BUILT.availability("cuda")
    monkeypatch.setattr(cuda_sparse, "built", lambda: True)
    assert cuda_sparse.BUILT.availability("cuda") is None
