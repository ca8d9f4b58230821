"""The coverage audit: every freedom of every argument record (fmha.contract.arguments) and how
many calls handed the kernel a tensor showing it, measured from the tensors themselves (their
strides, offsets and buffers: fmha.oracles.storage.observed), never from what a strategy asked for.

    python -m fmha.ci.coverage                       # fmha, triton, reference, sdpa-math
    python -m fmha.ci.coverage --fmha-kernel my_pkg.attn:fwd --draws 200
    python -m fmha.ci.coverage --fmha-device cuda --fmha-scale   # the GPU scale tier's calls too

Each row is reached (with its count), or excluded by the kernel's declaration (and which part of
it); every freedom a declaration allows is drawn (fmha.oracles.storage keeps stride 0 and elements
sharing memory valid: a drawn value wherever some call's row reads one).
A pytest session's summary says how many freedoms its calls showed (fmha.ci.hazard_report); a
freedom the covering set does not reach fails tests/test_arguments.py. Each kernel's table ends
with its covering array (fmha.properties.covering_array): how many calls, and any pair of values
its declaration allows that meets in none (the run fails; tests/test_covering_array.py too).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

from fmha.contract import ranges
from fmha.contract.arguments import ARGUMENTS, Argument, storage_freedoms
from fmha.contract.relations import RELATIONS

DEFAULT_KERNELS = ("fmha", "triton", "reference", "sdpa-math")


@dataclass(frozen=True)
class Row:
    argument: str
    freedom: str
    reached: int
    why_not: str = ""  # "" where the kernel may get it; else the declaration (or the draws) that keep it out

    @property
    def status(self) -> str:
        if self.why_not:
            return self.why_not
        return f"reached {self.reached}x" if self.reached else "UNREACHED"


def excluded(argument: Argument, freedom: str, caps) -> str:
    """Why a kernel of `caps` never gets `freedom` of `argument`, or ""."""
    if argument.calls == ("merge",):
        return "a merge's argument (audited with fmha.merge's laws)"
    if not set(caps.sources) & set(argument.calls):
        return f"sources: declares {', '.join(sorted(caps.sources))}"
    if argument.name == "sink" and "sink" not in caps.features:
        return "features: no sink"
    if argument.name.startswith("out") and "out" not in caps.features:
        return "features: no out="
    if argument.name == "quantized cache" and not caps.cache_layouts:
        return "cache_layouts: none"
    if argument.name in ("v", "v cache") and "shared_kv" in caps.requires:
        return "requires shared_kv: v is k"
    if argument.name == "v cache" and "paged" not in caps.sources:
        return "sources: a separate v cache is paged"
    if argument.name in ("k cache", "v cache") and not caps.unquantized_caches:
        return "unquantized_caches=False"
    if freedom == "alias:k" and "dense" not in caps.sources:
        return "sources: q shares a buffer with dense k only"
    fixed = {"T": caps.max_q_len == 1, "Hq": caps.heads_q == (1,)}
    for dim, one in fixed.items():
        if one and dim in argument.strided_dims and (freedom.startswith("order:") or freedom.endswith(f":{dim}")):
            return f"{'max_q_len' if dim == 'T' else 'heads_q'}: {dim} is always 1 (its stride means nothing)"
    return ""


def audit(caps, counts: Counter, sizes: Counter | None = None, shown: Counter | None = None,
          scale: bool = False) -> list[Row]:
    """Every freedom of every record, against a kernel of `caps`, with `counts` ((record, freedom) ->
    calls); then every size's (fmha.contract.ranges, its range narrowed by the declaration), with
    `sizes` ((symbol, value) -> calls), the GPU scale tier's among those to reach with `scale`; then
    every relation's forms (fmha.contract.relations), with `shown` ((relation, form) -> calls)."""
    rows = [Row(a.name, f, counts[(a.name, f)], excluded(a, f, caps))
            for a in ARGUMENTS.values() for f in storage_freedoms(a)]
    if sizes is not None:
        rows += [Row(f"size {symbol}", f"{label} ({value})", sizes[(symbol, value)], _size_excluded(symbol, value, caps, scale))
                 for symbol, label, value in ranges.freedoms(caps)]
    if shown is not None:
        rows += [Row(f"relation: {r.name}", form, shown[(r.name, form)], _form_excluded(r, form, caps))
                 for r in RELATIONS.values() for form in r.forms]
    return rows


def _form_excluded(relation, form: str, caps) -> str:
    """Why a kernel of `caps` is never handed `form` of `relation`, or ""."""
    if not set(caps.sources) & set(relation.calls):
        return f"sources: declares {', '.join(sorted(caps.sources))}"
    if "window" in relation.arguments and "window" not in caps.features:
        return "features: no window"
    if relation.name == "v is k":
        if form == "v is k" and "shared_kv" not in caps.features:
            return "features: no shared_kv"
        if form == "v apart" and "shared_kv" in caps.requires:
            return "requires shared_kv"
    if relation.name == "each scope's cache layout":
        quantized = {"neither quantized": 0, "first only": 1, "second only": 1, "both alike": 2, "both differ": 2}[form]
        if quantized < 2 and not caps.unquantized_caches:
            return "unquantized_caches=False"
        if quantized and not caps.cache_layouts:
            return "cache_layouts: none"
        if form == "both differ" and len(caps.cache_layouts) < 2:
            return f"cache_layouts: {', '.join(sorted(caps.cache_layouts))} only"
    return ""


def _size_excluded(symbol: str, value: int, caps, scale: bool = False) -> str:
    from fmha.properties.covering import smallest_cache

    if not ranges.applies(symbol, caps):
        return f"sources: a size of {', '.join(ranges.SIZES[symbol].sources)} calls"
    if symbol == "pages" and value < (fewest := smallest_cache(caps)):
        return (f"not drawn: a sparse call's cache holds its keys and a slot of poison, {fewest} "
                f"pages of {min(caps.block_sizes or (1,))}")
    tier = ranges.tier(symbol, value, caps)
    if tier == "none":
        return "no tier's (past what one card affords)"
    if tier == "scale" and not scale:
        return "the GPU scale tier's (past what a CPU run affords: --fmha-scale)"
    return ""


def unreached(rows: list[Row]) -> list[Row]:
    return [r for r in rows if not r.why_not and not r.reached]


def reached_by(samples, kernel, device: str) -> tuple[Counter, Counter, Counter]:
    """What `samples`' calls of `kernel` hand it, counted as run_kernel counts them (out= as it
    lays it out), without calling the kernel: (record, freedom), (size, value) and (relation, form)
    counts."""
    from fmha.oracles.kernel_call import out_for
    from fmha.oracles.storage import measured

    counters = (Counter(), Counter(), Counter())
    takes_out = "out" in kernel.capabilities_on(device).features
    for sample in samples:
        x = sample.inputs(device)
        call = {"q": x.q, "k": x.k, "v": x.v, **x.kwargs(), **({"out": out_for(x)[1]} if takes_out else {})}
        for counter, found in zip(counters, measured(call, x.problem)):
            counter.update(found)
    return counters


def draws(kernel, device: str, count: int, seed: int = 0) -> list:
    """The covering set, the covering array and `count` draws of the agreement laws' strategies,
    as a CI run makes them."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fmha.properties.covering import covering_samples
    from fmha.properties.paged_strategies import paged_samples
    from fmha.properties.strategies import samples

    caps = kernel.capabilities_on(device)
    found = list(covering_samples(kernel, device, seed, pairs=True))
    strategies = []
    if "dense" in caps.sources:
        strategies.append(samples(caps, device))
    if caps.sources & {"paged", "sparse"}:
        strategies.append(paged_samples(caps, device))
    if strategies and count:
        @settings(max_examples=count, database=None, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.one_of(*strategies))
        def collect(sample):
            found.append(sample)

        collect()
    return found


def table(kernel_name: str, rows: list[Row]) -> str:
    from fmha.tables import Table

    out = Table(["argument", "freedom", "this run"])
    for r in rows:
        out.add(r.argument, r.freedom, r.status)
    missing = unreached(rows)
    reachable = [r for r in rows if not r.why_not]
    head = (f"{kernel_name}: {len(reachable) - len(missing)} of {len(reachable)} freedoms its declaration allows "
            f"reached; {len(rows) - len(reachable)} excluded or not drawn")
    return head + "\n" + out.markdown()


def main(argv=None) -> int:
    from fmha.properties import scale
    from fmha.regressions.selection import command_line, parse, resolve_kernel, selected_kernels

    parser = command_line(__doc__, default_kernels=", ".join(DEFAULT_KERNELS))
    parser.prog = "python -m fmha.ci.coverage"
    parser.add_argument("--draws", type=int, default=40, help="hypothesis draws beside the covering set (default 40)")
    parser.add_argument("--fmha-scale", action="store_true",
                        help="the GPU scale tier's calls too (fmha.properties.scale; a CUDA device): its sizes then "
                             "count as reached or not, like the CPU tier's")
    args = parse(parser, argv)
    kernels = selected_kernels(parser, args) if args.fmha_kernel else [resolve_kernel(n) for n in DEFAULT_KERNELS]
    status = 0
    for kernel in kernels:
        device = args.fmha_device
        samples = draws(kernel, device, args.draws) + (scale.calls(kernel, device) if args.fmha_scale else [])
        rows = audit(kernel.capabilities_on(device), *reached_by(samples, kernel, device), scale=args.fmha_scale)
        print(table(kernel.name, rows) + "\n")
        if unreached(rows):
            status = 1
            print(f"{kernel.name}: UNREACHED: " + ", ".join(f"{r.argument} {r.freedom}" for r in unreached(rows)) + "\n")
        status = max(status, _pairs(kernel, device))
    return status


def _pairs(kernel, device: str) -> int:
    """The covering array's size and the pairs it leaves out (none, unless the builder failed one)."""
    from fmha.properties import covering_array

    sizes = covering_array.size(kernel, device)
    missing = [f"{source}: {pair}" for source in sizes for pair in covering_array.uncovered(kernel, device, source)]
    print(f"{kernel.name}: covering array of {sum(sizes.values())} calls ("
          + ", ".join(f"{source} {n}" for source, n in sizes.items()) + "): "
          + (f"{len(missing)} pairs its declaration allows in none: " + "; ".join(missing[:10]) if missing
             else "every pair of values its declaration allows meets in some call") + "\n")
    return 1 if missing else 0

if __name__ == "__main__":
    sys.exit(main())
