"""The FlashInfer and vLLM adapters on the CPU tier: each one's conventions (FlashInfer's CSR
page table, base-2 LSE and window_left; vLLM's packed queries, window_size and sinks) checked
against a stand-in that follows the library's documented API: it rebuilds each request's keys
from the library's own page-table format and runs the dense float64 reference on them. Random
paged and ragged draws inside each adapter's capabilities are judged against the oracle; the
same adapter with one convention left untranslated fails; without the library, each kernel is
listed with how to install it."""

import dataclasses
import importlib.util
import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from fmha.adapters import conventions, flashinfer, vllm
from fmha.contract import KernelEntry, Problem
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import reference
from fmha.oracles.sample import Sample
from fmha.properties.paged_strategies import paged_samples

pytestmark = pytest.mark.cpu_tier  # stand-ins on the CPU


def _keys(cache, pages, n: int, page_size: int):
    """A request's first n keys, read through its list of pages: (1, n, Hkv, D)."""
    j = torch.arange(n)
    return cache.flatten(0, 1)[pages.long()[j // page_size] * page_size + j % page_size][None]


def _dense(q, k, v, scale, causal, window, sink=None):
    """One request, dense: q (1, T, Hq, D) against its n keys."""
    if k.shape[1] == 0:  # no key: o = 0 (FlashInfer's page table cannot say this; vLLM's can)
        return torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype), torch.full((1, q.shape[2], q.shape[1]), -math.inf)
    return reference(q, k, v, scale=scale, causal=causal, window=window, sink=sink)


class _FlashInferWrapper:
    """BatchDecodeWithPagedKVCacheWrapper / BatchPrefillWithPagedKVCacheWrapper as FlashInfer
    0.7 documents them: NHD caches as a (k, v) tuple, a CSR page table with 1 <= last_page_len
    <= page_size, window_left keys left of the current one, the LSE in base 2 as (rows, Hq)."""

    def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, prefill=False):
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
        self.prefill = prefill

    def plan(self, *args, causal=False, window_left=-1, q_data_type=torch.float16, kv_data_type=None, sm_scale=None,
             **unused):
        if self.prefill:
            qo_indptr, *args = args
            self.qo_indptr = qo_indptr.tolist()
        indptr, indices, last_page_len, self.heads_q, self.heads_kv, self.head_dim, self.page_size = args
        for t in (indptr, indices, last_page_len):
            assert t.dtype == torch.int32
        pages = indptr.diff()
        assert ((pages == 0) | ((last_page_len >= 1) & (last_page_len <= self.page_size))).all(), last_page_len
        self.indptr, self.indices, self.last = indptr.tolist(), indices, last_page_len.tolist()
        self.causal = causal or not self.prefill  # decode: the row is the request's last
        self.window = window_left + 1 if window_left >= 0 else None
        self.scale, self.dtype = sm_scale, q_data_type

    def run(self, q, paged_kv_cache, return_lse=False):
        k_cache, v_cache = paged_kv_cache
        assert q.dtype == self.dtype and q.dim() == 3 and q.shape[1:] == (self.heads_q, self.head_dim)
        rows = self.qo_indptr if self.prefill else list(range(q.shape[0] + 1))
        outputs, lses = [], []
        for b in range(len(self.indptr) - 1):
            pages = self.indices[self.indptr[b]:self.indptr[b + 1]]
            n = (len(pages) - 1) * self.page_size + self.last[b] if len(pages) else 0
            o, lse = _dense(q[rows[b]:rows[b + 1]][None], _keys(k_cache, pages, n, self.page_size),
                            _keys(v_cache, pages, n, self.page_size), self.scale, self.causal, self.window)
            outputs.append(o[0])
            lses.append(lse[0].transpose(0, 1))
        return torch.cat(outputs), torch.cat(lses) / math.log(2.0)


def _flashinfer_standin():
    return types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=_FlashInferWrapper,
        BatchPrefillWithPagedKVCacheWrapper=lambda *a, **k: _FlashInferWrapper(*a, **k, prefill=True))


def _unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                       window_size, block_table, softcap, q_descale, k_descale, v_descale, sinks=None, **unused):
    """vLLM's unified_attention as its source reads: causal only, packed queries, each
    request's queries the last of its seqused_k keys, window_size[0] keys left of the current
    one, sinks (Hq,) in the denominator; it writes out."""
    assert causal and softcap == 0 and q_descale is None and q.dim() == 3 and out.shape[:2] == q.shape[:2]
    assert cu_seqlens_q.dtype == seqused_k.dtype == block_table.dtype == torch.int32
    assert window_size[0] == -1 or window_size[1] == 0
    starts, page_size = cu_seqlens_q.tolist(), k.shape[1]
    for b, n in enumerate(seqused_k.tolist()):
        rows = slice(starts[b], starts[b + 1])
        assert starts[b + 1] - starts[b] <= max_seqlen_q and n <= max_seqlen_k
        o, _ = _dense(q[rows][None], _keys(k, block_table[b], n, page_size), _keys(v, block_table[b], n, page_size),
                      softmax_scale, True, window_size[0] + 1 if window_size[0] >= 0 else None, sinks)
        out[rows] = o[0]


def _on_the_cpu(caps):
    return dataclasses.replace(caps, devices=("cpu",))


FI_DECODE = KernelEntry(name="flashinfer-decode-standin", capabilities=_on_the_cpu(flashinfer.DECODE),
                        fn=flashinfer.decode_with(_on_the_cpu(flashinfer.DECODE), library=_flashinfer_standin))
FI_PREFILL = KernelEntry(name="flashinfer-prefill-standin", capabilities=_on_the_cpu(flashinfer.PREFILL),
                         fn=flashinfer.prefill_with(_on_the_cpu(flashinfer.PREFILL), library=_flashinfer_standin))
VLLM = KernelEntry(name="vllm-unified-standin", capabilities=_on_the_cpu(vllm.CAPABILITIES),
                   fn=vllm.unified_with(_on_the_cpu(vllm.CAPABILITIES),
                                        library=lambda: types.SimpleNamespace(unified_attention=_unified_attention)))
STANDINS = {"flashinfer-decode": FI_DECODE, "flashinfer-prefill": FI_PREFILL, "vllm-unified": VLLM}

PAGED = Problem(batch=3, q_len=1, kv_len=37, heads_q=8, heads_kv=2, head_dim=64, source="paged", block_size=16,
                causal=True)
CASES = {  # (kernel, sample): what each convention is seen on
    "decode-gqa": (FI_DECODE, Sample(problem=PAGED, kv_lens=(37, 5, 16))),
    "decode-window": (FI_DECODE, Sample(problem=PAGED.replace(window=7), kv_lens=(37, 9, 16))),
    "prefill-causal": (FI_PREFILL, Sample(problem=PAGED.replace(q_len=4), kv_lens=(37, 5, 16))),
    "prefill-packed-window": (FI_PREFILL, Sample(problem=PAGED.replace(q_len=4, window=3, ragged=True),
                                                 q_lens=(4, 0, 2), kv_lens=(37, 5, 16))),
    "prefill-no-mask": (FI_PREFILL, Sample(problem=PAGED.replace(q_len=3, causal=False), kv_lens=(37, 5, 16))),
    "vllm-packed-sink": (VLLM, Sample(problem=PAGED.replace(q_len=4, ragged=True, sink=True), q_lens=(1, 4, 0),
                                      kv_lens=(37, 5, 16))),
    "vllm-window": (VLLM, Sample(problem=PAGED.replace(q_len=2, window=5), kv_lens=(37, 5, 16))),
}


@pytest.mark.parametrize("name", CASES)
def test_conventions_are_translated(name):
    kernel, sample = CASES[name]
    verdict = check_sample(kernel, sample, "cpu")
    assert verdict.passed, verdict.message()


@pytest.mark.parametrize("name", STANDINS)
def test_random_calls_inside_the_capabilities_agree_with_the_oracle(name):
    kernel = STANDINS[name]

    @settings(max_examples=8, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sample=paged_samples(kernel.capabilities, "cpu", kinds=("paged",)))
    def agrees(sample):
        verdict = check_sample(kernel, sample, "cpu")
        assert verdict.passed, verdict.message()

    agrees()


@pytest.mark.parametrize("name, module, attribute, untranslated, expected", [
    ("decode-gqa", flashinfer, "lse_from_base2", lambda lse: lse, "lse: "),
    ("decode-window", flashinfer, "keys_left_of_current", lambda w: w, "cosine: "),
    ("prefill-packed-window", flashinfer, "keys_left_of_current", lambda w: w, "cosine: "),
    ("vllm-window", vllm, "keys_left_of_current", lambda w: -1 if w is None else w, "cosine: "),
])
def test_a_convention_left_untranslated_fails(monkeypatch, name, module, attribute, untranslated, expected):
    monkeypatch.setattr(module, attribute, untranslated)
    kernel, sample = CASES[name]
    verdict = check_sample(kernel, sample, "cpu")
    assert not verdict.passed and any(f.startswith(expected) for f in verdict.failures), verdict.message()


def test_the_csr_page_table():
    """Request 0: 5 keys on pages 3, 1, 7 (the last holds 1); request 1: none; request 2: a full page."""
    block_table = torch.tensor([[3, 1, 7, 9], [2, 0, 0, 0], [4, 5, 0, 0]], dtype=torch.int32)
    indptr, indices, last = conventions.csr_page_table(block_table, torch.tensor([5, 0, 2], dtype=torch.int32), 2)
    assert indptr.tolist() == [0, 3, 3, 4] and indices.tolist() == [3, 1, 7, 4] and last.tolist() == [1, 0, 2]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_windows_count_the_keys_left_of_the_current_one():
    assert [conventions.keys_left_of_current(w) for w in (None, 1, 128)] == [-1, 0, 127]


@pytest.mark.parametrize("entry", [*flashinfer.ENTRIES, *vllm.ENTRIES], ids=lambda e: e.name)
def test_without_the_library_the_kernel_is_listed_with_how_to_get_it(entry):
    module = flashinfer if entry.name.startswith("flashinfer") else vllm
    library = "flashinfer" if module is flashinfer else "vllm"
    if importlib.util.find_spec(library) is not None:
        pytest.skip(f"{library} is installed here")
    assert entry.not_supported_reasons(PAGED, "cuda") == [module.INSTALL]
    assert "pip install" in module.INSTALL
