"""Name a failing kernel's bug: by the wrong answer its output matches, by the precision its
error matches, or by the simpler inputs on which it stops failing.

Three kinds of evidence, tried in this order when a verdict fails:
- wrong references: the output is far closer to a common mistake (top-left causal
  alignment, a missing 1/sqrt(D), the scale argument ignored, the sink ignored, a window off
  by one) than to the contract;
- precision: the error is as large as computing at a lower precision would make it (fp32
  inputs at TF32; q.k carried in 16 bits);
- the LSE: written in (B, T, Hq) order, -inf where a row sees only the sink, and other
  libraries' conventions (the sink left out, +inf for a row with no key);
- paged calls: which requests are wrong, and what they share that the right ones do not;
- reruns (when the caller can rerun the kernel): it passes on the same values in contiguous
  storage, or with Dv = D, so the failure is in how it handles that dimension.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch

from fmha.contract import DTYPE_NAMES, KernelEntry, Problem
from fmha.oracles import dense_reference
from fmha.oracles.hazards import invisible_keys
from fmha.oracles.inputs import Inputs
from fmha.oracles.kernel_call import Run, first_difference

if TYPE_CHECKING:
    from fmha.oracles.oracle import Oracle
    from fmha.oracles.verdict import Verdict

# A masked key this far above a row's visible ones leaves every weight the row sees below 2^-24
# of the max's (exp(-16.6)): where a kernel's sum takes an epsilon, a clamp or (past 87.3, fp32's
# least normal) underflow, those weights are gone.
MASKED_MAX_GAP = 24 * math.log(2)


def _top_left_causal(x: Inputs):
    scores = dense_reference.logits(x.q, x.k, x.sample.scale)
    T, S = x.problem.q_len, x.problem.kv_len
    visible = torch.ones(T, S, dtype=torch.bool, device=x.q.device).tril()  # row i sees keys <= i
    weights, _ = dense_reference.softmax_with_sink(scores.masked_fill(~visible, float("-inf")), x.sink)
    v = x.v.double().repeat_interleave(x.problem.group, dim=2)
    return torch.einsum("bhts,bshd->bthd", weights, v)


def _call(x: Inputs, **changes):
    return dense_reference.attention(x.q, x.k, x.v, **x.kwargs(**changes))[0]


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to TF32 (10 mantissa bits), nearest even."""
    bits = t.float().contiguous().view(torch.int32)
    bits = ((bits + 0xFFF + ((bits >> 13) & 1)) >> 13) << 13
    return bits.view(torch.float32).double()


def _tf32_attention(x: Inputs):
    """Attention as a TF32 matmul unit computes it: q, k, v and P rounded to TF32."""
    scores = dense_reference.logits(_tf32(x.q), _tf32(x.k), x.sample.scale)
    visible = dense_reference.visibility_mask(x.problem.q_len, x.problem.kv_len, x.problem.causal, x.problem.window,
                                        x.q.device)
    weights, _ = dense_reference.softmax_with_sink(scores.masked_fill(~visible, float("-inf")), x.sink)
    v = _tf32(x.v).repeat_interleave(x.problem.group, dim=2)
    return torch.einsum("bhts,bshd->bthd", _tf32(weights), v)


def _sixteen_bit_logits(x: Inputs):
    """Attention with the logits q.k rounded to 16 bits (the input dtype) before the softmax."""
    scale = x.q.shape[-1] ** -0.5 if x.sample.scale is None else x.sample.scale
    dots = dense_reference.logits(x.q, x.k, 1.0).to(x.q.dtype).double()
    visible = dense_reference.visibility_mask(x.problem.q_len, x.problem.kv_len, x.problem.causal, x.problem.window,
                                        x.q.device)
    weights, _ = dense_reference.softmax_with_sink((dots * scale).masked_fill(~visible, float("-inf")), x.sink)
    v = x.v.double().repeat_interleave(x.problem.group, dim=2)
    return torch.einsum("bhts,bshd->bthd", weights, v)


def _interleaved_heads(x: Inputs):
    """Query head h reading KV head h % Hkv: right for MHA and MQA, another head's keys in GQA."""
    heads = torch.arange(x.problem.heads_q, device=x.k.device) % x.problem.heads_kv
    k = x.k[:, :, heads]
    return dense_reference.attention(x.q, k, k if x.v is x.k else x.v[:, :, heads], **x.kwargs())[0]


SINK_IGNORED = "sink ignored (exp(sink) missing from the softmax denominator)"
# description -> (applies to this sample?, wrong reference)
MISTAKES: dict[str, tuple[Callable[[Inputs], bool], Callable[[Inputs], torch.Tensor]]] = {
    "top-left causal alignment (the contract is bottom-right: query row i sits at S - T + i; "
    "SDPA's is_causal is top-left)": (
        lambda x: x.problem.causal and x.problem.window is None and x.problem.q_len != x.problem.kv_len,
        _top_left_causal,
    ),
    "scale not applied (logits are q.k without the 1/sqrt(D))": (
        lambda x: x.sample.scale != 1.0,
        lambda x: _call(x, scale=1.0),
    ),
    "the scale argument ignored (logits scaled by D**-0.5 instead of the scale passed)": (
        lambda x: x.sample.scale is not None and x.sample.scale != x.q.shape[-1] ** -0.5,
        lambda x: _call(x, scale=None),
    ),
    SINK_IGNORED: (
        lambda x: x.problem.sink,
        lambda x: _call(x, sink=None),
    ),
    "window one key too wide (contract: exactly `window` keys, the current one included)": (
        lambda x: x.problem.window is not None,
        lambda x: _call(x, window=x.problem.window + 1),
    ),
    "window one key too narrow": (
        lambda x: x.problem.window is not None and x.problem.window > 1,
        lambda x: _call(x, window=x.problem.window - 1),
    ),
    "query head h reading KV head h % Hkv (interleaved; the contract's is h // (Hq / Hkv), grouped)": (
        lambda x: 1 < x.problem.heads_kv < x.problem.heads_q,
        _interleaved_heads,
    ),
    "the output written head-major ((B, Hq, T, Dv) order into the (B, T, Hq, Dv) tensor)": (
        lambda x: x.problem.q_len > 1 and x.problem.heads_q > 1,
        lambda x: _call(x).transpose(1, 2).reshape(_call(x).shape),
    ),
}

# description -> (applies to this problem?, reference at that precision)
PRECISIONS: dict[str, tuple[Callable[[Problem], bool], Callable[[Inputs], torch.Tensor]]] = {
    "fp32 inputs computed at TF32 precision (10-bit mantissa); the contract wants IEEE fp32 "
    "(torch.backends.cuda.matmul.allow_tf32 = False; Triton tl.dot(input_precision='ieee'))": (
        lambda p: p.dtype == torch.float32,
        _tf32_attention,
    ),
    "q.k accumulated or held in 16 bits (low-precision accumulation); accumulate QK^T in fp32": (
        lambda p: p.dtype != torch.float32,
        _sixteen_bit_logits,
    ),
}


def _rel_l2(o: torch.Tensor, ref: torch.Tensor) -> float:
    o = torch.nan_to_num(o.double(), nan=0.0, posinf=0.0, neginf=0.0)
    return float((o - ref).norm()) / max(float(ref.norm()), 1e-300)


def explain(run: Run, oracle: Oracle, verdict: Verdict) -> list[str]:
    """Likely causes of the failing `verdict` on `run`, each with its evidence, from the oracle
    (before any rerun of the kernel: the guard empties the oracle's answers before each call)."""
    x, floor = run.inputs, verdict.metrics.floor
    unread = _nan_from_unread(run, oracle)
    if x.problem.source != "dense":  # the wrong references below are written for dense keys
        requests = _wrong_requests(run, oracle, floor) if x.problem.source == "paged" else []
        return requests + unread + _lse_layout_and_sink(run, oracle)
    error = _rel_l2(run.o, oracle.o)
    x, matched = _unread_zeroed(x), {}
    if error >= 4 * floor:  # else not wrong enough to tell one wrong reference from another
        for description, (applies, wrong_reference) in MISTAKES.items():
            if applies(x):
                wrong = wrong_reference(x)
                alternative = _rel_l2(run.o, wrong)
                rounding = _rel_l2(wrong.to(x.problem.dtype), wrong)  # what returning that answer costs
                if alternative < 0.25 * error and alternative < 10 * max(floor, rounding):
                    matched[description] = (f"output matches {description}: rel-L2 {alternative:.3g} to that, "
                                            f"{error:.3g} to the contract")
    # an output a wrong reference reproduces is explained: the lost rows' gaps are then circumstance
    lost = [] if matched else _max_before_mask(run, oracle)
    hints = unread + lost + list(matched.values())
    if not hints and error >= 2 * floor:  # an output at its floor is not the error a precision explains
        for description, (applies, at_precision) in PRECISIONS.items():
            if applies(x.problem):
                expected = _rel_l2(at_precision(x), oracle.o)
                if 2 * floor < expected < 0.5 and expected / 3 <= error <= 16 * expected:
                    hints.append(f"error matches {description}: rel-L2 {error:.3g}; that precision alone gives "
                                 f"{expected:.3g}, the {DTYPE_NAMES[x.problem.dtype]} floor is {floor:.3g}")
    # an output computed without the sink has an LSE without it: one bug, not FlashMLA's convention
    return (hints + _lse_layout_and_sink(run, oracle, sink_hint=not lost)
            + _lse_conventions(run, oracle, sink_convention=SINK_IGNORED not in matched))


def _unread_zeroed(x: Inputs) -> Inputs:
    """The dense call with the poison of the keys no row may read (left of every row's window)
    zeroed: a wrong reference would carry it into every row (0 x NaN). Finite values stay: a wrong
    reference such as a window one key too wide reads them as the kernel did."""
    hidden = invisible_keys(x.problem.q_len, x.problem.kv_len, x.problem.window)
    if not hidden:
        return x
    k = x.k.clone()
    k[:, :hidden] = k[:, :hidden].nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    v = k if x.v is x.k else x.v.clone()
    v[:, :hidden] = v[:, :hidden].nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return x.with_tensors(k=k, v=v)


def rerun_hints(passes: Callable[[Inputs], bool], run: Run, verdict: Verdict) -> list[str]:
    """Simpler versions of the failing call on which the kernel passes (`passes(inputs)` reruns
    it and judges): what it mishandles."""
    return [] if verdict.metrics.unwritten else _reruns(passes, run)


def nondeterminism(kernel: KernelEntry, run: Run) -> list[str]:
    """Two identical calls that differ: a finding of its own, whatever else failed."""
    differ = first_difference(kernel, run.inputs)
    return [f"nondeterministic output: two identical calls differ: {differ}"] if differ else []


def _nan_from_unread(run: Run, oracle: Oracle) -> list[str]:
    """NaN in the output where the oracle is finite, while the keys or values hold NaN only
    where no row may read them (the poison of keys left of every window, of cache slots past a
    request's keys or outside its pages): the kernel took in what it must not read, most often
    as a weight of 0 times NaN."""
    x = run.inputs
    bad = ~torch.isfinite(run.o) & torch.isfinite(oracle.o.to(run.o.device))
    if not bad.any() or not any(t.is_floating_point() and not torch.isfinite(t).all() for t in (x.k, x.v)):
        return []
    if x.problem.source == "dense":
        poisoned = int((~torch.isfinite(x.k) | ~torch.isfinite(x.v)).any(-1).any(-1).any(0).nonzero().max()) + 1
        if poisoned > invisible_keys(x.problem.q_len, x.problem.kv_len, x.problem.window):
            return []  # NaN a row may read: not the poison of unread keys
        where = f"its first {poisoned} keys, left of every row's window,"
    elif _left_of_a_window(x):
        where = "the keys left of a request's window and the cache slots no request's keys occupy,"
    else:
        where = "the cache slots no request's keys occupy (past kv_lens, outside its pages),"
    return [f"NaN in {int(bad.sum())} output element(s) where the oracle is finite, first at (b,t,h,d)="
            f"{tuple(torch.nonzero(bad)[0].tolist())}, and the call holds NaN only in {where} which no row may "
            "read: the kernel took them in, most often as a weight of 0 times NaN (0 x NaN = NaN); mask the "
            "values (or skip those keys) rather than rely on a zero weight"]


def _left_of_a_window(x: Inputs) -> bool:
    """Some request of a paged call has keys left of every one of its rows' windows."""
    if x.problem.window is None or x.problem.source != "paged":
        return False
    return any(invisible_keys(rows, keys, x.problem.window) for rows, keys in zip(*x.sample.request_lengths()) if rows)


def _max_before_mask(run: Run, oracle: Oracle) -> list[str]:
    """Rows whose answer is lost (an output row off by half its size or more, or an lse of -inf
    where the oracle's is finite) in which keys the row must not see outscore
    every key it sees, and the sink, by MASKED_MAX_GAP or more: a row max taken before the mask."""
    x, p = run.inputs, run.inputs.problem
    if not (p.causal or p.window is not None):
        return []
    # rows off by half their size or more (zeros, NaN, far too short) where the oracle's row is past
    # the dtype's least normal
    want = oracle.o.to(run.o.device)
    off = (torch.nan_to_num(run.o.double(), nan=math.inf) - want).norm(dim=-1) >= 0.5 * want.norm(dim=-1)
    lost = (off & (want.abs() >= torch.finfo(p.dtype).tiny).any(-1)).transpose(1, 2)  # (B, Hq, T), the lse's order
    if run.lse is not None and run.lse.shape == oracle.lse.shape:
        lost |= torch.isneginf(run.lse) & torch.isfinite(oracle.lse.to(run.lse.device))
    if not lost.any():
        return []
    scores = dense_reference.logits(x.q, x.k, x.sample.scale).nan_to_num(nan=float("-inf"))
    visible = dense_reference.visibility_mask(p.q_len, p.kv_len, p.causal, p.window, scores.device)
    seen = scores.masked_fill(~visible, float("-inf")).amax(-1)
    if x.sink is not None:  # the sink is a term every row sees
        seen = torch.maximum(seen, x.sink.double().to(seen.device).view(1, -1, 1))
    gap = scores.masked_fill(visible, float("-inf")).amax(-1) - seen
    gap = gap[lost.to(gap.device)]
    if not (gap > MASKED_MAX_GAP).all():
        return []
    return [f"the row max taken before the mask: in the {int(lost.sum())} row(s) whose answer is lost (first at "
            f"(b,h,t)={tuple(torch.nonzero(lost)[0].tolist())}), keys the row must not see outscore every key it "
            f"sees (and the sink) by {float(gap.min()):.3g} or more, so exp(s - max) leaves its weights below 2^-24 "
            "(0 past 87.3); take the max over the keys the row sees"]


def _wrong_requests(run: Run, oracle: Oracle, floor: float) -> list[str]:
    """Which requests of a paged call have the wrong rows, and (when they all follow one) the
    ragged request with no query rows before them: a launch that drops such requests shifts
    the ones after them onto other requests' keys."""
    x = run.inputs
    q_lens, kv_lens = x.sample.request_lengths()
    o = run.o if x.problem.ragged else run.o.flatten(0, 1)  # rows of every request, one after another
    want = oracle.o.flatten(0, 1)
    bounds = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    wrong = []
    for b, (start, end) in enumerate(zip(bounds, bounds[1:])):
        got = torch.nan_to_num(o[start:end].double(), nan=1e300)
        error = float((got - want[start:end]).norm()) / max(float(want[start:end].norm()), 1e-300)
        if end > start and not error <= 16 * max(floor, 2.0**-8):
            wrong.append(b)
    if not wrong:
        return []
    empty = [b for b, n in enumerate(q_lens) if n == 0]
    after = [b for b in range(empty[0] + 1, len(q_lens)) if q_lens[b]] if empty else []
    if x.problem.ragged and empty and wrong == after:
        return [f"the rows of requests {', '.join(map(str, wrong))} are wrong, and every one comes after request "
                f"{empty[0]}, which has no query rows (cu_seqlens_q[{empty[0]}] == cu_seqlens_q[{empty[0] + 1}]): a "
                "launch that drops requests with no query rows gives the requests after them other requests' keys "
                "(vLLM's decode launch did)"]
    shared = _what_they_share(wrong, q_lens, kv_lens, x.problem.block_size, x.problem.window)
    return [f"the wrong rows are those of requests {', '.join(map(str, wrong))} of {len(q_lens)} (query rows "
            f"{[q_lens[b] for b in wrong]}, keys {[kv_lens[b] for b in wrong]})"
            + (f"; they, and no request whose rows are right, {shared}" if shared else "")]


def _what_they_share(wrong: list[int], q_lens, kv_lens, block_size: int | None, window: int | None = None) -> str:
    """What the wrong requests have in common and the right ones do not, in words (the most
    specific first: keys left of a window are where a 0 x NaN leak comes from)."""
    right = [b for b, n in enumerate(q_lens) if n and b not in wrong]
    traits = {
        f"have keys left of every row's window ({window} keys)":
            lambda b: window is not None and invisible_keys(q_lens[b], kv_lens[b], window) > 0,
        "have no keys": lambda b: kv_lens[b] == 0,
        f"fill their last page exactly (keys a multiple of the block size {block_size})":
            lambda b: bool(block_size) and kv_lens[b] > 0 and kv_lens[b] % block_size == 0,
        f"end in a partial page (keys not a multiple of the block size {block_size})":
            lambda b: bool(block_size) and kv_lens[b] % block_size != 0,
        "have more than one page of keys": lambda b: bool(block_size) and kv_lens[b] > block_size,
        "have more query rows than keys": lambda b: q_lens[b] > kv_lens[b],
        "have one query row (decodes)": lambda b: q_lens[b] == 1,
    }
    found = [words for words, has in traits.items() if all(map(has, wrong)) and not any(map(has, right))]
    return " and ".join(found)


def _lse_layout_and_sink(run: Run, oracle: Oracle, sink_hint: bool = True) -> list[str]:
    """An LSE written in (B, T, Hq) order, or (with `sink_hint`: no other cause explains the lost
    rows) -inf where a row sees no key but the sink."""
    if run.lse is None or run.lse.shape != oracle.lse.shape:
        return []
    lse, want, hints = run.lse.double(), oracle.lse.to(run.lse.device), []
    transposed = want.transpose(-1, -2).reshape(want.shape)  # (B, T, H) order read as (B, H, T)
    rows = torch.isfinite(transposed) & torch.isfinite(lse) & torch.isfinite(want)
    if want.shape[-1] > 1 and want.shape[-2] > 1 and rows.any() and float(
            (lse[rows] - transposed[rows]).abs().max()) < 1e-3 < float((lse[rows] - want[rows]).abs().max()):
        hints.append("lse is the contract's written in (B, T, Hq) order: the contract's lse is (B, Hq, T)")
    no_key = torch.isneginf(lse) & torch.isfinite(want)
    p = run.inputs.problem
    if p.source == "dense":  # rows that see a key have other reasons for a lost answer (_max_before_mask)
        sees = dense_reference.visibility_mask(p.q_len, p.kv_len, p.causal, p.window, lse.device).any(-1)
        no_key &= ~sees
    if sink_hint and p.sink and no_key.any():
        hints.append(f"lse is -inf in {int(no_key.sum())} row(s) (first at (b,h,t)="
                     f"{tuple(torch.nonzero(no_key)[0].tolist())}) where the contract's is finite: rows that see no "
                     "key, whose lse is the sink's logit; the sink left out where a row has no key")
    return hints


def _lse_conventions(run: Run, oracle: Oracle, sink_convention: bool = True) -> list[str]:
    """FlashMLA's LSE: the sink left out (with `sink_convention`: the output is not explained
    by the sink ignored throughout), +inf for a row with no key (the base-2 LSE of FlashInfer is
    named by the verdict's own hint, from the metrics alone)."""
    if run.lse is None:
        return []
    x, lse, hints = run.inputs, run.lse.double(), []
    adapter = "fmha.adapters.conventions.lse_from_sink_excluded translates it"
    no_key = torch.isposinf(lse)
    if no_key.any():
        hints.append(f"lse is +inf in {int(no_key.sum())} row(s) (first at (b,h,t)="
                     f"{tuple(torch.nonzero(no_key)[0].tolist())}): FlashMLA's mark of a row with no key; the "
                     f"contract wants -inf, or the sink; {adapter}")
    if x.problem.sink and sink_convention:
        o_without_sink, without_sink = dense_reference.attention(x.q, x.k, x.v, **x.kwargs(sink=None))
        rows = torch.isfinite(without_sink) & torch.isfinite(lse)
        if rows.any():
            off_oracle = (lse[rows] - oracle.lse[rows]).abs().max()
            off_no_sink = (lse[rows] - without_sink[rows]).abs().max()
            # The convention leaves the output the contract's: one nearer the call without its sink
            # is the sink ignored, though too little of it for the output's error to name it alone
            # (a sink of 0.5% of a row's weight: the output 1.3 floors off, the lse 0.005).
            o_error, o_error_without = _rel_l2(run.o, oracle.o), _rel_l2(run.o, o_without_sink)
            if off_no_sink < 0.01 * off_oracle and o_error_without < o_error:
                hints.append(f"output and lse match {SINK_IGNORED}: rel-L2 {o_error_without:.3g} to that, "
                             f"{o_error:.3g} to the contract; the lse {off_no_sink:.3g} from the one without the sink")
            elif off_no_sink < 0.01 * off_oracle:
                hints.append(f"lse leaves the sink out (FlashMLA's convention): {off_no_sink:.3g} from the LSE "
                             f"without the sink, {off_oracle:.3g} from the contract's; {adapter}")
    return hints


def _reruns(rerun_passes: Callable[[Inputs], bool], run: Run) -> list[str]:
    """Simpler versions of the failing call on which the kernel passes: what it mishandles."""
    x = run.inputs
    p = x.problem
    hints = []

    def passes(inputs: Inputs) -> bool:
        try:
            return rerun_passes(inputs)
        except Exception:  # noqa: BLE001 -- a simpler call that fails or raises tells nothing
            return False

    strided = [name for name in ("q", "k", "v") if not getattr(x, name).is_contiguous()]
    if strided and passes(x.contiguous()):
        layouts = ", ".join(f"{name} {x.sample.storages.get(name, 'from its source')} (strides "
                            f"{tuple(getattr(x, name).stride())}, offset {getattr(x, name).storage_offset()})"
                            for name in strided)
        hints.append(f"the kernel mishandles non-contiguous storage: it passes on contiguous copies of the same "
                     f"values; here {layouts}")
    if p.head_dim_v != p.head_dim and not p.shared_kv:
        D = p.head_dim
        v = x.v[..., :D] if p.head_dim_v > D else torch.nn.functional.pad(x.v, (0, D - p.head_dim_v))
        same_dims = x.with_tensors(v=v.contiguous(), sample=x.sample.replace(head_dim_v=D))
        if passes(same_dims):
            path = " on the decode path (T = 1)" if p.q_len == 1 else ""
            hints.append(f"the kernel mishandles Dv != D{path}: it passes with v cut or padded to Dv = D = {D}; "
                         f"here Dv = {p.head_dim_v}")
    return hints

