"""Which kernels a command runs, and on which device: `--fmha-kernel` and `--fmha-device`,
declared here once for pytest's plugin (fmha.ci.plugin) and every command line (fmha.ci.verify,
.nightly, .kernels, .sanitize; `python -m fmha.regressions matrix`), with one default and one
usage error each.

A kernel is named three ways: a registered name (fmha.registry: `fmha`, `sdpa-math`, ...), a
mutant (`mutant:NAME`, fmha.regressions.mutants), or a callable of your own by import path
(`my_pkg.attn:fwd`). The selector sits with the regressions because mutants are theirs.

pytest loads the plugin in every session of the environment: declaring the options imports
nothing but this module; the registries (and Triton with them) load on the first name resolved.
"""

from __future__ import annotations

import argparse

import torch

from fmha.contract import KernelEntry, MergeEntry
from fmha.oracles import threads

MUTANT = "mutant:"

DEVICES = ("cpu", "cuda")
DEFAULT_KERNELS = "every registered kernel that runs on the device by default"


def options(default_kernels: str = DEFAULT_KERNELS) -> dict[str, dict]:
    """The options, flag -> settings; `default_kernels` says what a command runs without --fmha-kernel."""
    return {
        "--fmha-kernel": dict(action="append", default=[], metavar="NAME|mutant:NAME|module:attr",
                              help="kernel to run: a registered name, a mutant or an import path (repeatable); "
                                   f"default: {default_kernels}"),
        "--fmha-device": dict(default=None, choices=DEVICES, help="device to run on; default: cuda when available, "
                                                                   "else cpu"),
    }


def add_options(add, default_kernels: str = DEFAULT_KERNELS) -> None:
    """Declare the options with `add`: argparse's `add_argument` or pytest's `addoption`."""
    for flag, settings in options(default_kernels).items():
        add(flag, **settings)


def device(requested: str | None) -> str:
    """The device a run uses: `requested`, else cuda when present; cuda without CUDA is a ValueError."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in DEVICES:
        raise ValueError(f"--fmha-device: expected one of {', '.join(DEVICES)}, got {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--fmha-device cuda: CUDA is not available on this machine")
    return requested


def resolve_kernel(spec: str) -> KernelEntry:
    """The kernel `spec` names; a name nothing answers to is a ValueError saying what there is."""
    from fmha import registry

    return _mutant(spec, KernelEntry, "--fmha-kernel", "--fmha-merge") or registry.resolve_kernel(spec)


def resolve_merge(spec: str) -> MergeEntry:
    from fmha import registry

    return _mutant(spec, MergeEntry, "--fmha-merge", "--fmha-kernel") or registry.resolve_merge(spec)


def _mutant(spec: str, kind: type, option: str, other: str):
    """The mutant `spec` names (None: `spec` names no mutant), as a `kind` entry."""
    if not spec.startswith(MUTANT):
        return None
    from fmha.regressions.mutants import mutant

    found = mutant(spec.removeprefix(MUTANT)).kernel()
    if not isinstance(found, kind):
        raise ValueError(f"{option} {spec}: a {type(found).__name__}, not a {kind.__name__}; pass it to {other}")
    return found


def kernels(specs: list[str], on: str) -> list[KernelEntry]:
    """The kernels `specs` name, or without any every registered kernel that runs on `on` by default."""
    from fmha import registry

    return [resolve_kernel(spec) for spec in specs] or registry.default_kernels(on)


def command_line(doc: str, default_kernels: str = DEFAULT_KERNELS) -> argparse.ArgumentParser:
    """A command's parser with the selection options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser.add_argument, default_kernels)
    return parser


def parse(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Arguments with the device decided; a bad device is a usage error (exit 2). The command takes
    its share of the cores (fmha.oracles.threads)."""
    args = parser.parse_args(argv)
    threads.share_cores()
    try:
        args.fmha_device = device(args.fmha_device)
    except ValueError as e:
        parser.error(str(e))
    return args


def selected_kernels(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[KernelEntry]:
    """The --fmha-kernel entries (the defaults without any); a bad name is a usage error (exit 2)."""
    try:
        return kernels(args.fmha_kernel, args.fmha_device)
    except ValueError as e:
        parser.error(str(e))
