"""Kernels with FlashMLA's LSE convention (the sink left out, +inf for a row with no key) and
FlashInfer's (base 2): unadapted, the verdict fails and names the convention; through
`fmha.adapters.conventions` they pass. The kernels are throwaway eager plug-ins."""

import math

import pytest
import torch

from fmha.adapters import conventions
from fmha.contract import Capabilities, KernelEntry
from fmha.oracles import dense_reference
from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.contract import FEATURES, Problem


def flashmla_style(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
    """Attention as FlashMLA returns it: o scaled by exp(lse) / (exp(lse) + exp(sink)), the
    LSE without the sink and +inf where a row sees no key."""
    o, lse = dense_reference.attention(q, k, v, scale=scale, causal=causal, window=window)
    if sink is not None:
        o = o * torch.sigmoid(lse - sink.double().view(1, -1, 1)).transpose(1, 2)[..., None]
    return o.to(q.dtype), lse.masked_fill(torch.isneginf(lse), math.inf).float()


def flashinfer_style(q, k, v, **kwargs):
    o, lse = dense_reference.attention(q, k, v, **{n: a for n, a in kwargs.items() if n != "out"})
    return o.to(q.dtype), (lse / math.log(2)).float()


def adapted_flashmla(q, k, v, *, sink=None, **kwargs):
    o, lse = flashmla_style(q, k, v, sink=sink, **kwargs)
    return o, conventions.lse_from_sink_excluded(lse, sink)


def adapted_flashinfer(q, k, v, **kwargs):
    o, lse = flashinfer_style(q, k, v, **kwargs)
    return o, conventions.lse_from_base2(lse)


WITH_SINK = Sample(problem=Problem(batch=2, q_len=3, kv_len=40, heads_q=4, heads_kv=2, head_dim=64, causal=True,
                                   sink=True), seed=1)
EMPTY_ROWS = Sample(problem=Problem(batch=1, q_len=6, kv_len=4, heads_q=2, heads_kv=1, head_dim=64, causal=True), seed=2)


def _entry(fn):
    return KernelEntry(name=fn.__name__, fn=fn, capabilities=Capabilities(features=frozenset(FEATURES) - {"out"}))


@pytest.mark.parametrize("sample, hint", [(WITH_SINK, "lse leaves the sink out (FlashMLA's convention)"),
                                          (EMPTY_ROWS, "FlashMLA's mark of a row with no key")],
                         ids=["sink", "empty-rows"])
def test_flashmlas_lse_fails_naming_the_convention_and_passes_adapted(sample, hint):
    verdict = check_sample(_entry(flashmla_style), sample)
    assert not verdict.passed and any(hint in h and "lse_from_sink_excluded" in h for h in verdict.hints), \
        verdict.message()
    assert check_sample(_entry(adapted_flashmla), sample).passed


def test_flashinfers_base2_lse_fails_naming_the_convention_and_passes_adapted():
    verdict = check_sample(_entry(flashinfer_style), WITH_SINK)
    assert not verdict.passed and any("base-2 LSE (FlashInfer's)" in h for h in verdict.hints), verdict.message()
    assert check_sample(_entry(adapted_flashinfer), WITH_SINK).passed
    assert check_sample(_entry(adapted_flashinfer), EMPTY_ROWS).passed


def test_the_sink_excluded_translation_on_hand_values():
    lse = torch.tensor([[[0.0, math.inf]]])  # (B=1, H=1, T=2): a row with keys, a row with none
    assert conventions.lse_from_sink_excluded(lse, None).tolist() == [[[0.0, -math.inf]]]
    got = conventions.lse_from_sink_excluded(lse, torch.tensor([0.0]))
    assert got.tolist() == [[[torch.tensor(2.0).log().item(), 0.0]]]  # log(e^0 + e^0) in fp32; no key: the sink
