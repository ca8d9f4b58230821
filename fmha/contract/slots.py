"""Where a paged cache holds a key (contract v2, docs/contract.md): logical key j of request b
is slot block_table[b, j // block_size] * block_size + j % block_size of the cache's
(num_blocks * block_size) slots; index-sparse calls name slots directly. The one place this
arithmetic is written outside a kernel."""

from __future__ import annotations

import torch


def slot(page, offset, block_size: int):
    """The flat slot of `offset` in page `page` (tensors or ints)."""
    return page * block_size + offset


def page_and_offset(slots, block_size: int):
    """The page and the offset in it of each flat slot."""
    return slots // block_size, slots % block_size


def request_slots(block_table_row, kv_len: int, block_size: int) -> torch.Tensor:
    """The flat slots of logical keys 0 .. kv_len - 1 of one request, given its block-table
    row (a tensor or a list of page numbers)."""
    row = torch.as_tensor(block_table_row).long()
    j = torch.arange(kv_len, device=row.device)
    return slot(row[j // block_size], j % block_size, block_size)
