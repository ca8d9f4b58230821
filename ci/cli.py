"""Kernel selection for the command-line tools, the same as pytest's --fmha-kernel."""

import argparse

import torch

from fmha import registry


def kernel_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fmha-kernel", action="append", default=[], metavar="NAME|module:attr")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def selected_kernels(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The --fmha-kernel entries (registry defaults without any); a bad name is a usage error."""
    try:
        return registry.selected_kernels(args.fmha_kernel, args.device)
    except ValueError as e:
        parser.error(str(e))
