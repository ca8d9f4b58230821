"""The attention contract (docs/contract.md), the bottom layer every other one builds on:
the shape of a call (`Problem`), its validation, what a kernel declares (`Capabilities`) and the
one protocol every kernel is run through (`KernelEntry`), quantized cache layouts and the slot
arithmetic of paged caches. It imports nothing else of fmha."""

from fmha.contract.capabilities import FULL_CONTRACT, PROMISES, Capabilities
from fmha.contract.errors import ContractError, NotSupportedError
from fmha.contract.kernel import KernelEntry, MergeEntry, always_available, implemented_by
from fmha.contract.paged_validation import output_shape
from fmha.contract.problem import CACHE_LAYOUTS, DTYPE_NAMES, FEATURES, SOURCES, Problem
from fmha.contract.validation import check_attention_args, check_merge_args, plain_scalars

__all__ = ["CACHE_LAYOUTS", "DTYPE_NAMES", "FEATURES", "FULL_CONTRACT", "PROMISES", "SOURCES", "Capabilities",
           "ContractError", "KernelEntry", "MergeEntry", "NotSupportedError", "Problem", "always_available",
           "check_attention_args", "check_merge_args", "implemented_by", "output_shape", "plain_scalars"]
