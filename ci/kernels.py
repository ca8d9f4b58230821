"""Every registered kernel and merge: whether it runs here, why not, what it declares.

    python -m fmha.ci.kernels [--fmha-device cpu|cuda] [--fmha-kernel NAME|mutant:NAME|module:attr ...]

A kernel that cannot run on this machine (a missing library, no GPU) says why and how to get
it; one that runs lists its capabilities (what the strategies draw for it and what its tests
skip) and whether it runs by default or only when selected with --fmha-kernel.
"""

from __future__ import annotations

import sys

from fmha import registry
from fmha.regressions.selection import command_line, parse, selected_kernels
from fmha.contract import DTYPE_NAMES, Capabilities
from fmha.tables import Table


def declared(c: Capabilities) -> str:
    """The capabilities in a line: what differs from the whole contract."""
    parts = [f"sources {', '.join(sorted(c.sources))}", "dtypes " + ", ".join(DTYPE_NAMES[d] for d in c.dtypes)]
    if c.head_dims is not None:
        dims = sorted(set(c.head_dims) if not isinstance(c.head_dims, dict) else {d for ds in c.head_dims.values() for d in ds})
        steps = {b - a for a, b in zip(dims, dims[1:])}
        parts.append(f"head dims {dims[0]}-{dims[-1]} in steps of {steps.pop()}" if len(dims) > 4 and len(steps) == 1
                     else f"head dims {', '.join(map(str, dims))}")
    parts.append(f"features {', '.join(sorted(c.features)) or 'none'}")
    for name, value in (("requires", ", ".join(sorted(c.requires))), ("Hq", c.heads_q), ("block sizes", c.block_sizes),
                        ("max top-k", c.max_topk), ("top-k a multiple of", c.topk_multiple_of > 1 and c.topk_multiple_of),
                        ("cache layouts", ", ".join(sorted(c.cache_layouts)) + ("" if c.unquantized_caches else " only")),
                        ("max T", c.max_q_len), ("max S", c.max_kv_len), ("promises", ", ".join(sorted(c.promises)))):
        if value:
            parts.append(f"{name} {value}")
    if not c.split_head_dim_v:
        parts.append("Dv = D only")
    return "; ".join(parts)


def main(argv=None) -> int:
    parser = command_line(__doc__, default_kernels="every registered kernel")
    args = parse(parser, argv)
    device = args.fmha_device
    defaults = {k.name for k in registry.default_kernels(device)}
    entries = selected_kernels(parser, args) if args.fmha_kernel else registry.KERNELS.values()
    table = Table(["kernel", "here", "runs", "declares / why not"])
    for entry in entries:
        why_not = entry.availability(device)
        capabilities = entry.capabilities_on(device)
        if why_not is None and device not in capabilities.devices:
            why_not = f"runs on {', '.join(capabilities.devices)}, not {device}"
        runs = "-" if why_not else ("by default" if entry.name in defaults else "when selected")
        table.add(entry.name, "no" if why_not else "yes", runs, why_not or declared(capabilities))
    merges = Table(["merge", "here", "why not"])
    for merge in registry.MERGES.values():
        why_not = merge.availability(device)
        merges.add(merge.name, "no" if why_not else "yes", why_not or "")
    print(f"# fmha kernels on {device}\n\n{table.markdown()}\n\n{merges.markdown()}")
    print("\nA kernel of your own: --fmha-kernel module:function (docs/contract.md says what it may declare).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
