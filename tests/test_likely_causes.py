"""Every likely cause the README names, each planted alone in a plain-torch kernel: the failure
leads with that cause and names no other cause of the table. A bug given another bug's cause
sends its author the wrong way, which is worse than no cause.

The planted kernels compute in float64 from their own arithmetic (not the diagnoser's wrong
references), so a cause is found from what a kernel does, not from the code that names it."""

import math

import pytest
import torch

from fmha.contract import Capabilities, FEATURES, KernelEntry, Problem
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, reference
from fmha.oracles.sample import Sample
from fmha.regressions.mutants import MUTANTS


def _tf32_truncated(t: torch.Tensor) -> torch.Tensor:
    """fp32 with the 13 low mantissa bits dropped (a TF32 unit's operand, toward zero)."""
    return (t.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32).double()


def _attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, bug=""):
    """The contract's attention with one `bug` planted."""
    if bug == "strides ignored":  # q read at a packed tensor's offsets over its storage
        packed = torch.empty(q.shape).stride()
        q = torch.as_strided(q, q.shape, packed, q.storage_offset())
    B, T, H, D = q.shape
    S, Hkv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    heads = torch.arange(H) % Hkv if bug == "interleaved heads" else torch.arange(H) // (H // Hkv)
    q, k, v = q.double(), k.double()[:, :, heads], v.double()[:, :, heads]
    if bug == "tf32":
        q, k, v = map(_tf32_truncated, (q, k, v))
    s = torch.einsum("bthd,bshd->bhts", q, k)
    if bug == "16-bit q.k":
        s = s.bfloat16().double()
    s = s * (1.0 if bug == "scale not applied" else D**-0.5 if scale is None or bug == "scale ignored" else scale)
    row = torch.arange(T)[:, None] + (0 if bug == "top-left causal" else S - T)
    key = torch.arange(S)[None, :]
    visible = torch.ones(T, S, dtype=torch.bool)
    if causal or window:
        visible &= key <= row
    if window:
        visible &= key > row - window - {"window too wide": 1, "window too narrow": -1}.get(bug, 0)
    if bug != "values left of the window read":  # keys no row sees may hold NaN: never multiply them
        v = v.masked_fill(~visible.any(0)[None, :, None, None], 0.0)
    masked = s.masked_fill(~visible, -math.inf)
    if sink is not None and bug != "sink ignored":
        column = sink.double().view(1, H, 1, 1).expand(B, H, T, 1)
        s, masked = torch.cat([s, column], -1), torch.cat([masked, column], -1)
    m = (s.nan_to_num(nan=-math.inf) if bug == "max before mask" else masked).amax(-1, keepdim=True)
    m = m.nan_to_num(neginf=0.0)
    e = torch.exp(masked - m)
    z = e.sum(-1, keepdim=True)
    p = e / z.clamp(min=1e-300)
    if bug == "normalized twice":
        p = p / z.clamp(min=1e-300)
    o = torch.einsum("bhts,bshd->bthd", p[..., :S], v)
    lse = (m + z.log()).squeeze(-1)
    if bug == "lse without the sink" and sink is not None:
        lse = torch.logsumexp(masked[..., :S], -1)
    if bug == "base-2 lse":
        lse = lse / math.log(2)
    if bug == "lse rows first":
        lse = lse.transpose(1, 2).reshape(lse.shape)
    if bug == "sink left out where a row sees no key":
        lse = lse.masked_fill(~visible.any(-1), -math.inf)
    if bug == "output head-major":
        o = o.transpose(1, 2).reshape(o.shape)
    if bug == "value tail dropped":
        o[..., min(D, Dv):] = 0
    o = o.to(q.dtype if bug == "tf32" else torch.bfloat16 if out is None else out.dtype)
    if out is not None:
        rows = T - 1 if bug == "out tail unwritten" else T
        out[:, :rows] = o[:, :rows]
        o = out
    return o, lse.float()


def _problem(**fields) -> Problem:
    return Problem(**{"batch": 2, "q_len": 4, "kv_len": 40, "heads_q": 4, "heads_kv": 2, "head_dim": 32, **fields})


# The README's causes (and the first hour's four), each: the bug, a call it shows on, the words its
# hint must lead with. Every other row's words are a wrong cause for it.
CAUSES = {
    "top-left causal": (Sample(problem=_problem(causal=True)), "top-left causal alignment"),
    "scale not applied": (Sample(problem=_problem()), "scale not applied"),
    "scale ignored": (Sample(problem=_problem(), scale=0.3), "the scale argument ignored"),
    "sink ignored": (Sample(problem=_problem(sink=True)), "sink ignored"),
    "window too wide": (Sample(problem=_problem(window=7)), "window one key too wide"),
    "window too narrow": (Sample(problem=_problem(window=7)), "window one key too narrow"),
    "interleaved heads": (Sample(problem=_problem(heads_q=8)), "query head h reading KV head h % Hkv"),
    "output head-major": (Sample(problem=_problem()), "the output written head-major"),
    "base-2 lse": (Sample(problem=_problem()), "base-2 LSE (FlashInfer's)"),
    "lse without the sink": (Sample(problem=_problem(sink=True)), "lse leaves the sink out (FlashMLA's convention)"),
    "lse rows first": (Sample(problem=_problem()), "lse is the contract's written in (B, T, Hq) order"),
    "sink left out where a row sees no key": (Sample(problem=_problem(q_len=6, kv_len=4, causal=True, sink=True)),
                                              "the sink left out where a row has no key"),
    "normalized twice": (Sample(problem=_problem()), "normalised twice"),
    "out tail unwritten": (Sample(problem=_problem()), "the kernel skips part of out="),
    "tf32": (Sample(problem=_problem(dtype=torch.float32)), "fp32 inputs computed at TF32 precision"),
    "16-bit q.k": (Sample(problem=_problem(), distribution="peaky"), "q.k accumulated or held in 16 bits"),
    "strides ignored": (Sample(problem=_problem(), q_storage="strided"), "mishandles non-contiguous storage"),
    "value tail dropped": (Sample(problem=_problem(head_dim_v=48)), "mishandles Dv != D"),
    "max before mask": (Sample(problem=_problem(window=7), distribution="large_logits"),
                        "the row max taken before the mask"),
    "values left of the window read": (Sample(problem=_problem(window=7), hazards=("invisible-keys",)),
                                       "left of every row's window, which no row may read"),
}


def _planted(bug: str) -> KernelEntry:
    def kernel(q, k, v, **kwargs):
        return _attention(q, k, v, bug=bug, **kwargs)

    return KernelEntry(name=bug.replace(" ", "-"), fn=kernel, capabilities=Capabilities(features=frozenset(FEATURES)))


def test_the_planted_kernel_is_correct_without_a_bug():
    kernel = _planted("")
    for bug, (sample, _) in CAUSES.items():
        verdict = check_sample(kernel, sample)
        assert verdict.passed, (bug, verdict.message())


@pytest.mark.parametrize("bug", CAUSES)
def test_a_bug_leads_with_its_own_cause_and_names_no_other(bug):
    sample, words = CAUSES[bug]
    verdict = check_sample(_planted(bug), sample)
    assert not verdict.passed, f"{bug}: the planted bug passed on {sample}"
    assert verdict.hints and words in verdict.hints[0], (bug, verdict.hints)
    wrong = [other for other, (_, said) in CAUSES.items() if other != bug and any(said in h for h in verdict.hints)]
    assert not wrong, (bug, wrong, verdict.hints)


def test_the_wrong_requests_of_a_paged_call_are_named_with_what_they_share():
    sample = Sample(problem=Problem(batch=4, q_len=1, kv_len=20, heads_q=2, heads_kv=1, head_dim=32, source="paged",
                                    block_size=5), kv_lens=(10, 7, 20, 13))
    verdict = check_sample(MUTANTS["full-last-page-reads-next"].kernel(), sample)
    assert any("requests 0, 2 of 4" in h and "fill their last page exactly (keys a multiple of the block size 5)" in h
               for h in verdict.hints), verdict.hints
    assert check_sample(KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES), sample).passed
