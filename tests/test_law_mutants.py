"""Each metamorphic law catches a kernel with a realistic bug, and hypothesis shrinks the
counterexample to a small sample. The buggy kernels are throwaway eager plug-ins written here;
they make both promises (bitwise determinism, batch invariance), as the correct one keeps them."""

import itertools
import math
import re

import pytest
import torch
from hypothesis import settings

from fmha.capabilities import Capabilities, KernelEntry, MergeEntry
from fmha.contract import check_merge_args
from fmha.merge_torch import merge as correct_merge
from fmha.oracles.sample import Sample
from fmha.problem import Problem
from fmha.properties import laws
from fmha.properties.strategies import samples

pytestmark = pytest.mark.cpu_tier  # eager mutants on the CPU: nightly on CUDA

FIND_AND_SHRINK = settings(max_examples=80, derandomize=True, database=None, deadline=None, report_multiple_bugs=False)
_calls = itertools.count()


def eager(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, bug=None):
    """A plain float32 attention, one batch row at a time (so rows do not depend on the batch
    size); `bug` switches on one realistic mistake."""
    if bug == "batch_max" or q.shape[0] == 1:
        return _eager(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out, bug=bug)
    rows = [_eager(q[b:b + 1], k[b:b + 1], v[b:b + 1] if v is not k else k[b:b + 1], scale=scale, causal=causal,
                   window=window, sink=sink, bug=bug) for b in range(q.shape[0])]
    o, lse = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


def _eager(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, bug=None):
    B, T, H, D = q.shape
    S, group = k.shape[1], H // k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    if bug == "prescale_k_in_place" and 0 not in k.stride():  # saves a multiply per logit, and scales v too
        k.mul_(scale)                                           # when k is v (a broadcast k cannot be written)
        scale = 1.0
    position = torch.arange(S)
    if bug == "random_key_order":  # like an atomics-based reduction: the order alternates per call
        position = torch.arange(S) if next(_calls) % 2 else torch.arange(S).flip(0)
        k, v = k[:, position], v[:, position]
    head = torch.arange(H) % k.shape[2] if bug == "head_modulo" else torch.arange(H) // group
    keys = (v if bug == "logits_from_v" else k).float()[:, :, head]  # "K = V", assumed
    values = v.float()[:, :, head]
    s = torch.einsum("bthd,bshd->bhts", q.float(), keys) * (1.0 if bug == "no_scale" else scale)
    if bug == "positional_bias":  # an ALiBi slope left on
        s = s + 0.05 * position.float()
    row = torch.arange(T)[:, None] + (0 if bug == "top_left" else S - T)
    col = position[None, :]
    visible = torch.ones(T, S, dtype=torch.bool)
    if causal or window is not None:
        visible &= col <= row
    if window is not None:
        visible &= col > row - (min(window, 256) if bug == "window_capped" else window)
    if bug != "nan_leak":  # keys nobody sees are dropped, not multiplied by a zero weight
        values = torch.where(visible.any(0)[None, :, None, None], values, 0.0)
    s = s.masked_fill(~visible, -math.inf)
    m = s.amax(dim=(0, -1) if bug == "batch_max" else -1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.view(1, -1, 1, 1))
    m = m.nan_to_num(neginf=0.0)
    e = torch.exp(s - m)
    denominator = e.sum(-1, keepdim=True)
    if sink is not None:
        sink_term = sink.view(1, -1, 1, 1) if bug == "sink_added_not_exp" else torch.exp(sink.view(1, -1, 1, 1) - m)
        denominator = denominator + sink_term
    p = e / torch.where(denominator == 0, 1.0, denominator)
    o = torch.einsum("bhts,bshd->bthd", p, values).to(q.dtype)
    lse = torch.where(denominator == 0, -math.inf, m + torch.log(denominator)).squeeze(-1)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse


PROMISING = Capabilities(promises=frozenset({"bitwise_deterministic", "batch_invariant"}))


def mutant(bug: str, capabilities: Capabilities = PROMISING) -> KernelEntry:
    return KernelEntry(name=f"eager-{bug}", fn=lambda *a, **kw: eager(*a, bug=bug, **kw), capabilities=capabilities)


def max_instead_of_logsumexp(parts, sink=None):
    """A D5 merge that takes L = max(lse_i) instead of log(sum exp(lse_i))."""
    check_merge_args(parts, sink)
    lses = torch.stack([lse for _, lse in parts])
    top = lses.amax(0)
    o = sum(torch.exp(lse - top).transpose(1, 2)[..., None] * o.float() for o, lse in parts)
    return o.to(parts[0][0].dtype), top


BROKEN_MERGE = MergeEntry("max-merge", max_instead_of_logsumexp)
CORRECT_MERGE = MergeEntry("torch-merge", correct_merge)
CORRECT = mutant(None)

# law -> (operands of the law, the bug)
CASES = {
    "agrees_with_oracle": ((mutant("no_scale"),), "missing 1/sqrt(D)"),
    "invisible_keys_do_not_leak": ((mutant("nan_leak"),), "0 * NaN from keys nobody sees"),
    "key_permutation_invariant": ((mutant("positional_bias"),), "a positional bias left on"),
    "linear_in_v": ((mutant("logits_from_v"),), "logits read from V (K = V assumed)"),
    "gqa_equals_mha_with_repeated_kv": ((mutant("head_modulo"),), "query head h -> KV head h % Hkv"),
    "k_is_v_equals_copies": ((mutant("prescale_k_in_place"),), "k scaled in place"),
    "batch_rows_independent": ((mutant("batch_max"),), "softmax max over the whole batch"),
    "deterministic": ((mutant("random_key_order"),), "reduction order changes per call"),
    "decode_row_equals_last_prefill_row": ((mutant("top_left"),), "top-left causal alignment"),
    "minus_infinity_sink_is_no_sink": ((mutant("sink_added_not_exp"),), "sink added, not exp(sink)"),
    "window_at_least_s_is_causal": ((mutant("window_capped"),), "window capped at 256 keys"),
    "split_keys_merge_to_the_whole": ((CORRECT, BROKEN_MERGE), "merge takes max(lse), not logsumexp"),
    "merge_algebra": ((BROKEN_MERGE,), "merge takes max(lse), not logsumexp"),
}


def _pinned_sample(error: BaseException) -> Sample:
    notes = "\n".join(getattr(error, "__notes__", []))
    found = re.search(r"@example\(sample=(Sample\(.*\))\)", notes)
    assert found, f"no @example line in the failure output:\n{notes}"
    return eval(found.group(1), {"Sample": Sample, "Problem": Problem, "torch": torch})


@pytest.mark.parametrize("law_name", CASES)
def test_the_law_catches_its_mutant_with_a_small_counterexample(law_name):
    operands, bug = CASES[law_name]
    strategy = samples(CORRECT.capabilities, "cpu")
    with pytest.raises(AssertionError) as caught:
        laws.run_law(getattr(laws, law_name), strategy, *operands, device="cpu", settings=FIND_AND_SHRINK)
    sample = _pinned_sample(caught.value)
    p = sample.problem
    work = p.batch * p.heads_q * p.q_len * p.kv_len * p.head_dim  # 1% of the CPU budget, or less
    assert work <= 2e5, f"{bug}: the shrunk counterexample is not small: {sample}"


@pytest.mark.parametrize("law_name", CASES)
def test_the_correct_eager_kernel_obeys_the_law(law_name):
    operands, _ = CASES[law_name]
    fixed = tuple(CORRECT if isinstance(o, KernelEntry) else CORRECT_MERGE for o in operands)
    laws.run_law(getattr(laws, law_name), samples(CORRECT.capabilities, "cpu"), *fixed, device="cpu",
                 settings=settings(max_examples=10, derandomize=True, database=None, deadline=None))


@pytest.mark.parametrize("law_name, bug", [("batch_rows_independent", "batch_max"), ("deterministic", "random_key_order")])
def test_a_kernel_that_makes_no_promise_is_held_to_the_verdict_and_one_that_does_bitwise(law_name, bug):
    """The same bits-only bug (a softmax max over the whole batch; a key order that changes per
    call) passes the law where the kernel promises nothing, and fails it where it promises."""
    law = getattr(laws, law_name)
    quick = settings(max_examples=10, derandomize=True, database=None, deadline=None)
    # N(0, 1) logits: the batch-wide max leaves every exp in range, so the values stay right
    strategy = samples(PROMISING, "cpu", distributions=("normal",))
    laws.run_law(law, strategy, mutant(bug, Capabilities()), device="cpu", settings=quick)
    with pytest.raises(AssertionError, match="differ bitwise"):
        laws.run_law(law, strategy, mutant(bug), device="cpu", settings=quick)
