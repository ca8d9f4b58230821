"""fmha: fused attention kernels, the contract they implement, and a framework that verifies
any kernel against float64 oracles (README.md, docs/contract.md).

    o, lse = fmha.attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    o, lse = fmha.merge([(o_1, lse_1), ...], sink=None)

On a machine without CUDA the Triton kernels can only run through the interpreter, and Triton
reads TRITON_INTERPRET when `triton` is first imported (its own library functions are
compiled-or-interpreted from then on), so the switch is set here, before anything imports
triton, unless the caller has set it. `attention` and `merge` load the kernels on first use,
so importing fmha (or its test side, fmha.oracles, ...) does not compile or import Triton.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fmha.contract import (  # noqa: E402
    FEATURES, Capabilities, ContractError, KernelEntry, NotSupportedError, Problem, check_attention_args,
    check_merge_args,
)

__all__ = ["attention", "merge", "Capabilities", "ContractError", "KernelEntry", "NotSupportedError",
           "check_attention_args", "check_merge_args", "FEATURES", "Problem"]


def __getattr__(name: str):
    if name in ("attention", "merge"):
        from fmha import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module 'fmha' has no attribute {name!r}")
