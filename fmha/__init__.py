"""fmha: fused attention kernels and the contract they implement (see README.md).

On a machine without CUDA the Triton kernels can only run through the interpreter, and Triton
reads TRITON_INTERPRET when `triton` is first imported (its own library functions are
compiled-or-interpreted from then on), so the switch is set here, before anything imports
triton, unless the caller has set it.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from fmha.contract import ContractError, NotSupportedError, check_attention_args, check_merge_args  # noqa: E402
from fmha.problem import FEATURES, Problem  # noqa: E402

__all__ = ["ContractError", "NotSupportedError", "check_attention_args", "check_merge_args", "FEATURES", "Problem"]
