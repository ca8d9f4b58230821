"""Mutant kernels: the real kernel with exactly one seed bug put back.

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
from fmha.contract import KernelEntry


class MutationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Mutant:
    name: str  # unique; the trap id, or the trap id and a flavour
    trap: str  # the trap whose cases must catch it
    bug: str  # what this mutant does wrong, in one line
    build: Callable[[], KernelEntry]  # built on first use (patching and importing takes time)
    isolate: str = ""  # "hang" or "crash": run only in a killable subprocess (regressions.isolation)

    def kernel(self) -> KernelEntry:
        return _built(self.build)


@functools.cache
def _built(build: Callable[[], KernelEntry]) -> KernelEntry:
    return build()


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


def patched_gluon_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's dense Gluon kernel with `patches` applied (Hopper GPUs only)."""
    from fmha.kernels import gluon_dense

    return _patched_entry("_mutant_gluon", name, gluon_dense, patches)


def patched_gluon_sparse_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's Gluon sparse-decode kernel with `patches` applied (Hopper GPUs only)."""
    from fmha.kernels import gluon_sparse

    return _patched_entry("_mutant_gluon_sparse", name, gluon_sparse, patches)


def patched_cuda_sparse_kernel(name: str, *patches: tuple[str, str]) -> KernelEntry:
    """fmha's CUDA sparse-decode kernel (fmha/kernels/cuda/sparse_decode.cu) with `patches`
    applied, built as an extension of its own on first call (Hopper GPUs with nvcc only)."""
    from fmha.contract import implemented_by
    from fmha.kernels import cuda_sparse

    with open(cuda_sparse.SOURCE) as f:
        source = patch_source(f.read(), patches, name, "fmha/kernels/cuda/sparse_decode.cu")
    extension = cuda_sparse.extension_name("mutant", name, source)
    path = _written(f"{extension}.cu", source)
    built = functools.cache(lambda: cuda_sparse.build(extension, path))
    return implemented_by(f"mutant:{name}", functools.partial(cuda_sparse.attend, extension=built),
                          cuda_sparse.CAPABILITIES, availability=cuda_sparse.availability, default_devices=("cuda",),
                          description=f"regressions mutant {name}")


def wrapped_kernel(name: str, fn: Callable, capabilities=None) -> KernelEntry:
    return KernelEntry(name=f"mutant:{name}", fn=fn, capabilities=capabilities or triton_dense.CAPABILITIES,
                       description=f"regressions mutant {name}")
