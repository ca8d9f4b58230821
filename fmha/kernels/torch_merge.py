"""D5 merge of partial attention results in eager PyTorch (float32 math).

    L = log(sum_i exp(lse_i) + exp(sink));  o = sum_i exp(lse_i - L) * o_i

Parts cover disjoint key sets and carry no sink. Empty parts (lse = -inf) add nothing; when
every part is empty o = 0 and L = -inf (or the sink), never NaN.
"""

from __future__ import annotations

import torch

from fmha.contract import check_merge_args


def merge(parts, sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, H, _ = check_merge_args(parts, sink)
    lses = torch.stack([lse for _, lse in parts])  # (P, B, H, T)
    if sink is not None:
        lses = torch.cat([lses, sink.view(1, 1, H, 1).expand(1, B, H, T)])
    total = torch.logsumexp(lses, dim=0)
    # exp(-inf - (-inf)) is NaN; with every part empty each weight must be 0 instead.
    finite_total = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
    o = 0
    for o_i, lse_i in parts:
        weight = torch.exp(lse_i - finite_total).transpose(1, 2)[..., None]
        o = o + torch.where(weight > 0, weight * o_i.float(), 0.0)  # an empty part's o may hold NaN
    return torch.as_tensor(o).to(parts[0][0].dtype), total


def add_sink(o: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor | None):
    """Attention without a sink -> with it: a merge with the sink as the only other part."""
    return (o, lse) if sink is None else merge([(o, lse)], sink)
