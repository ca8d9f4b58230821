"""Kernel and device selection for the command-line tools, with pytest's option names."""

import argparse

import torch

from fmha import registry


def kernel_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fmha-kernel", action="append", default=[], metavar="NAME|module:attr",
                        help="kernel to verify: a registry name or an import path (repeatable); "
                             "default: every registered kernel that runs on the device by default")
    parser.add_argument("--fmha-device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu")
    return parser


def parse(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Arguments with the device filled in; --fmha-device cuda without CUDA is a usage error."""
    args = parser.parse_args(argv)
    if args.fmha_device is None:
        args.fmha_device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.fmha_device == "cuda" and not torch.cuda.is_available():
        parser.error("--fmha-device cuda: CUDA is not available on this machine")
    return args


def selected_kernels(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The --fmha-kernel entries (registry defaults without any); a bad name is a usage error."""
    try:
        return registry.selected_kernels(args.fmha_kernel, args.fmha_device)
    except ValueError as e:
        parser.error(str(e))
