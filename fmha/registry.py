"""The kernels and merges under test, by name, and plug-ins by import path.

    resolve_kernel("sdpa-math")                 a built-in entry
    resolve_kernel("my_pkg.attn:flash_fwd")     any contract callable, no repo edit needed

A plugged-in callable may carry a `capabilities` attribute (fmha.Capabilities); one without
claims the whole contract and promises nothing beyond it. An attribute that is
already a KernelEntry is used as it is. A plug-in's module is imported from sys.path, and
else from the current directory (`pytest --fmha-kernel mykernel:fwd` next to mykernel.py).

The catalogue sits above the oracles: its `reference` kernel is the float64 oracle rounded.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Mapping

from fmha import dispatch
from fmha.adapters import flashinfer, flashmla, flex, sdpa, sdpa_paged, vllm
from fmha.contract import FULL_CONTRACT, Capabilities, KernelEntry, MergeEntry
from fmha.kernels import cuda_sparse, gluon_dense, gluon_sparse, torch_merge
from fmha.kernels.triton_utils import triton_availability
from fmha.oracles import reference_kernel

OURS = [
    KernelEntry(
        name="fmha", fn=dispatch.attention, capabilities=dispatch.CAPABILITIES,
        availability=triton_availability,
        description="fmha.attention: the first of " + ", ".join(e.name for e in dispatch.IMPLEMENTATIONS)
                    + " that supports the call (the Gluon kernels on Hopper for bf16 head dim 512 and DSV4's "
                      "sparse decode; the Triton kernels, compiled on CUDA and interpreted on CPU, for the rest)",
    ),
    KernelEntry(
        name="triton", fn=dispatch.dispatching(dispatch.implementations("triton")),
        capabilities=dispatch.CAPABILITIES, default_devices=(), availability=triton_availability,
        description="fmha's Triton kernels alone (dense and contract v2's sources), also where fmha.attention "
                    "would run a Gluon one",
    ),
    gluon_dense.ENTRY,
    gluon_sparse.ENTRY,
    cuda_sparse.ENTRY,
]

OURS_NAMES = frozenset(e.name for e in OURS)
# fmha's CUDA C++ kernels: the nightly gates them beside fmha (fmha.attention runs them first where built).
COMPILED = (cuda_sparse.ENTRY,)

# Other libraries' kernels, each imported only when called; unavailable (with how to get it)
# where the library is missing. They run when selected, or compared (`--compare installed`).
LIBRARIES = [*flashmla.ENTRIES, *flashinfer.ENTRIES, *vllm.ENTRIES]

KERNELS: dict[str, KernelEntry] = {e.name: e for e in [*OURS, *sdpa.ENTRIES, *flex.ENTRIES, reference_kernel.ENTRY,
                                                          *sdpa_paged.ENTRIES, *LIBRARIES]}

MERGES: dict[str, MergeEntry] = {
    m.name: m
    for m in [
        MergeEntry("fmha", dispatch.merge, description="fmha.merge: fmha's Triton D5 merge",
                   availability=triton_availability),
        MergeEntry("torch-merge", torch_merge.merge, description="eager PyTorch, float32 math"),
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
    except SyntaxError as e:
        raise ValueError(f"--fmha-{what} {spec!r}: {module_name!r} does not compile: {e.msg} at {e.filename}, "
                         f"line {e.lineno}") from None
    except Exception as e:  # noqa: BLE001 -- whatever the module's own code raises on import
        raise ValueError(f"--fmha-{what} {spec!r}: importing {module_name!r} raised {type(e).__name__}: {e}") from e
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
                         "or give 'package.module:attr', or a mutant as 'mutant:NAME'")
    obj = _import(spec, what)
    if isinstance(obj, entry_type):
        return obj
    if not callable(obj):
        raise ValueError(f"--fmha-{what} {spec!r}: {type(obj).__name__} is not callable")
    return wrap(spec, obj)


def resolve_kernel(spec: str) -> KernelEntry:
    return _resolve(spec, "kernel", KERNELS, KernelEntry, _plugged)


# What a call of each source passes a kernel beside q, k and v, always (fmha.oracles.inputs.Inputs.kwargs;
# out= where declared, the optional ones where a call has them): what a plug-in's signature must take.
_SCALARS = ("scale", "causal", "window", "sink")
CALL_KEYWORDS = {"dense": _SCALARS, "paged": (*_SCALARS, "block_table", "kv_lens"),
                 "ragged": (*_SCALARS, "block_table", "kv_lens", "cu_seqlens_q"), "sparse": (*_SCALARS, "indices"),
                 "two_scopes": (*_SCALARS, "indices", "extra_k_cache", "extra_indices")}


def _plugged(name: str, fn) -> KernelEntry:
    """A plug-in's entry, refused with what to change where its declaration is not a Capabilities or
    its signature cannot take the calls of the sources it declares."""
    capabilities = getattr(fn, "capabilities", FULL_CONTRACT)
    if not isinstance(capabilities, Capabilities):
        hint = ""
        if isinstance(capabilities, Mapping):
            unknown = sorted(set(capabilities) - {f.name for f in dataclasses.fields(Capabilities)})
            hint = (f" ({', '.join(map(str, unknown))} among its keys are not Capabilities' fields)" if unknown
                    else " (fmha.Capabilities(**that dict) is one)")
        raise ValueError(f"--fmha-kernel {name!r}: its capabilities attribute is a {type(capabilities).__name__}; "
                         f"expected an fmha.Capabilities{hint}")
    problem = _signature_problem(fn, capabilities)
    if problem:
        raise ValueError(f"--fmha-kernel {name!r}: {problem}")
    return KernelEntry(name=name, fn=fn, capabilities=capabilities)


def _signature_problem(fn, capabilities: Capabilities) -> str:
    """Why `fn`'s signature cannot take a call of a source it declares, with the fix; "" where it can
    (or where Python cannot read its signature: a builtin's call says so itself)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    for source in sorted(capabilities.sources):
        keywords = dict.fromkeys((*CALL_KEYWORDS[source], *(["out"] if "out" in capabilities.features else [])))
        try:
            signature.bind(None, None, None, **keywords)
        except TypeError as e:
            said = (f"{getattr(fn, '__qualname__', fn)}{signature} cannot take a {source} call, "
                    f"fn(q, k, v, {', '.join(f'{k}=...' for k in keywords)}): {e}")
            required = [p.name for p in signature.parameters.values() if p.default is p.empty
                        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("q", "k", "v")]
            passed_by = sorted({s for name in required for s, names in CALL_KEYWORDS.items() if name in names}
                               - set(capabilities.sources))
            if passed_by:
                said += (f"; {', '.join(required)} come with {' or '.join(passed_by)} calls: declare the sources it "
                         f"takes, fn.capabilities = fmha.Capabilities(sources=frozenset({{{passed_by[0]!r}}}), ...) "
                         f"(it declares {', '.join(sorted(capabilities.sources))})")
            return said
    return ""


def resolve_merge(spec: str) -> MergeEntry:
    return _resolve(spec, "merge", MERGES, MergeEntry, lambda name, fn: MergeEntry(name=name, fn=fn))


def installed_kernels(device: str) -> list[KernelEntry]:
    """Other kernels than fmha's that run here: the defaults, and the libraries that are installed."""
    return [e for e in default_kernels(device) + LIBRARIES if e.name not in OURS_NAMES
            and not e.availability(device) and device in e.capabilities_on(device).devices]


def default_kernels(device: str) -> list[KernelEntry]:
    """What runs when no --fmha-kernel is given: every entry that runs on `device` by default."""
    return [e for e in KERNELS.values() if device in e.default_devices and device in e.capabilities_on(device).devices]

