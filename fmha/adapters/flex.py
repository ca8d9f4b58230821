"""FlexAttention adapted to the fmha contract.

The contract's bottom-right causal and window masks become a block mask; GQA uses Flex's
`enable_gqa`. On CUDA Flex returns the LSE, and the sink is added from it afterwards
(o *= exp(lse - L), L = logaddexp(lse, sink)). Flex works in base-2 internally but returns
the natural-log LSE. On the CPU, Inductor's C++ backend compiles it (about 20 s the first
time), without LSE. torch.compile builds a kernel per shape (10-270 s each on an H200's
runner), which alone took a cold GPU run of the suite past its budget, so Flex is
in no default selection: pass `--fmha-kernel flex` (the nightly workflow does). A shape for
which Inductor finds no kernel (NoValidChoicesError: fp16/fp32 head dim 64 with 32 query rows
on one KV head, torch 2.11) is a NotSupportedError carrying Inductor's reason.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from fmha.contract import Capabilities, KernelEntry
from fmha.contract import NotSupportedError, check_attention_args, plain_scalars
from fmha.adapters.conventions import keys_some_row_sees
from fmha.kernels.torch_merge import add_sink

POWERS_OF_TWO = (16, 32, 64, 128, 256, 512)


@functools.cache
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def _block_mask(q_len: int, kv_len: int, window: int | None, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = kv_len - q_len  # query row i sits at position S - T + i

    def visible(b, h, row, col):
        causal = col <= row + offset
        if window is None:
            return causal
        return causal & (col > row + offset - window)

    return create_block_mask(visible, None, None, q_len, kv_len, device=device)


def flex(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
    device = q.device.type
    check_attention_args(
        q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
        capabilities=ENTRY.capabilities_on(device),
    )
    scale, causal, window = plain_scalars(scale, causal, window)
    k, v = keys_some_row_sees(k, v, q.shape[1], window)  # a partly masked block's values still enter P.V
    block_mask = _block_mask(q.shape[1], k.shape[1], window, str(q.device)) if causal or window else None
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    with torch.no_grad(), _no_valid_choice_is_not_supported():
        if device == "cpu":
            o = _compiled()(qh, kh, vh, block_mask=block_mask, scale=scale, enable_gqa=True)
            return o.transpose(1, 2), None
        o, lse = _compiled()(qh, kh, vh, block_mask=block_mask, scale=scale, enable_gqa=True, return_lse=True)
    o = o.transpose(1, 2)
    return add_sink(o, lse, sink)


@contextlib.contextmanager
def _no_valid_choice_is_not_supported():
    """Inductor with no kernel for a shape is Flex not supporting it, not a wrong answer."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 -- torch._inductor.exc.InductorError, matched by its text
        if "NoValidChoicesError" not in str(e):
            raise
        raise NotSupportedError(f"Inductor lowered Flex to no kernel for this shape: {str(e).strip().splitlines()[0]}") from e


ENTRY = KernelEntry(
    name="flex",
    fn=flex,
    capabilities=Capabilities(
        head_dims=POWERS_OF_TWO,
        features=frozenset({"causal", "window", "sink", "lse", "gqa", "shared_kv"}),
        notes={"head_dim": "Flex wants power-of-two head dims", "out": "the adapter does not take out="},
    ),
    device_capabilities={
        "cpu": Capabilities(
            head_dims=POWERS_OF_TWO,
            features=frozenset({"causal", "window", "gqa", "shared_kv"}),
            notes={"lse": "torch.compile of Flex on CPU does not return the LSE (torch 2.13)",
                   "sink": "needs the LSE, which Flex on CPU does not return",
                   "out": "the adapter does not take out="},
        )
    },
    default_devices=(),
    description="torch FlexAttention (compiled: Triton on CUDA, C++ on CPU)",
)
ENTRIES = [ENTRY]
