"""A sample's tensors (`Inputs`): the contract call's arguments as `Sample.inputs` makes them,
and the float64 sources the oracle reads for them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # a Sample makes its Inputs
    from fmha.contract import Problem
    from fmha.oracles.sample import Sample


@dataclass
class Inputs:
    """A sample's tensors: the positional arguments of the contract call, and the sink; for
    contract v2 the source's keyword arguments (block_table=, indices=, ...) and the float
    sources the oracle reads (fmha.oracles.oracle, quantized caches decoded)."""

    sample: Sample
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sink: torch.Tensor | None
    source_args: dict = field(default_factory=dict)
    oracle_sources: list = field(default_factory=list)

    @property
    def problem(self) -> Problem:
        return self.sample.problem

    def kwargs(self, **changes) -> dict:
        """The contract call's keyword arguments for this sample, with `changes`."""
        return {**self.sample.scalar_arguments(), "sink": self.sink, **self.source_args, **changes}

    def with_tensors(self, **tensors) -> Inputs:
        """The same sample with other q, k, v (or sink) tensors."""
        return dataclasses.replace(self, **tensors)

    def contiguous(self) -> Inputs:
        """The same values in dense storage (K is V kept)."""
        k = self.k.contiguous()
        return self.with_tensors(q=self.q.contiguous(), k=k, v=k if self.v is self.k else self.v.contiguous())
