"""What every adapter of another library's kernel shares: whether it can run here (the library
importable, a CUDA GPU) and the contract's `out=`."""

from __future__ import annotations

import functools
import importlib.util
from typing import Callable

import torch


def availability_of(module: str, install: str, device_check: Callable[[], str | None] = lambda: None):
    """A KernelEntry's `availability`: `install` (how to get it) where `module` is missing, then
    a CUDA GPU, then `device_check()` (e.g. an architecture the build is for)."""

    @functools.cache
    def availability(device) -> str | None:
        if importlib.util.find_spec(module) is None:
            return install
        if getattr(device, "type", device) != "cuda" or not torch.cuda.is_available():
            return "needs a CUDA GPU"
        return device_check()

    return availability


def written_to(out: torch.Tensor | None, o: torch.Tensor) -> torch.Tensor:
    """`o`, in the caller's `out` when one was given (the contract's out=)."""
    if out is None:
        return o
    out.copy_(o)
    return out
