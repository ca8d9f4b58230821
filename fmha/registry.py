"""The kernels and merges under test, by name, and plug-ins by import path.

    resolve_kernel("sdpa-math")                 a built-in entry
    resolve_kernel("my_pkg.attn:flash_fwd")     any contract callable, no repo edit needed

A plugged-in callable may carry a `capabilities` attribute (fmha.capabilities.Capabilities);
one without claims the whole contract and promises nothing beyond it. An attribute that is
already a KernelEntry is used as it is. A plug-in's module is imported from sys.path, and
else from the current directory (`pytest --fmha-kernel mykernel:fwd` next to mykernel.py).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

from fmha import dispatch, gluon_attention, gluon_sparse, merge_torch
from fmha.adapters import flex, paged, sdpa
from fmha.capabilities import FULL_CONTRACT, KernelEntry, MergeEntry
from fmha.triton_utils import triton_availability

OURS = [
    KernelEntry(
        name="fmha", fn=dispatch.attention, capabilities=dispatch.CAPABILITIES,
        availability=triton_availability,
        description="fmha.attention: the Gluon kernel for bf16 head dim 512 on Hopper, the Triton kernel for "
                    "everything else (compiled on CUDA, TRITON_INTERPRET=1 on CPU); contract v2's sources "
                    "through fmha.gluon_sparse (DSV4's sparse decode on Hopper) and fmha.triton_sources",
    ),
    KernelEntry(
        name="triton", fn=functools.partial(dispatch.attention, implementation="triton"),
        capabilities=dispatch.CAPABILITIES, default_devices=(), availability=triton_availability,
        description="fmha's Triton kernels alone (dense and contract v2's sources), also where fmha.attention "
                    "would run a Gluon one",
    ),
    KernelEntry(
        name="gluon", fn=dispatch.only(gluon_attention.IMPLEMENTATION),
        capabilities=gluon_attention.CAPABILITIES, availability=gluon_attention.availability,
        default_devices=("cuda",),
        description="fmha's Gluon kernel alone (bf16 head dim 512 on Hopper; fmha.attention runs it there)",
    ),
    KernelEntry(
        name="gluon-sparse", fn=dispatch.only_sources("gluon", gluon_sparse),
        capabilities=gluon_sparse.CAPABILITIES, availability=gluon_sparse.availability, default_devices=("cuda",),
        description="fmha's Gluon sparse-decode kernel alone (DSV4: index-sparse bf16 head dim 512 K = V over "
                    "bf16, FP8 or FP4 caches, on Hopper; fmha.attention runs it there)",
    ),
]

KERNELS: dict[str, KernelEntry] = {e.name: e for e in [*OURS, *sdpa.ENTRIES, *flex.ENTRIES, *paged.ENTRIES]}

MERGES: dict[str, MergeEntry] = {
    m.name: m
    for m in [
        MergeEntry("fmha", dispatch.merge, description="fmha.merge: fmha's Triton D5 merge",
                   availability=triton_availability),
        MergeEntry("torch-merge", merge_torch.merge, description="eager PyTorch, float32 math"),
    ]
}


def _import(spec: str, what: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--fmha-{what}: expected a registered name or 'package.module:attr', got {spec!r}")
    try:
        module = _import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--fmha-{what} {spec!r}: cannot import {module_name!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--fmha-{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


def _import_module(name: str):
    """`name` from sys.path, else from the current directory, as `python -m pytest` would
    (a plain `pytest` does not put it on sys.path)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if e.name != name.partition(".")[0] or here in sys.path:
            raise
        sys.path.insert(0, here)
        return importlib.import_module(name)


def _resolve(spec: str, what: str, table: dict, entry_type: type, wrap):
    if spec in table:
        return table[spec]
    if ":" not in spec:
        raise ValueError(f"--fmha-{what} {spec!r}: unknown name; registered: {', '.join(table)}; "
                         "or give 'package.module:attr'")
    obj = _import(spec, what)
    if isinstance(obj, entry_type):
        return obj
    if not callable(obj):
        raise ValueError(f"--fmha-{what} {spec!r}: {type(obj).__name__} is not callable")
    return wrap(spec, obj)


def resolve_kernel(spec: str) -> KernelEntry:
    return _resolve(spec, "kernel", KERNELS, KernelEntry, lambda name, fn: KernelEntry(
        name=name, fn=fn, capabilities=getattr(fn, "capabilities", FULL_CONTRACT)))


def resolve_merge(spec: str) -> MergeEntry:
    return _resolve(spec, "merge", MERGES, MergeEntry, lambda name, fn: MergeEntry(name=name, fn=fn))


def default_kernels(device: str) -> list[KernelEntry]:
    """What runs when no --fmha-kernel is given: every entry that runs on `device` by default."""
    return [e for e in KERNELS.values() if device in e.default_devices and device in e.capabilities_on(device).devices]


def selected_kernels(specs: list[str], device: str) -> list[KernelEntry]:
    """The kernels named by --fmha-kernel options, or the defaults for the device."""
    return [resolve_kernel(s) for s in specs] or default_kernels(device)
