"""fmha's CUDA C++ kernels built once per machine, into a cache every process reads.

    python -m fmha.kernels.build [--mutants] [--kernel-only] [--jobs N] [--cache DIR]

nvcc takes a minute a build. A runner image, or a CI step before the tests (with the cache
directory restored and saved), runs this once; every later process and every xdist worker loads
the built extension instead of running nvcc. A build is keyed by what decides its bytes: its sources
(the .cu and the headers beside it), nvcc's flags, the toolchain (nvcc's version), torch's and
its CUDA's versions and Python's; a change to any of them is a new entry, built on first use.
Processes that ask for the same entry at once wait on one lock, and one of them builds it.

The cache is `$FMHA_KERNEL_CACHE`, else ~/.cache/fmha/kernels. What to build, packages register
under the `fmha.cuda_builds` entry point: fmha's kernels ("kernels"), and for `--mutants` the
regression mutants of fmha.regressions.cuda_mutants ("mutants"), built in parallel. `--kernel-only` compiles each kernel alone
(-DFMHA_KERNEL_ONLY: no torch headers, no GPU; ptxas's register report kept beside it), what a
CPU runner with pip's nvidia-cuda-nvcc can check. Without nvcc it says why and exits 0: the
kernels' `availability` names the reason and fmha.attention runs the next kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

CACHE_ENV = "FMHA_KERNEL_CACHE"
ENTRY_POINTS = "fmha.cuda_builds"  # name -> a callable returning Builds
DONE = "built.json"  # written last: an entry without it is a build that did not finish


@dataclasses.dataclass(frozen=True)
class Build:
    """One extension: its module name, the .cu's text, the headers it includes from beside it
    ((file name, text), ...) and nvcc's flags."""

    name: str
    source: str
    headers: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()
    kernel_only: bool = False  # compiled alone (-DFMHA_KERNEL_ONLY) into an object file, not an extension
    # The .cu's file name in the build, which -lineinfo gives the binary: compute-sanitizer and
    # the profilers name a line as "<file>:<line>", so it is the source's own name in the repository.
    file_name: str = ""

    @property
    def source_file(self) -> str:
        return self.file_name or f"{self.name}.cu"

    def key(self, toolchain: str) -> str:
        parts = [self.name, self.source_file, self.source, *(f"{n}\0{t}" for n, t in self.headers), *self.flags,
                 str(self.kernel_only), toolchain]
        return hashlib.sha256("\0\0".join(parts).encode()).hexdigest()

    def write_sources(self, directory: Path) -> Path:
        """The sources in `directory`/src; the .cu's path."""
        src = directory / "src"
        src.mkdir(parents=True, exist_ok=True)
        for file_name, text in self.headers:
            (src / file_name).write_text(text)
        (src / self.source_file).write_text(self.source)
        return src / self.source_file


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fmha" / "kernels")


def nvcc() -> str | None:
    """The nvcc torch's extension loader would use, or None."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    candidate = os.path.join(home, "bin", "nvcc") if home else None
    return candidate if candidate and os.path.exists(candidate) else shutil.which("nvcc")


@functools.cache
def toolchain() -> str | None:
    """What else decides a build's bytes: nvcc's version, torch's, its CUDA's, Python's; None
    without nvcc."""
    import torch

    compiler = nvcc()
    if compiler is None:
        return None
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return (f"{version[-1] if version else compiler}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"Python {platform.python_version()} {platform.machine()}")


def entry(build: Build, toolchain_id: str, root: Path | None = None) -> Path:
    """The cache directory that holds (or will hold) `build` under `toolchain_id`."""
    return (root or cache_root()) / f"{build.name}-{build.key(toolchain_id)[:16]}"


def is_built(build: Build, toolchain_id: str | None = None, root: Path | None = None) -> bool:
    toolchain_id = toolchain_id or toolchain()
    return toolchain_id is not None and (entry(build, toolchain_id, root) / DONE).exists()


def get(build: Build, builder: Callable[[Build, Path], None], toolchain_id: str, root: Path | None = None) -> Path:
    """The cache directory of `build`, built by `builder(build, directory)` first unless some
    process has built it (concurrent callers wait on one lock; a build killed halfway is redone)."""
    directory = entry(build, toolchain_id, root)
    if (directory / DONE).exists():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / DONE).exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            started = time.monotonic()
            builder(build, directory)
            record = dict(name=build.name, toolchain=toolchain_id, seconds=round(time.monotonic() - started, 1))
            (directory / f"{DONE}.tmp").write_text(json.dumps(record))
            os.replace(directory / f"{DONE}.tmp", directory / DONE)
    return directory


def compile_extension(build: Build, directory: Path) -> None:
    """torch's extension loader, building into `directory`."""
    from torch.utils import cpp_extension

    source = build.write_sources(directory)
    sys.modules[build.name] = cpp_extension.load(  # imported too: `load` takes it from there
        name=build.name, sources=[str(source)], extra_include_paths=[str(source.parent)],
        build_directory=str(directory), extra_cuda_cflags=list(build.flags),
        verbose=bool(os.environ.get("FMHA_VERBOSE_BUILD")))


def compile_kernel_only(build: Build, directory: Path) -> None:
    """nvcc on the kernel alone (-DFMHA_KERNEL_ONLY), ptxas's report in ptxas.txt; a build error
    is a CalledProcessError with nvcc's output."""
    source = build.write_sources(directory)
    report = subprocess.run([nvcc(), "-c", *build.flags, "-Xptxas", "-v", "-DFMHA_KERNEL_ONLY", f"-I{source.parent}",
                             "-o", str(directory / "kernel.o"), str(source)], capture_output=True, text=True, check=True)
    (directory / "ptxas.txt").write_text(report.stderr)


def load(build: Build):
    """`build`'s extension module, from the cache (built there first if no process has)."""
    if build.name in sys.modules:
        return sys.modules[build.name]
    toolchain_id = toolchain()
    if toolchain_id is None:
        raise RuntimeError("no nvcc to build it with (set CUDA_HOME or put nvcc on PATH)")
    directory = get(build, compile_extension, toolchain_id)
    if build.name in sys.modules:  # this process built it: torch's loader imported it
        return sys.modules[build.name]
    import torch  # noqa: F401 -- the extension links against libtorch, loaded by importing torch

    (library,) = directory.glob(f"{build.name}*.so")
    spec = importlib.util.spec_from_file_location(build.name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[build.name] = module
    return module


def kernel_only(build: Build) -> Build:
    return dataclasses.replace(build, name=f"{build.name}_kernel_only", kernel_only=True)


def builds(mutants: bool) -> list[Build]:
    """What the `fmha.cuda_builds` entry points register: fmha's kernels ("kernels"), and with
    `mutants` the regression mutants ("mutants")."""
    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda p: p.name != "kernels"):
        if mutants or point.name != "mutants":
            found += point.load()()
    return found


def _one(build: Build, builder, toolchain_id: str) -> str:
    if is_built(build, toolchain_id):
        return "up to date"
    started = time.monotonic()
    try:
        get(build, builder, toolchain_id)
    except Exception as e:  # noqa: BLE001 -- one build's error is its line; the others go on
        lines = (getattr(e, "stderr", None) or str(e)).strip().splitlines()
        return f"FAILED: {type(e).__name__}: {lines[-1][:300] if lines else ''}"
    return f"built in {time.monotonic() - started:.0f} s"


def build_all(todo: list[Build], builder, toolchain_id: str, jobs: int, report=print) -> int:
    """Build every one of `todo` not yet in the cache, `jobs` processes at a time; the number
    that failed."""
    jobs = min(jobs, len(todo))
    if jobs <= 1:
        results = [_one(build, builder, toolchain_id) for build in todo]
    else:  # torch's loader keeps state per process: one build a process
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_one, todo, [builder] * len(todo), [toolchain_id] * len(todo)))
    for build, result in zip(todo, results):
        report(f"{build.name}: {result} ({entry(build, toolchain_id)})")
    return sum(result.startswith("FAILED") for result in results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", action="store_true", help="the regression mutants' builds too")
    parser.add_argument("--kernel-only", action="store_true", help="compile the kernels alone (no torch headers, no GPU)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="builds at once (default: one per core)")
    parser.add_argument("--cache", help=f"the cache directory (default: ${CACHE_ENV}, else ~/.cache/fmha/kernels)")
    args = parser.parse_args(argv)
    if args.cache:
        os.environ[CACHE_ENV] = args.cache
    toolchain_id = toolchain()
    if toolchain_id is None:
        print("fmha.kernels.build: no nvcc (set CUDA_HOME or put nvcc on PATH): nothing built; fmha.attention "
              "runs the Triton and Gluon kernels", file=sys.stderr)
        return 0
    todo = builds(args.mutants)
    if args.kernel_only:
        todo = [kernel_only(b) for b in todo]
    print(f"fmha.kernels.build: {len(todo)} build(s) into {cache_root()} with {toolchain_id}", flush=True)
    # each build is one nvcc process (one .cu): side by side, one per core at most
    return 1 if build_all(todo, compile_kernel_only if args.kernel_only else compile_extension, toolchain_id,
                          args.jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
