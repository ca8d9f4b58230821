"""The contract's metamorphic laws over paged and index-sparse caches (contract v2: paged,
ragged, index-sparse, two scopes), each a `Law` record like those of `laws.py`. Outputs of
ragged calls are compared as one request of total_q rows.
"""

from __future__ import annotations

import torch
from hypothesis import assume

from fmha.oracles import dense_reference
from fmha.oracles.oracle import Paged, attention
from fmha.oracles.check import oracle_of
from fmha.contract.cache_layouts import pages_of
from fmha.contract.slots import page_and_offset, slot
from fmha.oracles.inputs import Inputs
from fmha.oracles.sample import Sample
from fmha.properties.law_record import Law, assert_agrees, assert_same, law, variant
from fmha.properties.dense_laws import agrees_with_oracle, calls_in_sequence_agree, refilled_buffers_give_the_new_answer

NAN = float("nan")


def _run(kernel, x: Inputs, **changes):
    """The kernel on x's call with `changes` to its tensors or arguments; (o, lse) in batch
    shapes (a ragged call as one request)."""
    args = {"q": x.q, "k": x.k, "v": x.v, **x.kwargs()}
    args.update(changes)
    o, lse = kernel(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    if x.problem.ragged:
        return o[None], None if lse is None else lse[None]
    return o, lse


def _reordered(cache: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """The cache with physical page `inverse[i]` moved to position i (a quantized byte view
    page by page, its bytes as they are, each page padded as the layout pads it)."""
    if cache.dtype != torch.uint8:
        return cache[inverse].contiguous()
    moved = torch.zeros(cache.shape[0], cache.stride(0), dtype=torch.uint8, device=cache.device)
    moved[:, :cache.shape[1] * cache.shape[3]] = pages_of(cache)[inverse]
    return moved.as_strided(cache.shape, cache.stride())


def _moved_slots(indices: torch.Tensor, perm: torch.Tensor, block_size: int) -> torch.Tensor:
    page, offset = page_and_offset(indices.long().clamp(min=0), block_size)
    moved = slot(perm[page], offset, block_size)
    return torch.where(indices < 0, -1, moved).to(torch.int32)


@law(test="test_moving_physical_pages_changes_nothing", mutant="contiguous-pages", draws="paged",
     exact_under="bitwise_deterministic")
def pages_permuted_change_nothing(kernel, sample: Sample, device):
    """Moving physical pages (and pointing the block table or the indices at their new
    places) changes nothing: the same keys are read."""
    p = sample.problem
    x = sample.inputs(device)
    g = torch.Generator().manual_seed(sample.values_seed + 1)
    perm = torch.randperm(x.k.shape[0], generator=g).to(device)  # old page i goes to perm[i]
    inverse = torch.argsort(perm)
    changes = dict(k=_reordered(x.k, inverse))
    changes["v"] = changes["k"] if x.v is x.k else _reordered(x.v, inverse)
    if p.source == "paged":
        changes["block_table"] = perm[x.source_args["block_table"].long()].to(torch.int32)
    else:
        changes["indices"] = _moved_slots(x.source_args["indices"], perm, p.block_size)
    extra = x.source_args.get("extra_k_cache")
    if extra is not None:
        extra_perm = torch.randperm(extra.shape[0], generator=g).to(device)
        changes["extra_k_cache"] = _reordered(extra, torch.argsort(extra_perm))
        changes["extra_indices"] = _moved_slots(x.source_args["extra_indices"], extra_perm, p.extra_block_size)
    assert_same(kernel, device, "bitwise_deterministic", _run(kernel, x, **changes), _run(kernel, x),
                f"{kernel.name} {sample.id}: physical pages moved", x)


@law(test="test_unread_slots_pages_and_bytes_leak_nothing", mutant="whole-last-page", draws="paged",
     exact_under="bitwise_deterministic")
def unread_storage_leaks_nothing(kernel, sample: Sample, device):
    """Every slot, page and byte nothing reads holds NaN, then a huge finite value: the
    output is the same and finite."""
    x = sample.inputs(device)
    huge = sample.inputs(device, tail_fill=1e30 if sample.problem.dtype == torch.float32 else 6e4)
    assert_same(kernel, device, "bitwise_deterministic", _run(kernel, x), _run(kernel, huge),
                f"{kernel.name} {sample.id}: unread storage NaN vs huge", x)


@law(test="test_an_invalid_index_equals_its_absence", mutant="minus-one-counts", draws="paged",
     sources=("sparse",), exact_under="bitwise_deterministic")
def an_invalid_index_equals_its_absence(kernel, sample: Sample, device):
    """Indices of -1 appended to every row, and entries past topk_len replaced by -1, change
    nothing."""
    assume(sample.problem.source == "sparse")
    x = sample.inputs(device)
    step = kernel.capabilities_on(device).topk_multiple_of  # a top-k the kernel takes: 3 more, or one step
    padded = {}
    for name, lengths in (("indices", "topk_len"), ("extra_indices", "extra_topk_len")):
        indices = x.source_args.get(name)
        if indices is None:
            continue
        pad = torch.full((*indices.shape[:2], 3 if step == 1 else step), -1, dtype=torch.int32, device=device)
        padded[name] = torch.cat([indices, pad], dim=-1)
        if lengths in x.source_args:  # entries past topk_len are never read: -1 there too
            past = torch.arange(padded[name].shape[-1], device=device) >= x.source_args[lengths].view(-1, 1, 1)
            padded[name] = padded[name].masked_fill(past, -1)
    assert_same(kernel, device, "bitwise_deterministic", _run(kernel, x, **padded), _run(kernel, x),
                f"{kernel.name} {sample.id}: -1 appended (and past topk_len)", x)


@law(test="test_a_paged_request_alone_equals_its_rows_in_the_batch", mutant="batch-drops-last-key",
     draws="paged", sources=("paged",), exact_under="batch_invariant")
def a_request_alone_equals_its_rows_in_the_batch(kernel, sample: Sample, device):
    """A paged request called alone gives the rows it has in the batch (ragged too)."""
    p = sample.problem
    assume(p.source == "paged" and p.batch > 1)
    x = sample.inputs(device)
    o, lse = _run(kernel, x)
    r = sample.seed % p.batch
    alone = dict(block_table=x.source_args["block_table"][r:r + 1], kv_lens=x.source_args["kv_lens"][r:r + 1])
    if p.ragged:
        start, end = x.source_args["cu_seqlens_q"][r:r + 2].tolist()
        assume(end > start)  # a request with no query rows has no rows to compare
        alone |= dict(q=x.q[start:end], cu_seqlens_q=torch.tensor([0, end - start], dtype=torch.int32, device=device))
        rows = (o[:, start:end], None if lse is None else lse[..., start:end])
    else:
        alone["q"] = x.q[r:r + 1]
        rows = (o[r:r + 1], None if lse is None else lse[r:r + 1])
    assert_same(kernel, device, "batch_invariant", _run(kernel, x, **alone), rows,
                f"{kernel.name} {sample.id}: request {r} alone", _alone_inputs(x, r, alone))


def _alone_inputs(x: Inputs, r: int, alone: dict) -> Inputs:
    """Inputs whose oracle is request r's (for the verdict when nothing is promised)."""
    source = x.oracle_sources[0]
    one = Paged(source.k_cache, source.v_cache, alone["block_table"], alone["kv_lens"])
    sample = x.sample.replace(batch=1, kv_lens=None, q_lens=None)
    args = {**x.source_args, **{name: value for name, value in alone.items() if name != "q"}}
    return Inputs(sample, alone["q"], x.k, x.v, x.sink, args, [one])


@law(test="test_two_scopes_equal_the_merge_of_each_scope", mutant="sink-per-scope", draws="paged",
     sources=("sparse",), needs=("two_scopes", "lse"))
def two_scopes_equal_the_merge_of_each(kernel, sample: Sample, device):
    """One softmax over both scopes with the sink, and the D5 merge with the sink of each
    scope alone without it, both equal the oracle; the merge is allowed what rounding each
    part before merging costs an error-free kernel."""
    p = sample.problem
    assume(p.extra_topk is not None)
    x = sample.inputs(device)
    call = x.source_args
    o, lse = _run(kernel, x)
    main = _run(kernel, x, sink=None, extra_k_cache=None, extra_indices=None, extra_topk_len=None,
                extra_cache_layout=None)
    extra = _run(kernel, x, sink=None, k=call["extra_k_cache"], v=call["extra_k_cache"], indices=call["extra_indices"],
                 topk_len=call.get("extra_topk_len"), cache_layout=call.get("extra_cache_layout"),
                 extra_k_cache=None, extra_indices=None, extra_topk_len=None, extra_cache_layout=None)
    oracle = oracle_of(x)  # after every kernel call: no float64 answer exists while a kernel runs
    assert_agrees(o, oracle.o, f"{kernel.name} {sample.id}: both scopes in one call", lse, oracle.lse, oracle)
    merged_o, merged_lse = dense_reference.merge([main, extra], sink=x.sink)
    exact = [attention(x.q, [source], scale=sample.scale) for source in x.oracle_sources]
    perfect_o = dense_reference.merge([(part_o.to(p.dtype), part_lse) for part_o, part_lse in exact], sink=x.sink)[0]
    assert_agrees(merged_o.to(p.dtype), oracle.o, f"{kernel.name} {sample.id}: each scope alone, merged",
                  merged_lse.float(), oracle.lse, oracle, perfect_o=perfect_o.to(p.dtype))


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def _one_block_size(caps) -> str | None:
    if caps.block_sizes is not None and len(caps.block_sizes) < 2:
        return f"declares one block size ({', '.join(map(str, caps.block_sizes))}): no other size to compare with"
    return None


@law(test="test_another_block_size_changes_nothing", mutant="power-of-two-pages", draws="paged",
     unstatable=_one_block_size)
def block_size_changes_nothing(kernel, sample: Sample, device):
    """The same keys in pages of another size give the same answer (within the verdict: a
    kernel may tile by page). A power of two is compared with a size that is not, and back:
    slot arithmetic by shifts and masks is right for powers of two only."""
    # what a shared page holds depends on its size, and what elements at stride 0 or sharing
    # memory hold on the slots and pages beside them
    sample = sample.replace(shared_pages=False).without_forms("overlap:", "zero:")
    p = sample.problem
    supported = kernel.capabilities_on(device).block_sizes
    sizes = [b for b in (supported or (1, 3, 5, 16, 64)) if b != p.block_size]
    opposite = [b for b in sizes if _power_of_two(b) != _power_of_two(p.block_size)]
    assume(sizes)
    other = (opposite or sizes)[sample.seed % len(opposite or sizes)]
    resized = variant(kernel, sample, device, block_size=other)
    x, y = sample.inputs(device), resized.inputs(device)
    o, lse = _run(kernel, x)
    o_other, lse_other = _run(kernel, y)
    assert_agrees(o_other, o, f"{kernel.name} {sample.id}: block size {other} instead of {p.block_size}", lse_other,
                  lse, oracle_of(x))


@law(test="test_reordering_a_rows_indices_changes_nothing", mutant="last-index-dropped", draws="paged",
     sources=("sparse",))
def index_order_changes_nothing(kernel, sample: Sample, device):
    """Each row's indices (the first topk_len of them) in another order: the same keys."""
    assume(sample.problem.source == "sparse")
    x = sample.inputs(device)
    g = torch.Generator().manual_seed(sample.values_seed + 2)
    shuffled = {}
    for name, lengths in (("indices", "topk_len"), ("extra_indices", "extra_topk_len")):
        indices = x.source_args.get(name)
        if indices is None:
            continue
        B, T, topk = indices.shape
        keys = torch.rand(B, T, topk, generator=g).to(device)
        if lengths in x.source_args:  # keep the entries past topk_len where they are
            keys = torch.where(torch.arange(topk, device=device) < x.source_args[lengths].view(-1, 1, 1), keys, 2.0)
        shuffled[name] = torch.gather(indices, 2, keys.argsort(dim=-1))
    o, lse = _run(kernel, x, **shuffled)
    oracle = oracle_of(x)
    assert_agrees(o, oracle.o, f"{kernel.name} {sample.id}: indices reordered", lse, oracle.lse, oracle)


@law(test="test_sparse_rows_over_their_keys_equal_the_dense_call", mutant="last-index-dropped",
     draws="paged", sources=("sparse",), needs=("dense",))
def sparse_over_its_keys_equals_dense(kernel, sample: Sample, device):
    """Index-sparse rows that each read all of their request's keys (no -1, no topk_len)
    equal the dense call over those keys (K = V, no mask), within the verdict."""
    every_key = sample.replace(invalid=0.0, repeats=0.0, topk_lens=None, extra_topk_lens=None,
                               hazards=tuple(h for h in sample.hazards if h != "invalid-runs"))
    every_key = every_key.without_forms("overlap:")  # a row running into the next reads some of its keys
    # the first scope alone (a scale and outliers shape its cache only if it is quantized)
    plain = {} if every_key.problem.cache_layout else dict(cache_exponent=0, outliers=False)
    sample = variant(kernel, every_key, device, extra_topk=None, extra_block_size=None, extra_cache_layout=None, **plain)
    p = sample.problem
    assume(p.source == "sparse")
    x = sample.inputs(device)
    slots = x.source_args["indices"][:, 0].long()  # (B, topk): row 0 reads every key of its request
    keys = x.oracle_sources[0].k_cache.flatten(0, 1)[slots].to(p.dtype)  # quantized values are bf16 values
    dense = sample.replace(source="dense", block_size=None, cache_layout=None, repeats=0.0, last_slot=False,
                           cache_exponent=0, outliers=False)
    assume(not kernel.not_supported_reasons(dense.problem, device))
    o_dense, lse_dense = kernel(x.q, keys, keys, scale=sample.scale, sink=x.sink)
    o, lse = _run(kernel, x)
    assert_agrees(o, o_dense, f"{kernel.name} {sample.id}: sparse rows vs the dense call over their keys", lse,
                  lse_dense, oracle_of(x))


# -- every paged and sparse call judged against the oracle, one law per family of calls --------
# The same check as the dense agreement (laws.agrees_with_oracle), on the family's draws: a
# kernel consistently wrong on a kind of call, which every law above compares it with itself
# on, fails here.

def _agreement(label: str, test: str, mutant: str, sources: tuple[str, ...], needs: tuple[str, ...], doc: str) -> Law:
    return Law(check=agrees_with_oracle.check, label=label, test=test, mutant=mutant, draws="paged", sources=sources,
               needs=needs, doc=doc, covering="family")


paged_calls_agree_with_the_oracle = _agreement(
    "paged_calls_agree_with_the_oracle", "test_a_paged_call_agrees_with_the_oracle", "causal-from-the-first-key",
    ("paged",), (), "A paged call (pages shuffled and shared, a kv length per request, windows over pages) agrees "
    "with the float64 oracle under the verdict.")
ragged_calls_agree_with_the_oracle = _agreement(
    "ragged_calls_agree_with_the_oracle", "test_a_ragged_call_agrees_with_the_oracle", "zero-query-request-shifts-rows",
    ("paged",), ("ragged",), "A ragged batch (decodes and prefills, requests with no query rows anywhere, kv "
    "lengths drawn with each request's rows) agrees with the float64 oracle under the verdict.")
sparse_calls_agree_with_the_oracle = _agreement(
    "sparse_calls_agree_with_the_oracle", "test_an_index_sparse_call_agrees_with_the_oracle",
    "last-slot-unread", ("sparse",), (), "An index-sparse call (-1 anywhere, repeated indices, the cache's "
    "last slot, topk_len) agrees with the float64 oracle under the verdict.")
two_scope_calls_agree_with_the_oracle = _agreement(
    "two_scope_calls_agree_with_the_oracle", "test_a_two_scope_call_agrees_with_the_oracle", "topk-len-zero-reads-all",
    ("sparse",), ("two_scopes",), "A call over two scopes (one of them read not at all, now and then) agrees with the "
    "float64 oracle under the verdict.")
fp8_cache_calls_agree_with_the_oracle = _agreement(
    "fp8_cache_calls_agree_with_the_oracle", "test_a_call_over_an_fp8_cache_agrees_with_the_oracle",
    "fp8-subnormals-flushed", ("paged", "sparse"), ("dsv4-fp8",), "A call over a dsv4-fp8 cache, paged or "
    "index-sparse (codes across the whole range, subnormal ones beside an outlier, scales toward either end) agrees "
    "with the oracle over the decoded keys.")
fp4_cache_calls_agree_with_the_oracle = _agreement(
    "fp4_cache_calls_agree_with_the_oracle", "test_a_call_over_an_fp4_cache_agrees_with_the_oracle",
    "fp4-halves-flushed", ("paged", "sparse"), ("dsv4-fp4",), "A call over a dsv4-fp4 cache, paged or index-sparse "
    "(every e2m1 code, scales toward either end) agrees with the oracle over the decoded keys.")

calls_over_caches_in_sequence_agree = Law(
    check=calls_in_sequence_agree.check, label="calls_over_caches_in_sequence_agree",
    test="test_paged_calls_in_sequence_agree_with_the_oracle", mutant="plan-reused", draws="paged",
    sources=("paged", "sparse"), covering="sequence", doc="Paged and sparse calls in sequence each agree with the oracle: one with a "
    "request more, then the drawn one, then the same shapes with new values (a kernel whose plan, scratch or "
    "metadata from one call leaks into the next fails).")
refilled_caches_give_the_new_answer = Law(
    check=refilled_buffers_give_the_new_answer.check, label="refilled_caches_give_the_new_answer",
    test="test_the_same_caches_and_tables_refilled_give_the_new_answer", mutant="paged-cached-by-address",
    draws="paged", sources=("paged", "sparse"), doc="The same caches, tables and indices, refilled in place with another draw's values, give "
    "that draw's answer: a kernel that caches its results (or a plan) by address or by shape fails.")
