"""Other libraries' LSE conventions, translated to fmha's, for adapters.

fmha's LSE (docs/contract.md): float32 (B, Hq, T), natural log, the sink included; a row
with no visible key has lse = -inf, or the sink's logit when there is one. An adapter for a
kernel with another convention returns `(o, lse_from_...(lse, ...))`:

- FlashInfer returns the LSE in base 2 (every backend, by default): `lse_from_base2`.
- FlashMLA leaves the sink out of its LSE (it scales the output by
  exp(lse) / (exp(lse) + exp(sink)) instead) and returns +inf for a row with no key:
  `lse_from_sink_excluded`.

The verdict names both mismatches when an adapter forgets them ("a base-2 LSE", "the sink
left out of the LSE").
"""

from __future__ import annotations

import math

import torch


def lse_from_base2(lse: torch.Tensor) -> torch.Tensor:
    """log2(sum exp) -> ln(sum exp); -inf stays -inf."""
    return lse * math.log(2.0)


def lse_from_sink_excluded(lse: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """FlashMLA's (B, Hq, T) LSE without the sink, +inf where a row has no key -> fmha's."""
    lse = lse.masked_fill(torch.isposinf(lse), -math.inf)
    if sink is None:
        return lse
    return torch.logaddexp(lse, sink.to(lse.dtype).view(1, -1, 1))
