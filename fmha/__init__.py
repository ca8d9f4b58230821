"""fmha: fused attention kernels and the contract they implement (see README.md)."""

from fmha.contract import ContractError, NotSupportedError, check_attention_args, check_merge_args
from fmha.problem import FEATURES, Problem

__all__ = ["ContractError", "NotSupportedError", "check_attention_args", "check_merge_args", "FEATURES", "Problem"]
