"""A failure names its likely cause where the numbers alone would not: an output written in
the wrong order whose shape happens to fit (T == Hq), an LSE-only bug, and the requests of a
paged call that are wrong named with what they share. The kernels are throwaway eager plug-ins."""

import torch

from fmha.contract import Capabilities, FEATURES, KernelEntry, Problem
from fmha.oracles import reference
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, reference as reference_kernel
from fmha.oracles.sample import Sample
from fmha.regressions.mutants import MUTANTS

DENSE = Capabilities(features=frozenset(FEATURES) - {"out"})
SQUARE = Sample(problem=Problem(batch=2, q_len=4, kv_len=33, heads_q=4, heads_kv=2, head_dim=32, causal=True))
NO_KEY_ROWS = Sample(problem=Problem(batch=1, q_len=6, kv_len=4, heads_q=2, heads_kv=1, head_dim=32, causal=True,
                                     sink=True))


def _hints(kernel, sample):
    if not isinstance(kernel, KernelEntry):
        kernel = KernelEntry(name=kernel.__name__, fn=kernel, capabilities=DENSE)
    verdict = check_sample(kernel, sample)
    assert not verdict.passed
    return verdict.hints


def test_an_output_written_head_major_is_named_though_its_shape_fits():
    def head_major(q, k, v, **kwargs):
        o, lse = reference.attention(q, k, v, **kwargs)
        return o.transpose(1, 2).reshape(o.shape).to(q.dtype), lse.float()  # (B, Hq, T, D) memory as (B, T, Hq, D)

    assert any("output matches the output written head-major" in h for h in _hints(head_major, SQUARE))


def test_an_lse_written_rows_first_is_named():
    def rows_first(q, k, v, **kwargs):
        o, lse = reference.attention(q, k, v, **kwargs)
        return o.to(q.dtype), lse.transpose(-1, -2).reshape(lse.shape).float()

    assert any("lse is the contract's written in (B, T, Hq) order" in h for h in _hints(rows_first, SQUARE))


def test_the_sink_left_out_of_rows_without_keys_is_named_where_only_the_lse_is_wrong():
    def sink_only_where_keys(q, k, v, *, sink=None, **kwargs):
        o, lse = reference.attention(q, k, v, sink=sink, **kwargs)
        no_key = torch.isneginf(reference.attention(q, k, v, **kwargs)[1])
        return o.to(q.dtype), lse.masked_fill(no_key, float("-inf")).float()

    hints = _hints(sink_only_where_keys, NO_KEY_ROWS)
    assert any("lse is -inf in" in h and "the sink left out where a row has no key" in h for h in hints), hints


def test_the_wrong_requests_of_a_paged_call_are_named_with_what_they_share():
    mutant = MUTANTS["full-last-page-reads-next"].kernel()
    sample = Sample(problem=Problem(batch=4, q_len=1, kv_len=20, heads_q=2, heads_kv=1, head_dim=32, source="paged",
                                    block_size=5), kv_lens=(10, 7, 20, 13))
    hints = _hints(mutant, sample)
    assert any("requests 0, 2 of 4" in h and "fill their last page exactly (keys a multiple of the block size 5)" in h
               for h in hints), hints
    assert check_sample(KernelEntry(name="reference", fn=reference_kernel, capabilities=CAPABILITIES), sample).passed
