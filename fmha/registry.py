"""The kernels and merges under test, by name, and plug-ins by import path.

    resolve_kernel("sdpa-math")                 a built-in entry
    resolve_kernel("my_pkg.attn:flash_fwd")     any contract callable, no repo edit needed

A plugged-in callable may carry a `capabilities` attribute (fmha.capabilities.Capabilities);
one without claims the whole contract. An attribute that is already a KernelEntry is used as
it is.
"""

from __future__ import annotations

import importlib

from fmha import gluon_attention, merge_torch, triton_attention, triton_merge
from fmha.adapters import flex, sdpa
from fmha.capabilities import FULL_CONTRACT, KernelEntry, MergeEntry

KERNELS: dict[str, KernelEntry] = {
    e.name: e for e in [triton_attention.ENTRY, gluon_attention.ENTRY, *sdpa.ENTRIES, *flex.ENTRIES]
}

MERGES: dict[str, MergeEntry] = {
    m.name: m
    for m in [
        triton_merge.MERGE_ENTRY,
        MergeEntry("torch-merge", merge_torch.merge, description="eager PyTorch, float32 math"),
    ]
}


def register_kernel(entry: KernelEntry) -> KernelEntry:
    if entry.name in KERNELS:
        raise ValueError(f"kernel name {entry.name!r} is already registered")
    KERNELS[entry.name] = entry
    return entry


def _import(spec: str, what: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--fmha-{what}: expected a registered name or 'package.module:attr', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--fmha-{what} {spec!r}: cannot import {module_name!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--fmha-{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None


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
