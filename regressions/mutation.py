"""What a mutant is (`Mutant`), and how the mutants of fmha's own kernels are made: the real
kernel with exactly one seed bug put back.

Where the bug lives in tiling, layout or lanes, the mutant is fmha's own Triton kernel with
a textual patch applied to its source (as mutation-testing tools do), written to a private
file and imported as a module of its own; the Triton compiler sees a real kernel. A patch
whose text no longer occurs exactly once fails loudly, so a kernel change can never silently
turn a mutant into a copy of the correct kernel. Mutants live here, never in fmha/.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

from fmha.kernels import triton_dense
from fmha.contract import KernelEntry, MergeEntry


class MutationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Mutant:
    """A kernel (or a merge) with one known bug, and what proves the suite catches it. Every kind
    is this record: a patched copy of fmha's kernels, the eager or float64 reference with one
    mistake, a user's buggy plug-in; fmha.regressions.mutants lists them all by name."""

    name: str  # unique, kebab-case: `--fmha-kernel mutant:NAME` runs it
    trap: str  # the trap whose every case must catch it; "" for one that only laws or GPU tests prove
    bug: str  # what this mutant does wrong, in one line
    build: Callable[[], KernelEntry | MergeEntry]  # built on first use (patching and importing takes time)
    isolate: str = ""  # "hang" or "crash": run only in a killable subprocess (regressions.isolation)
    # The correct kernel it is one bug away from, for the laws it proves (Law.mutant): that one obeys them.
    twin: Callable[[], KernelEntry | MergeEntry] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")  # where it can be built and run (the Gluon and CUDA kernels': cuda)
    source: str = ""  # where a public kernel shipped the bug (an issue or pull request)
    # "scale": its bug lives past the sizes a CPU run affords; the GPU scale tier proves it
    # (fmha.regressions.scale_mutants), and the CPU tier passes it, so it is no kill-matrix row.
    tier: str = ""

    def __post_init__(self):
        if not self.name or self.name != self.name.lower() or "_" in self.name or " " in self.name:
            raise ValueError(f"mutant name: expected kebab-case like 'normalize-twice', got {self.name!r}")
        if self.isolate not in ("", "hang", "crash"):
            raise ValueError(f"mutant {self.name}: isolate is '', 'hang' or 'crash', got {self.isolate!r}")
        if self.tier not in ("", "scale"):
            raise ValueError(f"mutant {self.name}: tier is '' or 'scale', got {self.tier!r}")

    def kernel(self) -> KernelEntry | MergeEntry:
        """The mutant's kernel (or merge), named `mutant:NAME` as the command line names it."""
        return _built(self.build, f"mutant:{self.name}")

    def correct_twin(self) -> KernelEntry | MergeEntry:
        if self.twin is None:
            raise ValueError(f"mutant {self.name} names no correct twin (Mutant.twin)")
        return self.twin()


def cuda_only(*mutants: Mutant) -> tuple[Mutant, ...]:
    """Mutants of kernels that run on a CUDA GPU alone (Gluon on Hopper, CUDA C++ with nvcc)."""
    return tuple(dataclasses.replace(m, devices=("cuda",)) for m in mutants)


@functools.cache
def _built(build: Callable[[], KernelEntry | MergeEntry], name: str) -> KernelEntry | MergeEntry:
    return dataclasses.replace(build(), name=name)


def _mutant_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), f"fmha-mutants-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def patch_source(source: str, patches: tuple[tuple[str, str], ...], name: str,
                 path: str = "fmha/kernels/triton_dense.py") -> str:
    for old, new in patches:
        count = source.count(old)
        if count != 1:
            raise MutationError(
                f"mutant {name!r}: the patch target occurs {count} times in {path} "
                f"(expected exactly once); the kernel changed, update the mutant. Target:\n{old}")
        source = source.replace(old, new)
    return source


def _digest(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()[:12]


def _written(file_name: str, source: str) -> str:
    """`source` in the private mutant directory as `file_name` (its path), written once."""
    path = os.path.join(_mutant_dir(), file_name)
    if not os.path.exists(path):  # atomic: xdist workers may build the same mutant at once
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    return path


def _import_patched(prefix: str, name: str, source: str):
    """`source` imported as a module of its own, from a private file (the JIT compilers read
    the source of what they compile)."""
    module_name = f"fmha.{prefix}_{name.replace('-', '_')}_{_digest(source)}"
    if module_name not in sys.modules:
        path = _written(f"{module_name}.py", source)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def _patched_entry(prefix: str, name: str, module, patches) -> KernelEntry:
    """`module`'s kernel entry with `patches` ((old, new) source snippets) applied, as mutant
    `name`: its capabilities and availability are the patched module's."""
    path = f"fmha/kernels/{module.__name__.rsplit('.', 1)[-1]}.py"
    patched = _import_patched(prefix, name, patch_source(inspect.getsource(module), patches, name, path))
    return dataclasses.replace(patched.ENTRY, name=f"mutant:{name}", description=f"regressions mutant {name}")


def patched_triton_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's dense Triton kernel with `patches` applied, run where fmha.attention would hand
    the problem to the Gluon one too (bf16 head dim 512 on Hopper)."""
    return _patched_entry("_mutant", name, triton_dense, patches)


def patched_paged_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's paged and index-sparse Triton kernel (fmha.kernels.triton_paged) with `patches`
    applied."""
    from fmha.kernels import triton_paged

    return _patched_entry("_mutant_paged", name, triton_paged, patches)


def patched_gluon_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's dense Gluon kernel with `patches` applied (Hopper GPUs only)."""
    from fmha.kernels import gluon_dense

    return _patched_entry("_mutant_gluon", name, gluon_dense, patches)


def patched_gluon_sparse_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's Gluon sparse-decode kernel with `patches` applied (Hopper GPUs only)."""
    from fmha.kernels import gluon_sparse

    return _patched_entry("_mutant_gluon_sparse", name, gluon_sparse, patches)


def cuda_sparse_mutant_build(name: str, *patches: tuple[str, str]):
    """The build (fmha.kernels.build) of fmha's CUDA sparse-decode kernel with `patches` applied,
    an extension of its own named for its content."""
    from fmha.kernels import cuda_sparse

    with open(cuda_sparse.SOURCE) as f:
        source = patch_source(f.read(), patches, name, "fmha/kernels/cuda/sparse_decode.cu")
    return cuda_sparse.kernel_build(cuda_sparse.extension_name("mutant", name, source), source)


def patched_cuda_sparse_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's CUDA sparse-decode kernel (fmha/kernels/cuda/sparse_decode.cu) with `patches`
    applied, loaded from the build cache on first call, built into it first where
    `python -m fmha.kernels.build --mutants` has not (Hopper GPUs with nvcc only)."""
    from fmha.contract import implemented_by
    from fmha.kernels import build, cuda_sparse

    extension = functools.cache(functools.partial(build.load, cuda_sparse_mutant_build(name, *patches)))
    return implemented_by(f"mutant:{name}", functools.partial(cuda_sparse.attend, extension=extension),
                          cuda_sparse.CAPABILITIES, availability=cuda_sparse.availability, default_devices=("cuda",),
                          description=f"regressions mutant {name}")


def wrapped_kernel(name: str, fn: Callable, capabilities=None) -> KernelEntry:
    return KernelEntry(name=f"mutant:{name}", fn=fn, capabilities=capabilities or triton_dense.CAPABILITIES,
                       description=f"regressions mutant {name}")
